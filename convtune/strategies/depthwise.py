"""Direct depthwise kernels (CUDA, CuPy RawKernel): all three passes, channel multiplier 1, GPU
only. Small kernels (up to 81 taps): any stride, padding and dilation. Larger ones: the window
kernels (stride 1, dilation 1, up to 64 wide, planes that fit shared memory), for large kernels on
small planes. 3-D problems: the tiled kernels of :mod:`convtune.direct.depthwise3d` (stride 1, any
padding and dilation, depth slices of up to 81 taps: 7x7x7 and 9x9x9 kernels). The 1-D and 2-D kernels read and
write channels-first operands of float32, bfloat16 and float16 themselves (sums in float32; a half-precision filter
gradient summed in a float32 workspace and rounded once), and so do the 3-D ones (channels_last 3-D problems run
through conversions, :func:`convtune.precision.bounded`). Channels-last problems also get the ``nhwc``
kernels (:mod:`convtune.direct.depthwise_nhwc`), which read and write float32, bfloat16 and
float16 channels-last operands themselves: any stride, padding and dilation, kernels up to 81 wide;
and ``nhwc-tiled`` (shared-memory tiles: stride 1, up to 81 taps, forward and backward-data), ``nhwc-vecV`` and
``nhwc-stP`` (dilation 1; the vectorized kernel stride 1, the staged ones strides 1 and 2: vectorized loads; tiles
staged in shared memory, every pass)."""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from .. import precision
from ..direct import depthwise3d, depthwise_nhwc, replay
from ..direct.depthwise import (MAX_TAPS, TILE_W, TILED_ROWS, WINDOW_S, DepthwiseConv, tiled_reason, tiled_warps,
                                window_layout, window_reason)
from ..executor import Executor
from ..problem import ConvProblem
from ..versioning import no_shape
from .base import Config, Strategy, register


@dataclass(frozen=True)
class DepthwiseConfig(Config):
    threads: int = 256
    # or "tiled" (stride-1 2-D, register-blocked shared-memory tiles), "window", "nhwc", "nhwc-tiled" and
    # "nhwc-vecV" (channels-last operands in their own dtype, V channels a thread: :mod:`convtune.direct.depthwise_nhwc`)
    # and "nhwc-stP" (the staged channels-last kernels, P channel pairs a block, tiles of up to ``rows`` rows;
    # "nhwc-stPwS": up to S columns a thread, not 16; a trailing "p": two tiles' buffers, copies in flight)
    variant: str = "simple"
    rows: int = 1  # outputs per thread (tiled, window, nhwc; window's filter gradient: taps per thread)


#: Smallest kernel (taps) offered the window kernels (below it the tiled kernels hold the filter in registers).
WINDOW_MIN_TAPS = 49
#: Outputs per thread along a row that the channels-last kernels try (a search axis; the first is the heuristic's).
NHWC_ROWS = (4, 8, 2)
#: The same for the channels-last tiled kernel (forward and stride-1 backward-data).
NHWC_TILED_ROWS = (4, 8)
#: Channels per thread (``nhwc-vecV``) and threads per block of the channels-last vectorized kernel (forward and
#: backward-data at stride and dilation 1), at 4 outputs a row. A sweep on an H200 in bfloat16 at batch 32 (V 2, 4
#: and 8; 4 and 8 outputs a row; 1, 2 and 4 rows; 64, 128 and 256 threads; 2, 8 and 32 blocks per multiprocessor)
#: found these, at 2 rows and 2 blocks per multiprocessor, best on four of five 7x7 layers of ConvNeXt-T's shapes
#: and 2x to 2.8x faster than the ``nhwc-tiled`` kernel on every 7x7 and 3x3 one; with the loads issued together,
#: ``benchmarks/depthwise_vec.py`` then found 128 threads (not 64) best on the 7x7 layer of 7x7 pixels (22.7 against
#: 29.4 us a call) and as good elsewhere.
NHWC_VEC = ((4, 256), (2, 256), (2, 128), (4, 128))


