"""The CUDA source of the channels-last depthwise kernels (:mod:`convtune.direct.depthwise_nhwc`'s): their templates,
each formatted with its compile-time sizes and preceded by an element type's loads and stores
(:data:`convtune.direct.elements.ELEMENT_TYPES`), and the cast that rounds float32 sums into half-precision memory.
Which problems they take, their tiles and their launches are :mod:`convtune.direct.depthwise_nhwc`'s."""

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

_FWD_VEC = r"""
#define KH {kh}
#define KW {kw}
#define R {r}
#define RH {rh}
#define V {v}
#define KK (KH * KW)
#define SPAN (R + KW - 1)
// V adjacent channels of one pixel, loaded and stored as one vector
struct __align__(V * sizeof(T)) VecT {{ T e[V]; }};

// f(n, oh0, ow0) for each of the thread's blocks of RH x R outputs (threadIdx.y, then blockIdx.y, over the images'
// groups of RH rows and their segments of R outputs): its image, first row and first column
template <typename F>
__device__ __forceinline__ void vec_blocks(int N, int OH, int OW, F f) {{
  const int segs = (OW + R - 1) / R, hgroups = (OH + RH - 1) / RH;
  const long long items = (long long)N * hgroups * segs;
  for (long long it = blockIdx.y * (long long)blockDim.y + threadIdx.y; it < items;
       it += (long long)gridDim.y * blockDim.y) {{
    const int seg = it % segs;
    const long long hg = it / segs;
    const int n = hg / hgroups;
    f(n, (int)(hg - (long long)n * hgroups) * RH, seg * R);
  }}
}}

// xs[j] = the V channels of input row xr's column iw0 + j, for the SPAN columns of R adjacent outputs (zeros outside
// the image)
__device__ __forceinline__ void vec_span(const T* __restrict__ xr, int iw0, int W, int C, float (&xs)[SPAN][V]) {{
#pragma unroll
  for (int j = 0; j < SPAN; ++j) {{
    // (every column loaded, one outside the image from column 0 and dropped: the loads issue together, none waits
    // on a branch)
    const int iw = iw0 + j;
    const bool in = iw >= 0 && iw < W;
    const VecT u = *reinterpret_cast<const VecT*>(xr + (long long)(in ? iw : 0) * C);
#pragma unroll
    for (int v = 0; v < V; ++v) xs[j][v] = in ? cv(u.e[v]) : 0.f;
  }}
}}

// f(q, kh, xs) for each output row oh0 + q of a block of RH x R outputs and each kernel row kh that meets it: xs the
// input row oh0 + q - ph + kh's SPAN x V inputs of the block's columns (from iw0), each input row loaded once for
// every output row it meets (rows outside the image skipped); xn: the image's first pixel at the thread's channels
template <typename F>
__device__ __forceinline__ void vec_window(const T* __restrict__ xn, int oh0, int ph, int iw0, int H, int W, int C,
                                           F f) {{
#pragma unroll
  for (int kr = 0; kr < KH + RH - 1; ++kr) {{
    const int ih = oh0 - ph + kr;
    if (ih < 0 || ih >= H) continue;
    float xs[SPAN][V];
    vec_span(xn + (long long)ih * W * C, iw0, W, C, xs);
#pragma unroll
    for (int q = 0; q < RH; ++q) {{
      const int kh = kr - q;
      if (kh >= 0 && kh < KH) f(q, kh, xs);
    }}
  }}
}}

#define FLIP {flip}
#define WSH {wsh}
// Stride and dilation 1: y[n, oh, ow, c] = sum over taps of x[n, oh - ph + kh, ow - pw + kw, c] * w[c, kh, kw]
// (FLIP: the filter reversed, which with dy in and padding k - 1 - pad is backward-data). A thread owns V adjacent
// channels (threadIdx.x along the channels: a warp's loads are runs of whole pixels) and blocks of RH x R outputs
// (threadIdx.y, then blockIdx.y, over the image rows' groups and row segments); each input row of the block's
// window is loaded once, V channels a load, and added into every output row it belongs to. The taps sit in
// registers (WSH 0) or, where V x KK would not fit there, in shared memory, read V at a time.
extern "C" __global__ void dwv_fwd(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
                                   int N, int C, int H, int W, int OH, int OW, int ph, int pw) {{
  const int G = C / V;
  const int g = blockIdx.x * blockDim.x + threadIdx.x;
  const int c = g * V;
#if WSH
  extern __shared__ float wsh[];  // [KK][blockDim.x * V]
  const int cw = blockDim.x * V, c0 = blockIdx.x * blockDim.x * V;
  for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < KK * cw; i += blockDim.x * blockDim.y) {{
    const int cc = i / KK, k = i % KK;  // consecutive threads read consecutive taps
    wsh[k * cw + cc] = c0 + cc < C ? ld(w + (long long)(c0 + cc) * KK + (FLIP ? KK - 1 - k : k)) : 0.f;
  }}
  __syncthreads();
  const float* wl = wsh + threadIdx.x * V;
#else
  float wr[KK][V];
#pragma unroll
  for (int k = 0; k < KK; ++k)
#pragma unroll
    for (int v = 0; v < V; ++v) wr[k][v] = g < G ? ld(w + (long long)(c + v) * KK + (FLIP ? KK - 1 - k : k)) : 0.f;
#endif
  if (g >= G) return;
  vec_blocks(N, OH, OW, [&](int n, int oh0, int ow0) {{
    float acc[RH][R][V];
#pragma unroll
    for (int q = 0; q < RH; ++q)
#pragma unroll
      for (int o = 0; o < R; ++o)
#pragma unroll
        for (int v = 0; v < V; ++v) acc[q][o][v] = 0.f;
    const T* xn = x + (long long)n * H * W * C + c;
    vec_window(xn, oh0, ph, ow0 - pw, H, W, C, [&](int q, int kh, const float (&xs)[SPAN][V]) {{
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        float wv[V];
#pragma unroll
        for (int v = 0; v < V; ++v)
#if WSH
          wv[v] = wl[(kh * KW + kw) * cw + v];
#else
          wv[v] = wr[kh * KW + kw][v];
#endif
#pragma unroll
        for (int o = 0; o < R; ++o)
#pragma unroll
          for (int v = 0; v < V; ++v) acc[q][o][v] += xs[o + kw][v] * wv[v];
      }}
    }});
#pragma unroll
    for (int q = 0; q < RH; ++q) {{
      if (oh0 + q >= OH) break;
      T* yp = y + (((long long)n * OH + oh0 + q) * OW + ow0) * C + c;
#pragma unroll
      for (int o = 0; o < R; ++o) {{
        if (ow0 + o < OW) {{
          VecT u;
#pragma unroll
          for (int v = 0; v < V; ++v) u.e[v] = st(acc[q][o][v]);
          *reinterpret_cast<VecT*>(yp + (long long)o * C) = u;
        }}
      }}
    }}
  }});
}}
"""

CAST = r"""
// float32 sums rounded into a half-precision filter gradient's memory
extern "C" __global__ void dw_cast(const float* __restrict__ s, T* __restrict__ out, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)blockDim.x * gridDim.x)
    out[i] = st(s[i]);
}
"""

#: kernel -> (its source template, its functions' names)
SOURCES = {"fwd": (_FWD, ("dwl_fwd",)), "fwd-tiled": (_FWD_TILED, ("dwl_fwd_tiled",)), "dgrad": (_DGRAD, ("dwl_dgrad",)),
            "wgrad": (_WGRAD, ("dwl_wgrad",)), "wgrad-tiled": (_WGRAD_TILED, ("dwl_wgrad_tiled",)),
           "fwd-vec": (_FWD_VEC, ("dwv_fwd",))}
