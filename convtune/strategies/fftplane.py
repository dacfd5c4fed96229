"""The one-block image FFT (:mod:`convtune.fft.planeconv`): 2-D depthwise convolutions (channel multiplier 1, stride
1, dilation 1) whose transform (powers of two, or 2^a 3^b) fits one thread block's shared memory (72 x 72, 128 x 128,
128 x 256, ...), every pass two kernels (the filter's spectra, then the images; the filter gradient: slices of the
batch, then their sum). GPU only; float32, float16 and bfloat16, channels-first and channels_last, read and written
in place."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from .. import precision
from ..direct import replay
from ..fft import planeconv
from ..problem import ConvProblem
from ..versioning import no_shape
from .base import Config, Strategy, register
from .fft import small_depthwise

#: A transform whose plane (``L0 x L1``) is over this many times the smallest of the problem's options
#: (:func:`convtune.fft.planeconv.size_options`) is not tried on the GPU (:meth:`PlaneFftStrategy.pruned`).
LARGER_PLANE = 1.5


@dataclass(frozen=True)
class PlaneFftConfig(Config):
    sizes: tuple[int, ...]  # the transform sizes (powers of two, or 2^a 3^b)
    slices: int = 1  # the filter gradient: the batch cut into this many slices per channel (planeconv.batch_slices)
    threads: int = 0  # threads per block, registers uncapped (planeconv.shape_options); 0: planeconv.launch_shape's
    radices: str = "8"  # the passes' radices (rowconv.RADICES: "8", "16", "16x9"; planeconv.radix_options)

    def shape(self):
        """The launch shape ``(threads, blocks per SM)`` it names, or ``None`` for the policy's."""
        return (self.threads, 1) if self.threads else None


@register
class PlaneFftStrategy(Strategy):
    name = "fft-plane"
    transforms = True
    version = 3  # 2: launch shapes (registers capped for occupancy, or a block of the other size), twiddle tables,
    # the filter gradient's spectra and sums in shared memory, radices 16 and 9; 3: the launches replayed from CUDA
    # graphs (the kernels and their times are the same: every plan stands, the duels are measured again)
    changes = {3: no_shape}
    config_type = PlaneFftConfig
    native_dtypes = ("float32", "float16", "bfloat16")
    native_layouts = ("channels_first", "channels_last")

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if getattr(backend, "name", "") != "cupy":
            return "the image FFT's kernels are CUDA kernels: they need the CuPy (GPU) backend"
        return None if planeconv.size_options(problem) else planeconv.reason(problem)

    def serves_shape(self, problem: ConvProblem) -> bool:
        return problem.rank == 2 and problem.groups == problem.in_channels == problem.out_channels

    def pruned(self, problem, config, backend, room=None):
        """The FFT strategies' rule on small depthwise kernels (:func:`convtune.strategies.fft.small_depthwise`): the
        image FFT's candidates on 7x7 kernels or smaller never came within 2.53x of the winner in ConvNeXt-T's AMP
        tune on an H100. And on the GPU no plane over :data:`LARGER_PLANE` times the area of the problem's smallest
        (the power of two beside a much smaller 2^a 3^b: 128 x 128 beside SLaK's 81 x 96 and RepLKNet's 72 x 72,
        64 x 64 beside 48 x 48). Replayed on the stored GPU searches (``benchmarks/check_rules.py`` on
        tests/data/searches, H200: SLaK-T's and RepLKNet-31B's tunes in float32 and bfloat16) it prunes 24 candidates in
        6 problems of each, the closest 1.25x the winner (RepLKNet's 29x29 filter gradient at 28 x 28, on 64 x 64
        beside 48 x 48), while planes 1.40x the smallest have won (SLaK's 49x49 filter gradient, 64 x 64 beside
        54 x 54); in two SLaK-T fp32 tunes on an H100 (2026-12-07) never within 1.52x. Their timing costs little
        (0.1 to 0.2 s a tune); their kernels, the largest to compile, are about a fifth of SLaK-T's plane modules
        (18 of 84 in fp32)."""
        return small_depthwise(problem, backend) or self._larger_plane(problem, config, backend)

    @staticmethod
    def _larger_plane(problem, config, backend) -> str | None:
        if getattr(backend, "name", "") != "cupy":
            return None
        smallest = min((math.prod(s) for s in planeconv.size_options(problem)), default=0)
        if smallest and math.prod(config.sizes) > LARGER_PLANE * smallest:
            return (f"a plane over {LARGER_PLANE}x the area of the smallest the problem has: never within 1.25x of "
                    "the best there")
        return None

    def candidates(self, problem, backend):
        slices = sorted({planeconv.batch_slices(problem, blocks) for blocks in planeconv.WGRAD_BLOCKS}) \
            if problem.pass_ == "wgrad" else [1]
        return [PlaneFftConfig(sizes=sizes, slices=s, threads=t, radices=r)
                for sizes in planeconv.size_options(problem) for s in slices for t in planeconv.shape_options(sizes)
                for r in planeconv.radix_options(sizes)]

    def kernel_builds(self, problem, configs, backend):
        """The candidates' kernels (a module per dtype, sizes and pass): the convolutions alone (an executor would
        allocate its workspace, see build)."""
        if getattr(backend, "name", "") != "cupy":
            return []
        return [functools.partial(self._conv, problem, c, backend) for c in configs]

    def workspace_bytes(self, problem, config) -> int:
        return planeconv.workspace_bytes(problem, config.sizes, config.slices)

    def recordable(self, problem, config) -> bool:
        return True  # kernel launches only

    @staticmethod
    def _conv(problem, config, backend):
        return planeconv.PlaneFftConv(backend.xp, problem, config.sizes,
                                      slices=config.slices if problem.pass_ == "wgrad" else None,
                                      shape=config.shape(), radix=config.radices)

    def build(self, problem, config, backend):
        executor = self._conv(problem, config, backend)
        # the kernel launches replayed from CUDA graphs per operand addresses, with the spectra in a workspace of
        # the plan's own
        launch = replay.owning(executor.launch, executor.workspace, backend.xp,
                               f"the plan {self.describe(config)} of {problem.describe()}")
        return precision.launched(launch, problem, backend.xp)