#: The staged channels-last kernels' configurations offered (``nhwc-stP``: every pass at dilation 1 and strides 1 and
#: 2, the tiles of input and dy copied into shared memory by 16-byte loads): ``(channel pairs a block, output rows a
#: tile at most, columns a thread at most, double-buffered, KiB of shared memory a block at most)``. A sweep of 4 to 32
#: pairs and 8 and 16 rows on an H100 in bfloat16 at batch 32 found each layer's best of every pass among five pairs
#: and rows, single-buffered; a second
#: (``benchmarks/depthwise_vec.py --kernels staged --tiles strategy --segw 8,16 --pipe 0,1 --blocks 2,4,8``) found
#: the double-buffered tiles (``pipe``: the next tile's copies in flight while the threads work on the current one)
#: best on the planes of 28x28 and below, up to 1.18x faster (3x3, 28x28) and 1.06x to 1.11x on ConvNeXt-T's stage-4
#: passes, and the single-buffered ones best on 56x56; these seven hold every pass's best of the ten, at 16 columns a
#: thread (8 gained at most 3%, on filter gradients of 28x28) and the kernels' own blocks per multiprocessor. A third,
#: with double-buffered blocks opted in to 100 KiB of shared memory (``--smem 48,100``), found three of them best
#: on ConvNeXt-T's 56x56 and 28x28 layers, every pass: 1.03x to 1.06x on 56x56, 1.06x to 1.12x on 28x28 (the filter
#: gradient 35.5 against 39.6 us); they are offered where the device gives a block that much (``m100``).
NHWC_STAGED_CONFIGS = ((8, 8, 16, False, 48), (4, 16, 16, False, 48), (32, 8, 16, False, 48), (16, 8, 16, True, 48),
                       (32, 8, 16, True, 48), (8, 16, 16, True, 48), (4, 16, 16, True, 48),
                       (8, 8, 16, True, 100), (8, 16, 16, True, 100), (16, 8, 16, True, 100))
#: Their channel pairs a block and rows a tile (at most), in the 48 KiB every device gives a block.
NHWC_STAGED = tuple(dict.fromkeys((pairs, rows) for pairs, rows, _segw, _pipe, kib in NHWC_STAGED_CONFIGS
                                  if kib * 1024 <= depthwise_nhwc.SMEM_LIMIT))
_STAGED_VARIANT = re.compile(r"nhwc-st(\d+)(?:w(\d+))?(p?)(?:m(\d+))?")


def _nhwc(config: DepthwiseConfig) -> bool:
    """Is ``config`` one of the channels-last kernels (``nhwc``, ``nhwc-tiled``, ``nhwc-vecV``, ``nhwc-stP``)?"""
    return config.variant.startswith("nhwc")


def _vec(config: DepthwiseConfig) -> int:
    """The channels per thread of a vectorized channels-last configuration (``nhwc-vecV``), else 0."""
    return int(config.variant[len("nhwc-vec"):]) if config.variant.startswith("nhwc-vec") else 0


def _staged(config: DepthwiseConfig) -> tuple[int, int, bool, int]:
    """The channel pairs a block, columns a thread at most, double buffering and bytes of shared memory a block at
    most of a staged channels-last configuration (``nhwc-stP``, ``nhwc-stPwS``, either with a trailing ``p``, then
    ``mK`` for K KiB over the 48 every device gives), else ``(0, 16, False, 48 KiB)``."""
    if not config.variant.startswith("nhwc-st"):
        return 0, depthwise_nhwc.STAGED_SEGW, False, depthwise_nhwc.SMEM_LIMIT
    m = _STAGED_VARIANT.fullmatch(config.variant)
    if m is None:
        raise ValueError(f"not a staged channels-last variant: {config.variant!r} (nhwc-stP, nhwc-stPwS, either "
                         "with a trailing p, then mK for K KiB of shared memory)")
    smem = int(m[4]) * 1024 if m[4] else depthwise_nhwc.SMEM_LIMIT
    return int(m[1]), int(m[2] or depthwise_nhwc.STAGED_SEGW), bool(m[3]), smem


def staged_variant(pairs: int, segw: int, pipe: bool, smem: int = depthwise_nhwc.SMEM_LIMIT) -> str:
    """The variant name of a staged configuration (:func:`_staged`'s inverse; ``smem`` in bytes)."""
    return (f"nhwc-st{pairs}" + (f"w{segw}" if segw != depthwise_nhwc.STAGED_SEGW else "") + ("p" if pipe else "")
            + (f"m{smem // 1024}" if smem != depthwise_nhwc.SMEM_LIMIT else ""))


