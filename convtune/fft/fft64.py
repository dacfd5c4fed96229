"""convtune's own 64x64 real transforms, one pass over memory each, for the packed product.

cuFFT runs a 64x64 R2C or C2R as more than one pass over memory: on an H100 a plain R2C of
fbfft-L2's 8192 input images took 0.21 ms, 1.3 TB/s counting only what it must read and write,
and the callbacks of the fused plans did not make it faster. Here one
thread block transforms one image entirely in shared memory, reading the image once and writing
its spectrum once (or the reverse). The zero-extension of the forward operand and the gather of
the inverse result (crop, strides, filter taps) are done in the same kernels, as the fused cuFFT
plans do with callbacks.

The algorithm, for one image (256 threads, 8 per 64-point transform):

- rows: 32 complex 64-point FFTs, of rows ``p + i p+32`` (two real rows in one complex one);
- columns: 32 complex 64-point FFTs, of columns 1..31 and of ``column 0 + i column 32`` (both
  columns of a real image's row spectra are Hermitian, so the pair separates after the transform);
- each 64-point FFT is two radix-8 steps, with a shared-memory exchange and twiddles in between.

The spectrum's frequency order is the kernels' own: ``f = v * 64 + u`` for row frequency ``v``
(0..32) and column frequency ``u`` (0..63), so each column transform writes 64 contiguous
frequencies. The product does not care (it works frequency by frequency), but a spectrum made here
must be inverted here: an executor uses either these kernels or cuFFT for all its transforms.
Unnormalised in both directions, as cuFFT is.

Operands as they lie: the forward kernel reads (N, C, n0, n1) images of any strides in float32, float16 or
bfloat16 (as its 16 bits), widening to float32; the inverse writes the gathered result into any strides in those
dtypes, rounded to nearest (or a float32 array holding bfloat16 values, rounded to them). So a half-precision or
channels_last problem needs no conversions around the transforms (:class:`~convtune.fft.freqmajor.FreqMajorConv`,
the FFT strategy's ``own`` plans). Dense channels_last operands go through one tiled transposing pass in their own
dtype first (:func:`channels_first_copy`, :func:`channels_last_into`): a block reads one image, and a channels_last
image's samples lie a sector apart each (on the H100 fbfft-L2's inverse into channels_last float32 took 0.50 ms
read in place against 0.15 ms plus 0.08 for the transpose).
"""

from __future__ import annotations

import functools

import numpy

from .. import precision
from ..compiling import compiled_once

