"""Direct depthwise convolution kernels (CUDA through CuPy RawKernel), all three passes.

Depthwise: ``groups == in_channels == out_channels``; each channel is convolved
with its own kernel. The data is read and written about once per pass, so these
are memory-bound; the kernel size is a compile-time constant so the loops unroll
and the filter gradient's per-tap accumulators stay in registers.

Two families:

* ``simple`` (any stride, padding, dilation, rank 1 or 2): forward and backward-data
  one thread per output element (grid-stride), the taps read through the cache;
  backward-data gathers, so no atomics. Backward-filter: one block per (channel,
  batch slice); each thread sums its positions into ``KH*KW`` registers, warps
  reduce by shuffles, one atomic add per warp and tap.
* ``tiled`` (stride 1, 2-D, any padding and dilation): register-blocked
  shared-memory tiles for all three passes (see ``depthwise_source.TILED_COMMON``); backward-data
  is the forward kernel run on ``dy`` with the filter reversed.
* ``window`` (stride 1, dilation 1, 1-D and 2-D, kernels of any height and up to
  :data:`WINDOW_MAX_KW` wide, planes that fit shared memory): large kernels on small
  planes, where an output sees only the taps that fall inside the image (RepLKNet's
  27x27 kernels on 14x14 planes, 13x13 on 7x7); see ``depthwise_source._WINDOW_COMMON``.
"""

from __future__ import annotations

import math

from ..compiling import compiled_once
from ..problem import ConvProblem
from . import depthwise_nhwc
from .elements import ELEMENT_TYPES
from .depthwise_source import SOURCES

#: Largest kernel (taps) whose filter gradient keeps one accumulator per tap in registers (the simple
#: and tiled kernels; the window kernels take larger ones).
MAX_TAPS = 81

TILE_W = 32
#: Output rows per thread of the tiled kernels (a search axis).
TILED_ROWS = (4, 8)
#: Most warps (rows of 32 threads) in a tiled block.
TILED_MAX_WARPS = 8
#: Shared memory a block may take without opting in to more.
SMEM_LIMIT = 48 * 1024


@compiled_once
def _kernel(cp, which: str, kh: int, kw: int, dh: int = 1, dw: int = 1, rows: int = 1, by: int = 1,
            dtype: str = "float32"):
    """Kernel ``which`` for these compile-time sizes, reading and writing ``dtype`` (its element type ``T``, loads
    ``ld`` and rounding stores ``st``: :data:`convtune.direct.elements.ELEMENT_TYPES`; sums in float32)."""
    code, name = source(which, kh, kw, dh, dw, rows, by, dtype), SOURCES[which][1]
    kernel = cp.RawKernel(code, name, options=("--std=c++14",))
    kernel.compile()  # at build time, so no first call pays for NVRTC (the planner compares first runs)
    return kernel


def source(which: str, kh: int, kw: int, dh: int = 1, dw: int = 1, rows: int = 1, by: int = 1,
           dtype: str = "float32") -> str:
    """The CUDA source of kernel ``which`` (:func:`_kernel`'s arguments)."""
    return ELEMENT_TYPES[dtype] + SOURCES[which][0].format(kh=kh, kw=kw, dh=dh, dw=dw, rows=rows, by=by, s=rows)


def kernel_hw(p: ConvProblem) -> tuple[int, int]:
    return (1, p.kernel_size[0]) if p.rank == 1 else tuple(p.kernel_size)


def tiled_warps(p: ConvProblem, rows: int) -> int:
    """Warps per tiled block: enough to cover the output's height (of the pass's forward form), at most 8."""
    height = p.input_size[0] if p.pass_ == "dgrad" else p.output_size[0]
    return max(1, min(TILED_MAX_WARPS, math.ceil(height / rows)))


def tiled_smem_bytes(p: ConvProblem, rows: int, warps: int) -> int:
    """Static shared memory of a tiled block: the input tile with its halo (+ the dy tile and the
    per-warp partial sums for the filter gradient)."""
    kh, kw = kernel_hw(p)
    dh, dw = p.dilation
    th = rows * warps
    floats = (th + (kh - 1) * dh) * (TILE_W + (kw - 1) * dw) + kh * kw
    if p.pass_ == "wgrad":
        floats += th * TILE_W + warps * kh * kw
    return 4 * floats


