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
  shared-memory tiles for all three passes (see ``_TILED_COMMON``); backward-data
  is the forward kernel run on ``dy`` with the filter reversed.
* ``window`` (stride 1, dilation 1, 1-D and 2-D, kernels of any height and up to
  :data:`WINDOW_MAX_KW` wide, planes that fit shared memory): large kernels on small
  planes, where an output sees only the taps that fall inside the image (RepLKNet's
  27x27 kernels on 14x14 planes, 13x13 on 7x7); see ``_WINDOW_COMMON``.
"""

from __future__ import annotations

import math

from ..compiling import compiled_once
from ..problem import ConvProblem
from . import depthwise_nhwc
from .depthwise_nhwc import ELEMENT_TYPES

#: Largest kernel (taps) whose filter gradient keeps one accumulator per tap in registers (the simple
#: and tiled kernels; the window kernels take larger ones).
MAX_TAPS = 81

_COMMON = r"""
#define KH {kh}
#define KW {kw}
struct Geo {{ int N, C, H, W, OH, OW, sh, sw, ph, pw, dh, dw; }};
#define GEO_PARAMS int N, int C, int H, int W, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw
#define GEO_INIT const Geo g = {{N, C, H, W, OH, OW, sh, sw, ph, pw, dh, dw}}
"""

_FWD = _COMMON + r"""
extern "C" __global__ void dw_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                  GEO_PARAMS) {{
  GEO_INIT;
  const long long total = (long long)g.N * g.C * g.OH * g.OW;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)blockDim.x * gridDim.x) {{
    const int ow = i % g.OW;
    const long long t = i / g.OW;
    const int oh = t % g.OH;
    const long long nc = t / g.OH;
    const int c = nc % g.C;
    const T* xp = x + nc * g.H * g.W;
    const T* wp = w + c * KH * KW;
    float acc = 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      const int ih = oh * g.sh - g.ph + kh * g.dh;
      if (ih < 0 || ih >= g.H) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const int iw = ow * g.sw - g.pw + kw * g.dw;
        if (iw >= 0 && iw < g.W) acc += ld(xp + ih * g.W + iw) * ld(wp + kh * KW + kw);
      }}
    }}
    y[i] = st(acc);
  }}
}}
"""

_TILED_COMMON = r"""
// Stride-1 tiles, register-blocked: a block of 32 x BY threads owns a 32-wide, R*BY-tall tile of
// output positions of one (n, c) plane; its input tile with the halo sits in shared memory (zeros
// outside the image). A thread owns R vertically adjacent outputs: it walks the R + (KH-1)*DH input
// rows its outputs touch once, keeping KW inputs of a row in registers, and adds each row into every
// output (forward) or tap (filter gradient) it belongs to. Shared-memory loads per output fall from
// KH*KW to about (R + (KH-1)*DH)*KW / R, and every loop bound is a compile-time constant.
#define KH {kh}
#define KW {kw}
#define DH {dh}
#define DW {dw}
#define R {rows}
#define BY {by}
#define TW 32
#define TH (R * BY)
#define IN_W (TW + (KW - 1) * DW)
#define IN_H (TH + (KH - 1) * DH)
#define KK (KH * KW)

// input tile (rows oh0 - ph .., cols ow0 - pw ..) of plane xp into smem, zero outside the image
__device__ __forceinline__ void load_tile(float* tile, const T* __restrict__ xp, int H, int W, int ih0,
                                          int iw0, int tid) {{
  for (int i = tid; i < IN_H * IN_W; i += TW * BY) {{
    const int ih = ih0 + i / IN_W, iw = iw0 + i % IN_W;
    tile[i] = (ih >= 0 && ih < H && iw >= 0 && iw < W) ? ld(xp + (long long)ih * W + iw) : 0.f;
  }}
}}