def shared_room(backend) -> int:
    """The bytes of shared memory a block may opt in to on ``backend``'s device (48 KiB, what every device gives,
    where it cannot say: not CuPy, or a stand-in)."""
    cp = getattr(backend, "xp", None) if getattr(backend, "name", "") == "cupy" else None
    if cp is None or not hasattr(cp, "cuda"):
        return depthwise_nhwc.SMEM_LIMIT
    return _shared_room(cp, cp.cuda.Device().id)


def _staged_configs(problem: ConvProblem, room: int) -> list:
    """The staged configurations offered ``problem`` on a device that gives a block up to ``room`` bytes of shared
    memory: those of :data:`NHWC_STAGED_CONFIGS` that take it, one of more than 48 KiB only where its tile needs more
    (elsewhere it is another's tile again, or a double-buffered one the sweeps did not find best) and the device gives
    the tile's own bytes (a device of 99 KiB a block runs the tiles of 61 to 99 KiB that a configuration of 100
    makes)."""
    return [DepthwiseConfig(threads=tile.threads, variant=staged_variant(pairs, segw, pipe, smem), rows=rows)
            for (pairs, rows, segw, pipe, smem), tile in _staged_tiles(problem)
            if tile.shared <= room and depthwise_nhwc.opts_in_for(tile, smem)]


def _staged_tiles(problem: ConvProblem):
    """``((pairs, rows, segw, pipe, smem in bytes), tile)`` of each of :data:`NHWC_STAGED_CONFIGS` that takes
    ``problem``."""
    for pairs, rows, segw, pipe, kib in NHWC_STAGED_CONFIGS:
        smem = kib * 1024
        if depthwise_nhwc.staged_reason(problem, pairs, rows, segw, pipe, smem) is None:
            yield (pairs, rows, segw, pipe, smem), depthwise_nhwc.staged_tile(problem, pairs, rows, segw, pipe, smem)


@functools.cache
def _shared_room(cp, device_id: int) -> int:
    return int(cp.cuda.runtime.deviceGetAttribute(97, device_id))  # (cudaDevAttrMaxSharedMemoryPerBlockOptin)


def _stageable(problem: ConvProblem) -> bool:
    """Does a staged channels-last kernel take ``problem`` at stride 1 (version 12's to 15's shapes)?"""
    return all(s == 1 for s in problem.stride) and _staged_takes(problem)


def _staged_takes(problem: ConvProblem) -> bool:
    return any(depthwise_nhwc.staged_reason(problem, pairs, rows) is None for pairs, rows in NHWC_STAGED)


def _strided_stageable(problem: ConvProblem) -> bool:
    """Does a staged channels-last kernel take ``problem`` at a stride over 1 (version 17's shapes)?"""
    return any(s != 1 for s in problem.stride) and _staged_takes(problem)


def _opting_in(problem: ConvProblem) -> bool:
    """Does a staged configuration of more than 48 KiB make ``problem``, at stride 1, a tile that needs more (version
    16's shapes)?"""
    limit = depthwise_nhwc.SMEM_LIMIT
    return all(s == 1 for s in problem.stride) and any(
        smem > limit and tile.shared > limit for (*_tile_axes, smem), tile in _staged_tiles(problem))


def _vectorized(problem: ConvProblem) -> bool:
    """Does the vectorized channels-last kernel take ``problem`` (version 10's and 11's shapes)?"""
    return any(depthwise_nhwc.vec_reason(problem, v) is None for v, _threads in NHWC_VEC)


def _channels_last_depthwise(problem: ConvProblem) -> bool:
    return problem.layout == "channels_last" and problem.groups == problem.in_channels == problem.out_channels


def _half_channels_first_depthwise(problem: ConvProblem) -> bool:
    return (problem.layout == "channels_first" and problem.dtype != "float32" and problem.rank < 3
            and problem.groups == problem.in_channels == problem.out_channels)


def _half_depthwise_3d(problem: ConvProblem) -> bool:
    return problem.rank == 3 and problem.dtype != "float32" and problem.groups == problem.in_channels == \
        problem.out_channels


def _depthwise_3d(problem: ConvProblem) -> bool:
    return problem.rank == 3 and problem.groups == problem.in_channels == problem.out_channels


