"""The float64 direct reference as a strategy: the oracle, never selected."""

from __future__ import annotations

from dataclasses import dataclass

from ..direct.reference import reference
from ..problem import ConvProblem
from .base import Config, Strategy, register


@dataclass(frozen=True)
class ReferenceConfig(Config):
    pass


@register
class ReferenceStrategy(Strategy):
    name = "reference"
    version = 1
    selectable = False
    config_type = ReferenceConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        return None

    def candidates(self, problem, backend):
        return [ReferenceConfig()]

    def workspace_bytes(self, problem, config) -> int:
        return 8 * (problem.min_bytes() // 4)

    def build(self, problem, config, backend):
        xp = backend.xp

        def run(a, b, out=None):
            result = reference(xp, problem, a, b)
            if out is None:
                return result
            out[...] = result
            return out
        return run
