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
* Backward-filter: a block owns 32 channels, a group of kernel rows (at most
  :data:`REGISTER_TAPS` sums per thread, in registers) and a slice of the output rows; the warps of
  a block add their sums in shared memory, then one float32 atomic add per block and tap. A
  half-precision filter gradient is summed in a float32 workspace and rounded once at the end.
"""

from __future__ import annotations

import math

from ..compiling import compiled_once
from ..problem import ConvProblem

#: Taps a thread keeps in registers (the forward's filter; the filter gradient's accumulators per row group).
REGISTER_TAPS = 81
#: Widest kernel these kernels take (one kernel row of accumulators must fit :data:`REGISTER_TAPS`).
MAX_KW = REGISTER_TAPS
#: Channels per block (one warp's lanes: adjacent channels of a pixel).
LANES = 32

#: Each dtype's element type ``T`` (bfloat16 and float16 as their 16 bits), its widening load ``ld`` and rounding
#: store ``st`` (to nearest, ties to even): the source prefix of every kernel that reads a problem's own memory.
ELEMENT_TYPES = {
    "float32": r"""
typedef float T;
__device__ __forceinline__ float ld(const T* p) { return __ldg(p); }
__device__ __forceinline__ T st(float v) { return v; }
""",
    "bfloat16": r"""
typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p) { return __uint_as_float(((unsigned int)__ldg(p)) << 16); }
__device__ __forceinline__ T st(float v) {  // round to nearest, ties to even; NaN stays NaN
  unsigned int u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (T)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (T)(u >> 16);
}
""",
    "float16": r"""
typedef unsigned short T;
__device__ __forceinline__ float ld(const T* p) {
  const unsigned short h = __ldg(p);
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ T st(float v) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
}
""",
}

_COMMON = r"""
#define KH {kh}
#define KW {kw}
#define SW {sw}
#define DWL {dwl}
#define R {r}
#define KK (KH * KW)
#define SPAN ((R - 1) * SW + (KW - 1) * DWL + 1)

// The kernel column that input j of a row's span is for output o of R adjacent ones (-1: none); a
// compile-time constant wherever the loops over j and o are unrolled.
__device__ __forceinline__ int tap_of(int j, int o) {{
  const int d = j - o * SW;
  return d >= 0 && d % DWL == 0 && d / DWL < KW ? d / DWL : -1;
}}

