"""Direct depthwise kernels (CUDA, CuPy RawKernel): all three passes, channel multiplier 1, GPU
only. Small kernels (up to 81 taps): any stride, padding and dilation. Larger ones: the window
kernels (stride 1, dilation 1, up to 64 wide, planes that fit shared memory), for large kernels on
small planes."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..direct.depthwise import (MAX_TAPS, TILE_W, TILED_ROWS, WINDOW_S, DepthwiseConv, tiled_reason, tiled_warps,
                                window_layout, window_reason)
from ..problem import ConvProblem
from .base import Config, Strategy, register


@dataclass(frozen=True)
class DepthwiseConfig(Config):
    threads: int = 256
    variant: str = "simple"  # or "tiled" (stride-1 2-D, register-blocked shared-memory tiles), "window"
    rows: int = 1  # outputs per thread (tiled, window; window's filter gradient: taps per thread)


#: Smallest kernel (taps) offered the window kernels (below it the tiled kernels hold the filter in registers).
WINDOW_MIN_TAPS = 49


@register
class DepthwiseStrategy(Strategy):
    name = "depthwise"
    version = 4
    config_type = DepthwiseConfig

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if backend is None or getattr(backend, "name", "") != "cupy":
            return "the direct depthwise kernels are CUDA kernels: they need the CuPy (GPU) backend"
        if problem.rank > 2:
            return "the direct depthwise kernels are 1-D and 2-D (3-D ones are not written yet)"
        if not (problem.groups == problem.in_channels == problem.out_channels):
            return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
        taps = math.prod(problem.kernel_size)
        if taps > MAX_TAPS:
            reason = window_reason(problem)
            if reason is not None:
                return f"kernel of {taps} taps is over {MAX_TAPS} and {reason} (large kernels: use FFT)"
        return None

    def serves_shape(self, problem: ConvProblem) -> bool:
        return problem.rank <= 2 and problem.groups == problem.in_channels == problem.out_channels

    def candidates(self, problem, backend):
        window = [DepthwiseConfig(threads=window_layout(problem, s)[1], variant="window", rows=s)
                  for s in WINDOW_S if math.prod(problem.kernel_size) >= WINDOW_MIN_TAPS
                  and window_reason(problem, s) is None]
        if math.prod(problem.kernel_size) > MAX_TAPS:
            return window
        tiled = [DepthwiseConfig(threads=TILE_W * tiled_warps(problem, rows), variant="tiled", rows=rows)
                 for rows in sorted(TILED_ROWS, reverse=True) if tiled_reason(problem, rows) is None]
        # the tiled kernels first: the heuristic's choice (the first candidate) for kernels they hold
        return tiled + window + [DepthwiseConfig(threads=t) for t in (256, 128, 512)]

    def workspace_bytes(self, problem, config) -> int:
        return 0

    def recordable(self, problem, config) -> bool:
        return True  # one kernel launch per pass (and a memset for the filter gradient)

    def build(self, problem, config, backend):
        cp = backend.xp
        executor = DepthwiseConv(cp, problem, config.threads, backend.device_info().sm_count, config.variant,
                                 config.rows)
        shape = problem.result_shape

        def run(a, b, out=None):
            return executor(a, b, cp.empty(shape, dtype=cp.float32) if out is None else out)
        run.launch = executor.launch  # by address, for the PyTorch bridge (see Strategy.build)
        return run
