"""2-D depthwise FFT convolution in one kernel per pass: a thread block transforms a whole image in shared memory.

The 2-D counterpart of :mod:`convtune.fft.rowconv`, for depthwise layers whose images and kernels fit one block's
transform: RepLKNet's and SLaK's stage-1 layers (56x56 images, 31x31 and 51x51 kernels) on 128x128 transforms,
ConvNeXt's 7x7 layers. The FFT strategy runs them through cuFFT with a zero-extending copy before and a gather
after each transform (replknet-dw31's round trip 0.77 to 0.90 ms against a floor of 0.035); here each pass reads
its operand once and writes its result once.

Transform sizes ``L0 x L1`` are 2^a 3^b, ``L1`` even (each at least :func:`convtune.fft.sizes.min_length` of its axis;
the candidates: powers of two, and the smallest such sizes, :func:`size_options`), in Stockham passes of radix 8, 4,
2 and 3.
One image, as the kernels transform it, lies in shared memory as ``L0`` rows of ``M1 + 1`` complex values (``M1 =
L1 / 2``), a pad after every 8 and an odd row stride (:func:`row_stride`), so row and column accesses both spread
over the banks:

1. the image's rows (only those holding samples; the zero-extension is never transformed) as complex rows of
   ``M1`` points (``a[2j] + i a[2j+1]``), Stockham passes, then unpacked into ``M1 + 1`` frequencies each
   (:mod:`convtune.fft.rowconv`'s ``unpack``);
2. the ``M1 + 1`` columns' complex transforms of ``L0`` points;
3. the product with the filter's spectrum (``L0 x (M1 + 1)`` complex64 per channel, made by the ``spectrum``
   kernel into the workspace), conjugated in the forward pass;
4. the columns' inverses, then only the rows the result reads (the crop and its cyclic shift), packed and
   inverted, the result's elements written in its dtype and layout.

The filter gradient sums ``conj(DY) X`` over the batch: ``wgrad_part`` blocks take a (channel, batch slice) each
and keep their slice's sums in the workspace (each frequency read back by the thread that wrote it), and
``wgrad_sum`` adds a channel's slices and inverts once. Passes as in :mod:`convtune.fft.rowconv` (its docstring),
per axis.
"""

from __future__ import annotations

import math

import numpy

from ..compiling import compiled_once, pass_launchables
from ..precision import launch_strides
from ..problem import ConvProblem
from . import rowconv, rowsource
from .pairhelpers import device_helpers
from .planesource import PLANE_SOURCE
from .sizes import is_smooth, min_length, next_pow2, next_smooth

#: Smallest transform lengths per axis.
MIN_SIZES = (4, 8)
#: Shared memory a block may take (the H100 gives a block up to 227 KiB): 128 x 256 and 256 x 128 fit, 256 x 256 not.
MAX_SMEM = rowconv.MAX_SMEM
#: Blocks the filter gradient's first kernel aims at (twice and eight times an H100's 132 SMs; a search axis: more
#: slices fill the device better and leave more partial sums to add): a channel's batch is cut into slices
#: (:func:`batch_slices`) where there are fewer channels.
WGRAD_BLOCKS = (264, 1056)
#: Points per thread in one call of the batched Stockham passes (rows and columns are transformed in groups).
POINTS_PER_THREAD = 16


def transform_sizes(p: ConvProblem, smooth: bool = False) -> tuple[int, int]:
    """The transform sizes for ``p``, per axis at least its minimum and :data:`MIN_SIZES`: powers of two, or with
    ``smooth`` the smallest 2^a 3^b (even along the rows, which are packed two samples to a point)."""
    least = (max(m, min_length(n, pad, k)) for m, n, pad, k in zip(MIN_SIZES, p.input_size, p.padding,
                                                                    p.dilated_kernel))
    if smooth:
        a, b = least
        return next_smooth(a, (2, 3)), rowconv.even_smooth(b)
    return tuple(next_pow2(m) for m in least)