// f(j, v) for each input v of the span of R adjacent outputs in row xr that lies inside the image (columns
// iw0 .. iw0 + SPAN - 1; channel stride C)
template <typename F>
__device__ __forceinline__ void each_in_span(const T* __restrict__ xr, int iw0, int W, int C, F f) {{
#pragma unroll
  for (int j = 0; j < SPAN; ++j) {{
    const int iw = iw0 + j;
    if (iw >= 0 && iw < W) f(j, ld(xr + iw * C));
  }}
}}
"""

_FWD = _COMMON + r"""
#define FLIP {flip}
#define BY {by}
#define WREG (KK <= {register_taps})
// y[n, oh, ow, c] = sum over taps of x[n, oh*sh - ph + kh*dh, ow*SW - pw + kw*DWL, c] * w[c, kh, kw]
// (FLIP: the filter reversed, which with dy in and padding dil*(k-1) - pad is backward-data at stride 1).
// A block owns 32 channels (blockIdx.x) and output rows (n, oh) blockIdx.y, blockIdx.y + gridDim.y, ...; its
// warps take the row's segments of R outputs in turn. The 32 channels' taps are read once per block, coalesced,
// through shared memory into registers.
extern "C" __global__ void __launch_bounds__(32 * BY) dwl_fwd(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int C, int H, int W, int OH, int OW, int sh, int ph, int pw, int dh) {{
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c0 = blockIdx.x * 32, c = c0 + tx;
  const bool active = c < C;
#if WREG
  __shared__ float wsh[KK][33];
  for (int i = ty * 32 + tx; i < 32 * KK; i += 32 * BY) {{
    const int cc = i / KK, k = i % KK;  // consecutive threads read consecutive taps of the block's channels
    wsh[k][cc] = c0 + cc < C ? ld(w + (long long)(c0 + cc) * KK + (FLIP ? KK - 1 - k : k)) : 0.f;
  }}
  __syncthreads();
  float wr[KK];
#pragma unroll
  for (int k = 0; k < KK; ++k) wr[k] = wsh[k][tx];
#else
  const T* wc = w + (long long)c * KK;
#endif
  if (!active) return;
  const int segs = (OW + R - 1) / R;
  const int rows = N * OH;
  const int WC = W * C;
  for (int row = blockIdx.y; row < rows; row += gridDim.y) {{
    const int n = row / OH, oh = row - n * OH;
    const T* xn = x + (long long)n * H * WC + c;
    T* yrow = y + (long long)row * OW * C + c;
    for (int seg = ty; seg < segs; seg += BY) {{
      const int ow0 = seg * R;
      const int iw0 = ow0 * SW - pw;
      float acc[R];
#pragma unroll
      for (int o = 0; o < R; ++o) acc[o] = 0.f;
#if WREG
#pragma unroll
#else
#pragma unroll 1
#endif
      for (int kh = 0; kh < KH; ++kh) {{
        const int ih = oh * sh - ph + kh * dh;
        if (ih < 0 || ih >= H) continue;
        each_in_span(xn + (long long)ih * WC, iw0, W, C, [&](int j, float v) {{
#pragma unroll
          for (int o = 0; o < R; ++o) {{
            const int kw = tap_of(j, o);
            if (kw >= 0) {{
#if WREG
              acc[o] += v * wr[kh * KW + kw];
#else
              acc[o] += v * ld(wc + (FLIP ? KK - 1 - (kh * KW + kw) : kh * KW + kw));
#endif
            }}
          }}
        }});
      }}
#pragma unroll
      for (int o = 0; o < R; ++o)
        if (ow0 + o < OW) yrow[(ow0 + o) * C] = st(acc[o]);
    }}
  }}
}}
"""

_DGRAD = _COMMON + r"""
// dx[n, ih, iw, c] = sum of dy[n, oh, ow, c] * w[c, kh, kw] over ih = oh*sh - ph + kh*dh, iw = ow*sw - pw + kw*dw
// (any stride: a gather, one input pixel per thread; R and SW are 1 here, the strides run-time)
extern "C" __global__ void dwl_dgrad(const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
                                     int N, int C, int H, int W, int OH, int OW, int sh, int sw, int ph, int pw,
                                     int dh, int dw) {{
  const int c = blockIdx.x * 32 + threadIdx.x;
  if (c >= C) return;
  const T* wc = w + (long long)c * KK;
  const long long positions = (long long)N * H * W;
  for (long long p = blockIdx.y * (long long)blockDim.y + threadIdx.y; p < positions;
       p += (long long)gridDim.y * blockDim.y) {{
    const int iw = p % W;
    const long long t = p / W;
    const int ih = t % H;
    const long long n = t / H;
    const T* dn = dy + n * OH * OW * C + c;
    float acc = 0.f;
    for (int kh = 0; kh < KH; ++kh) {{
      const int th = ih + ph - kh * dh;
      if (th < 0 || th % sh) continue;
      const int oh = th / sh;
      if (oh >= OH) continue;
      for (int kw = 0; kw < KW; ++kw) {{
        const int tw = iw + pw - kw * dw;
        if (tw < 0 || tw % sw) continue;
        const int ow = tw / sw;
        if (ow < OW) acc += ld(dn + ((long long)oh * OW + ow) * C) * ld(wc + kh * KW + kw);
      }}
    }}
    dx[p * C + c] = st(acc);
  }}
}}
"""

_WGRAD = _COMMON + r"""
#define KHG {khg}
#define BY {by}
// dw[c, kh, kw] = sum over n, oh, ow of dy[n, oh, ow, c] * x[n, oh*sh - ph + kh*dh, ow*SW - pw + kw*DWL, c],
// kernel rows kh0 .. kh0 + KHG - 1 (blockIdx.z), summed into float32 dwt (zeroed before). A block owns 32
// channels and the output rows blockIdx.y, blockIdx.y + gridDim.y, ...; its warps take each row's segments of R
// outputs in turn.
extern "C" __global__ void __launch_bounds__(32 * BY) dwl_wgrad(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dwt,
    int N, int C, int H, int W, int OH, int OW, int sh, int ph, int pw, int dh) {{
  __shared__ float red[KHG * KW][32];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const int kh0 = blockIdx.z * KHG;
  for (int i = ty * 32 + tx; i < KHG * KW * 32; i += 32 * BY) (&red[0][0])[i] = 0.f;
  __syncthreads();
  float acc[KHG * KW];
#pragma unroll
  for (int k = 0; k < KHG * KW; ++k) acc[k] = 0.f;
  if (c < C) {{
    const int segs = (OW + R - 1) / R;
    const int rows = N * OH;
    const int WC = W * C;
    for (int row = blockIdx.y; row < rows; row += gridDim.y) {{
      const int n = row / OH, oh = row - n * OH;
      const T* xn = x + (long long)n * H * WC + c;
      const T* drow = dy + (long long)row * OW * C + c;
      for (int seg = ty; seg < segs; seg += BY) {{
        const int ow0 = seg * R;
        const int iw0 = ow0 * SW - pw;
        float g[R];
#pragma unroll
        for (int o = 0; o < R; ++o) g[o] = ow0 + o < OW ? ld(drow + (ow0 + o) * C) : 0.f;
#pragma unroll
        for (int r = 0; r < KHG; ++r) {{
          const int ih = oh * sh - ph + (kh0 + r) * dh;
          if (kh0 + r >= KH || ih < 0 || ih >= H) continue;
          each_in_span(xn + (long long)ih * WC, iw0, W, C, [&](int j, float v) {{
#pragma unroll
            for (int o = 0; o < R; ++o)
              if (tap_of(j, o) >= 0) acc[r * KW + tap_of(j, o)] += g[o] * v;
          }});
        }}
      }}
    }}
  }}
#pragma unroll
  for (int k = 0; k < KHG * KW; ++k) atomicAdd(&red[k][tx], acc[k]);
  __syncthreads();
  if (c < C)
    for (int k = ty; k < KHG * KW; k += BY)
      if (kh0 + k / KW < KH) atomicAdd(dwt + (long long)c * KK + kh0 * KW + k, red[k][tx]);
}}