// A thread's walk over the R + (KH-1)*DH tile rows its R outputs touch, KW inputs of a row in registers:
// add(o, kh, xr) for each output o that the row feeds as the filter's tap row kh
template <typename F>
__device__ __forceinline__ void each_tile_row(const float* tile, int tx, int ty, F add) {{
  const float* base = tile + ty * R * IN_W + tx;
#pragma unroll
  for (int ir = 0; ir < R + (KH - 1) * DH; ++ir) {{
    float xr[KW];
#pragma unroll
    for (int kw = 0; kw < KW; ++kw) xr[kw] = base[ir * IN_W + kw * DW];
#pragma unroll
    for (int o = 0; o < R; ++o) {{
      const int d = ir - o;  // this input row is tap row d / DH of output o
      if (d >= 0 && d % DH == 0 && d / DH < KH) add(o, d / DH, xr);
    }}
  }}
}}

// forward: acc[o] += the row x the filter's taps wr of the output it feeds
__device__ __forceinline__ void add_tile(float* acc, const float* tile, const float* wr, int tx, int ty) {{
  each_tile_row(tile, tx, ty, [&](int o, int kh, const float* xr) {{
#pragma unroll
    for (int kw = 0; kw < KW; ++kw) acc[o] += xr[kw] * wr[kh * KW + kw];
  }});
}}

// filter gradient: acc[tap] += g[o] (output o's gradient) x the row
__device__ __forceinline__ void add_tile_grad(float* acc, const float* tile, const float* g, int tx, int ty) {{
  each_tile_row(tile, tx, ty, [&](int o, int kh, const float* xr) {{
#pragma unroll
    for (int kw = 0; kw < KW; ++kw) acc[kh * KW + kw] += g[o] * xr[kw];
  }});
}}

// the filter gradient's sums acc[tap] over every tile of one plane pair: x plane xp (H x W), dy plane gp
// (OH x OW); tile and gsh are the block's shared input and dy tiles
__device__ __forceinline__ void add_plane_grad(float* acc, float* tile, float* gsh, const T* __restrict__ xp,
                                               const T* __restrict__ gp, int H, int W, int OH, int OW, int ph,
                                               int pw, int tx, int ty, int tid) {{
  const int tiles_w = (OW + TW - 1) / TW, tiles = tiles_w * ((OH + TH - 1) / TH);
  for (int t = 0; t < tiles; ++t) {{
    const int ow0 = (t % tiles_w) * TW, oh0 = (t / tiles_w) * TH;
    load_tile(tile, xp, H, W, oh0 - ph, ow0 - pw, tid);
    for (int i = tid; i < TH * TW; i += TW * BY) {{
      const int oh = oh0 + i / TW, ow = ow0 + i % TW;
      gsh[i] = (oh < OH && ow < OW) ? ld(gp + (long long)oh * OW + ow) : 0.f;
    }}
    __syncthreads();
    float g[R];
#pragma unroll
    for (int o = 0; o < R; ++o) g[o] = gsh[(ty * R + o) * TW + tx];
    add_tile_grad(acc, tile, g, tx, ty);
    __syncthreads();
  }}
}}

