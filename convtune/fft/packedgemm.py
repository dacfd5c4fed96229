"""The packed layout's channel product: convtune's batched complex GEMM kernels (float32, and TF32 on tensor cores).

Spectra stay in cuFFT's ``(B, F)`` layout and are passed around as transposed views; these kernels read and write
rows of ``F`` contiguous frequencies, so no transpose is needed (on the H100 about two thirds of cuBLAS's speed;
they win where the transposes cost more than that). :class:`convtune.fft.arrayops.CupyOps` launches them.
"""

from __future__ import annotations

import numpy

from ..compiling import compiled_once

# Tile of the packed-layout GEMM: 4 frequencies x (64 x 64) outputs per block of 256 threads, each
# thread one frequency and an 8 x 8 block of outputs; the reduction runs 4 at a time through two
# shared-memory buffers that cp.async fills (the next 4 arrive while the current ones are multiplied).
# A wide tile per frequency keeps the operand traffic from L2 at 1/32 of an element per multiply-add.
PG_THREADS, PG_FREQS, PG_TILE = 256, 4, 64

# What both packed kernels (float32 and TF32) share: the tile's sizes, the shared-memory layout of an operand's
# rows and the asynchronous copy that fills it.
PACKED_COMMON = f"#define FT {PG_FREQS}\n#define MT {PG_TILE}\n" + r"""
// shared-memory index of (row, frequency): rows of 4 frequencies, 4 more elements after every 8 rows,
// so the 8 column blocks that a warp reads fall in different banks
#define SIDX(r, f) ((r) * FT + (f) + ((r) >> 3) * FT)

#ifndef CONVTUNE_CPU_STANDINS  // (tests/cuda_cpu.py runs these kernels on the CPU with stand-ins of its own)
__device__ __forceinline__ void convtune_cp8(float2* dst, const float2* src, bool ok) {
    // 8 bytes global -> shared, asynchronously; zeros where ``ok`` is false (nothing is read)
    unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global.L2::128B [%0], [%1], 8, %2;\n" :: "r"(d), "l"(src), "r"(ok ? 8 : 0));
}
__device__ __forceinline__ void convtune_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// wait until at most N of this thread's committed groups are still in flight
template <int N> __device__ __forceinline__ void convtune_cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }
__device__ __forceinline__ unsigned convtune_tf32(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}
__device__ __forceinline__ void convtune_mma_tf32(float* c, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#endif
"""