@register
class DepthwiseStrategy(Strategy):
    name = "depthwise"
    version = 17
    config_type = DepthwiseConfig
    # version 5 added the nhwc kernels, 6 the 3-D ones, 7 half precision in the channels-first kernels, 8 in the 3-D
    # ones (the plans of other shapes stand); 9 replays the launches from CUDA graphs: the kernels and their times
    # are the same, so every plan stands, and the duels against PyTorch's call, which weigh the host's time too,
    # are measured again (their conditions name this version); 10 added the vectorized channels-last kernel, 11
    # changed its loads (issued together, none behind a branch) and its configurations, 12 added the staged
    # channels-last kernels, 13 their double-buffered configurations, 14 their tiles' rows (as few as cover the plane
    # in as many tiles) and their filter gradient's grid (the blocks that fit at once, each with as many tiles), 15
    # their double-buffered configurations opted in to 100 KiB of shared memory a block, 16 offered them where the
    # device gives the tile's own bytes (not only the whole 100 KiB), 17 ran the staged kernels at stride 2 (every
    # pass; backward-data's by phases)
    changes = {5: _channels_last_depthwise, 6: _depthwise_3d, 7: _half_channels_first_depthwise, 8: _half_depthwise_3d,
               9: no_shape, 10: _vectorized, 11: _vectorized, 12: _stageable,
               13: _stageable, 14: _stageable, 15: _stageable, 16: _opting_in,
               17: _strided_stageable}

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if backend is None or getattr(backend, "name", "") != "cupy":
            return "the direct depthwise kernels are CUDA kernels: they need the CuPy (GPU) backend"
        if problem.rank == 3:
            return depthwise3d.reason(problem, min(TILED_ROWS))
        if not (problem.groups == problem.in_channels == problem.out_channels):
            return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
        taps = math.prod(problem.kernel_size)
        if taps > MAX_TAPS and depthwise_nhwc.reason(problem) is not None:
            reason = window_reason(problem)
            if reason is not None:
                return f"kernel of {taps} taps is over {MAX_TAPS} and {reason} (large kernels: use FFT)"
        return None

    def serves_shape(self, problem: ConvProblem) -> bool:
        return problem.groups == problem.in_channels == problem.out_channels

    def candidates(self, problem, backend):
        if problem.rank == 3:
            return self._tiled(problem, depthwise3d.warps, depthwise3d.reason)
        # channels-last: the nhwc kernels first (they read the operands as they lie), then the others through
        # conversions
        tiled = [DepthwiseConfig(threads=256, variant="nhwc-tiled", rows=r) for r in NHWC_TILED_ROWS
                 if depthwise_nhwc.tiled_reason(problem, r) is None]
        nhwc = [DepthwiseConfig(threads=256, variant="nhwc", rows=r) for r in NHWC_ROWS] \
            if depthwise_nhwc.reason(problem) is None else []
        vec = [DepthwiseConfig(threads=t, variant=f"nhwc-vec{v}", rows=4) for v, t in NHWC_VEC
               if depthwise_nhwc.vec_reason(problem, v) is None]
        staged = _staged_configs(problem, shared_room(backend))
        return vec + staged + tiled + nhwc + self._channels_first(problem)

    def pruned(self, problem, config, backend, room=None):
        """The rule fitted on measured searches (``benchmarks/check_rules.py`` replays it):

        * GPU, bfloat16 channels_last 2-D layers: not the channels-first ``tiled`` and ``simple`` kernels (between
          conversions). H200, SLaK-T's, ConvNeXt-T's and RepLKNet-31B's searches under AMP
          (tests/data/searches/h200-*-bf16-*.db.gz): in 46 such problems they won nothing, ``tiled`` never within
          1.64x of the winner (34 problems), ``simple`` within 3.08x (46), and they cost 3.6 of ConvNeXt-T's 33.2 s
          of candidate costs, 3.6 of SLaK-T's 91.8 s. The ``window`` kernels (7 wins there) and the channels-last
          ones stay.
        """
        if (backend.name == "cupy" and problem.rank == 2 and problem.dtype == "bfloat16"
                and problem.layout == "channels_last" and config.variant in ("tiled", "simple")):
            return (f"the channels-first {config.variant} kernels on a bfloat16 channels_last layer on the GPU "
                    "(between conversions): they have never come within 1.6x of the best there")
        return None

    def _channels_first(self, problem):
        window = [DepthwiseConfig(threads=window_layout(problem, s)[1], variant="window", rows=s)
                  for s in WINDOW_S if math.prod(problem.kernel_size) >= WINDOW_MIN_TAPS
                  and window_reason(problem, s) is None]
        if math.prod(problem.kernel_size) > MAX_TAPS:
            return window
        # the tiled kernels first: the heuristic's choice (the first candidate) for kernels they hold
        return self._tiled(problem, tiled_warps, tiled_reason) + window + \
            [DepthwiseConfig(threads=t) for t in (256, 128, 512)]

    @staticmethod
    def _tiled(problem, warps, reason):
        """The tiled kernels' configs that ``reason(problem, rows)`` allows, most rows per thread first, with
        ``warps(problem, rows)`` warps per block (2-D: :mod:`convtune.direct.depthwise`; 3-D:
        :mod:`convtune.direct.depthwise3d`)."""
        return [DepthwiseConfig(threads=TILE_W * warps(problem, rows), variant="tiled", rows=rows)
                for rows in sorted(TILED_ROWS, reverse=True) if reason(problem, rows) is None]

    def kernel_builds(self, problem, configs, backend):
        """Every candidate's kernels (compiled at once by :meth:`prepare`, on several threads: :mod:`convtune.compiling`):
        a kernel per kernel size, variant, rows and block shape, 0.3 to 1 s of NVRTC each, one after another in the
        candidates' builds otherwise. The kernels are made and dropped (not executors, which allocate their workspace);
        the verification batch's builds then find them compiled."""
        if getattr(backend, "name", "") != "cupy":
            return []
        return [functools.partial(self._conv, problem, c, backend) for c in configs]

    def workspace_bytes(self, problem, config) -> int:
        if _nhwc(config):
            return depthwise_nhwc.workspace_bytes(problem)
        # a half-precision filter gradient's float32 sums (the channels-first kernels)
        half_sums = problem.pass_ == "wgrad" and problem.dtype != "float32" and self.reads(problem, config)
        return 4 * math.prod(problem.w_shape) if half_sums else 0

    def reads(self, problem, config=None) -> bool:
        """Does ``config``'s executor read the problem's dtype and layout itself? The nhwc kernels do; the
        channels-first kernels (1-D, 2-D and 3-D) read channels-first operands of any dtype (without ``config``: what
        every configuration reads, float32 channels-first)."""
        if config is None:
            return super().reads(problem)
        if _nhwc(config):
            return True
        return problem.layout == "channels_first"

    def recordable(self, problem, config) -> bool:
        """One kernel launch per pass (and a memset for the filter gradient), where ``config`` reads the problem's dtype
        and layout itself. Not a channels-first kernel between conversions (a half-precision or channels-last layer):
        on an H200 such a plan (``window``, a bfloat16 channels-last 7x7 forward) failed inside a caller's CUDA graph
        capture with cudaErrorStreamCaptureUnsupported, which invalidates the whole capture, so recording PyTorch's
        convolution instead came too late; the cause is not known. PyTorch's convolution is recorded for those."""
        return self.reads(problem, config)

    @staticmethod
    def _conv(problem, config, backend):
        """``config``'s kernels for ``problem`` (compiled here), launched by address."""
        cp, sm_count = backend.xp, backend.device_info().sm_count
        if _nhwc(config):
            pairs, segw, pipe, smem = _staged(config)
            return depthwise_nhwc.NhwcDepthwiseConv(cp, problem, config.threads, sm_count, config.rows,
                                                    tiled=config.variant == "nhwc-tiled", vec=_vec(config),
                                                    staged=pairs, segw=segw, pipe=pipe, smem=smem)
        if problem.rank == 3:
            return depthwise3d.Depthwise3dConv(cp, problem, config.threads, sm_count, config.rows)
        return DepthwiseConv(cp, problem, config.threads, sm_count, config.variant, config.rows)

    def build(self, problem, config, backend):
        cp = backend.xp
        executor = self._conv(problem, config, backend)
        # the launch (a memset, the kernel, a rounding kernel: 15 to 60 us of CuPy's host work) replayed from CUDA
        # graphs per operand addresses, with the workspace of a half-precision filter gradient the plan's own
        launch = replay.owning(executor.launch, executor.workspace, cp,
                               f"the plan {self.describe(config)} of {problem.describe()}")
        if problem.dtype != "float32" or _nhwc(config):  # by address on the dtype's own memory (bfloat16 as 16-bit
            # numbers), in the problem's layout: the planner times the launch on copies in that memory, as the
            # PyTorch bridge runs it
            return precision.launched(launch, problem, cp)
        shape = problem.result_shape

        def run(a, b, out=None):
            return executor(a, b, cp.empty(shape, dtype=cp.float32) if out is None else out)
        return Executor(run, launch=launch)  # (by address: the PyTorch bridge)