// a block's per-tap sums into dst[0 .. KK): warp shuffles, then the warps' partial sums (red: BY * KK floats
// of shared memory), one atomic add per tap
__device__ __forceinline__ void reduce_taps(const float* acc, float* red, float* dst, int tx, int ty, int tid) {{
#pragma unroll
  for (int k = 0; k < KK; ++k) {{
    float v = acc[k];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (tx == 0) red[ty * KK + k] = v;
  }}
  __syncthreads();
  for (int k = tid; k < KK; k += TW * BY) {{
    float v = 0.f;
    for (int j = 0; j < BY; ++j) v += red[j * KK + k];
    atomicAdd(dst + k, v);
  }}
}}
"""

_FWD_TILED = _TILED_COMMON + r"""
// y = x * w (correlation); with flip != 0 the filter is read reversed in both axes, which makes
// this kernel the backward-data pass (dy in, dx out, padding dil*(k-1) - pad).
extern "C" __global__ void __launch_bounds__(TW * BY) dw_fwd_tiled(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw, int flip) {{
  __shared__ float tile[IN_H * IN_W];
  __shared__ float wsh[KK];
  const int tiles_w = (OW + TW - 1) / TW;
  const int ow0 = (blockIdx.x % tiles_w) * TW, oh0 = (blockIdx.x / tiles_w) * TH;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;
  const long long planes = (long long)N * C;
  for (long long nc = blockIdx.y; nc < planes; nc += gridDim.y) {{
    const int c = nc % C;
    for (int i = tid; i < KK; i += TW * BY) wsh[i] = ld(w + c * KK + (flip ? KK - 1 - i : i));
    load_tile(tile, x + nc * H * W, H, W, oh0 - ph, ow0 - pw, tid);
    __syncthreads();
    float wr[KK];
#pragma unroll
    for (int i = 0; i < KK; ++i) wr[i] = wsh[i];
    float acc[R];
#pragma unroll
    for (int o = 0; o < R; ++o) acc[o] = 0.f;
    add_tile(acc, tile, wr, tx, ty);
    const int ow = ow0 + tx;
    if (ow < OW) {{
#pragma unroll
      for (int o = 0; o < R; ++o) {{
        const int oh = oh0 + ty * R + o;
        if (oh < OH) y[nc * OH * OW + (long long)oh * OW + ow] = st(acc[o]);
      }}
    }}
    __syncthreads();
  }}
}}
"""

_WGRAD_TILED = _TILED_COMMON + r"""
// dw[c] += sum over the block's images and tiles of dy (x) x; per-tap sums in registers, then a
// warp-shuffle and shared-memory reduction, one atomic add per tap and block.
extern "C" __global__ void __launch_bounds__(TW * BY) dw_wgrad_tiled(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dwt,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw, int n_per_block) {{
  __shared__ float tile[IN_H * IN_W];
  __shared__ float gsh[TH * TW];
  __shared__ float red[BY * KK];
  const int c = blockIdx.x;
  const int n0 = blockIdx.y * n_per_block, n1 = min(N, n0 + n_per_block);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;
  float acc[KK];
#pragma unroll
  for (int k = 0; k < KK; ++k) acc[k] = 0.f;
  for (int n = n0; n < n1; ++n) {{
    const long long nc = (long long)n * C + c;
    add_plane_grad(acc, tile, gsh, x + nc * H * W, dy + nc * OH * OW, H, W, OH, OW, ph, pw, tx, ty, tid);
  }}
  reduce_taps(acc, red, dwt + c * KK, tx, ty, tid);
}}
"""

_DGRAD = _COMMON + r"""
extern "C" __global__ void dw_dgrad(const T* __restrict__ dy, const T* __restrict__ w,
                                    T* __restrict__ dx, GEO_PARAMS) {{
  GEO_INIT;
  const long long total = (long long)g.N * g.C * g.H * g.W;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)blockDim.x * gridDim.x) {{
    const int iw = i % g.W;
    const long long t = i / g.W;
    const int ih = t % g.H;
    const long long nc = t / g.H;
    const int c = nc % g.C;
    const T* dp = dy + nc * g.OH * g.OW;
    const T* wp = w + c * KH * KW;
    float acc = 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      const int th = ih + g.ph - kh * g.dh;
      if (th < 0 || th % g.sh) continue;
      const int oh = th / g.sh;
      if (oh >= g.OH) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const int tw = iw + g.pw - kw * g.dw;
        if (tw < 0 || tw % g.sw) continue;
        const int ow = tw / g.sw;
        if (ow < g.OW) acc += ld(dp + oh * g.OW + ow) * ld(wp + kh * KW + kw);
      }}
    }}
    dx[i] = st(acc);
  }}
}}
"""

_WGRAD = _COMMON + r"""
extern "C" __global__ void dw_wgrad(const T* __restrict__ x, const T* __restrict__ dy,
                                    float* __restrict__ dwt, GEO_PARAMS, const int n_per_block) {{
  GEO_INIT;
  const int c = blockIdx.x;
  const int n0 = blockIdx.y * n_per_block;
  const int n1 = min(g.N, n0 + n_per_block);
  float acc[KH * KW];
#pragma unroll
  for (int k = 0; k < KH * KW; ++k) acc[k] = 0.f;
  const long long plane = (long long)g.OH * g.OW;
  const long long positions = (long long)(n1 - n0) * plane;
  for (long long p = threadIdx.x; p < positions; p += blockDim.x) {{
    const int n = n0 + p / plane;
    const int q = p % plane;
    const int oh = q / g.OW, ow = q % g.OW;
    const long long nc = (long long)n * g.C + c;
    const float grad = ld(dy + nc * plane + q);
    const T* xp = x + nc * g.H * g.W;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      const int ih = oh * g.sh - g.ph + kh * g.dh;
      const bool row = ih >= 0 && ih < g.H;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const int iw = ow * g.sw - g.pw + kw * g.dw;
        if (row && iw >= 0 && iw < g.W) acc[kh * KW + kw] += grad * ld(xp + ih * g.W + iw);
      }}
    }}
  }}
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int k = 0; k < KH * KW; ++k) {{
    float v = acc[k];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    if (lane == 0) atomicAdd(dwt + c * KH * KW + k, v);
  }}
}}
"""

_WINDOW_COMMON = r"""
// Window kernels (stride 1, dilation 1, any kernel size up to WINDOW_MAX_KW columns): whole planes in
// shared memory, zero-padded on the left by the padding and on the right to the last column read, so
// the register loops need no bounds checks; rows are clipped to the image instead, so an output of a
// small image (a 14x14 plane under a 27x27 kernel) costs its valid taps only, not the kernel's.
#define KW {kw}
#define S {s}
"""

_FWD_WINDOW = _WINDOW_COMMON + r"""
// y = x * w (correlation) for G planes of one channel per block. A thread owns S adjacent outputs of a
// row; per input row it holds the S + KW - 1 inputs its outputs read in registers and adds KW taps into
// each. flip != 0 reads the filter reversed in both axes: with padding k - 1 - pad, that is the
// backward-data pass (dy in, dx out).
extern "C" __global__ void dw_fwd_window(const T* __restrict__ x, const T* __restrict__ w,
                                         T* __restrict__ y, int N, int C, int H, int W, int OH, int OW,
                                         int KH, int PH, int PW, int G, int flip) {{
  extern __shared__ float sm[];
  const int KK = KH * KW;
  const int segs = (OW + S - 1) / S, wp = segs * S + KW - 1;
  float* ws = sm;
  float* xs = sm + KK;
  const int c = blockIdx.x, n0 = blockIdx.y * G, tid = threadIdx.x;
  for (int i = tid; i < KK; i += blockDim.x) ws[i] = ld(w + (long long)c * KK + (flip ? KK - 1 - i : i));
  for (int i = tid; i < G * H * wp; i += blockDim.x) {{
    const int g = i / (H * wp), r = (i / wp) % H, iw = i % wp - PW, n = n0 + g;
    xs[i] = (n < N && iw >= 0 && iw < W) ? ld(x + ((long long)n * C + c) * H * W + (long long)r * W + iw) : 0.f;
  }}
  __syncthreads();
  const int tasks = G * OH * segs;
  for (int t = tid; t < tasks; t += blockDim.x) {{
    const int seg = t % segs, oh = (t / segs) % OH, g = t / (segs * OH), n = n0 + g;
    if (n >= N) continue;
    const int ow0 = seg * S;
    float acc[S];
#pragma unroll
    for (int o = 0; o < S; ++o) acc[o] = 0.f;
    const int ih_lo = max(0, oh - PH), ih_hi = min(H, oh - PH + KH);
    for (int ih = ih_lo; ih < ih_hi; ++ih) {{
      const float* xrow = xs + (g * H + ih) * wp + ow0;
      const float* wrow = ws + (ih - oh + PH) * KW;
      float xr[S + KW - 1];
#pragma unroll
      for (int j = 0; j < S + KW - 1; ++j) xr[j] = xrow[j];
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const float wv = wrow[kw];
#pragma unroll
        for (int o = 0; o < S; ++o) acc[o] += xr[o + kw] * wv;
      }}
    }}
    T* yp = y + ((long long)n * C + c) * OH * OW + (long long)oh * OW + ow0;
#pragma unroll
    for (int o = 0; o < S; ++o)
      if (ow0 + o < OW) yp[o] = st(acc[o]);
  }}
}}
"""

_WGRAD_WINDOW = _WINDOW_COMMON + r"""
// dw[c] += sum over the block's images of dy (x) x. A thread owns S adjacent taps of a kernel row; per
// image it walks the output rows whose input row is inside the image, CH outputs at a time: the
// CH + S - 1 inputs and CH gradients in registers, CH * S products. One atomic add per tap and block.
#define CH 8
extern "C" __global__ void dw_wgrad_window(const T* __restrict__ x, const T* __restrict__ dy,
                                           float* __restrict__ dwt, int N, int C, int H, int W, int OH, int OW,
                                           int KH, int PH, int PW, int n_per_block) {{
  extern __shared__ float sm[];
  const int ksegs = (KW + S - 1) / S, owp = (OW + CH - 1) / CH * CH, wp = owp + ksegs * S - 1;
  float* xs = sm;              // H x wp: column j holds input column j - PW
  float* gs = sm + H * wp;     // OH x owp: dy, zeros beyond OW
  const int c = blockIdx.x, tid = threadIdx.x;
  const int n0 = blockIdx.y * n_per_block, n1 = min(N, n0 + n_per_block);
  const int tasks = KH * ksegs;
  const int t = tid;           // one task per thread (the block has at least KH * ksegs threads)
  const int kh = t / ksegs, kw0 = (t % ksegs) * S;
  float acc[S];
#pragma unroll
  for (int o = 0; o < S; ++o) acc[o] = 0.f;
  for (int n = n0; n < n1; ++n) {{
    const long long nc = (long long)n * C + c;
    for (int i = tid; i < H * wp; i += blockDim.x) {{
      const int r = i / wp, iw = i % wp - PW;
      xs[i] = (iw >= 0 && iw < W) ? ld(x + nc * H * W + (long long)r * W + iw) : 0.f;
    }}
    for (int i = tid; i < OH * owp; i += blockDim.x) {{
      const int r = i / owp, col = i % owp;
      gs[i] = col < OW ? ld(dy + nc * OH * OW + (long long)r * OW + col) : 0.f;
    }}
    __syncthreads();
    if (t < tasks) {{
      const int oh_lo = max(0, PH - kh), oh_hi = min(OH, H + PH - kh);
      for (int oh = oh_lo; oh < oh_hi; ++oh) {{
        const float* xrow = xs + (oh - PH + kh) * wp + kw0;
        const float* grow = gs + oh * owp;
        for (int ow0 = 0; ow0 < owp; ow0 += CH) {{
          float xr[CH + S - 1], gr[CH];
#pragma unroll
          for (int j = 0; j < CH + S - 1; ++j) xr[j] = xrow[ow0 + j];
#pragma unroll
          for (int j = 0; j < CH; ++j) gr[j] = grow[ow0 + j];
#pragma unroll
          for (int j = 0; j < CH; ++j)
#pragma unroll
            for (int o = 0; o < S; ++o) acc[o] += gr[j] * xr[j + o];
        }}
      }}
    }}
    __syncthreads();
  }}
  if (t < tasks) {{
#pragma unroll
    for (int o = 0; o < S; ++o)
      if (kw0 + o < KW) atomicAdd(dwt + (long long)c * KH * KW + kh * KW + kw0 + o, acc[o]);
  }}
}}
"""


_SOURCES = {"fwd": (_FWD, "dw_fwd"), "dgrad": (_DGRAD, "dw_dgrad"), "wgrad": (_WGRAD, "dw_wgrad"),
            "tiled-fwd": (_FWD_TILED, "dw_fwd_tiled"), "tiled-wgrad": (_WGRAD_TILED, "dw_wgrad_tiled"),
            "window-fwd": (_FWD_WINDOW, "dw_fwd_window"), "window-wgrad": (_WGRAD_WINDOW, "dw_wgrad_window")}
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
    ``ld`` and rounding stores ``st``: :data:`convtune.direct.depthwise_nhwc.ELEMENT_TYPES`; sums in float32)."""
    code, name = source(which, kh, kw, dh, dw, rows, by, dtype), _SOURCES[which][1]
    kernel = cp.RawKernel(code, name, options=("--std=c++14",))
    kernel.compile()  # at build time, so no first call pays for NVRTC (the planner compares first runs)
    return kernel


def source(which: str, kh: int, kw: int, dh: int = 1, dw: int = 1, rows: int = 1, by: int = 1,
           dtype: str = "float32") -> str:
    """The CUDA source of kernel ``which`` (:func:`_kernel`'s arguments)."""
    return ELEMENT_TYPES[dtype] + _SOURCES[which][0].format(kh=kh, kw=kw, dh=dh, dw=dw, rows=rows, by=by, s=rows)


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