PACKED_GEMM_SOURCE = PACKED_COMMON + r"""
#define KT 4
#define SROWS (MT * FT + (MT / 8) * FT)

extern "C" __global__ void __launch_bounds__(256, 1)
convtune_packed_cgemm(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
                      int M, int N, int K, int F, long long sAm, long long sAk, long long sBk, long long sBn,
                      long long sCm, long long sCn, int conjA, int conjB, float alpha, int accumulate)
{
    // C[m, n, f] = alpha * sum_k opA[m, k, f] * opB[k, n, f] (+ C), element (r, c) of an operand at
    // (r * s_r + c * s_c) * F + f: rows of F contiguous frequencies, read 4 frequencies (a sector) at a time
    __shared__ float2 As[2][KT][SROWS];
    __shared__ float2 Bs[2][KT][SROWS];
    const int tid = threadIdx.x;
    const int tf = tid & 3, tm = tid >> 5, tn = (tid >> 2) & 7;
    // one block per (64 x 64 tile, 4 frequencies), the tiles of one set of frequencies next to each other
    const int mtiles = (M + MT - 1) / MT, tiles = mtiles * ((N + MT - 1) / MT);
    const int tile = blockIdx.x % tiles, f0 = (blockIdx.x / tiles) * FT;
    const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    float2 acc[8][8];
#pragma unroll
    for (int r = 0; r < 8; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c) acc[r][c] = make_float2(0.f, 0.f);

    // element e = tid + 256 j of a 4 x 64 x 4 tile: frequency e & 3, row (e >> 2) & 63, k e >> 8
    auto issue = [&](int k0, int buf) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int e = tid + 256 * j, f = f0 + (e & 3), r = (e >> 2) & 63, kk = k0 + j;
            const bool fk = f < F && kk < K;
            const bool oka = fk && m0 + r < M, okb = fk && n0 + r < N;
            convtune_cp8(&As[buf][j][SIDX(r, e & 3)],
                         oka ? A + ((long long)(m0 + r) * sAm + (long long)kk * sAk) * F + f : A, oka);
            convtune_cp8(&Bs[buf][j][SIDX(r, e & 3)],
                         okb ? B + ((long long)kk * sBk + (long long)(n0 + r) * sBn) * F + f : B, okb);
        }
        convtune_cp_commit();
    };
    issue(0, 0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += KT) {
        if (k0 + KT < K) {
            issue(k0 + KT, buf ^ 1);
            convtune_cp_wait<1>();
        } else {
            convtune_cp_wait<0>();
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < KT; ++kk) {
            float2 a[8], b[8];
#pragma unroll
            for (int r = 0; r < 8; ++r) { a[r] = As[buf][kk][SIDX(tm * 8 + r, tf)]; a[r].y *= sa; }
#pragma unroll
            for (int c = 0; c < 8; ++c) { b[c] = Bs[buf][kk][SIDX(tn * 8 + c, tf)]; b[c].y *= sb; }
#pragma unroll
            for (int r = 0; r < 8; ++r)
#pragma unroll
                for (int c = 0; c < 8; ++c) {
                    acc[r][c].x = fmaf(a[r].x, b[c].x, fmaf(-a[r].y, b[c].y, acc[r][c].x));
                    acc[r][c].y = fmaf(a[r].x, b[c].y, fmaf(a[r].y, b[c].x, acc[r][c].y));
                }
        }
        __syncthreads();
        buf ^= 1;
    }
    const int f = f0 + tf;
    if (f >= F) return;
#pragma unroll
    for (int r = 0; r < 8; ++r) {
        const int m = m0 + tm * 8 + r;
        if (m >= M) break;
#pragma unroll
        for (int c = 0; c < 8; ++c) {
            const int n = n0 + tn * 8 + c;
            if (n >= N) break;
            float2* out = C + ((long long)m * sCm + (long long)n * sCn) * F + f;
            float2 v = make_float2(alpha * acc[r][c].x, alpha * acc[r][c].y);
            if (accumulate) { v.x += out->x; v.y += out->y; }
            *out = v;
        }
    }
}
"""


