"""im2col + GEMM: every pass, stride, padding, dilation and groups; batch chunks as candidates."""

from __future__ import annotations

from dataclasses import dataclass

from ..direct import im2col
from ..problem import ConvProblem
from .base import Config, Strategy, register


@dataclass(frozen=True)
class Im2colConfig(Config):
    chunk: int  # samples per GEMM; bounds the column buffer


def _chunk_options(batch: int) -> list[int]:
    return sorted({batch, max(1, batch // 4), 1}, reverse=True)


@register
class Im2colStrategy(Strategy):
    name = "im2col"
    version = 1
    config_type = Im2colConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if problem.math not in ("fp32", "tf32"):
            return f"math mode {problem.math!r} is not implemented"
        return None

    def candidates(self, problem, backend):
        return [Im2colConfig(chunk=c) for c in _chunk_options(problem.batch)]

    def workspace_bytes(self, problem, config) -> int:
        return im2col.workspace_bytes(problem, config.chunk)

    def build(self, problem, config, backend):
        xp = backend.xp
        fn = im2col.PASS_FUNCTIONS[problem.pass_]
        chunk = max(1, min(config.chunk, problem.batch))
        shape = problem.result_shape

        def run(a, b, out=None):
            if out is None:
                out = xp.empty(shape, dtype=a.dtype)
            return fn(xp, problem, chunk, a, b, out)
        return run
