"""The CUDA source of the direct depthwise kernels (:mod:`convtune.direct.depthwise`'s): the simple, tiled and
window families' templates, each formatted with its compile-time sizes (kernel height and width, dilation, rows,
block rows) and preceded by an element type's loads and stores (:data:`convtune.direct.elements.ELEMENT_TYPES`).
Which family runs which problem, and the launches, are :mod:`convtune.direct.depthwise`'s."""

from __future__ import annotations

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

TILED_COMMON = r"""
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

_FWD_TILED = TILED_COMMON + r"""
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

_WGRAD_TILED = TILED_COMMON + r"""
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


#: kernel -> (its source template, its name)
SOURCES = {"fwd": (_FWD, "dw_fwd"), "dgrad": (_DGRAD, "dw_dgrad"), "wgrad": (_WGRAD, "dw_wgrad"),
            "tiled-fwd": (_FWD_TILED, "dw_fwd_tiled"), "tiled-wgrad": (_WGRAD_TILED, "dw_wgrad_tiled"),
            "window-fwd": (_FWD_WINDOW, "dw_fwd_window"), "window-wgrad": (_WGRAD_WINDOW, "dw_wgrad_window")}