# The same product on TF32 tensor cores (tf32 math: mma.sync m16n8k8, float32 sums), the same tile of 4 frequencies
# x (64 x 64) outputs per block of 256 threads: each warp one frequency and 32 of the 64 columns (4 x 4 fragments of
# 16 x 8, a complex product as 4 real ones), the reduction 8 at a time through two shared-memory buffers that
# cp.async fills (dynamic shared memory, 72 KiB), and the results through shared memory 16 rows at a time, so that 4
# adjacent threads write one output's 4 frequencies (a whole sector). On the H100, fbfft-L2's three products took
# 0.34 to 0.38 ms against the float32 kernel's 0.53 to 0.61 (written in place from the fragments: 0.52 to 0.74).
PGT_SMEM = 2 * 2 * 8 * (PG_TILE * PG_FREQS + (PG_TILE // 8) * PG_FREQS + 1) * 8

PACKED_TF32_SOURCE = PACKED_COMMON + r"""
#define KT 8
#define SROWS_T (MT * FT + (MT / 8) * FT + 1)  // +1: a fragment's 4 k rows fall in different banks
extern "C" __global__ void __launch_bounds__(256, 1)
convtune_packed_cgemm_tf32(const float2* __restrict__ A, const float2* __restrict__ B, float2* __restrict__ C,
                           int M, int N, int K, int F, long long sAm, long long sAk, long long sBk, long long sBn,
                           long long sCm, long long sCn, int conjA, int conjB, float alpha, int accumulate)
{
    extern __shared__ float2 smem[];
    float2* As = smem;                      // [2][KT][SROWS_T]
    float2* Bs = smem + 2 * KT * SROWS_T;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int fw = warp >> 1, nh = warp & 1;  // the warp's frequency and half of the 64 columns
    const int mtiles = (M + MT - 1) / MT, tiles = mtiles * ((N + MT - 1) / MT);
    const int tile = blockIdx.x % tiles, f0 = (blockIdx.x / tiles) * FT;
    const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    float re[4][4][4], im[4][4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) { re[i][j][q] = 0.f; im[i][j][q] = 0.f; }
    const int lf = tid & 3, lr = (tid >> 2) & 63;
    auto issue = [&](int k0, int buf) {
        const int f = f0 + lf;
#pragma unroll
        for (int j = 0; j < KT; ++j) {
            const int kk = k0 + j;
            const bool fk = f < F && kk < K;
            const bool oka = fk && m0 + lr < M, okb = fk && n0 + lr < N;
            convtune_cp8(&As[(buf * KT + j) * SROWS_T + SIDX(lr, lf)],
                oka ? A + ((long long)(m0 + lr) * sAm + (long long)kk * sAk) * F + f : A, oka);
            convtune_cp8(&Bs[(buf * KT + j) * SROWS_T + SIDX(lr, lf)],
                okb ? B + ((long long)kk * sBk + (long long)(n0 + lr) * sBn) * F + f : B, okb);
        }
        convtune_cp_commit();
    };
    issue(0, 0);
    int buf = 0;
    for (int k0 = 0; k0 < K; k0 += KT) {
        if (k0 + KT < K) {
            issue(k0 + KT, buf ^ 1);
            convtune_cp_wait<1>();
        } else {
            convtune_cp_wait<0>();
        }
        __syncthreads();
        const float2* a_s = As + buf * KT * SROWS_T;
        const float2* b_s = Bs + buf * KT * SROWS_T;
        unsigned ar[4][4], ai[4][4], br[4][2], bi[4][2], nbi[4][2];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = i * 16 + g;
            const float2 v0 = a_s[t * SROWS_T + SIDX(r, fw)], v1 = a_s[t * SROWS_T + SIDX(r + 8, fw)];
            const float2 v2 = a_s[(t + 4) * SROWS_T + SIDX(r, fw)], v3 = a_s[(t + 4) * SROWS_T + SIDX(r + 8, fw)];
            ar[i][0] = convtune_tf32(v0.x); ar[i][1] = convtune_tf32(v1.x); ar[i][2] = convtune_tf32(v2.x); ar[i][3] = convtune_tf32(v3.x);
            ai[i][0] = convtune_tf32(sa * v0.y); ai[i][1] = convtune_tf32(sa * v1.y); ai[i][2] = convtune_tf32(sa * v2.y); ai[i][3] = convtune_tf32(sa * v3.y);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int n = nh * 32 + j * 8 + g;
            const float2 w0 = b_s[t * SROWS_T + SIDX(n, fw)], w1 = b_s[(t + 4) * SROWS_T + SIDX(n, fw)];
            br[j][0] = convtune_tf32(w0.x); br[j][1] = convtune_tf32(w1.x);
            bi[j][0] = convtune_tf32(sb * w0.y); bi[j][1] = convtune_tf32(sb * w1.y);
            nbi[j][0] = convtune_tf32(-sb * w0.y); nbi[j][1] = convtune_tf32(-sb * w1.y);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                convtune_mma_tf32(re[i][j], ar[i], br[j]);
                convtune_mma_tf32(re[i][j], ai[i], nbi[j]);
                convtune_mma_tf32(im[i][j], ar[i], bi[j]);
                convtune_mma_tf32(im[i][j], ai[i], br[j]);
            }
        __syncthreads();
        buf ^= 1;
    }
    // the results through shared memory, one 16-row slice at a time, so that 4 adjacent threads write the 4
    // frequencies of one output (a whole 32-byte sector) as the float32 kernel does
    float2* cs = smem;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int row = g + (q >> 1) * 8, col = nh * 32 + j * 8 + 2 * t + (q & 1);
                cs[(row * 64 + col) * FT + fw] = make_float2(alpha * re[i][j][q], alpha * im[i][j][q]);
            }
        __syncthreads();
#pragma unroll 4
        for (int s = 0; s < 16; ++s) {
            const int e = tid + 256 * s, f = f0 + (e & 3), col = (e >> 2) & 63, row = e >> 8;
            const int m = m0 + i * 16 + row, n = n0 + col;
            if (m < M && n < N && f < F) {
                float2* out = C + ((long long)m * sCm + (long long)n * sCn) * F + f;
                float2 v = cs[e];
                if (accumulate) { v.x += out->x; v.y += out->y; }
                *out = v;
            }
        }
        __syncthreads();
    }
}
"""


@compiled_once
def packed_tf32_kernel():
    """The TF32 product's kernel, compiled once for the current device (a caller that comes while it compiles waits
    for it: the FFT strategy compiles it ahead, :meth:`~convtune.strategies.fft.FftStrategy.kernel_builds`)."""
    import cupy
    kernel = cupy.RawKernel(PACKED_TF32_SOURCE, "convtune_packed_cgemm_tf32", options=("--std=c++17",))
    kernel.max_dynamic_shared_size_bytes = PGT_SMEM  # (compiles it; over the 48 KiB a block gets without opting in)
    return kernel


def packed_available(backend) -> bool:
    """Whether the packed product's kernel can run: CuPy on a GPU of compute capability 8.0 or newer."""
    if backend.name != "cupy":
        return False
    major = str(backend.device_info().compute_capability).split(".")[0]
    return major.isdigit() and int(major) >= 8


@compiled_once
def packed_gemm_kernel():
    """The product's kernel, compiled once for the current device (as :func:`packed_tf32_kernel`)."""
    import cupy
    kernel = cupy.RawKernel(PACKED_GEMM_SOURCE, "convtune_packed_cgemm", options=("--std=c++17",))
    kernel.kernel  # noqa: B018 (compiles it)
    return kernel


def product_args(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate) -> tuple:
    """The kernel arguments every product on the packed layout begins with (this module's and
    :func:`convtune.fft.narrow.gemm`'s): the operands, the sizes, the row strides in rows of F elements ``(s_am, s_ak,
    s_bk, s_bn, s_cm, s_cn)`` of the operands as multiplied, whether each operand is conjugated, alpha and whether the
    result is added to ``c``."""
    i64, i32 = numpy.int64, numpy.int32
    return (a, b, c, i32(m), i32(n), i32(k), i32(F), *map(i64, strides), i32(conj_a), i32(conj_b),
            numpy.float32(alpha), i32(1 if accumulate else 0))


def gemm(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate, tf32=False):
    """``c = alpha op(a) op(b) (+ c)`` per frequency on the packed layout, in 64 x 64 tiles of 4 frequencies (with
    ``tf32``, on TF32 tensor cores); ``strides`` as :func:`convtune.fft.narrow.gemm` takes them: the row strides in
    rows of F elements ``(s_am, s_ak, s_bk, s_bn, s_cm, s_cn)`` of the operands as multiplied."""
    tiles = ((m + PG_TILE - 1) // PG_TILE) * ((n + PG_TILE - 1) // PG_TILE)
    grid = (tiles * ((F + PG_FREQS - 1) // PG_FREQS),)
    args = product_args(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate)
    if tf32:  # TF32 tensor cores (tf32 math)
        packed_tf32_kernel()(grid, (PG_THREADS,), args, shared_mem=PGT_SMEM)
    else:
        packed_gemm_kernel()(grid, (PG_THREADS,), args)