def tiled_reason(p: ConvProblem, rows: int = max(TILED_ROWS)) -> str | None:
    """Why the tiled kernels cannot run ``p`` with ``rows`` rows per thread (``None`` when they can)."""
    if p.rank != 2:
        return "the tiled kernels are for 2-D problems"
    if any(s != 1 for s in p.stride):
        return "the tiled kernels need stride 1"
    if tiled_smem_bytes(p, rows, tiled_warps(p, rows)) > SMEM_LIMIT:
        return "the input tile with its halo exceeds 48 KiB of shared memory"
    return None


#: Outputs (forward, backward-data) or taps (filter gradient) per thread of the window kernels (a search axis).
WINDOW_S = (4, 8)
#: Widest kernel the window kernels take (a row of inputs for S outputs sits in registers).
WINDOW_MAX_KW = 64
#: Threads a window block aims at (forward and backward-data: planes per block to reach it).
WINDOW_THREADS = 256


def _plane_dims(p: ConvProblem) -> tuple:
    """``(H, W, OH, OW, KH, KW, PH, PW)`` of the pass's forward form (backward-data: dy in, dx out,
    padding ``k - 1 - pad``); rank 1 has a height-1 axis."""
    two = (lambda v, fill: (fill, *v)) if p.rank == 1 else (lambda v, fill: tuple(v))
    (H, W), (OH, OW) = two(p.input_size, 1), two(p.output_size, 1)
    (KH, KW), (PH, PW) = two(p.kernel_size, 1), two(p.padding, 0)
    if p.pass_ == "dgrad":
        H, W, OH, OW, PH, PW = OH, OW, H, W, KH - 1 - PH, KW - 1 - PW
    return H, W, OH, OW, KH, KW, PH, PW


