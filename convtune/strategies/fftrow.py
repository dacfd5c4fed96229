"""The one-block row FFT (:mod:`convtune.fft.rowconv`): 1-D depthwise convolutions (channel multiplier 1, stride 1,
dilation 1) whose rows fit one thread block's shared memory (transforms of up to 32768 samples as powers of two, or
even 2^a 3^b lengths), every pass one kernel over the operands (plus one for the filter's spectra in the forward and
backward-data passes). GPU only; float32, float16 and bfloat16, channels-first and channels_last, read and written in
place."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .. import precision
from ..direct import replay
from ..fft import rowconv
from ..problem import ConvProblem
from ..versioning import no_shape
from .base import Config, Strategy, register


@dataclass(frozen=True)
class RowFftConfig(Config):
    size: int  # the transform length (a power of two, or an even 2^a 3^b)
    radices: str = "8"  # the passes' radices (rowconv.RADICES: "8", "16", "16x9", "32"; rowconv.radix_options)


@register
class RowFftStrategy(Strategy):
    name = "fft-row"
    transforms = True
    # 2: twiddles from a table, the filter gradient keeping the input spectrum in shared memory, radices 16 and 9
    # 3: radix-32 passes (rows whose passes they make fewer); 4: the forward's first pass reads the row and the
    # inverse's last writes the result (every row), shared memory padded after as many points as the first radix;
    # 5: the launches replayed from CUDA graphs (the kernels and their times are the same: every plan stands, the
    # duels are measured again)
    version = 5
    changes = {3: lambda p: rowconv.offers(p, "32"), 5: no_shape}
    config_type = RowFftConfig
    native_dtypes = tuple(rowconv.ELEMENTS)
    native_layouts = ("channels_first", "channels_last")

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if getattr(backend, "name", "") != "cupy":
            return "the row FFT's kernels are CUDA kernels: they need the CuPy (GPU) backend"
        return None if rowconv.size_options(problem) else rowconv.reason(problem)

    def serves_shape(self, problem: ConvProblem) -> bool:
        return problem.rank == 1 and problem.groups == problem.in_channels == problem.out_channels

    def candidates(self, problem, backend):
        return [RowFftConfig(size=L, radices=r) for L in rowconv.size_options(problem)
                for r in rowconv.radix_options(L // 2)]

    def kernel_builds(self, problem, configs, backend):
        """The candidates' kernels (a module per dtype, transform length, radices and pass): making an executor
        compiles its kernels and allocates nothing (its workspace is the plan's, see build)."""
        if getattr(backend, "name", "") != "cupy":
            return []
        return [functools.partial(rowconv.RowFftConv, backend.xp, problem, c.size, radix=c.radices) for c in configs]

    def workspace_bytes(self, problem, config) -> int:
        return rowconv.workspace_bytes(problem, config.size)

    def recordable(self, problem, config) -> bool:
        return True  # kernel launches only

    def build(self, problem, config, backend):
        executor = rowconv.RowFftConv(backend.xp, problem, config.size, radix=config.radices)
        # one or two kernel launches (the filter's spectra, then the rows), replayed from CUDA graphs per operand
        # addresses, with the spectra in a workspace of the plan's own
        launch = replay.owning(executor.launch, executor.workspace, backend.xp,
                               f"the plan {self.describe(config)} of {problem.describe()}")
        return precision.launched(launch, problem, backend.xp)
