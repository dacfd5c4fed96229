"""1-D depthwise FFT convolution in one kernel per pass: a thread block transforms a whole row in shared memory.

The FFT strategy runs a long depthwise row as separate launches: a zero-extending copy, cuFFT's transform, the
product, cuFFT's inverse and a gather, each a pass over memory (hyena-long-dw's round trip 1.2 ms against a floor
of 0.11). Here a row (transforms of up to 32768 samples as powers of two, 41472 as 2^a 3^b) is transformed,
multiplied and transformed back by one thread block in shared memory: a pass reads its operand once and writes its result once, with the zero-extension, the product, the
crop and the dtype conversions inside the kernel.

Notation: a channel's input row ``x`` (``n`` samples), filter ``w`` (``k`` taps), padding ``p``, output ``y`` (``n + 2p
- k + 1`` samples), transform length ``L`` (a power of two or an even 2^a 3^b, at least
:func:`convtune.fft.sizes.min_length`; the candidates: :func:`size_options`), ``M =
L / 2``. The three passes, with ``X``, ``W``, ``DY`` the real spectra (``L`` frequencies, ``M + 1`` stored) of the
zero-extended rows and ``IDFT`` the inverse transform divided by ``L``:

* forward: ``y[t] = u[(t - p) mod L]``, ``u = IDFT(X conj(W))`` (a circular correlation);
* backward-data: ``dx[i] = v[(i + p) mod L]``, ``v = IDFT(DY W)`` (a circular convolution);
* backward-filter: ``dw[s] = q[(s - p) mod L]``, ``q = IDFT(sum over the batch of conj(DY) X)``.

A real row of ``L`` samples is transformed as the complex row ``z[j] = a[2j] + i a[2j+1]`` of ``M`` points (a Stockham
FFT: radix 8, one radix-2 or radix-4 pass for the rest of the power of two, radix-3 passes). The real spectrum's
frequencies ``f`` and ``M - f`` come out of ``Z[f]`` and ``Z[M - f]`` together (:func:`convtune.fft.rowmodel._unpack`), and the inverse's
complex row of the product's ``Y[f]`` and ``Y[M - f]`` together (:func:`~convtune.fft.rowmodel._pack`): so one thread takes a pair of
frequencies from the forward transform to the inverse's input without another exchange through shared memory.
The forward transform's first pass reads its butterflies' points from the row in memory, and the inverse's last
pass writes its butterflies' results to the result row (the crop and the shift on the way): a row goes through
shared memory only between passes (on the H100 long-16k-dw's round trip 0.549 -> 0.457 ms, with :func:`pad_shift`'s pads).

Kernels (``DTYPE`` float32, float16, or bfloat16 as its 16 bits; any element strides, so channels_last too):

* ``spectrum``: each filter row's spectrum, ``M + 1`` complex64 per channel, into the workspace;
* ``conv``: the forward (``conj(W)``) and the backward-data (``W``) pass, one block per (sample, channel) row;
* ``wgrad``: one block per channel, the batch summed in the frequency domain (a thread's frequency pairs, the input
  row's spectrum and the sums, in its registers, or for the longest rows in the workspace, each read back by the
  thread that wrote it), one inverse.

:mod:`convtune.fft.rowmodel` runs the same algorithm step by step in float64: the index arithmetic, the packing and
the shifts that the kernels use are tested on the CPU against direct convolution.
"""

from __future__ import annotations

import numpy

from ..compiling import compiled_once, pass_launchables
from ..precision import launch_strides
from ..problem import ConvProblem
from .pairhelpers import device_helpers
from .rowsource import ROW_SOURCE, pad_shift, radices, root_type, roots_source, row_passes
from .sizes import is_smooth, min_length, next_pow2, next_smooth

