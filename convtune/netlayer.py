"""A network's convolution layer as every network source (YAML, ONNX, PyTorch models) describes it."""

from __future__ import annotations

from dataclasses import dataclass

from .problem import ConvProblem


@dataclass(frozen=True)
class Layer:
    name: str
    problem: ConvProblem  # the forward problem; other passes via problem.for_pass
    source: str = ""
    #: the passes training runs for this layer (a model's first layer needs no input gradient); None: all
    passes: tuple[str, ...] | None = None