def _pass_work(points: int) -> int:
    """Points times Stockham passes of a ``points``-point transform: what a block's passes move through shared
    memory."""
    return points * len(rowsource.radices(points))  # (of the default radices: the sizes are chosen before them)


def fewer_pass_sizes(p: ConvProblem) -> tuple[int, int]:
    """Per axis, the smallest ``2^a`` or ``3 * 2^a`` at least the axis's minimum where its passes move fewer points
    than the smallest 2^a 3^b's (radix-3 passes move many: SLaK's 81-point columns take four, 96 points three), else
    the smallest 2^a 3^b. SLaK's 51x51 stage-1 layer: 96 x 96 beside 81 x 96; RepLKNet's 31x31: 72 x 72 itself."""
    out = []
    for axis, smooth in enumerate(transform_sizes(p, smooth=True)):
        points = (lambda L: L // 2) if axis == 1 else (lambda L: L)
        least = max(MIN_SIZES[axis], min_length(p.input_size[axis], p.padding[axis], p.dilated_kernel[axis]))
        few = min(next_pow2(least), 3 * next_pow2(-(-least // 3)))
        if axis == 1 and few % 2:
            few = next_pow2(least)
        out.append(few if _pass_work(points(few)) < _pass_work(points(smooth)) else smooth)
    return tuple(out)


def size_options(p: ConvProblem) -> list[tuple[int, int]]:
    """The candidates' transform sizes: powers of two, the smallest 2^a 3^b where they differ (RepLKNet's 31x31
    stage-1 layer: 128 x 128 and 72 x 72), and :func:`fewer_pass_sizes` where they differ again (SLaK's 51x51:
    96 x 96 beside 128 x 128 and 81 x 96), those that fit a block (none for a problem :func:`reason` refuses
    whatever the sizes: not 2-D, not depthwise)."""
    if p.rank != 2:
        return []
    options = dict.fromkeys((transform_sizes(p), transform_sizes(p, smooth=True), fewer_pass_sizes(p)))
    return [s for s in options if reason(p, s) is None]


def row_stride(l1: int) -> int:
    """Slots per image row in shared memory: ``M1 + 1`` values with a pad after every 8, made odd."""
    m1 = l1 // 2
    return (m1 + (m1 >> 3) + 1) | 1


def smem_bytes(sizes) -> int:
    return 8 * sizes[0] * row_stride(sizes[1])


def wgrad_buffers(sizes) -> int:
    """Images of shared memory the filter gradient's first kernel takes: three (DY's spectrum, X's, the sums) where
    they fit a block, else one (X's spectrum and the sums in the workspace: its first form, whose read-modify-write
    of the workspace ran it at one instruction a cycle)."""
    return 3 if 3 * smem_bytes(sizes) <= MAX_SMEM else 1


def wgrad_min_blocks(sizes, threads: int) -> int:
    """The filter gradient's first kernel's blocks per SM (as :func:`launch_shape`'s, for its shared memory)."""
    return rowconv.blocks_per_sm(wgrad_buffers(sizes) * smem_bytes(sizes), threads)


def launch_shape(sizes) -> tuple[int, int]:
    """``(threads per block, blocks per SM)`` for ``L0 x L1`` transforms: the blocks whose images fit an SM's shared
    memory (at most :data:`convtune.fft.rowconv.SM_THREADS` threads in all) share it, 256 threads each where four or more fit, else 512 or
    1024 so that an SM still runs :data:`convtune.fft.rowconv.SM_THREADS`. The blocks per SM go to ``__launch_bounds__``, which caps the
    registers so they fit (the registers, not the shared memory, limited the first kernels to one or two blocks: one
    128x128 forward pass at 144 registers a thread ran 8 warps an SM). The cap makes ptxas spill: 520 bytes a
    thread in the 72x72 forward pass, 1344 in the 128x128 one (``benchmarks/kernel_registers.py``), which is one
    reason the uncapped block size of :func:`shape_options` stays a candidate.

    >>> launch_shape((72, 72)), launch_shape((128, 128)), launch_shape((64, 64))
    ((256, 4), (512, 2), (256, 4))
    """
    fit = rowconv.fitting_blocks(smem_bytes(sizes))
    threads = 256 if fit >= 4 else 512 if fit >= 2 else 1024
    return threads, rowconv.blocks_per_sm(smem_bytes(sizes), threads)


def reason(p: ConvProblem, sizes=None) -> str | None:
    """Why the kernels cannot run ``p`` (at transform ``sizes``, default :func:`transform_sizes`), or ``None``."""
    if p.rank != 2:
        return f"the one-block image FFT is 2-D, not rank {p.rank}"
    if not (p.groups == p.in_channels == p.out_channels):
        return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
    if any(s != 1 for s in p.stride) or any(d != 1 for d in p.dilation):
        return "stride and dilation must be 1"
    sizes = transform_sizes(p) if sizes is None else tuple(sizes)
    least = tuple(min_length(n, pad, k) for n, pad, k in zip(p.input_size, p.padding, p.kernel_size))
    if any(not is_smooth(L, (2, 3)) or L < m for L, m in zip(sizes, MIN_SIZES)) or sizes[1] % 2:
        return f"transform sizes {sizes}: 2^a 3^b from {MIN_SIZES} are needed, the second even"
    if any(L < m for L, m in zip(sizes, least)):
        return f"transform sizes {sizes} are below the {least} this problem needs"
    if smem_bytes(sizes) > MAX_SMEM:
        return (f"a {sizes[0]}x{sizes[1]} transform takes {smem_bytes(sizes) // 1024} KiB of shared memory, over the "
                f"{MAX_SMEM // 1024} KiB a block gets here")
    if p.dtype not in rowconv.ELEMENTS:
        return f"dtype {p.dtype}"
    return None


def shifts(p: ConvProblem, sizes) -> tuple[int, int]:
    """Per axis, the cyclic shift of the result's gather (as :func:`convtune.fft.rowconv.shifts`)."""
    sign = 1 if p.pass_ == "dgrad" else -1
    return tuple((sign * pad) % L for pad, L in zip(p.padding, sizes))


def batch_slices(p: ConvProblem, blocks: int = WGRAD_BLOCKS[0]) -> int:
    """The filter gradient's slices of the batch: at least ``blocks`` (channel, slice) blocks where the batch allows,
    every slice holding a sample."""
    return effective_slices(p, max(1, math.ceil(blocks / p.in_channels)))


def effective_slices(p: ConvProblem, slices: int) -> int:
    """The slices a filter gradient of ``p`` runs for a configuration of ``slices``: at most one per sample, each
    holding one (a configuration tuned for the full batch also serves the planner's verification batch of two:
    8 slices of it were refused, so no sliced candidate could win).

    >>> p = ConvProblem.make(batch=10, in_channels=4, out_channels=4, groups=4, input_size=(8, 8), kernel_size=3)
    >>> effective_slices(p, 8), effective_slices(p.replace(batch=2), 8), effective_slices(p, 3)
    (5, 2, 3)
    """
    if slices < 1:
        raise ValueError(f"image FFT: {slices} slices of a batch")
    chunk = math.ceil(p.batch / min(slices, p.batch))
    return math.ceil(p.batch / chunk)


def workspace_bytes(p: ConvProblem, sizes, slices: int = 1) -> int:
    """The filter spectra (forward, backward-data), or each (channel, slice)'s sums (filter gradient; with its input
    spectrum before them where :func:`wgrad_buffers` is one)."""
    per_image = 8 * sizes[0] * (sizes[1] // 2 + 1)
    if p.pass_ == "wgrad":
        return p.in_channels * per_image * effective_slices(p, slices) * (1 if wgrad_buffers(sizes) == 3 else 2)
    return p.in_channels * per_image


NAMES = ("planefft_spectrum", "planefft_fwd", "planefft_dgrad", "planefft_wgrad_part", "planefft_wgrad_sum")


def shape_options(sizes) -> list[int]:
    """The candidates' block sizes beside :func:`launch_shape`'s (``0`` in the list): the other of 256 and 512
    threads, registers uncapped. Measured on the H100 (2026-11-27), neither shape won everywhere: replknet-dw31's
    72x72 forward pass ran 0.159 ms at the policy's 256 threads (4 blocks an SM) against 0.217 at 512 uncapped, its
    filter gradient 0.29 against 0.21; SLaK's 128x128 forward pass 0.34 ms at 256 uncapped against 0.475 at the
    policy's 512."""
    return [0, 512 if launch_shape(sizes)[0] != 512 else 256]


def groups(sizes, threads: int) -> tuple[int, int]:
    """Rows and columns transformed per call of the batched passes (:data:`POINTS_PER_THREAD` points a thread)."""
    l0, l1 = sizes
    m1 = l1 // 2
    return (max(1, min(l0, POINTS_PER_THREAD * threads // m1)),
            max(1, min(m1 + 1, POINTS_PER_THREAD * threads // l0)))


def source(dtype: str, sizes, shape=None, radix: str = "8") -> str:
    """The CUDA source of ``dtype``'s kernels for ``L0 x L1`` transforms, launched ``shape`` (``(threads, blocks
    per SM)``, default :func:`launch_shape`), both axes' passes of the radices named ``radix``
    (:data:`convtune.fft.rowconv.RADICES`)."""
    l0, l1 = sizes
    t, minb = shape or launch_shape(sizes)
    rowg, colg = groups(sizes, t)
    large = rowconv.RADICES[radix]
    rows = rowsource.stockham_calls(l1 // 2, rowg, t, "slot", "count", large=large)
    cols = rowsource.stockham_calls(l0, colg, t, "slot", "count", large=large)
    roots = "".join(rowsource.roots_source(n) for n in dict.fromkeys((l1 // 2, l0)))
    return device_helpers() + PLANE_SOURCE.format(l0=l0, l1=l1, rs=row_stride(l1), t=t, minb=minb, rowg=rowg,
                                                     wgrad_minb=wgrad_min_blocks(sizes, t),
                                                     three="true" if wgrad_buffers(sizes) == 3 else "false",
                                                     roots=roots, row_root=rowsource.root_type(l1 // 2),
                                                     col_root=rowsource.root_type(l0),
                                                     colg=colg, row_passes=rows, col_passes=cols,
                                                     e=rowconv.ELEMENTS[dtype])




@compiled_once
def _kernels(dtype: str, sizes, shape, radix: str, pass_: str, device_id: int):
    """:data:`NAMES` for ``dtype``, ``sizes``, launch ``shape`` and radices ``radix``: those ``pass_`` launches
    (:func:`convtune.compiling.pass_names`) compiled once per device, ``None`` for the others."""
    return pass_launchables(source(dtype, sizes, shape, radix), NAMES, pass_, wgrad_buffers(sizes) * smem_bytes(sizes),
                            device_id)


def radix_options(sizes) -> list[str]:
    """The radices worth a candidate for ``L0 x L1`` (:func:`convtune.fft.rowconv.radix_options` of the columns'
    ``L0`` and the rows' ``L1 / 2`` points)."""
    return rowconv.radix_options(sizes[0], sizes[1] // 2, names=("16", "16x9"))


class PlaneFftConv(rowconv.BlockFftLaunch):
    """One 2-D depthwise problem's executor at transform ``sizes``: :meth:`launch` runs the pass by address on dense
    operands of the problem's dtype (bfloat16 as 16-bit numbers) and layout, with :attr:`workspace` bytes of device
    memory: two launches (the filter's spectra and the images; or the batch slices' sums and their inverse).
    ``kernels``: the launchables of :data:`NAMES` (default: compiled for the current device; the CPU tests pass
    stand-ins, built from the same ``shape``). ``slices``: the filter gradient's batch slices (default
    :func:`batch_slices`). ``shape``: ``(threads, blocks per SM)`` (default :func:`launch_shape`). ``radix``: the
    passes' radices (:data:`convtune.fft.rowconv.RADICES`)."""

    what = "the image FFT"

    def __init__(self, cp, p: ConvProblem, sizes=None, kernels=None, slices: int | None = None, shape=None,
                 radix: str = "8"):
        sizes = transform_sizes(p) if sizes is None else tuple(sizes)
        why = reason(p, sizes)
        if why:
            raise ValueError(f"image FFT: {why}")
        self.p, self.sizes = p, sizes
        self.shape = launch_shape(sizes) if shape is None else tuple(shape)
        spectrum, fwd, dgrad, part, total = kernels or _kernels(p.dtype, sizes, self.shape, radix, p.pass_,
                                                                cp.cuda.Device().id)
        i32, i64, f32 = numpy.int32, numpy.int64, numpy.float32
        block, smem, C = (self.shape[0],), smem_bytes(sizes), p.in_channels
        (k0, k1), sh = p.kernel_size, tuple(i32(s) for s in shifts(p, sizes))
        scale = f32(1.0 / (sizes[0] * sizes[1]))
        wN, _, w0, w1 = launch_strides(p.w_shape, p.layout)
        x_strides, y_strides = (tuple(map(i64, launch_strides(s, p.layout))) for s in (p.x_shape, p.y_shape))
        (n0, n1), (o0, o1) = p.input_size, p.output_size
        if p.pass_ == "wgrad":
            S = batch_slices(p) if slices is None else effective_slices(p, slices)
            chunk = math.ceil(p.batch / S)
            self.workspace = workspace_bytes(p, sizes, S)
            self.steps = ((part, (C * S,), block, (i32(p.batch), i32(C), i32(S), i32(chunk), *x_strides, *y_strides,
                                                    i32(n0), i32(n1), i32(o0), i32(o1)),
                           wgrad_buffers(sizes) * smem, ("a", "b", "ws")),
                          (total, (C,), block, (i32(S), i64(wN), i64(w0), i64(w1), i32(k0), i32(k1), *sh, scale),
                           smem, ("ws", "out")))
            return
        self.workspace = workspace_bytes(p, sizes)
        src, dst = (x_strides, y_strides) if p.pass_ == "fwd" else (y_strides, x_strides)
        (in0, in1), (out0, out1) = ((n0, n1), (o0, o1)) if p.pass_ == "fwd" else ((o0, o1), (n0, n1))
        self.steps = ((spectrum, (C,), block, (i64(wN), i64(w0), i64(w1), i32(k0), i32(k1)), smem, ("b", "ws")),
                      (fwd if p.pass_ == "fwd" else dgrad, (p.batch * C,), block,
                       (i32(C), *src, *dst, i32(in0), i32(in1), i32(out0), i32(out1), *sh, scale), smem,
                       ("a", "ws", "out")))


#: The kept-spectra kernels of :func:`source` (a round trip's, :class:`convtune.fft.blockkept.PlaneKept`), in its
#: order.
KEPT_NAMES = ("planefft_images_spectrum", "planefft_fwd_from", "planefft_dgrad_from", "planefft_wgrad_from",
              "planefft_fwd_keep", "planefft_dgrad_keep")
#: Both backward passes of a ``fused`` round trip: the slices' kernel, then the per-pass filter gradient's sum.
FUSED_NAMES = ("planefft_bwd_part", "planefft_wgrad_sum")
#: Samples a slice of the fused backward passes takes: each slice writes one image of sums per channel (two samples
#: a slice halve what dy's spectra cost, written and read back, and keep N C / 2 blocks).
FUSED_CHUNK = 2


def fused_slices(p: ConvProblem) -> int:
    """The fused backward passes' slices of ``p``'s batch (:data:`FUSED_CHUNK` samples each)."""
    return effective_slices(p, math.ceil(p.batch / FUSED_CHUNK))


def fused_workspace_bytes(p: ConvProblem, sizes) -> int:
    """The fused backward passes' sums: as the per-pass filter gradient's, for :func:`fused_slices`."""
    return workspace_bytes(p.for_pass("wgrad"), sizes, fused_slices(p))
