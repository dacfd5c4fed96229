"""The frequency-domain product for small channel counts: a register-blocked complex GEMM per
frequency on the packed spectrum layout (GPU).

With few channels on one side (an RGB first layer, a strided layer's few phases, a depthwise
multiplier), or few images (the forward and backward-data products of a dense layer at a small batch: images x
channels per frequency, while the filter's spectrum, read once, is what the product's time goes to), the
per-frequency matrices are thin: at most :data:`MAX_CHANNELS` rows or columns. A
shared-memory GEMM tile (:mod:`convtune.fft.freqmajor`'s packed kernel, 64 x 64 per frequency)
then computes mostly padding, and cuBLAS's batched GEMM needs the spectra transposed first. Here
each thread owns one frequency and an ``RM x RN`` block of the result, with the whole reduction in
registers: every operand element it needs is one coalesced 8-byte load (a warp reads 32
consecutive frequencies of one matrix element), nothing goes through shared memory, and the
result is written once. Where at most 8 rows meet a wide side, the rows are one block (``RM = M``),
so the wide operand is read once and the thin one re-read from L2 once per block of the wide side
(the blocks of one set of frequencies run next to each other); elsewhere blocks of up to 8 x 8 on
one warp per block of threads (:func:`block`, as measured by ``benchmarks/narrow_blocks.py``).

Operands are (F, rows, cols) views whose frequency axis is contiguous, as the packed product's:
element (r, c) of a matrix is at ``(r * s_r + c * s_c) * F + f``.
"""

from __future__ import annotations

import functools

import numpy

from .packedgemm import product_args

#: The product applies where the groups' input or output channels are at most this many.
MAX_CHANNELS = 16
#: At most this many complex accumulators per thread where a few rows meet a wide side (more spill registers).
MAX_ACC = 32
#: Threads per block where at most 8 rows meet a wide side (a forward pass at batch 8): consecutive frequencies.
THREADS = 128
#: Threads per block elsewhere: one warp (the blocks found fastest on an H200 ran so, ``benchmarks/narrow_blocks.py``;
#: an RGB layer's backward-data product at batch 32 took the same 235 µs with 8 x 3 blocks on one warp or four).
WARP = 32
#: The block of a thread (and the threads per block) where both sides of the result are wide (over
#: :data:`MAX_CHANNELS`: a small batch's filter gradient, an RGB layer's forward pass) or the rows are 9 to 16 images:
#: 8 x 8 (on an H200 the filter gradient of 64 -> 64 channels at batch 8 took 77 against 96 µs, and at batch 16 the
#: forward pass 125 against 447 µs).
WIDE_BLOCK = (8, 8, WARP)


def unsupported_reason(in_per_group: int, out_per_group: int, batch: int | None = None) -> str | None:
    """Why the narrow product does not apply to these channel counts and this batch (the images one product call
    takes; ``None``: not known), or None. A small batch is the thin side of the forward and backward-data products
    (images x channels per frequency); the filter gradient's product then reduces over it."""
    if min(in_per_group, out_per_group, MAX_CHANNELS + 1 if batch is None else batch) > MAX_CHANNELS:
        images = "" if batch is None else f" and a batch of {batch}"
        return (f"{in_per_group} -> {out_per_group} channels per group{images}: the narrow product is for at most "
                f"{MAX_CHANNELS} on one side")
    return None