"""

_FWD_TILED = _COMMON + r"""
#define FLIP {flip}
#define BY {by}
#define TH {th}
#define TW {tw}
#define DH {dh}
#define IN_H ((TH - 1) + (KH - 1) * DH + 1)
#define IN_W ((TW - 1) + (KW - 1) * DWL + 1)
#define SEGS (TW / R)
#define PER ((IN_H * IN_W + BY - 1) / BY)
#define CHUNK 16
// Stride-1 tiles: a block owns 32 channels (blockIdx.x) and tiles of TH x TW outputs of one image
// (blockIdx.y, blockIdx.y + gridDim.y, ...). Its warps copy the tile's input with the halo into shared memory
// (one pixel's 32 channels per warp load, zeros outside the image), then each thread adds up R adjacent
// outputs of one row from there, the channel's taps in registers (read once per block, as in dwl_fwd).
extern "C" __global__ void __launch_bounds__(32 * BY) dwl_fwd_tiled(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw) {{
  __shared__ float tile[IN_H * IN_W][32];
  __shared__ float wsh[KK][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c0 = blockIdx.x * 32, c = c0 + tx;
  const bool active = c < C;
  for (int i = ty * 32 + tx; i < 32 * KK; i += 32 * BY) {{
    const int cc = i / KK, k = i % KK;
    wsh[k][cc] = c0 + cc < C ? ld(w + (long long)(c0 + cc) * KK + (FLIP ? KK - 1 - k : k)) : 0.f;
  }}
  __syncthreads();
  float wr[KK];
#pragma unroll
  for (int k = 0; k < KK; ++k) wr[k] = wsh[k][tx];
  const int tiles_w = (OW + TW - 1) / TW, tiles_h = (OH + TH - 1) / TH;
  const int tiles = N * tiles_h * tiles_w;
  for (int t = blockIdx.y; t < tiles; t += gridDim.y) {{
    const int tw_i = t % tiles_w, rest = t / tiles_w;
    const int th_i = rest % tiles_h, n = rest / tiles_h;
    const int oh0 = th_i * TH, ow0 = tw_i * TW;
    const T* xn = x + (long long)n * H * W * C + c;
    __syncthreads();  // the previous tile's reads are done
    // the tile's pixels, CHUNK loads in flight per thread before any is stored (one at a time, each load's
    // latency would be paid in turn)
    for (int base = 0; base < PER; base += CHUNK) {{
      float v[CHUNK];
#pragma unroll
      for (int k = 0; k < CHUNK; ++k) {{
        const int i = ty + (base + k) * BY;
        const int ih = oh0 - ph + i / IN_W, iw = ow0 - pw + i % IN_W;
        v[k] = active && i < IN_H * IN_W && ih >= 0 && ih < H && iw >= 0 && iw < W ?
            ld(xn + ((long long)ih * W + iw) * C) : 0.f;
      }}
#pragma unroll
      for (int k = 0; k < CHUNK; ++k) {{
        const int i = ty + (base + k) * BY;
        if (i < IN_H * IN_W) tile[i][tx] = v[k];
      }}
    }}
    __syncthreads();
    if (active) {{
      for (int item = ty; item < TH * SEGS; item += BY) {{
        const int r = item / SEGS, o0 = (item % SEGS) * R;
        if (oh0 + r >= OH || ow0 + o0 >= OW) continue;
        float acc[R];
#pragma unroll
        for (int o = 0; o < R; ++o) acc[o] = 0.f;
#pragma unroll
        for (int kh = 0; kh < KH; ++kh) {{
          const float* trow = &tile[(r + kh * DH) * IN_W + o0][tx];
#pragma unroll
          for (int j = 0; j < SPAN; ++j) {{
            const float v = trow[j * 32];
#pragma unroll
            for (int o = 0; o < R; ++o)
              if (tap_of(j, o) >= 0) acc[o] += v * wr[kh * KW + tap_of(j, o)];
          }}
        }}
        T* yp = y + (((long long)n * OH + oh0 + r) * OW + ow0 + o0) * C + c;
#pragma unroll
        for (int o = 0; o < R; ++o)
          if (ow0 + o0 + o < OW) yp[(long long)o * C] = st(acc[o]);
      }}
    }}
  }}
}}
"""

_WGRAD_TILED = _COMMON + r"""
#define BY {by}
#define TH {th}
#define TW {tw}
#define DH {dh}
#define IN_H ((TH - 1) + (KH - 1) * DH + 1)
#define IN_W ((TW - 1) + (KW - 1) * DWL + 1)
#define SEGS (TW / R)
#define ROWS_PER_WARP ((KH + BY - 1) / BY)
#define CHUNK 16
// Stride-1 filter gradient in tiles: a block owns 32 channels (blockIdx.x) and tiles of TH x TW outputs
// (blockIdx.y, blockIdx.y + gridDim.y, ...): it copies the tile's dy and its input with the halo into shared
// memory, then warp ty adds up kernel rows ty, ty + BY, ... of its channels' filter gradient over the tile (a
// thread: R outputs' dy and the inputs they read, in registers, KW sums per kernel row), the sums kept across
// tiles; at the end one float32 atomic add per block and tap into dwt (zeroed before).
__device__ __forceinline__ void copy_tile(float (*dst)[32], const T* __restrict__ src, int rows, int cols,
                                          int r0, int c0, int H, int W, int C, bool active, int ty) {{
  const int count = rows * cols;
  for (int base = ty; base < count; base += CHUNK * BY) {{
    float v[CHUNK];
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {{
      const int i = base + k * BY;
      const int r = r0 + i / cols, c = c0 + i % cols;
      v[k] = active && i < count && r >= 0 && r < H && c >= 0 && c < W ? ld(src + ((long long)r * W + c) * C) : 0.f;
    }}
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {{
      const int i = base + k * BY;
      if (i < count) dst[i][threadIdx.x] = v[k];
    }}
  }}
}}

extern "C" __global__ void __launch_bounds__(32 * BY) dwl_wgrad_tiled(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dwt,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw) {{
  __shared__ float xs[IN_H * IN_W][32];
  __shared__ float gs[TH * TW][32];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.x * 32 + tx;
  const bool active = c < C;
  float acc[ROWS_PER_WARP * KW];
#pragma unroll
  for (int k = 0; k < ROWS_PER_WARP * KW; ++k) acc[k] = 0.f;
  const int tiles_w = (OW + TW - 1) / TW, tiles_h = (OH + TH - 1) / TH;
  const int tiles = N * tiles_h * tiles_w;
  for (int t = blockIdx.y; t < tiles; t += gridDim.y) {{
    const int tw_i = t % tiles_w, rest = t / tiles_w;
    const int th_i = rest % tiles_h, n = rest / tiles_h;
    const int oh0 = th_i * TH, ow0 = tw_i * TW;
    __syncthreads();  // the previous tile's reads are done
    copy_tile(xs, x + (long long)n * H * W * C + c, IN_H, IN_W, oh0 - ph, ow0 - pw, H, W, C, active, ty);
    copy_tile(gs, dy + (long long)n * OH * OW * C + c, TH, TW, oh0, ow0, OH, OW, C, active, ty);  // zeros beyond
    __syncthreads();
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; ++q) {{
      const int kh = ty + q * BY;
      if (kh >= KH) continue;
      for (int r = 0; r < TH; ++r) {{
#pragma unroll 1
        for (int sg = 0; sg < SEGS; ++sg) {{
          float g[R];
#pragma unroll
          for (int o = 0; o < R; ++o) g[o] = gs[r * TW + sg * R + o][tx];
          const float* xrow = &xs[(r + kh * DH) * IN_W + sg * R][tx];
#pragma unroll
          for (int j = 0; j < SPAN; ++j) {{
            const float v = xrow[j * 32];
#pragma unroll
            for (int o = 0; o < R; ++o)
              if (tap_of(j, o) >= 0) acc[q * KW + tap_of(j, o)] += g[o] * v;
          }}
        }}
      }}
    }}
  }}
  if (active) {{
#pragma unroll
    for (int q = 0; q < ROWS_PER_WARP; ++q) {{
      const int kh = ty + q * BY;
      if (kh < KH)
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) atomicAdd(dwt + (long long)c * KK + kh * KW + kw, acc[q * KW + kw]);
    }}
  }}
}}
"""

_CAST = r"""
// float32 sums rounded into a half-precision filter gradient's memory
extern "C" __global__ void dw_cast(const float* __restrict__ s, T* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
    out[i] = st(s[i]);
}
"""

_SOURCES = {"fwd": (_FWD, ("dwl_fwd",)), "fwd-tiled": (_FWD_TILED, ("dwl_fwd_tiled",)), "dgrad": (_DGRAD, ("dwl_dgrad",)),
            "wgrad": (_WGRAD, ("dwl_wgrad",)), "wgrad-tiled": (_WGRAD_TILED, ("dwl_wgrad_tiled",))}


def source(which: str, dtype: str, kh: int, kw: int, sw: int = 1, dwl: int = 1, r: int = 1, flip: int = 0,
           khg: int = 1, by: int = 1, th: int = 1, tw: int = 1, dh: int = 1) -> str:
    """The CUDA source of kernel ``which`` (:func:`_kernels`'s arguments)."""
    return ELEMENT_TYPES[dtype] + _SOURCES[which][0].format(kh=kh, kw=kw, sw=sw, dwl=dwl, r=r, flip=flip, khg=khg, by=by,
                                                           th=th, tw=tw, dh=dh, register_taps=REGISTER_TAPS)


@compiled_once
def _kernels(cp, which: str, dtype: str, kh: int, kw: int, sw: int = 1, dwl: int = 1, r: int = 1, flip: int = 0,
             khg: int = 1, by: int = 1, th: int = 1, tw: int = 1, dh: int = 1):
    code = source(which, dtype, kh, kw, sw, dwl, r, flip, khg, by, th, tw, dh)
    module = cp.RawModule(code=code, options=("--std=c++14",))
    # the launchable functions, compiled here at build time: no first call pays for NVRTC
    return tuple(module.get_function(name).kernel for name in _SOURCES[which][1])


@compiled_once
def cast_kernel(cp, dtype: str):
    """``k(sums, out, n)``, a launchable function: ``n`` float32 sums rounded into ``dtype``'s memory (bfloat16 as its
    16 bits), the last step of a half-precision filter gradient (these kernels' and the channels-first ones')."""
    module = cp.RawModule(code=ELEMENT_TYPES[dtype] + _CAST, options=("--std=c++14",))
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


def workspace_bytes(p: ConvProblem) -> int:
    """The float32 sums of a half-precision filter gradient (none otherwise)."""
    return 4 * p.in_channels * math.prod(p.kernel_size) if p.pass_ == "wgrad" and p.dtype != "float32" else 0


class NhwcDepthwiseConv:
    """One channels-last depthwise problem's executor on CuPy: ``rows`` outputs per thread along the row,
    ``threads // 32`` warps per block (32 channels each).

    :meth:`launch` runs on channels-last memory of the problem's dtype (bfloat16 as 16-bit numbers) by address:
    the PyTorch bridge's path; :func:`convtune.precision.launched` makes the array executor of it."""

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int, rows: int = 1, tiled: bool = False):
        why = tiled_reason(p, rows) if tiled else reason(p)
        if why:
            raise ValueError(f"channels-last depthwise kernel: {why}")
        if threads % LANES or not LANES <= threads <= 1024:
            raise ValueError(f"channels-last depthwise kernel: threads must be a multiple of {LANES} up to 1024, "
                             f"not {threads}")
        self.cp, self.p, self.rows = cp, p, rows
        H, W, OH, OW, KH, KW, SH, SW, PH, PW, DH, DW = dims(p)
        C = p.in_channels
        cx = math.ceil(C / LANES)
        self.workspace = workspace_bytes(p)
        self.cast = None
        self.result_bytes = 4 * C * KH * KW
        i32 = cp.int32
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
        if self.cast is None:
            if self.p.pass_ == "wgrad":  # float32: the sums go straight into the zeroed result
                self.cp.cuda.runtime.memsetAsync(out, 0, self.result_bytes, stream.ptr)
            self.kernel(self.grid, self.block, (a, b, out, *self.args), 0, stream)
            return
        if workspace is None:
            raise ValueError(f"a half-precision filter gradient needs a workspace of {self.workspace} bytes")
        self.cp.cuda.runtime.memsetAsync(workspace, 0, self.result_bytes, stream.ptr)
        self.kernel(self.grid, self.block, (a, b, workspace, *self.args), 0, stream)
        self.cast(self.cast_grid, (256,), (workspace, out, *self.cast_args), 0, stream)