#: Shortest transform length the kernels take, and the most shared memory a block may use (the H100 gives up to 227
#: KiB): rows of up to 32768 samples as powers of two (144 KiB), 41472 as 2^a 3^b.
MIN_SIZE, MAX_SMEM = 16, 200 * 1024
#: Threads per block: ``M / 8`` (one radix-8 butterfly each), at most this.
MAX_THREADS = 512
ELEMENTS = {"float32": "float", "float16": "h16", "bfloat16": "b16"}


def transform_size(p: ConvProblem, smooth: bool = False) -> int:
    """The transform length for ``p`` (at least :data:`MIN_SIZE` and :func:`convtune.fft.sizes.min_length`): a power of
    two, or with ``smooth`` the smallest even 2^a 3^b."""
    least = max(MIN_SIZE, min_length(p.input_size[0], p.padding[0], p.dilated_kernel[0]))
    return even_smooth(least) if smooth else next_pow2(least)


def even_smooth(n: int) -> int:
    """The smallest even 2^a 3^b at least ``n`` (a real row packed two samples to a point: twice a 2^a 3^b).

    >>> even_smooth(81), even_smooth(4126), even_smooth(1)
    (96, 4374, 2)
    """
    return 2 * next_smooth(-(-n // 2), (2, 3))


def size_options(p: ConvProblem) -> list[int]:
    """The candidates' transform lengths: a power of two, and the smallest even 2^a 3^b where it is shorter (a
    4096-sample row with a 31-tap kernel, same padding: 8192 and 4374), those that fit a block."""
    return [L for L in dict.fromkeys((transform_size(p), transform_size(p, smooth=True))) if reason(p, L) is None]


def reason(p: ConvProblem, size: int | None = None) -> str | None:
    """Why the kernels cannot run ``p`` (at transform length ``size``, default :func:`transform_size`), or ``None``."""
    if p.rank != 1:
        return f"the one-block row FFT is 1-D, not rank {p.rank}"
    if not (p.groups == p.in_channels == p.out_channels):
        return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
    if p.stride[0] != 1 or p.dilation[0] != 1:
        return f"stride {p.stride[0]} and dilation {p.dilation[0]}: the row FFT takes 1 and 1"
    L = transform_size(p) if size is None else size
    if L % 2 or L < MIN_SIZE or not is_smooth(L, (2, 3)):
        return f"transform length {L}: an even 2^a 3^b of at least {MIN_SIZE} is needed"
    if smem_bytes(L // 2) > MAX_SMEM:
        return (f"a transform of {L} samples takes {smem_bytes(L // 2) // 1024} KiB of shared memory, over the "
                f"{MAX_SMEM // 1024} KiB a block gets here")
    least = min_length(p.input_size[0], p.padding[0], p.kernel_size[0])
    if L < least:
        return f"transform length {L} is below the {least} this problem needs"
    if p.dtype not in ELEMENTS:
        return f"dtype {p.dtype}"
    return None


#: The passes' radices a configuration may ask for beside the default (8, then 4 or 2, then 3): radix 16 first,
#: and also radix 9 before 3 (by name, as configurations label them); rows only: radix 32 first, then 16 (16384 points
#: in three passes, 32 x 32 x 16, not four).
RADICES = {"8": (), "16": (16,), "16x9": (16, 9), "32": (32, 16)}
#: The named sets :func:`radix_options` weighs beyond the default, in order (images: :func:`convtune.fft.planeconv.
#: radix_options` leaves out radix 32, whose butterflies their register caps do not hold).
LARGER_RADICES = ("16", "16x9", "32")


def radix_options(*lengths: int, names=LARGER_RADICES) -> list[str]:
    """The :data:`RADICES` names worth a candidate for transforms of ``lengths`` points (one per axis): the default,
    then each larger set of ``names`` where it makes some axis's passes fewer than the set before it (4096 points:
    three radix-16 passes, not four of 8; 81: two of 9, not four of 3; 16384: three with radix 32, not four). Each pass
    is a round trip through shared memory and two barriers, and a larger butterfly needs fewer twiddles a point.

    >>> radix_options(16384), radix_options(4096), radix_options(8192, names=("16", "16x9"))
    (['8', '16', '32'], ['8', '16'], ['8', '16'])
    """
    out, passes = ["8"], [len(radices(n)) for n in lengths]
    for name in names:
        now = [len(radices(n, RADICES[name])) for n in lengths]
        if any(a < b for a, b in zip(now, passes)):
            out.append(name)
            passes = now
    return out


def offers(p: ConvProblem, name: str) -> bool:
    """Whether some transform length of ``p`` (:func:`size_options`) has the :data:`RADICES` set ``name`` among its
    candidates (:func:`radix_options`): the shapes a new set changes."""
    return any(name in radix_options(L // 2) for L in size_options(p))


def threads(m: int) -> int:
    return min(MAX_THREADS, max(1, m // 8))


#: The larger block a round trip may ask for (:func:`thread_options`).
LARGE_BLOCK = 1024


def thread_options(m: int) -> list[int]:
    """The block sizes worth a round-trip candidate for ``m``-point rows (0: :func:`threads`): also
    :data:`LARGE_BLOCK` threads where :func:`threads` leaves a thread more than 16 points of a pass. Such a row's
    block has its SM to itself (16384 points: 144 KiB of shared memory), and 512 threads are 16 warps to hide every
    latency; 1024 make 32 (one radix-16 butterfly a thread a pass), at 64 registers a thread."""
    return [0, LARGE_BLOCK] if m // threads(m) > 16 else [0]


def launch_options(m: int) -> list[tuple[int, str]]:
    """The ``(threads, radices)`` pairs worth a round-trip candidate for ``m``-point rows: each block size of
    :func:`thread_options` with each set of :func:`radix_options`, except radix 32 in :data:`LARGE_BLOCK` threads
    (its passes leave half the block idle, and at 64 registers a thread it spills: 1004 bytes a thread in the
    forward-keeping kernel at 16384 points, ptxas sm_90, ``benchmarks/kernel_registers.py``)."""
    return [(t, r) for t in thread_options(m) for r in radix_options(m) if not (r == "32" and t == LARGE_BLOCK)]


def smem_bytes(m: int) -> int:
    """Shared memory of a block: the complex row with one pad after every 8 points (:func:`_padded`)."""
    return 8 * _padded(m)


def _padded(i):
    """Shared-memory slot of point ``i`` (a pad after every 8: the radix-8 passes' strided writes spread over banks)."""
    return i + (i >> 3)


def shifts(p: ConvProblem, L: int) -> int:
    """The cyclic shift the result's gather applies: element ``t`` of the result is element ``(t + shift) mod L`` of
    the inverse transform (the padding folded in)."""
    pad = p.padding[0]
    return pad % L if p.pass_ == "dgrad" else (-pad) % L


#: The filter gradient keeps a thread's frequency pairs (its input spectrum and its sums) in registers up to this
#: many pairs a thread (rows of up to 16384 samples), else in the workspace.
MAX_REGISTER_PAIRS = 9


def pairs_in_registers(m: int) -> bool:
    return m // 2 // threads(m) + 1 <= MAX_REGISTER_PAIRS


#: Shared memory an SM gives its blocks (the H100's 228 KiB), what the driver keeps of it per block, and the threads
#: an SM should run of the block kernels at 64 registers a thread (half its warps; the kernels issue an instruction
#: most cycles at that occupancy, and more threads would cap their registers below 64).
SM_SMEM, SMEM_RESERVED, SM_THREADS = 228 * 1024, 1024, 1024
#: The most threads an SM runs at once.
SM_THREADS_MAX = 2048


def fitting_blocks(smem: int) -> int:
    """Blocks of ``smem`` bytes of shared memory an SM holds (at least one)."""
    return max(1, SM_SMEM // (smem + SMEM_RESERVED))


def blocks_per_sm(smem: int, threads: int) -> int:
    """Blocks per SM for ``__launch_bounds__``: as many as the shared memory holds, up to :data:`SM_THREADS`
    threads."""
    return max(1, min(fitting_blocks(smem), SM_THREADS // threads))


def wgrad_smem_bytes(m: int) -> int:
    """The filter gradient's shared memory: two rows (the input's transform kept beside DY's) where the sums stay in
    registers, else one."""
    return smem_bytes(m) * (2 if pairs_in_registers(m) else 1)


def wgrad_min_blocks(m: int) -> int:
    """The filter gradient's blocks per SM for ``__launch_bounds__``: as many as fit the shared memory, up to
    :data:`SM_THREADS` threads (its first form, pairs and sums in registers, took 128 registers a thread and ran
    one 512-thread block an SM)."""
    return blocks_per_sm(wgrad_smem_bytes(m), threads(m))


def workspace_bytes(p: ConvProblem, L: int) -> int:
    """The filter spectra (forward, backward-data), or, where a thread's frequency pairs do not fit its registers,
    the input spectra and the sums (backward-filter)."""
    per_channel = 8 * (L // 2 + 1)
    if p.pass_ == "wgrad":
        return 0 if pairs_in_registers(L // 2) else 2 * p.in_channels * per_channel
    return p.in_channels * per_channel


def source(dtype: str, m: int, radix: str = "8", block: int = 0) -> str:
    """The CUDA source of ``dtype``'s kernels for ``m``-point complex rows (transform length ``2 m``), its passes'
    radices as :data:`RADICES` names ``radix``, ``block`` threads a block (0: :func:`threads`, which larger radices
    leave as it is: some threads wait out their passes)."""
    t = block or threads(m)
    forward, inverse = row_passes(m, t, RADICES[radix])

    def at_this_block(blocks: int) -> int:  # (blocks per SM as counted for threads(m), at most what t threads allow)
        return max(1, min(blocks, SM_THREADS_MAX // t))
    return device_helpers() + ROW_SOURCE.format(m=m, t=t, forward_passes=forward, inverse_passes=inverse,
                                             pad_shift=pad_shift(m, RADICES[radix]), roots=roots_source(m), root_type=root_type(m),
                                             e=ELEMENTS[dtype], max_register_pairs=MAX_REGISTER_PAIRS,
                                             wgrad_min_blocks=at_this_block(wgrad_min_blocks(m)),
                                             both_min_blocks=at_this_block(both_min_blocks(m)))


#: The kernels of :func:`source`, in :class:`RowFftConv`'s order.
NAMES = ("rowfft_spectrum", "rowfft_fwd", "rowfft_dgrad", "rowfft_wgrad")


@compiled_once
def _kernels(dtype: str, m: int, radix: str, pass_: str, device_id: int):
    """:data:`NAMES` for ``dtype``, ``m``-point rows and radices ``radix``: those ``pass_`` launches
    (:func:`convtune.compiling.pass_names`) compiled once per device, ``None`` for the others."""
    return pass_launchables(source(dtype, m, radix), NAMES, pass_, max(smem_bytes(m), wgrad_smem_bytes(m)), device_id)


class BlockFftLaunch:
    """What :class:`RowFftConv` and :class:`convtune.fft.planeconv.PlaneFftConv` share: the pass as ``steps``, each a
    launch ``(kernel, grid, block, args, shared memory, pointers)`` whose first arguments are the named ``pointers``
    (``a``, ``b``, ``out``, ``ws``), then ``args``; and ``workspace`` bytes of device memory."""

    what = "the block FFT"
    steps: tuple = ()
    workspace: int = 0

    def launch(self, a: int, b: int, out: int, stream, workspace: int | None = None) -> None:
        """The pass on operands ``a``, ``b`` and result ``out`` given by device address, on ``stream``, with
        :attr:`workspace` bytes at ``workspace``. Nothing is allocated."""
        if workspace is None:
            if self.workspace:
                raise ValueError(f"{self.what} needs a workspace of {self.workspace} bytes")
            workspace = 0
        where = {"a": a, "b": b, "out": out, "ws": workspace}
        for kernel, grid, block, args, smem, pointers in self.steps:
            kernel(grid, block, (*(where[name] for name in pointers), *args), smem, stream)


class RowFftConv(BlockFftLaunch):
    """One 1-D depthwise problem's executor at transform length ``L``: :meth:`launch` runs the pass by address on
    dense operands of the problem's dtype (bfloat16 as 16-bit numbers) and layout, with :attr:`workspace` bytes of
    device memory; :func:`convtune.precision.launched` makes the array executor of it. One launch for the filter
    gradient, two for the other passes (the filter's spectra, then the rows). ``kernels``: the (spectrum, fwd, dgrad,
    wgrad) launchables (default: compiled for the current device, with the :data:`RADICES` named ``radix``; the CPU
    tests pass stand-ins)."""

    what = "the row FFT"

    def __init__(self, cp, p: ConvProblem, L: int | None = None, kernels=None, radix: str = "8"):
        L = transform_size(p) if L is None else L
        why = reason(p, L)
        if why:
            raise ValueError(f"row FFT: {why}")
        self.p, self.L, m = p, L, L // 2
        self.workspace = workspace_bytes(p, L)
        spectrum, fwd, dgrad, wgrad = kernels or _kernels(p.dtype, m, radix, p.pass_, cp.cuda.Device().id)
        i32, i64, f32 = numpy.int32, numpy.int64, numpy.float32
        block, smem, C = (threads(m),), smem_bytes(m), p.in_channels
        n, length, k = p.input_size[0], p.output_size[0], p.kernel_size[0]
        shift, scale = i32(shifts(p, L)), f32(1.0 / L)
        wN, _, wK = launch_strides(p.w_shape, p.layout)
        x_strides, y_strides = (tuple(map(i64, launch_strides(s, p.layout))) for s in (p.x_shape, p.y_shape))
        if p.pass_ == "wgrad":
            self.steps = ((wgrad, (C,), block, (i32(p.batch), i32(C), *x_strides, *y_strides, i64(wN), i64(wK),
                                                i32(n), i32(length), i32(k), shift, scale), wgrad_smem_bytes(m),
                           ("a", "b", "out", "ws")),)
            return
        src, dst = (x_strides, y_strides) if p.pass_ == "fwd" else (y_strides, x_strides)
        n_in, n_out = (n, length) if p.pass_ == "fwd" else (length, n)
        self.steps = ((spectrum, (C,), block, (i64(wN), i64(wK), i32(k)), smem, ("b", "ws")),
                      (fwd if p.pass_ == "fwd" else dgrad, (p.batch * C,), block,
                       (i32(C), *src, *dst, i32(n_in), i32(n_out), shift, scale), smem, ("a", "ws", "out")))


#: The kept-spectra kernels of :func:`source` (a round trip's, :class:`convtune.fft.blockkept.RowKept`), in its order.
KEPT_NAMES = ("rowfft_rows_spectrum", "rowfft_fwd_from", "rowfft_dgrad_from", "rowfft_wgrad_from",
              "rowfft_fwd_keep", "rowfft_dgrad_keep")
#: Both backward passes in one kernel from the forward pass's kept spectra (a ``fused`` block round trip's).
BOTH_NAME = "rowfft_bwd_both"


def both_smem_bytes(m: int) -> int:
    """:data:`BOTH_NAME`'s shared memory: the row, then the batch's sums (``M + 1`` complex64)."""
    return smem_bytes(m) + 8 * (m + 1)


def both_min_blocks(m: int) -> int:
    """:data:`BOTH_NAME`'s blocks per SM for ``__launch_bounds__``, as :func:`wgrad_min_blocks` (4096 points: 2, so
    radix 16 gets 64 registers, not the 127 it took uncapped)."""
    return blocks_per_sm(both_smem_bytes(m), threads(m))


def fused_backward_fits(m: int) -> bool:
    """Whether :data:`BOTH_NAME` fits a block's shared memory for ``m``-point rows (up to 8192 points: 136 KiB)."""
    return both_smem_bytes(m) <= MAX_SMEM