def block(m: int, n: int) -> tuple[int, int, int]:
    """The register block ``(RM, RN)`` of a thread for an ``m x n`` result, and the threads per block: where the
    columns are few (at most :data:`MAX_CHANNELS`), blocks of up to 8 x 8 (8 x 4 for fewer than 8 rows), one warp per
    block of threads; where at most 8 rows meet a wide side, the rows whole and at most :data:`MAX_ACC` complex
    accumulators; elsewhere :data:`WIDE_BLOCK`."""
    if n <= MAX_CHANNELS:
        return min(m, 8), min(n, 8 if m >= 8 else 4), WARP
    if m <= 8:
        return m, max(1, min(n, 8, MAX_ACC // m)), THREADS
    return WIDE_BLOCK


def _block_before(m: int, n: int) -> tuple[int, int, int]:
    """:func:`block` before the fft strategy's version 13 and the round trips' version 18 (what plans stored under
    earlier versions were timed with): the thin side whole, at most 32 accumulators, 128 threads."""
    if n <= MAX_CHANNELS:
        return max(1, min(m, 8, 32 // n)), n, 128
    if m <= MAX_CHANNELS:
        return m, max(1, min(n, 8, 32 // m)), 128
    return 4, 8, 128


def blocks_changed(in_per_group: int, out_per_group: int, batch: int) -> bool:
    """Does the narrow product apply to a layer of these channels per group and this batch, and does one of its
    passes' products (images x output channels, images x input channels, output x input channels) take a block
    other than the one earlier versions took (:func:`_block_before`)?"""
    if unsupported_reason(in_per_group, out_per_group, batch) is not None:
        return False
    return any(block(m, n) != _block_before(m, n) for m, n in ((batch, out_per_group), (batch, in_per_group),
                                                                (out_per_group, in_per_group)))


_SOURCE = r"""
extern "C" __global__ void __launch_bounds__(NT)
convtune_narrow_cgemm(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
                      int M, int N, int K, int F, long long sAm, long long sAk, long long sBk, long long sBn,
                      long long sCm, long long sCn, int conjA, int conjB, float alpha, int accumulate,
                      int mblocks, int nblocks)
{
    // C[m, n, f] = alpha * sum_k opA[m, k, f] * opB[k, n, f] (+ C); one frequency and an RM x RN block
    // per thread, the blocks of one set of NT frequencies next to each other in the grid
    const int tiles = mblocks * nblocks;
    const int tile = blockIdx.x % tiles;
    const int f = (blockIdx.x / tiles) * NT + threadIdx.x;
    if (f >= F) return;
    const int m0 = (tile % mblocks) * RM, n0 = (tile / mblocks) * RN;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    // rows and columns past the result's edge read the last valid one and are not stored
    const float2* pa = A + f;
    const float2* pb = B + f;
    const long long aF = sAm * (long long)F, bF = sBn * (long long)F;
    float2 acc[RM][RN];
#pragma unroll
    for (int r = 0; r < RM; ++r)
#pragma unroll
        for (int c = 0; c < RN; ++c) acc[r][c] = make_float2(0.f, 0.f);
    for (int k = 0; k < K; ++k) {
        float2 a[RM], b[RN];
#pragma unroll
        for (int r = 0; r < RM; ++r) { a[r] = pa[min(m0 + r, M - 1) * aF]; a[r].y *= sa; }
#pragma unroll
        for (int c = 0; c < RN; ++c) { b[c] = pb[min(n0 + c, N - 1) * bF]; b[c].y *= sb; }
        pa += sAk * (long long)F;
        pb += sBk * (long long)F;
#pragma unroll
        for (int r = 0; r < RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                acc[r][c].x = fmaf(a[r].x, b[c].x, fmaf(-a[r].y, b[c].y, acc[r][c].x));
                acc[r][c].y = fmaf(a[r].x, b[c].y, fmaf(a[r].y, b[c].x, acc[r][c].y));
            }
    }
#pragma unroll
    for (int r = 0; r < RM; ++r) {
        if (m0 + r >= M) break;
#pragma unroll
        for (int c = 0; c < RN; ++c) {
            if (n0 + c >= N) break;
            float2* out = C + ((long long)(m0 + r) * sCm + (long long)(n0 + c) * sCn) * F + f;
            float2 v = make_float2(alpha * acc[r][c].x, alpha * acc[r][c].y);
            if (accumulate) { v.x += out->x; v.y += out->y; }
            *out = v;
        }
    }
}
"""


@functools.lru_cache(maxsize=None)
def _kernel(rm: int, rn: int, threads: int):
    import cupy
    return cupy.RawKernel(f"#define RM {rm}\n#define RN {rn}\n#define NT {threads}\n" + _SOURCE,
                          "convtune_narrow_cgemm")


def gemm(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate, blocks=None):
    """``c = alpha op(a) op(b) (+ c)`` per frequency; ``strides`` are the row strides (in rows of F elements)
    ``(s_am, s_ak, s_bk, s_bn, s_cm, s_cn)`` of the operands as multiplied (after any transpose), as
    :meth:`convtune.fft.arrayops.CupyOps.gemm` computes them for the packed layout. ``blocks``: ``(RM, RN,
    threads)`` instead of :func:`block`'s (``benchmarks/narrow_blocks.py`` times others)."""
    rm, rn, threads = blocks or block(m, n)
    rm, rn = min(rm, m), min(rn, n)
    mblocks, nblocks = -(-m // rm), -(-n // rn)
    grid = (mblocks * nblocks * (-(-F // threads)),)
    _kernel(rm, rn, threads)(grid, (threads,), product_args(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha,
                                                            accumulate) + (numpy.int32(mblocks), numpy.int32(nblocks)))
