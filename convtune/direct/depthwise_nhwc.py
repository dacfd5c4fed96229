"""Direct depthwise kernels for channels-last operands (NHWC, NLC) in float32, bfloat16 and float16.

The channels-first kernels (:mod:`convtune.direct.depthwise`) read float32 planes. A channels-last
tensor has a pixel's channels side by side instead, so these kernels give a warp 32 adjacent
channels of one pixel: every load of a warp is one contiguous run of memory, in any dtype, and
no layout conversion runs before or after. Half-precision operands are read and written as
16-bit numbers (bfloat16 and float16 without CUDA's headers: bit shifts and PTX conversions);
every product and sum is float32.

* Forward: a block owns 32 channels and whole output rows; a thread owns one channel and ``R``
  adjacent outputs of a row. Per kernel row it loads the ``(R - 1) * SW + (KW - 1) * DW + 1``
  inputs its outputs read once and adds each into every output it belongs to. The block reads its
  channels' taps once, coalesced, through shared memory into registers (up to
  :data:`REGISTER_TAPS` taps; larger kernels read them through the cache).
* Forward, tiled (stride 1, up to :data:`REGISTER_TAPS` taps): a block copies a tile of outputs' input
  with its halo into shared memory (a warp load per pixel's 32 channels), then its threads add up
  ``R`` adjacent outputs each from there: every input is read from global memory about once per tile.
* Backward-data, stride 1: either forward kernel on ``dy`` with the filter reversed and padding
  ``dil * (k - 1) - pad``. Strided: a gather, one input pixel per thread.
* Backward-filter, tiled (stride 1, 2-D): a block copies a tile's dy and input into shared memory;
  warp ``ty`` sums kernel rows ``ty, ty + 8, ...`` over it, its sums kept across the block's tiles.
* Forward and stride-1 backward-data, vectorized (``vec``: stride and dilation 1, channels a multiple of ``V``): a
  thread owns ``V`` adjacent channels, read and written ``V`` at a time (one 4- to 16-byte access), and a block of
  :data:`VEC_ROWS` x ``R`` outputs; each input row of its window is loaded once and added into every output row it
  belongs to. The taps sit in registers where ``V`` x taps fit :data:`VEC_REGISTER_TAPS`, else in shared memory.
  Operands whose addresses are not multiples of the vector's bytes take the plain forward kernel instead.
* Staged, every pass (dilation 1, strides up to :data:`STAGED_STRIDES`, 2-D, a block's channels a multiple of 16
  bytes; backward-data at a stride over 1 by phases): a block of ``2P``
  channels copies a tile's input (and the filter gradient's dy) into shared memory by 16-byte loads, then its
  threads read pairs of channels from there (:mod:`convtune.direct.depthwise_staged_source`); double-buffered
  (``pipe``), the next tile's copies are in flight while they do.
* Backward-filter: a block owns 32 channels, a group of kernel rows (at most
  :data:`REGISTER_TAPS` sums per thread, in registers) and a slice of the output rows; the warps of
  a block add their sums in shared memory, then one float32 atomic add per block and tap. A
  half-precision filter gradient is summed in a float32 workspace and rounded once at the end.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from ..compiling import allow_shared, compiled_once, resident_blocks
from ..errors import ConvtuneError
from ..precision import ITEMSIZE
from ..problem import ConvProblem
from .depthwise_nhwc_source import CAST, SOURCES
from .depthwise_staged_source import SOURCES as STAGED_SOURCES
from .elements import ELEMENT_TYPES

#: Taps a thread keeps in registers (the forward's filter; the filter gradient's accumulators per row group).
REGISTER_TAPS = 81
#: Widest kernel these kernels take (one kernel row of accumulators must fit :data:`REGISTER_TAPS`).
MAX_KW = REGISTER_TAPS
#: Channels per block (one warp's lanes: adjacent channels of a pixel).
LANES = 32


#: Output rows per thread of the vectorized kernel (the rows of its window each input row is added into).
VEC_ROWS = 2
#: The vectorized kernel keeps its ``V`` x taps in registers up to this many, else in shared memory.
VEC_REGISTER_TAPS = 128
#: Blocks per multiprocessor the vectorized kernel launches (each loops over its share of the outputs, its taps read
#: once): 2 was the best of 2, 8 and 32 on most of ConvNeXt-T's 7x7 and 3x3 layers in bfloat16 on an H200.
VEC_BLOCKS_PER_SM = 2


def source(which: str, dtype: str, kh: int, kw: int, sw: int = 1, dwl: int = 1, r: int = 1, flip: int = 0,
           khg: int = 1, by: int = 1, th: int = 1, tw: int = 1, dh: int = 1, v: int = 1) -> str:
    """The CUDA source of kernel ``which`` (:func:`_kernels`'s arguments; ``v``: the vectorized kernel's channels per
    thread)."""
    return ELEMENT_TYPES[dtype] + SOURCES[which][0].format(
        kh=kh, kw=kw, sw=sw, dwl=dwl, r=r, flip=flip, khg=khg, by=by, th=th, tw=tw, dh=dh, register_taps=REGISTER_TAPS,
        v=v, rh=VEC_ROWS, wsh=int(v * kh * kw > VEC_REGISTER_TAPS))


@compiled_once
def _kernels(cp, which: str, dtype: str, kh: int, kw: int, sw: int = 1, dwl: int = 1, r: int = 1, flip: int = 0,
             khg: int = 1, by: int = 1, th: int = 1, tw: int = 1, dh: int = 1, v: int = 1):
    code = source(which, dtype, kh, kw, sw, dwl, r, flip, khg, by, th, tw, dh, v)
    module = cp.RawModule(code=code, options=("--std=c++14",))
    # the launchable functions, compiled here at build time: no first call pays for NVRTC
    return tuple(module.get_function(name).kernel for name in SOURCES[which][1])


def staged_source(which: str, dtype: str, kh: int, kw: int, p: int, s: int, segw: int, th: int, flip: int = 0,
                  pipe: int = 0, sh: int = 1, sw: int = 1) -> str:
    """The CUDA source of staged kernel ``which`` (``fwd-staged``, ``wgrad-staged``): :func:`_staged_kernel`'s
    arguments (``sh``, ``sw``: the stride)."""
    return ELEMENT_TYPES[dtype] + STAGED_SOURCES[which][0].format(kh=kh, kw=kw, p=p, s=s, segw=segw, th=th, flip=flip,
                                                                  pipe=pipe, sh=sh, sw=sw)


@compiled_once
def _staged_kernel(cp, which: str, dtype: str, kh: int, kw: int, p: int, s: int, segw: int, th: int, flip: int = 0,
                   pipe: int = 0, sh: int = 1, sw: int = 1):
    code = staged_source(which, dtype, kh, kw, p, s, segw, th, flip, pipe, sh, sw)
    (name,) = STAGED_SOURCES[which][1]
    return cp.RawModule(code=code, options=("--std=c++14",)).get_function(name).kernel


@compiled_once
def cast_kernel(cp, dtype: str):
    """``k(sums, out, n)``, a launchable function: ``n`` float32 sums rounded into ``dtype``'s memory (bfloat16 as its
    16 bits), the last step of a half-precision filter gradient (these kernels' and the channels-first ones')."""
    module = cp.RawModule(code=ELEMENT_TYPES[dtype] + CAST, options=("--std=c++14",))
    return module.get_function("dw_cast").kernel


def dims(p: ConvProblem) -> tuple:
    """``(H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW)`` of a problem; rank 1 has a height-1 axis."""
    def two(values, fill):
        return (fill, *values) if p.rank == 1 else tuple(values)
    (H, W), (OH, OW), (KH, KW) = two(p.input_size, 1), two(p.output_size, 1), two(p.kernel_size, 1)
    (SH, SW), (PH, PW), (DH, DW) = two(p.stride, 1), two(p.padding, 0), two(p.dilation, 1)
    return H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW


def reason(p: ConvProblem) -> str | None:
    """Why these kernels cannot run ``p`` (``None`` when they can)."""
    if p.rank not in (1, 2):
        return "the channels-last depthwise kernels are 1-D and 2-D"
    if not (p.groups == p.in_channels == p.out_channels):
        return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
    if p.layout != "channels_last":
        return "the channels-last depthwise kernels read channels-last operands"
    if dims(p)[5] > MAX_KW:
        return f"a kernel wider than {MAX_KW} (a kernel row of the filter gradient's sums sits in registers)"
    return None


def row_group(p: ConvProblem) -> int:
    """Kernel rows per filter-gradient block: as many as keep :data:`REGISTER_TAPS` sums in registers."""
    KH, KW = dims(p)[4:6]
    return max(1, min(KH, REGISTER_TAPS // KW))


#: Shared memory a block may take without opting in to more.
SMEM_LIMIT = 48 * 1024


def tile_shape(p: ConvProblem, rows: int) -> tuple[int, int] | None:
    """``(TH, TW)``: the output tile of a tiled block with ``rows`` outputs per thread (up to 4 segments of a
    row, 16 in 1-D; as many rows as fit): its input and halo in shared memory as float32, beside the taps
    (forward and stride-1 backward-data) or the tile's dy (filter gradient); ``None`` where not even one row
    fits."""
    H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = dims(p)
    out_h, out_w = (H, W) if p.pass_ == "dgrad" else (OH, OW)
    tw = rows * max(1, min(math.ceil(out_w / rows), 4 if out_h > 1 else 16))
    for th in (8, 4, 2, 1):
        if th > out_h and th > 1:
            continue
        in_h, in_w = th + (KH - 1) * DH, tw + (KW - 1) * DW
        beside = th * tw if p.pass_ == "wgrad" else 33 * KH * KW // 32 + 1  # (see dwl_*_tiled's shared arrays)
        if 4 * 32 * (in_h * in_w + beside) <= SMEM_LIMIT:
            return th, tw
    return None


def wgrad_warps(p: ConvProblem) -> int:
    """Warps of a tiled filter-gradient block: one per kernel row, at most 8 (a warp takes every 8th row)."""
    return min(8, dims(p)[4])


def tiled_reason(p: ConvProblem, rows: int) -> str | None:
    """Why the tiled kernels cannot run ``p`` with ``rows`` outputs per thread (``None`` when they can)."""
    why = reason(p)
    if why:
        return why
    if any(v != 1 for v in p.stride):
        return "the tiled kernels need stride 1"
    KH, KW = dims(p)[4:6]
    if p.pass_ == "wgrad":
        if KH == 1:
            return "the tiled filter gradient shares kernel rows among warps: 1-D problems take the plain kernel"
        if math.ceil(KH / wgrad_warps(p)) * KW > REGISTER_TAPS:
            return f"the tiled filter gradient keeps each warp's kernel rows in registers: at most {REGISTER_TAPS}"
    elif KH * KW > REGISTER_TAPS:
        return f"the tiled kernel holds the filter in registers: at most {REGISTER_TAPS} taps"
    if tile_shape(p, rows) is None:
        return "one row of the tile with its halo exceeds 48 KiB of shared memory"
    return None


def _unit_reason(p: ConvProblem, kernel: str, plural: bool = False, strides: int = 1) -> str | None:
    """Why ``kernel`` (the vectorized or the staged kernels, as a sentence names them), which need dilation 1 and
    strides up to ``strides`` and unroll every tap, cannot run ``p``."""
    why = reason(p)
    if why:
        return why
    verb = "" if plural else "s"
    if any(s != 1 for s in p.dilation) or any(s > strides for s in p.stride):
        return f"{kernel} need{verb} " + ("stride and dilation 1" if strides == 1 else
                                          f"dilation 1 and strides up to {strides}")
    if math.prod(p.kernel_size) > REGISTER_TAPS:
        return f"{kernel} unroll{verb} every tap: at most {REGISTER_TAPS}"
    return None


def vec_reason(p: ConvProblem, v: int) -> str | None:
    """Why the vectorized kernel cannot run ``p`` with ``v`` channels per thread (``None`` when it can)."""
    if p.pass_ == "wgrad" and reason(p) is None:
        return "the vectorized kernel runs the forward and backward-data passes"
    why = _unit_reason(p, "the vectorized kernel")
    if why:
        return why
    if p.in_channels % v:
        return f"{p.in_channels} channels are not a multiple of the vector's {v}"
    return None


#: Output columns a thread of the staged kernels owns at most (a row's outputs are split into as few segments of at most
#: this many as cover it).
STAGED_SEGW = 16
#: The largest stride the staged kernels take (a forward thread's span of inputs in registers grows with the stride;
#: backward-data's, by phases, has a thread for each column phase).
STAGED_STRIDES = 2
#: Blocks of :data:`STAGED_THREADS` threads per multiprocessor the staged kernels launch at most (each loops over its
#: share of the tiles; smaller blocks: proportionally more).
STAGED_BLOCKS_PER_SM, STAGED_THREADS = 4, 256


class Staged(NamedTuple):
    """A staged kernel's tile: ``s`` segments of ``segw`` columns by ``th`` rows, ``threads`` a block and ``shared``
    bytes of shared memory; ``width`` output columns (strided backward-data's: ``s * segw * SW``, a thread's columns
    ``SW`` apart)."""

    s: int
    segw: int
    th: int
    threads: int
    shared: int
    width: int


def _padded_row(pixels: int, pairs: int, lead: int) -> int:
    """The pairs of a shared row of ``pixels`` pixels of ``pairs`` pairs, padded to ``lead`` more than a multiple of 32
    (the kernels' ``PADDED_ROW``)."""
    return pixels * pairs + (lead % 32 + 32 - (pixels * pairs) % 32) % 32


def staged_tile(p: ConvProblem, pairs: int, rows: int, segw: int = STAGED_SEGW, pipe: bool = False,
                smem: int = SMEM_LIMIT) -> Staged | None:
    """The tile of a staged kernel with ``pairs`` channel pairs a block, up to ``rows`` output rows a tile and up to
    ``segw`` columns a thread: as many rows as fit ``smem`` bytes of shared memory (``pipe``: two tiles' buffers; over
    :data:`SMEM_LIMIT`, the launch opts in to more) and 1024 threads, then as few as cover the plane's rows in as many
    tiles (``None`` where not even one row fits). Strided backward-data's threads own ``segw`` columns ``SW`` apart: a
    segment spans ``segw * SW`` columns (:attr:`Staged.width`)."""
    H, W, OH, OW, KH, KW, SH, SW = dims(p)[:8]
    out_h, out_w = (H, W) if p.pass_ == "dgrad" else (OH, OW)
    phases = SW if staged_which(p) == "dgrad-staged" else 1  # (its threads: one per column phase, SW columns apart)
    s = math.ceil(out_w / (segw * phases))
    segw = math.ceil(out_w / (s * phases))
    tw, iw, pair = s * segw, (s * segw - 1) * SW + KW, 2 * ITEMSIZE[p.dtype]
    xrow = _padded_row(iw, pairs, pairs // SH)  # (the kernels' XROW)
    buffers = 2 if pipe else 1

    def fits(th):
        in_rows = ((th - 1) * SH + KH) * xrow * pair
        if phases > 1:  # (dy's tile: DIH x DIW pixels, DROW pairs a row)
            mh, mw = math.ceil(KH / SH), math.ceil(KW / SW)
            drow = _padded_row(tw + mw, pairs, pairs)
            dy_rows = (th - 1) // SH + 1 + mh
            threads, shared = pairs * th * SW * s, KH * KW * pairs * 8 + buffers * dy_rows * drow * pair
        elif p.pass_ == "wgrad":
            threads = pairs * KH * s
            shared = max(buffers * (in_rows + th * tw * pairs * pair), 2 * pairs * KH * KW * 4)
        else:
            threads, shared = pairs * th * s, KH * KW * pairs * 8 + buffers * in_rows
        return Staged(s, segw, th, threads, shared, tw * phases) if threads <= 1024 and shared <= smem else None
    for th in range(min(rows, out_h), 0, -1):
        if fits(th):
            # as few rows as cover the plane in as many tiles (28 rows: two tiles of 14, not 16 and 12)
            return fits(math.ceil(out_h / math.ceil(out_h / th)))
    return None


def staged_which(p: ConvProblem) -> str:
    """The staged kernel that runs ``p``'s pass: ``fwd-staged`` (the forward, and backward-data at stride 1 as the
    forward of dy), ``dgrad-staged`` (backward-data at a stride over 1), ``wgrad-staged``."""
    if p.pass_ == "wgrad":
        return "wgrad-staged"
    return "dgrad-staged" if p.pass_ == "dgrad" and any(v != 1 for v in p.stride) else "fwd-staged"


def opts_in_for(tile: Staged, smem: int) -> bool:
    """Is ``tile``, made in up to ``smem`` bytes of shared memory, one that asking for them makes: any tile of at most
    :data:`SMEM_LIMIT` asked, else one over it (one that fits within it is a 48 KiB configuration's tile again)?"""
    return smem <= SMEM_LIMIT or tile.shared > SMEM_LIMIT


def staged_reason(p: ConvProblem, pairs: int, rows: int, segw: int = STAGED_SEGW, pipe: bool = False,
                  smem: int = SMEM_LIMIT) -> str | None:
    """Why the staged kernels cannot run ``p`` with ``pairs`` channel pairs a block, ``rows`` rows a tile and
    ``segw`` columns a thread (``pipe``: two tiles' buffers; ``smem``: shared memory a block, :func:`staged_tile`)."""
    if p.rank != 2 and reason(p) is None:
        return "the staged kernels are 2-D"
    why = _unit_reason(p, "the staged kernels", plural=True, strides=STAGED_STRIDES)
    if why:
        return why
    if pairs % (8 // ITEMSIZE[p.dtype]):
        return f"a block's {2 * pairs} channels are not a whole number of 16-byte loads"
    if p.in_channels % (2 * pairs):
        return f"{p.in_channels} channels are not a multiple of a block's {2 * pairs}"
    if staged_tile(p, pairs, rows, segw, pipe, smem) is None:
        return f"one row of the staged tile exceeds {smem // 1024} KiB of shared memory or 1024 threads"
    return None


def _unit_forward_geometry(p: ConvProblem) -> tuple:
    """The vectorized and staged kernels' geometry arguments ``(N, C, H, W, OH, OW, ph, pw)`` at dilation 1: the
    forward's (and the filter gradient's, at any stride the kernel is made for); backward-data's, at stride 1, as the
    forward of dy (its image dy's, its output dx's) with padding k - 1 - pad."""
    H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = dims(p)
    if p.pass_ == "dgrad":
        return (p.batch, p.in_channels, OH, OW, H, W, KH - 1 - PH, KW - 1 - PW)
    return (p.batch, p.in_channels, H, W, OH, OW, PH, PW)


def workspace_bytes(p: ConvProblem) -> int:
    """The float32 sums of a half-precision filter gradient (none otherwise)."""
    return 4 * p.in_channels * math.prod(p.kernel_size) if p.pass_ == "wgrad" and p.dtype != "float32" else 0


class NhwcDepthwiseConv:
    """One channels-last depthwise problem's executor on CuPy: ``rows`` outputs per thread along the row,
    ``threads // 32`` warps per block (32 channels each).

    :meth:`launch` runs on channels-last memory of the problem's dtype (bfloat16 as 16-bit numbers) by address:
    the PyTorch bridge's path; :func:`convtune.precision.launched` makes the array executor of it. ``blocks_per_sm``:
    the vectorized and staged kernels' blocks per multiprocessor (``None``: :data:`VEC_BLOCKS_PER_SM`,
    :data:`STAGED_BLOCKS_PER_SM`); ``segw``, ``pipe`` and ``smem``: the staged kernels' columns a thread, double
    buffering and shared memory a block at most (:func:`staged_tile`)."""

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int, rows: int = 1, tiled: bool = False,
                 vec: int = 0, blocks_per_sm: int | None = None, staged: int = 0, segw: int = STAGED_SEGW,
                 pipe: bool = False, smem: int = SMEM_LIMIT):
        why = (tiled_reason(p, rows) if tiled else vec_reason(p, vec) if vec else
               staged_reason(p, staged, rows, segw, pipe, smem) if staged else reason(p))
        if why:
            raise ValueError(f"channels-last depthwise kernel: {why}")
        if not staged and (threads % LANES or not LANES <= threads <= 1024):  # (staged: its tile's threads)
            raise ValueError(f"channels-last depthwise kernel: threads must be a multiple of {LANES} up to 1024, "
                             f"not {threads}")
        self.cp, self.p, self.rows = cp, p, rows
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = dims(p)
        C = p.in_channels
        cx = math.ceil(C / LANES)
        self.workspace = workspace_bytes(p)
        self.cast = self.fallback = None
        self.sm_count, self.shared = sm_count, 0
        self.align = 0  # (the vectorized and staged kernels': the bytes their operands' addresses are multiples of)
        self.align_b = False  # (whether the second operand's address must be such a multiple too)
        self.result_bytes = 4 * C * KH * KW
        i32 = cp.int32
        if vec:
            self._set_vec(threads, sm_count, vec, blocks_per_sm or VEC_BLOCKS_PER_SM)
            return
        if staged:
            self._set_staged(staged, rows, sm_count, blocks_per_sm or STAGED_BLOCKS_PER_SM, segw, pipe, smem)
            return
        if p.pass_ == "dgrad" and not SH == SW == 1:  # the gather: one input pixel per thread
            by = threads // LANES
            (self.kernel,) = _kernels(cp, "dgrad", p.dtype, KH, KW)
            self.block = (LANES, by)
            self.grid = (cx, max(1, min(math.ceil(p.batch * H * W / by), 65535)))
            self.args = tuple(i32(v) for v in (p.batch, C, H, W, OH, OW, SH, SW, PH, PW, DH, DW))
            return
        out_h, out_w = (H, W) if p.pass_ == "dgrad" else (OH, OW)
        if tiled and p.pass_ == "wgrad":
            th, tw = tile_shape(p, rows)
            by = wgrad_warps(p)
            self.block = (LANES, by)
            (self.kernel,) = _kernels(cp, "wgrad-tiled", p.dtype, KH, KW, 1, DW, rows, by=by, th=th, tw=tw, dh=DH)
            self._set_cast()
            self.args = tuple(i32(v) for v in (p.batch, C, H, W, OH, OW, PH, PW))
            tiles = p.batch * math.ceil(OH / th) * math.ceil(OW / tw)
            self.grid = (cx, max(1, min(tiles, math.ceil(4 * sm_count / cx), 65535)))
            return
        if tiled:  # stride 1, forward or backward-data (the forward of dy, filter reversed)
            th, tw = tile_shape(p, rows)
            by = max(1, min(threads // LANES, th * (tw // rows)))
            self.block = (LANES, by)
            flip = int(p.pass_ == "dgrad")
            (self.kernel,) = _kernels(cp, "fwd-tiled", p.dtype, KH, KW, 1, DW, rows, flip=flip, by=by, th=th, tw=tw,
                                      dh=DH)
            if flip:
                geometry = (p.batch, C, OH, OW, H, W, (KH - 1) * DH - PH, (KW - 1) * DW - PW)
            else:
                geometry = (p.batch, C, H, W, OH, OW, PH, PW)
            self.args = tuple(i32(v) for v in geometry)
            tiles = p.batch * math.ceil(out_h / th) * math.ceil(out_w / tw)
            self.grid = (cx, max(1, min(tiles, math.ceil(32 * sm_count / cx), 65535)))
            return
        # warps per block: one per segment of the row up to threads // 32 (a block takes whole rows)
        by = max(1, min(threads // LANES, math.ceil(out_w / rows)))
        self.block = (LANES, by)
        rows_total = p.batch * out_h
        if p.pass_ == "fwd":
            (self.kernel,) = _kernels(cp, "fwd", p.dtype, KH, KW, SW, DW, rows, by=by)
            self.args = tuple(i32(v) for v in (p.batch, C, H, W, OH, OW, SH, PH, PW, DH))
        elif p.pass_ == "dgrad":  # stride 1: the forward of dy, filter reversed
            (self.kernel,) = _kernels(cp, "fwd", p.dtype, KH, KW, 1, DW, rows, flip=1, by=by)
            self.args = tuple(i32(v) for v in (p.batch, C, OH, OW, H, W, 1, (KH - 1) * DH - PH, (KW - 1) * DW - PW,
                                               DH))
        else:
            khg = row_group(p)
            (self.kernel,) = _kernels(cp, "wgrad", p.dtype, KH, KW, SW, DW, rows, khg=khg, by=by)
            self._set_cast()
            groups = math.ceil(KH / khg)
            slices = max(1, min(rows_total, math.ceil(8 * sm_count / (cx * groups))))
            self.grid = (cx, slices, groups)
            self.args = tuple(i32(v) for v in (p.batch, C, H, W, OH, OW, SH, PH, PW, DH))
            return
        # rows per block: enough blocks to fill the device several times over, each reading its taps once
        self.grid = (cx, max(1, min(rows_total, math.ceil(32 * sm_count / cx), 65535)))

    def _set_vec(self, threads: int, sm_count: int, v: int, blocks_per_sm: int) -> None:
        """The vectorized kernel's launch: ``v`` channels per thread, ``threads`` per block (along the channels first,
        the rest along the outputs), ``blocks_per_sm`` blocks per multiprocessor (each loops over its share)."""
        p, cp = self.p, self.cp
        H, W, OH, OW, KH, KW = dims(p)[:6]
        C, flip = p.in_channels, int(p.pass_ == "dgrad")
        groups = C // v
        gx = min(groups, threads)
        taps = KH * KW
        shared = 4 * taps * gx * v if v * taps > VEC_REGISTER_TAPS else 0
        while shared > SMEM_LIMIT:  # fewer channels a block (one vector's taps fit: at most 81 of them)
            gx = max(1, gx // 2)
            shared = 4 * taps * gx * v
        by = max(1, threads // gx)
        (self.kernel,) = _kernels(cp, "fwd-vec", p.dtype, KH, KW, 1, 1, self.rows, flip=flip, v=v)
        out_h, out_w = (H, W) if flip else (OH, OW)
        items = p.batch * math.ceil(out_h / VEC_ROWS) * math.ceil(out_w / self.rows)
        gxs = math.ceil(groups / gx)
        self.block, self.shared = (gx, by), shared
        self.grid = (gxs, max(1, min(math.ceil(items / by), math.ceil(blocks_per_sm * sm_count / gxs), 65535)))
        self.args = tuple(cp.int32(g) for g in _unit_forward_geometry(p))
        self.align = v * ITEMSIZE[p.dtype]

    def _set_staged(self, pairs: int, rows: int, sm_count: int, blocks_per_sm: int, segw: int, pipe: bool,
                    smem: int) -> None:
        """The staged kernels' launch: ``pairs`` channel pairs a block, tiles of up to ``rows`` output rows and
        ``segw`` columns a thread, ``pipe`` double-buffered (:func:`staged_tile`), ``blocks_per_sm`` blocks per
        multiprocessor at most (each loops over its share; the filter gradient's, no more than fit at once)."""
        p, cp = self.p, self.cp
        H, W, OH, OW, KH, KW, SH, SW, PH, PW = dims(p)[:10]
        tile = staged_tile(p, pairs, rows, segw, pipe, smem)
        which = staged_which(p)
        flip = int(which == "fwd-staged" and p.pass_ == "dgrad")
        self.kernel = _staged_kernel(cp, which, p.dtype, KH, KW, pairs, tile.s, tile.segw, tile.th, flip, int(pipe),
                                     SH, SW)
        if tile.shared > SMEM_LIMIT and not allow_shared(self.kernel, tile.shared):
            raise ConvtuneError(f"the staged kernel's block needs {tile.shared} bytes of shared memory, more than "
                                "this device gives one (a configuration of at most 48 KiB runs it)")
        out_h, out_w = (H, W) if p.pass_ == "dgrad" else (OH, OW)
        gx = p.in_channels // (2 * pairs)
        tiles = p.batch * math.ceil(out_h / tile.th) * math.ceil(out_w / tile.width)
        self.block, self.shared = (tile.threads,), tile.shared
        per_sm = blocks_per_sm * math.ceil(STAGED_THREADS / tile.threads)  # (small blocks: more of them)
        if p.pass_ == "wgrad":
            # the filter gradient: the blocks that fit at once (where the driver says), each given as many tiles as
            # the others (a block's sums kept across its tiles, added once; double-buffered, its copies overlap)
            per_sm = min(per_sm, resident_blocks(self.kernel, tile.threads, tile.shared) or per_sm)
            slots = max(1, min(tiles, per_sm * sm_count // gx))
            self.grid = (gx, min(math.ceil(tiles / math.ceil(tiles / slots)), 65535))
        else:
            self.grid = (gx, max(1, min(tiles, math.ceil(per_sm * sm_count / gx), 65535)))
        geometry = (p.batch, p.in_channels, OH, OW, H, W, PH, PW) if which == "dgrad-staged" else \
            _unit_forward_geometry(p)
        self.args = tuple(cp.int32(g) for g in geometry)
        self.align, self.align_b = 16, p.pass_ == "wgrad"
        if p.pass_ == "wgrad":
            self._set_cast()

    def _plain(self) -> "NhwcDepthwiseConv":
        """The plain kernel in place of the vectorized or staged one, for operands whose addresses are not multiples
        of the bytes those load at once (made on first need)."""
        if self.fallback is None:
            self.fallback = NhwcDepthwiseConv(self.cp, self.p, 256, self.sm_count, 4)
        return self.fallback

    def _set_cast(self) -> None:
        """A half-precision filter gradient's rounding of its float32 sums (float32: none, the sums are it)."""
        if self.p.dtype == "float32":
            return
        taps = self.p.in_channels * math.prod(self.p.kernel_size)
        self.cast, self.cast_args = cast_kernel(self.cp, self.p.dtype), (self.cp.int64(taps),)
        self.cast_grid = (min(1024, math.ceil(taps / 256)),)

    def launch(self, a: int, b: int, out: int, stream, workspace: int | None = None) -> None:
        """The pass on dense channels-last operands and result of the problem's dtype (bfloat16 as 16-bit
        numbers) given by device address, on ``stream``; a half-precision filter gradient needs
        :attr:`workspace` bytes of device memory at ``workspace``. Nothing is allocated."""
        if self.align and (a % self.align or (b % self.align if self.align_b else out % self.align)):
            self._plain().launch(a, b, out, stream, workspace)
            return
        if self.cast is None:
            if self.p.pass_ == "wgrad":  # float32: the sums go straight into the zeroed result
                self.cp.cuda.runtime.memsetAsync(out, 0, self.result_bytes, stream.ptr)
            self.kernel(self.grid, self.block, (a, b, out, *self.args), self.shared, stream)
            return
        if workspace is None:
            raise ValueError(f"a half-precision filter gradient needs a workspace of {self.workspace} bytes")
        self.cp.cuda.runtime.memsetAsync(workspace, 0, self.result_bytes, stream.ptr)
        self.kernel(self.grid, self.block, (a, b, workspace, *self.args), self.shared, stream)
        self.cast(self.cast_grid, (256,), (workspace, out, *self.cast_args), 0, stream)