def window_layout(p: ConvProblem, s: int) -> tuple[int, int, int]:
    """``(planes per block, threads per block, shared-memory bytes)`` of a window kernel (filter gradient:
    one plane at a time, so ``planes`` is 1)."""
    H, W, OH, OW, KH, KW, PH, PW = _plane_dims(p)
    if p.pass_ == "wgrad":
        ksegs = math.ceil(KW / s)
        owp = math.ceil(OW / 8) * 8
        wp = owp + ksegs * s - 1
        threads = 32 * math.ceil(KH * ksegs / 32)
        return 1, threads, 4 * (H * wp + OH * owp)
    segs = math.ceil(OW / s)
    wp = segs * s + KW - 1
    per_plane = OH * segs
    planes = max(1, min(p.batch, WINDOW_THREADS // per_plane if per_plane < WINDOW_THREADS else 1))
    while planes > 1 and 4 * (KH * KW + planes * H * wp) > SMEM_LIMIT:
        planes -= 1
    threads = min(512, 32 * math.ceil(planes * per_plane / 32))
    return planes, threads, 4 * (KH * KW + planes * H * wp)


def window_reason(p: ConvProblem, s: int = min(WINDOW_S)) -> str | None:
    """Why the window kernels cannot run ``p`` with ``s`` outputs per thread (``None`` when they can)."""
    if any(v != 1 for v in p.stride) or any(v != 1 for v in p.dilation):
        return "the window kernels need stride 1 and dilation 1"
    if any(not 0 <= q <= k - 1 for q, k in zip(p.padding, p.kernel_size)):
        return "the window kernels need padding between 0 and the kernel size - 1"
    H, W, OH, OW, KH, KW, PH, PW = _plane_dims(p)
    if KW > WINDOW_MAX_KW:
        return f"a kernel wider than {WINDOW_MAX_KW} (the window kernels hold a row of inputs in registers)"
    _, threads, smem = window_layout(p, s)
    if smem > SMEM_LIMIT:
        return "a plane with its padding exceeds 48 KiB of shared memory"
    if threads > 1024:
        return "more kernel taps than a block of 1024 threads holds"
    return None


def _geometry(cp, p: ConvProblem) -> tuple:
    """The simple kernels' geometry arguments, as int32 (2-D view; rank 1 has a height-1 axis)."""
    def two(values, fill):
        return (fill, *values) if p.rank == 1 else tuple(values)
    values = (p.batch, p.in_channels, *two(p.input_size, 1), *two(p.output_size, 1), *two(p.stride, 1),
              *two(p.padding, 0), *two(p.dilation, 1))
    return tuple(cp.int32(v) for v in values)


def _filter_gradient_grid(p: ConvProblem, blocks: int) -> tuple[int, tuple[int, int]]:
    """Images per block and the (channel, batch slice) grid of a filter-gradient kernel: about
    ``blocks`` blocks (a few per SM), at most one slice per image."""
    slices = max(1, min(p.batch, math.ceil(blocks / p.in_channels)))
    n_per_block = math.ceil(p.batch / slices)
    return n_per_block, (p.in_channels, math.ceil(p.batch / n_per_block))


class DepthwiseConv:
    """One problem's depthwise executor on CuPy.

    ``variant`` ``simple``: one thread per output (``threads`` per block), any geometry. ``tiled``:
    stride-1 2-D problems through register-blocked shared-memory tiles, ``rows`` outputs per thread
    and ``threads // 32`` warps per block; backward-data is the forward of ``dy`` with the filter
    reversed and padding ``dil*(k-1) - pad`` (which may be negative: the tile loader bounds-checks).
    ``window``: stride-1, dilation-1 problems with large kernels, whole planes per block
    (:func:`window_layout` decides planes, threads and shared memory; ``threads`` is ignored), ``rows``
    outputs (filter gradient: taps) per thread; backward-data likewise through the forward kernel.
    """

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int, variant: str = "simple", rows: int = 1):
        self.cp, self.p, self.threads, self.variant = cp, p, threads, variant
        dt = self._operands(cp, p)
        kh, kw = kernel_hw(p)
        self.smem, self.int_args = 0, None
        if variant == "window":
            reason = window_reason(p, rows)
            if reason:
                raise ValueError(f"window depthwise kernel: {reason}")
            H, W, OH, OW, KH, KW, PH, PW = _plane_dims(p)
            planes, self.threads, self.smem = window_layout(p, rows)
            if p.pass_ == "wgrad":
                self.kernel = _kernel(cp, "window-wgrad", 0, KW, rows=rows, dtype=dt)
                n_per_block, self.grid = _filter_gradient_grid(p, 8 * sm_count)
                self.args = (p.batch, p.in_channels, H, W, OH, OW, KH, PH, PW, n_per_block)
            else:
                self.kernel = _kernel(cp, "window-fwd", 0, KW, rows=rows, dtype=dt)
                self.grid = (p.in_channels, math.ceil(p.batch / planes))
                self.args = (p.batch, p.in_channels, H, W, OH, OW, KH, PH, PW, planes, int(p.pass_ == "dgrad"))
            self.block = (self.threads,)
            return
        if variant == "tiled":
            reason = tiled_reason(p, rows)
            if reason:
                raise ValueError(f"tiled depthwise kernel: {reason}")
            by = threads // TILE_W
            if threads % TILE_W or not 1 <= by <= 32:
                raise ValueError(f"tiled depthwise kernel: threads must be a multiple of {TILE_W} up to 1024, "
                                 f"not {threads}")
            self.block = (TILE_W, by)
            (H, W), (OH, OW), (ph, pw) = p.input_size, p.output_size, p.padding
            dh, dw = p.dilation
            if p.pass_ == "wgrad":
                self.kernel = _kernel(cp, "tiled-wgrad", kh, kw, dh, dw, rows, by, dtype=dt)
                self.n_per_block, self.grid = _filter_gradient_grid(p, 8 * sm_count)
                self.args = (p.batch, p.in_channels, H, W, OH, OW, ph, pw, self.n_per_block)
                return
            self.kernel = _kernel(cp, "tiled-fwd", kh, kw, dh, dw, rows, by, dtype=dt)
            if p.pass_ == "dgrad":  # dy (output-sized) in, dx (input-sized) out, filter reversed
                H, W, OH, OW = OH, OW, H, W
                ph, pw = ((k - 1) * d - q for q, k, d in zip(p.padding, p.kernel_size, p.dilation))
            self.grid = (math.ceil(OW / TILE_W) * math.ceil(OH / (rows * by)), min(p.batch * p.in_channels, 65535))
            self.args = (p.batch, p.in_channels, H, W, OH, OW, ph, pw, int(p.pass_ == "dgrad"))
            return
        self.kernel = _kernel(cp, p.pass_, kh, kw, dtype=dt)
        self.block = (threads,)
        self.geo = _geometry(cp, p)
        if p.pass_ == "wgrad":
            self.n_per_block, self.grid = _filter_gradient_grid(p, 4 * sm_count)
        else:
            total = math.prod(p.result_shape)
            self.grid = (min(math.ceil(total / threads), 32 * sm_count),)

    def _operands(self, cp, p: ConvProblem) -> str:
        """The operands' and result's memory: channels-first, of ``p``'s dtype (bfloat16 as its 16 bits; sums in
        float32), a half-precision filter gradient's float32 sums in a workspace, rounded into the result once. Returns
        the dtype (the 3-D executor's kernels take it too)."""
        if p.layout != "channels_first":
            raise ValueError(f"these kernels read channels-first operands, not {p.layout} (the nhwc kernels do)")
        dt = self.dtype = p.dtype
        self.result_bytes = 4 * math.prod(p.result_shape)
        self.workspace = depthwise_nhwc.workspace_bytes(p)
        self.rounding = depthwise_nhwc.cast_kernel(cp, dt) if self.workspace else None
        self.count = math.prod(p.result_shape)
        return dt

    def _launch_args(self) -> tuple:
        """The kernel's arguments after the three arrays (int32 scalars), made once."""
        if self.int_args is None:  # a call does no work it could have done once
            cp = self.cp
            if self.variant in ("tiled", "window"):
                self.int_args = tuple(cp.int32(v) for v in self.args)
            elif self.p.pass_ == "wgrad":
                self.int_args = (*self.geo, cp.int32(self.n_per_block))
            else:
                self.int_args = self.geo
        return self.int_args

    def __call__(self, a, b, out):
        if self.dtype != "float32":
            raise ValueError("a half-precision executor runs by address (launch; precision.launched gives its array "
                             "form)")
        cp = self.cp
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        target = out if out.flags.c_contiguous else cp.empty(out.shape, dtype=cp.float32)
        if self.p.pass_ == "wgrad":
            target.fill(0)
        self.kernel(self.grid, self.block, (a, b, target, *self._launch_args()), shared_mem=self.smem)
        if target is not out:
            out[...] = target
        return out

    def launch(self, a: int, b: int, out: int, stream, workspace: int | None = None) -> None:
        """The same work on C-contiguous operands and result of the problem's dtype (bfloat16 as its 16 bits)
        given by device address, on ``stream`` (a CuPy stream of the current device): no arrays made, nothing
        allocated. A half-precision filter gradient needs ``workspace`` (:attr:`workspace` bytes) for its float32
        sums. This is the PyTorch bridge's hot path (:meth:`__call__` spent 50-60 us of host time per pass making
        views, checking layouts and filling through CuPy, for one kernel launch)."""
        sums = out
        if self.workspace:
            if workspace is None:
                raise ValueError(f"a half-precision filter gradient needs a workspace of {self.workspace} bytes")
            sums = workspace
        if self.p.pass_ == "wgrad":  # the filter gradient accumulates into zeroed sums
            self.cp.cuda.runtime.memsetAsync(sums, 0, self.result_bytes, stream.ptr)
        self.kernel.kernel(self.grid, self.block, (a, b, sums, *self._launch_args()), self.smem, stream)
        if self.rounding is not None:
            self.rounding((min(1024, (self.count + 255) // 256),), (256,),
                                 (sums, out, self.cp.int64(self.count)), 0, stream)