SIZE = 64
#: Frequencies of one image's spectrum: 33 row frequencies x 64 column frequencies.
FREQS = (SIZE // 2 + 1) * SIZE
_THREADS = 256

#: Device helpers shared with :mod:`convtune.fft.rowconv`: complex arithmetic, the operands' element types (float32,
#: float16 and bfloat16 as 16 bits: ``load``, ``store<ROUND>``) and the in-place 8-point DFT.
DEVICE_HELPERS = r"""
__device__ __forceinline__ float2 cadd(float2 a, float2 b) { return make_float2(a.x + b.x, a.y + b.y); }
__device__ __forceinline__ float2 csub(float2 a, float2 b) { return make_float2(a.x - b.x, a.y - b.y); }
__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}
__device__ __forceinline__ float2 conjf2(float2 a) { return make_float2(a.x, -a.y); }

// the operands' element types: float32, and float16 and bfloat16 as their 16 bits
struct h16 { unsigned short v; };
struct b16 { unsigned short v; };
__device__ __forceinline__ float load(const float* p) { return __ldg(p); }
__device__ __forceinline__ float load(const h16* p) {
    const unsigned short h = __ldg(reinterpret_cast<const unsigned short*>(p));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float load(const b16* p) {
    return __uint_as_float(((unsigned int)__ldg(reinterpret_cast<const unsigned short*>(p))) << 16);
}
// bfloat16's bits of v: to nearest, ties to even; NaN stays NaN
__device__ __forceinline__ unsigned int bf16_bits(float v) {
    unsigned int u = __float_as_uint(v);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x40u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
// ROUND: a float32 result that stores bfloat16 values (convtune.precision's storage) is rounded to them
template <bool ROUND> __device__ __forceinline__ void store(float* p, float v) {
    *p = ROUND ? __uint_as_float(bf16_bits(v) << 16) : v;
}
template <bool ROUND> __device__ __forceinline__ void store(h16* p, float v) {
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p->v = h;
}
template <bool ROUND> __device__ __forceinline__ void store(b16* p, float v) { p->v = (unsigned short)bf16_bits(v); }
// a * (-i) forward, a * i inverse
template <bool INV> __device__ __forceinline__ float2 rot(float2 a) {
    return INV ? make_float2(-a.y, a.x) : make_float2(a.y, -a.x);
}

// in-place 8-point DFT, exp(-2 pi i nk / 8) forward and exp(+2 pi i nk / 8) inverse
template <bool INV> __device__ __forceinline__ void dft8(float2* a) {
    const float r = 0.70710678118654752f;
    float2 b[4], c[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) { b[n] = cadd(a[n], a[n + 4]); c[n] = csub(a[n], a[n + 4]); }
    // c1 *= w8, c2 *= w8^2 (-i or i), c3 *= w8^3
    c[1] = INV ? make_float2(r * (c[1].x - c[1].y), r * (c[1].x + c[1].y))
               : make_float2(r * (c[1].x + c[1].y), r * (c[1].y - c[1].x));
    c[2] = rot<INV>(c[2]);
    c[3] = INV ? make_float2(-r * (c[3].x + c[3].y), r * (c[3].x - c[3].y))
               : make_float2(r * (c[3].y - c[3].x), -r * (c[3].x + c[3].y));
    float2 d0 = cadd(b[0], b[2]), d1 = csub(b[0], b[2]), d2 = cadd(b[1], b[3]), d3 = rot<INV>(csub(b[1], b[3]));
    float2 e0 = cadd(c[0], c[2]), e1 = csub(c[0], c[2]), e2 = cadd(c[1], c[3]), e3 = rot<INV>(csub(c[1], c[3]));
    a[0] = cadd(d0, d2); a[2] = cadd(d1, d3); a[4] = csub(d0, d2); a[6] = csub(d1, d3);
    a[1] = cadd(e0, e2); a[3] = cadd(e1, e3); a[5] = csub(e0, e2); a[7] = csub(e1, e3);
}

"""

_MACROS = r"""
// exchange layout of the 32 transforms' 64 points: one pad after every 8 points and 72 per
// transform, so the radix-8 steps' writes and reads both fall in different banks
#define XIDX(t, q) ((t) * 72 + (q) + ((q) >> 3))
// layout of the rows' spectra (row transform t, frequency k; or row r, column transform t on the
// way back): 32 per frequency, swizzled so a warp's 8 frequencies of 2 transforms use 16 banks
#define ZIDX(k, t) ((k) * 32 + ((t) ^ ((((k) & 1) << 3) | ((k) & 6))))

"""

#: The transposing kernels between channels_last and channels-first memory (:func:`_transpose`).
TRANSPOSE_SOURCE = r"""
// src (N, R, S) -> dst (N, S, R), both dense, through 32 x 32 tiles in shared memory (reads and writes both
// coalesced): channels_last (N, H W, C) operands to channels-first and back, in their own element size
template <typename T> __device__ __forceinline__ void transpose_tiles(const T* __restrict__ src, T* __restrict__ dst,
                                                                      int R, int S)
{
    __shared__ T tile[32][33];
    const long long base = (long long)blockIdx.z * R * S;
    const int s0 = blockIdx.x * 32, r0 = blockIdx.y * 32, tx = threadIdx.x;
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int r = r0 + i, c = s0 + tx;
        if (r < R && c < S) tile[i][tx] = src[base + (long long)r * S + c];
    }
    __syncthreads();
    for (int i = threadIdx.y; i < 32; i += 8) {
        const int c = s0 + i, r = r0 + tx;
        if (c < S && r < R) dst[base + (long long)c * R + r] = tile[tx][i];
    }
}
extern "C" __global__ void __launch_bounds__(256)
convtune_transpose16(const unsigned short* __restrict__ src, unsigned short* __restrict__ dst, int R, int S)
{ transpose_tiles(src, dst, R, S); }
// 16-bit elements two at a time: src (N, R, S) -> dst (N, S, R) through 64 x 64 tiles, reading and writing 32-bit
// words (pairs of neighbours along S, then along R), so a warp moves 128 bytes per row as the 32-bit form does; for
// even R and S (every pair lies within a row) and 4-byte aligned arrays
extern "C" __global__ void __launch_bounds__(256)
convtune_transpose16_pairs(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst, int R, int S)
{
    __shared__ unsigned int tile[64][33];  // [r][s / 2]: row r's 64 elements as 32 words
    const unsigned short* t16 = (const unsigned short*)&tile[0][0];
    const long long base = (long long)blockIdx.z * (R / 2) * S;  // in words
    const int s0 = blockIdx.x * 64, r0 = blockIdx.y * 64, tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    for (int i = ty; i < 64; i += 8) {
        const int r = r0 + i, c = s0 + 2 * tx;
        if (r < R && c < S) tile[i][tx] = src[base + ((long long)r * S + c) / 2];
    }
    __syncthreads();
    for (int i = ty; i < 64; i += 8) {
        const int c = s0 + i, r = r0 + 2 * tx;
        if (c < S && r < R)
            dst[base + ((long long)c * R + r) / 2] = t16[(2 * tx) * 66 + i] | ((unsigned)t16[(2 * tx + 1) * 66 + i] << 16);
    }
}
extern "C" __global__ void __launch_bounds__(256)
convtune_transpose32(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst, int R, int S)
{ transpose_tiles(src, dst, R, S); }
// 16-bit elements four at a time: src (N, R, S) -> dst (N, S, R) for R and S multiples of 4 and 8-byte aligned
// arrays, without shared memory. A thread reads a 4 x 4 block as four rows' 8-byte words, transposes it in its
// registers and writes it as four columns' 8-byte words. A warp's lanes (qa, rb, qb) = (l & 3, (l >> 2) & 3, l >> 4)
// read 4 consecutive words of a row (a 32-byte sector) and write 4 consecutive words of a column, so every sector
// read or written is whole. A block of 8 warps takes a tile of 64 x 64 (two tiles a block, one after the other along R,
// were slower on the H100: benchmarks/transpose16_probe.py)
extern "C" __global__ void __launch_bounds__(256)
convtune_transpose16_quads(const unsigned long long* __restrict__ src, unsigned long long* __restrict__ dst, int R,
                           int S)
{
    const int l = threadIdx.x & 31, w = threadIdx.x >> 5;
    const int qa = l & 3, rb = (l >> 2) & 3, qb = l >> 4;
    const int s = blockIdx.x * 64 + (w >> 2) * 32 + qb * 16 + qa * 4;  // the first of the thread's 4 columns
    if (s >= S) return;
    const long long base = (long long)blockIdx.z * R * S;  // in elements
    const int r = blockIdx.y * 64 + (w & 3) * 16 + rb * 4;  // the first of its 4 rows
    if (r < R) {
        unsigned int lo[4], hi[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned long long a = src[(base + (long long)(r + i) * S + s) >> 2];
            lo[i] = (unsigned int)a;
            hi[i] = (unsigned int)(a >> 32);
        }
        const unsigned int c[4][2] = {
            {(lo[0] & 0xffffu) | (lo[1] << 16), (lo[2] & 0xffffu) | (lo[3] << 16)},
            {(lo[0] >> 16) | (lo[1] & 0xffff0000u), (lo[2] >> 16) | (lo[3] & 0xffff0000u)},
            {(hi[0] & 0xffffu) | (hi[1] << 16), (hi[2] & 0xffffu) | (hi[3] << 16)},
            {(hi[0] >> 16) | (hi[1] & 0xffff0000u), (hi[2] >> 16) | (hi[3] & 0xffff0000u)}};
#pragma unroll
        for (int m = 0; m < 4; ++m)
            dst[(base + (long long)(s + m) * R + r) >> 2] = c[m][0] | ((unsigned long long)c[m][1] << 32);
    }
}
"""

_SOURCE = _MACROS + DEVICE_HELPERS + r"""
// first radix-8 step of transform t (thread j holds points j + 8 n), twiddled, into the exchange
template <bool INV> __device__ __forceinline__ void step1(float2* a, float2* buf, int t, int j,
                                                          const float2* __restrict__ tw) {
    dft8<INV>(a);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        float2 w = __ldg(tw + ((j * k) & 63));
        buf[XIDX(t, j + 8 * k)] = cmul(a[k], INV ? conjf2(w) : w);
    }
}

// second step: thread j reads points 8 j .. 8 j + 7 and ends with frequencies j + 8 k
template <bool INV> __device__ __forceinline__ void step2(float2* a, const float2* buf, int t, int j) {
#pragma unroll
    for (int n = 0; n < 8; ++n) a[n] = buf[XIDX(t, 8 * j + n)];
    dft8<INV>(a);
}

// image b of src is (b / C, b % C) of an (N, C, n0, n1) array with element strides sN, sC, sH, sW, any
// dtype; its sample (i, j) is placed at (i s0, j s1) of the 64 x 64 grid
template <typename T> __device__ __forceinline__ void rfft64(
    const T* __restrict__ src, float2* __restrict__ out, const float2* __restrict__ tw, int C, long long sN,
    long long sC, long long sH, long long sW, int n0, int n1, int s0, int s1)
{
    __shared__ float2 buf[32 * 72];
    __shared__ float2 col0[64];
    const int t = threadIdx.x >> 3, j = threadIdx.x & 7;
    const long long b = blockIdx.x;
    const long long ni = b / C;
    const T* img = src + ni * sN + (b - ni * C) * sC;
    float2 a[8];
    // rows p and p + 32 as one complex row
    {
        const int r0 = t, r1 = t + 32;
        const bool ok0 = r0 % s0 == 0 && r0 / s0 < n0, ok1 = r1 % s0 == 0 && r1 / s0 < n0;
        const T* row0 = img + (r0 / s0) * sH;
        const T* row1 = img + (r1 / s0) * sH;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int c = j + 8 * n;
            const bool okc = c % s1 == 0 && c / s1 < n1;
            const long long at = (c / s1) * sW;
            a[n] = make_float2(ok0 && okc ? load(row0 + at) : 0.f, ok1 && okc ? load(row1 + at) : 0.f);
        }
    }
    step1<false>(a, buf, t, j, tw);
    __syncthreads();
    step2<false>(a, buf, t, j);
    __syncthreads();
#pragma unroll
    for (int k = 0; k < 8; ++k) buf[ZIDX(j + 8 * k, t)] = a[k];
    __syncthreads();
    // columns: transform t >= 1 is column t, transform 0 is column 0 + i column 32; rows r < 32 are
    // the real parts of the row transforms, rows r >= 32 their imaginary parts
    {
        const int ka = t, kb = t ? 64 - t : 32;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
            const int p = (j + 8 * n) & 31;
            const float2 za = buf[ZIDX(ka, p)], zb = buf[ZIDX(kb, p)];
            if (n < 4)
                a[n] = t ? make_float2(0.5f * (za.x + zb.x), 0.5f * (za.y - zb.y)) : make_float2(za.x, zb.x);
            else
                a[n] = t ? make_float2(0.5f * (za.y + zb.y), 0.5f * (zb.x - za.x)) : make_float2(za.y, zb.y);
        }
    }
    __syncthreads();
    step1<false>(a, buf, t, j, tw);
    __syncthreads();
    step2<false>(a, buf, t, j);
    float2* spec = out + b * (33 * 64);
    if (t) {
#pragma unroll
        for (int k = 0; k < 8; ++k) spec[t * 64 + j + 8 * k] = a[k];
    } else {
        // separate column 0 and column 32: U[u] and U[-u]
#pragma unroll
        for (int k = 0; k < 8; ++k) col0[j + 8 * k] = a[k];
        __syncwarp(0xff);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int u = j + 8 * k;
            const float2 m = col0[(64 - u) & 63];
            spec[u] = make_float2(0.5f * (a[k].x + m.x), 0.5f * (a[k].y - m.y));
            spec[32 * 64 + u] = make_float2(0.5f * (a[k].y + m.y), 0.5f * (m.x - a[k].x));
        }
    }
}

#define RFFT64(NAME, T) \
extern "C" __global__ void __launch_bounds__(256) \
NAME(const T* __restrict__ src, float2* __restrict__ out, const float2* __restrict__ tw, int C, long long sN, \
     long long sC, long long sH, long long sW, int n0, int n1, int s0, int s1) \
{ rfft64<T>(src, out, tw, C, sN, sC, sH, sW, n0, n1, s0, s1); }
RFFT64(convtune_rfft64_f32, float)
RFFT64(convtune_rfft64_f16, h16)
RFFT64(convtune_rfft64_b16, b16)

// element (r, c) of image b's inverse lands at (q0, q1) of image b = (b / C, b % C) of an (N, C, c0, c1)
// array with element strides sN, sC, sH, sW when (r + o0) mod 64 == q0 s0 with q0 < c0, and the same along
// the columns; stored in the array's dtype (ROUND: float32 storage of bfloat16 values)
template <typename T, bool ROUND> __device__ __forceinline__ void irfft64(
    const float2* __restrict__ in, T* __restrict__ dst, const float2* __restrict__ tw, int C, long long sN,
    long long sC, long long sH, long long sW, int o0, int s0, int c0, int o1, int s1, int c1)
{
    __shared__ float2 buf[32 * 72];
    const int t = threadIdx.x >> 3, j = threadIdx.x & 7;
    const long long b = blockIdx.x;
    const float2* spec = in + b * (33 * 64);
    float2 a[8];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int u = j + 8 * n;
        if (t) {
            a[n] = __ldg(spec + t * 64 + u);
        } else {  // column 0 + i column 32
            const float2 x0 = __ldg(spec + u), x32 = __ldg(spec + 32 * 64 + u);
            a[n] = make_float2(x0.x - x32.y, x0.y + x32.x);
        }
    }
    step1<true>(a, buf, t, j, tw);
    __syncthreads();
    step2<true>(a, buf, t, j);
    __syncthreads();
    // row r = j + 8 k of column transform t
#pragma unroll
    for (int k = 0; k < 8; ++k) buf[ZIDX(j + 8 * k, t)] = a[k];
    __syncthreads();
    // rows p and p + 32: their full (Hermitian) spectra A and B as one complex row A + i B
#pragma unroll
    for (int n = 0; n < 8; ++n) {
        const int k = j + 8 * n;
        const int tk = k < 32 ? k : (64 - k) & 31;
        const float2 ea = buf[ZIDX(t, tk)], eb = buf[ZIDX(t + 32, tk)];
        float2 A, B;
        if (n < 4) {  // k < 32: column transform k, or the real part of transform 0 for k == 0
            A = k ? ea : make_float2(ea.x, 0.f);
            B = k ? eb : make_float2(eb.x, 0.f);
        } else {  // k >= 32: conjugate of column 64 - k, or the imaginary part of transform 0 for k == 32
            A = k != 32 ? conjf2(ea) : make_float2(ea.y, 0.f);
            B = k != 32 ? conjf2(eb) : make_float2(eb.y, 0.f);
        }
        a[n] = make_float2(A.x - B.y, A.y + B.x);
    }
    __syncthreads();
    step1<true>(a, buf, t, j, tw);
    __syncthreads();
    step2<true>(a, buf, t, j);
    // a[k] = (row t, column j + 8 k) + i (row t + 32, same column)
    const long long ni = b / C;
    T* img = dst + ni * sN + (b - ni * C) * sC;
    const int t0a = (t + o0) & 63, t0b = (t + 32 + o0) & 63;
    const bool oka = t0a % s0 == 0 && t0a / s0 < c0, okb = t0b % s0 == 0 && t0b / s0 < c0;
    T* rowa = img + (t0a / s0) * sH;
    T* rowb = img + (t0b / s0) * sH;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int t1 = (j + 8 * k + o1) & 63;
        const int q1 = s1 == 1 ? t1 : t1 / s1;  // (no division on the common stride-1 path)
        if ((s1 != 1 && t1 % s1 != 0) || q1 >= c1) continue;
        const long long at = (long long)q1 * sW;
        if (oka) store<ROUND>(rowa + at, a[k].x);
        if (okb) store<ROUND>(rowb + at, a[k].y);
    }
}

// (4 blocks of 256 threads per SM asked of the compiler: on the H100 fbfft-L2's inverse into bfloat16 took 0.173 ms
// against 0.188 without, and 0.208 with the divisions by s1)
#define IRFFT64(NAME, T, ROUND) \
extern "C" __global__ void __launch_bounds__(256, 4) \
NAME(const float2* __restrict__ in, T* __restrict__ dst, const float2* __restrict__ tw, int C, long long sN, \
     long long sC, long long sH, long long sW, int o0, int s0, int c0, int o1, int s1, int c1) \
{ irfft64<T, ROUND>(in, dst, tw, C, sN, sC, sH, sW, o0, s0, c0, o1, s1, c1); }
IRFFT64(convtune_irfft64_f32, float, false)
IRFFT64(convtune_irfft64_f32r, float, true)
IRFFT64(convtune_irfft64_f16, h16, false)
IRFFT64(convtune_irfft64_b16, b16, false)

""" + TRANSPOSE_SOURCE


def applies(sizes) -> str | None:
    """Why these kernels cannot run transforms of ``sizes``, or None.

    Examples
    --------
    >>> from convtune.fft import fft64
    >>> fft64.applies((64, 64)) is None, fft64.applies((32, 32))
    (True, "convtune's own transforms are 64x64 only, not 32x32")
    """
    if tuple(sizes) != (SIZE, SIZE):
        return f"convtune's own transforms are {SIZE}x{SIZE} only, not {'x'.join(map(str, sizes))}"
    return None


@compiled_once
def compile_kernels() -> None:
    """Compile this module's kernels (one NVRTC module for them all, about 2 s of host time) for the current device:
    the FFT strategy's build ahead (:meth:`~convtune.strategies.fft.FftStrategy.kernel_builds`). A kernel asked for
    while it compiles waits for it (:func:`~convtune.compiling.compiled_once`)."""
    import cupy
    cupy.RawKernel(_SOURCE, "convtune_rfft64_f32", options=("--std=c++17",)).kernel  # noqa: B018 (compiles it)


@compiled_once
def _kernel(name: str):
    """Kernel ``name``, made once and compiled for the current device (as the packed GEMM's is; CuPy caches the
    compiled module, so the other names load it; ``RawModule.get_function`` would make a new kernel object on every
    call)."""
    import cupy
    compile_kernels()
    kernel = cupy.RawKernel(_SOURCE, name, options=("--std=c++17",))
    kernel.kernel  # noqa: B018 (loads it from CuPy's cache of the module)
    return kernel


@functools.lru_cache(maxsize=None)
def _twiddles(device_id: int):
    import cupy
    k = numpy.arange(SIZE)
    with cupy.cuda.Device(device_id):
        return cupy.asarray(numpy.exp(-2j * numpy.pi * k / SIZE).astype(numpy.complex64))


#: an operand's array dtype -> the kernels' element type (bfloat16 as its 16 bits: int16 or uint16 arrays)
_ELEMENTS = {"float32": "f32", "float16": "f16", "int16": "b16", "uint16": "b16"}


def _images(a, what: str):
    """``a`` (B, n0, n1) or (N, C, n0, n1) as the kernels read it: its element type, the images' channel count
    ``C`` and element strides ``(sN, sC, sH, sW)`` (a 3-D array is one channel per image)."""
    element = _ELEMENTS.get(str(a.dtype))
    if element is None:
        raise ValueError(f"{what} must be float32, float16, or bfloat16 as 16-bit integers, not {a.dtype}")
    if a.ndim not in (3, 4):
        raise ValueError(f"{what} must be (B, n0, n1) or (N, C, n0, n1), not {a.shape}")
    item = a.itemsize
    if any(st % item or st < 0 for st in a.strides):
        raise ValueError(f"{what}'s strides {a.strides} are not whole non-negative elements")
    strides = [st // item for st in a.strides]
    if a.ndim == 3:
        return element, 1, (strides[0], 0, strides[1], strides[2])
    return element, a.shape[1], tuple(strides)


def rfft(src, out, steps=(1, 1)):
    """Spectra of the real images ``src``, sample (i, j) placed at (i s0, j s1) of the zero-extended 64x64
    grid, into ``out`` (B, FREQS) complex64, in this module's frequency order. ``src`` is (B, n0, n1) or
    (N, C, n0, n1) (B = N C images), of any strides (channels_last too), float32, float16, or bfloat16 as
    its 16 bits (an int16 or uint16 array): the kernel reads it as it lies and widens to float32."""
    element, C, (sN, sC, sH, sW) = _images(src, "the images")
    *lead, n0, n1 = src.shape
    b = int(numpy.prod(lead))
    if tuple(out.shape) != (b, FREQS) or not out.flags.c_contiguous:
        raise ValueError(f"the spectrum buffer must be C-contiguous ({b}, {FREQS}), not {tuple(out.shape)}")
    if min(steps) < 1 or (n0 - 1) * steps[0] >= SIZE or (n1 - 1) * steps[1] >= SIZE:
        raise ValueError(f"{n0}x{n1} samples at steps {tuple(steps)} do not fit a {SIZE}x{SIZE} transform")
    if b:
        i32, i64 = numpy.int32, numpy.int64
        _kernel("convtune_rfft64_" + element)(
            (b,), (_THREADS,), (src, out, _twiddles(src.device.id), i32(C), i64(sN), i64(sC), i64(sH), i64(sW),
                                i32(n0), i32(n1), i32(steps[0]), i32(steps[1])))
    return out


def irfft(spec, dst, geometry=((0, 1, SIZE), (0, 1, SIZE)), round_bfloat16: bool = False):
    """Inverse of the spectra ``spec`` (B, FREQS) gathered into ``dst``: element (r, c) of each 64x64 result
    lands at (q0, q1) where ``(r + o0) mod 64 == q0 * s0``, ``q0 < c0`` (and the same along the columns),
    ``geometry = ((o0, s0, c0), (o1, s1, c1))``; the rest is dropped. ``dst`` is (B, c0, c1) or (N, C, c0, c1)
    (B = N C), of any strides and of :func:`rfft`'s dtypes, written in its own dtype (rounded to nearest);
    ``round_bfloat16``: a float32 ``dst`` holds bfloat16 values (:mod:`convtune.precision`'s storage)."""
    (o0, s0, c0), (o1, s1, c1) = geometry
    b = spec.shape[0]
    if tuple(spec.shape) != (b, FREQS) or not spec.flags.c_contiguous:
        raise ValueError(f"the spectrum must be C-contiguous (B, {FREQS}), not {tuple(spec.shape)}")
    element, C, (sN, sC, sH, sW) = _images(dst, "the destination")
    *lead, d0, d1 = dst.shape
    if int(numpy.prod(lead)) != b or (d0, d1) != (c0, c1):
        raise ValueError(f"the destination must hold {b} images of {c0}x{c1}, not {tuple(dst.shape)}")
    if min(s0, s1) < 1:
        raise ValueError(f"gather steps must be positive, not {s0} and {s1}")
    if round_bfloat16 and element == "f32":
        element = "f32r"
    if b:
        i32, i64 = numpy.int32, numpy.int64
        _kernel("convtune_irfft64_" + element)(
            (b,), (_THREADS,), (spec, dst, _twiddles(spec.device.id), i32(C), i64(sN), i64(sC), i64(sH), i64(sW),
                                i32(o0 % SIZE), i32(s0), i32(c0), i32(o1 % SIZE), i32(s1), i32(c1)))
    return dst


def dense_channels_last(a) -> bool:
    """Is ``a`` (N, C, n0, n1) dense in channels_last order (N, n0, n1, C), with more than one channel?"""
    return a.ndim == 4 and precision.layout_of(a) == "channels_last"


def _transpose(src, dst, r: int, s: int, samples: int):
    """Dense (samples, r, s) ``src`` -> dense (samples, s, r) ``dst``, elements of 2 or 4 bytes: 16-bit ones four at a
    time as 8-byte words where ``r`` and ``s`` are multiples of 4 and both arrays 8-byte aligned, else in pairs as
    32-bit words where they are even and both arrays 4-byte aligned (64 x 64 tiles), else one by one (32 x 32)."""
    if samples and r and s:
        i32 = numpy.int32

        def in_words(k: int) -> bool:  # (k 16-bit elements to a word: every word within a row, every array aligned)
            return (src.itemsize == 2 and r % k == 0 and s % k == 0 and src.data.ptr % (2 * k) == 0
                    and dst.data.ptr % (2 * k) == 0)
        # quads: transposed in registers, no shared memory (on the H100 fbfft-L2's four operands 0.254 ms against
        # the pairs' 0.261 and a copy's 0.241); pairs: the 32 x 32 tiles of 16-bit elements had moved them at 1.8
        # TB/s, 0.37 ms of its bfloat16 channels_last round trip's 2.30
        name = "convtune_transpose16_quads" if in_words(4) else "convtune_transpose16_pairs" if in_words(2) else None
        if name:
            _kernel(name)(((s + 63) // 64, (r + 63) // 64, samples), (256,), (src, dst, i32(r), i32(s)))
            return
        _kernel(f"convtune_transpose{8 * src.itemsize}")(((s + 31) // 32, (r + 31) // 32, samples), (32, 8),
                                                          (src, dst, i32(r), i32(s)))


def channels_first_copy(a):
    """A dense channels_last (N, C, n0, n1) array's values in a new C-contiguous array of its dtype: one transposing
    pass (:func:`_transpose`: 32 x 32 tiles, or 64 x 64 of 16-bit elements in words) that reads and writes whole
    sectors, where the transforms' reads of channels_last images
    straight from it touch a sector per element (on the H100, fbfft-L2's 8192 images of 64x64 in bfloat16 storage:
    0.28 ms a transform against 0.12 from channels-first)."""
    import cupy
    n, c, h, w = a.shape
    out = cupy.empty(a.shape, dtype=a.dtype)
    _transpose(a, out, h * w, c, n)
    return out


def channels_last_into(src, dst):
    """The C-contiguous (N, C, n0, n1) ``src`` written into the dense channels_last ``dst`` of its dtype (one
    transposing pass, as :func:`channels_first_copy`)."""
    n, c, h, w = src.shape
    _transpose(src, dst, c, h * w, n)
    return dst
