"""The CUDA source of the staged channels-last depthwise kernels (:mod:`convtune.direct.depthwise_nhwc`'s ``staged``
launch): dilation 1, stride ``SH x SW``, 16-bit or float32 operands in their own memory, a block's
tile of input (and, for the filter gradient, of dy) copied into shared memory by 16-byte loads before any thread reads
it.

A block owns ``2P`` adjacent channels (a thread: two of them, ``P`` threads side by side across the block's channels)
and loops over tiles of ``TH`` output rows by ``S x SEGW`` columns of one image.

* Forward (and stride-1 backward-data: the forward of dy with the filter reversed): a thread owns ``SEGW`` adjacent
  outputs of one row of the tile; it reads each of the ``KH`` input rows they meet once from shared memory into
  registers (``(SEGW - 1) * SW + KW`` inputs of a row) and adds every tap's products; the taps are read from shared
  memory, two channels at once.
* Backward-data at a stride over 1 (``dgrad-staged``): by phases; a thread owns ``SEGW`` outputs of one row ``SW``
  columns apart, which meet the same taps (every ``SH``-th kernel row and ``SW``-th column) and adjacent dy columns.
* Filter gradient: a thread owns one kernel row of its two channels (``KW`` sums each) and a segment of ``SEGW``
  columns; over the tile's rows it reads the input row its kernel row meets and dy's row once each into registers
  (dy's reads are broadcasts: the threads of the other kernel rows read the same words). At the end the block adds
  its threads' sums in shared memory and then into the float32 result with one atomic add per channel and tap.

``PIPE`` 1 (devices of compute capability 8.0 and above; elsewhere, and in the CPU emulator, the copies are made as
with 0): two tiles' buffers, the next tile's copies issued asynchronously (``cp.async``, straight into shared memory)
before the threads work on the current one, so that a block's loads and arithmetic overlap.
"""

_COMMON = r"""
#define KH {kh}
#define KW {kw}
#define P {p}
#define S {s}
#define SEGW {segw}
#define TH {th}
#define SH {sh}
#define SW {sw}
#define KK (KH * KW)
#define TW (S * SEGW)
#define IH ((TH - 1) * SH + KH)
#define IW ((TW - 1) * SW + KW)
#define SPAN ((SEGW - 1) * SW + KW)
// Pairs of a shared row of PX pixels of P pairs, padded to LEAD more than a multiple of 32 pairs, so that the rows
// threads of a warp read side by side start on different banks.
#define PADDED_ROW(PX, LEAD) ((PX) * P + ((LEAD) % 32 + 32 - ((PX) * P) % 32) % 32)
// Pairs of a shared input row: padded to P / SH (neighbouring output rows read input rows SH apart).
#define XROW PADDED_ROW(IW, P / SH)
#define GROW (TW * P)
// Pairs one 16-byte load moves, and those loads a thread issues before it stores any (kept in flight together).
#define LV (16 / (2 * (int)sizeof(T)))
#define CHUNK 4
#define PIPE {pipe}
#if PIPE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define ASYNC 1
#else
#define ASYNC 0
#endif
struct __align__(2 * sizeof(T)) PairT {{ T a, b; }};

// rows x cols pixels of one image (src: its first pixel at the block's first channel) from image row r0 and column c0
// into dst (rowp pairs a row), zeros outside the image; every thread of the block takes part.
__device__ __forceinline__ void stage(PairT* dst, int rowp, const T* __restrict__ src, int rows, int cols, int r0,
                                      int c0, int H, int W, int C) {{
  const int pieces = P / LV, count = rows * cols * pieces;
  for (int base = threadIdx.x; base < count; base += CHUNK * blockDim.x) {{
    uint4 u[CHUNK];
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {{
      const int i = base + k * blockDim.x;
      const int px = i / pieces, r = px / cols, col = px % cols;
      const int ir = r0 + r, ic = c0 + col;
      u[k] = make_uint4(0u, 0u, 0u, 0u);
      if (i < count && ir >= 0 && ir < H && ic >= 0 && ic < W)
        u[k] = __ldg(reinterpret_cast<const uint4*>(src + ((long long)ir * W + ic) * C) + i % pieces);
    }}
#pragma unroll
    for (int k = 0; k < CHUNK; ++k) {{
      const int i = base + k * blockDim.x;
      if (i < count) {{
        const int px = i / pieces;
        *reinterpret_cast<uint4*>(dst + (px / cols) * rowp + (px % cols) * P + (i % pieces) * LV) = u[k];
      }}
    }}
  }}
}}

// As stage, by asynchronous copies (ASYNC: cp.async, 16 bytes each, a copy of no bytes filling zeros outside the
// image) that the caller commits and waits for; without ASYNC (PIPE 0, or a device before compute capability 8.0),
// stage itself.
__device__ __forceinline__ void stage_async(PairT* dst, int rowp, const T* __restrict__ src, int rows, int cols,
                                            int r0, int c0, int H, int W, int C) {{
#if ASYNC
  const int pieces = P / LV, count = rows * cols * pieces;
  for (int i = threadIdx.x; i < count; i += blockDim.x) {{
    const int px = i / pieces, r = px / cols, col = px % cols;
    const int ir = r0 + r, ic = c0 + col;
    const bool in = ir >= 0 && ir < H && ic >= 0 && ic < W;
    const T* from = in ? src + ((long long)ir * W + ic) * C + (i % pieces) * 2 * LV : src;
    const unsigned to = (unsigned)__cvta_generic_to_shared(dst + r * rowp + col * P + (i % pieces) * LV);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(to), "l"(from), "r"(in ? 16 : 0));
  }}
#else
  stage(dst, rowp, src, rows, cols, r0, c0, H, W, C);
#endif
}}

// The asynchronous copies issued since the last commit, made one group; waiting for all groups but the newest.
__device__ __forceinline__ void commit_copies() {{
#if ASYNC
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}}
__device__ __forceinline__ void wait_but_newest() {{
#if ASYNC
  asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}}

// The tile loop's steps: load(t, buf) copies tile t into buffer buf (ASYNC: by asynchronous copies, committed and
// waited for here). first_tile before the loop issues the block's first tile's copies (PIPE); next_tile at the top of
// step k (tile t) waits for every thread's reads of the previous tile (and whatever the block wrote to shared memory
// before the loop), has tile t's copies made (PIPE: issued the step before; the next tile's issued now, into the other
// buffer) and waits for them.
template <class Load>
__device__ __forceinline__ void first_tile(int tiles, Load load) {{
  if (PIPE && blockIdx.y < tiles) load(blockIdx.y, 0);
  commit_copies();
}}
template <class Load>
__device__ __forceinline__ void next_tile(int t, int k, int tiles, Load load) {{
  __syncthreads();
  if (PIPE) {{
    if (t + gridDim.y < tiles) load(t + gridDim.y, (k + 1) & 1);
    commit_copies();
    wait_but_newest();
  }} else {{
    load(t, 0);
  }}
  __syncthreads();
}}

// The block's shared memory (16-byte aligned).
__device__ __forceinline__ unsigned char* shared_bytes() {{
  extern __shared__ uint4 shared16[];
  return reinterpret_cast<unsigned char*>(shared16);
}}

// The tile of the loop's step t (tiles of TH x tw outputs): its image n and first output row and column.
__device__ __forceinline__ void tile_of(int t, int OH, int OW, int& n, int& oh0, int& ow0, int tw = TW) {{
  const int tiles_w = (OW + tw - 1) / tw, tiles_h = (OH + TH - 1) / TH;
  ow0 = (t % tiles_w) * tw;
  const int rest = t / tiles_w;
  oh0 = (rest % tiles_h) * TH;
  n = rest / tiles_h;
}}

// The block's channels' taps (from channel c0) read once into the start of shared memory as float2 [KK][P] (flip:
// the filter reversed), every thread taking part; the tiles go after them.
__device__ __forceinline__ float2* shared_taps(const T* __restrict__ w, int c0, int flip) {{
  float2* ws = reinterpret_cast<float2*>(shared_bytes());
  for (int i = threadIdx.x; i < KK * P; i += blockDim.x) {{
    const int q = i % P, k = i / P, kk = flip ? KK - 1 - k : k;
    ws[i] = make_float2(ld(w + (long long)(c0 + 2 * q) * KK + kk), ld(w + (long long)(c0 + 2 * q + 1) * KK + kk));
  }}
  return ws;
}}

// The span of a thread's outputs' inputs, N pixels of a shared row (P pairs apart), widened.
template <int N>
__device__ __forceinline__ void load_span(const PairT* row, float (&a)[N], float (&b)[N]) {{
#pragma unroll
  for (int j = 0; j < N; ++j) {{
    const PairT u = row[j * P];
    a[j] = cv(u.a);
    b[j] = cv(u.b);
  }}
}}

// A thread's SEGW outputs of two channels into out (the first's pair), step pixels apart: those whose column (from
// col, step apart) is before cols.
__device__ __forceinline__ void store_segment(T* out, const float (&acc)[SEGW][2], int col, int step, int cols,
                                              int C) {{
#pragma unroll
  for (int o = 0; o < SEGW; ++o) {{
    if (col + step * o < cols) {{
      PairT u;
      u.a = st(acc[o][0]);
      u.b = st(acc[o][1]);
      *reinterpret_cast<PairT*>(out + (long long)step * o * C) = u;
    }}
  }}
}}
"""

_FWD = _COMMON + r"""
#define FLIP {flip}
// y[n, oh, ow, c] = sum over taps of x[n, oh * SH - ph + kh, ow * SW - pw + kw, c] * w[c, kh, kw] (FLIP, at stride
// 1: the filter reversed; with dy in and padding k - 1 - pad, backward-data). Threads: P along the channels, then TH along the tile's rows,
// then S along its column segments. Shared memory: the taps as float2 [KK][P], then the input tile [IH][XROW] pairs
// (PIPE: two such tiles, the next one's copies in flight while the threads read the current one).
extern "C" __global__ void __launch_bounds__(P * TH * S) dws_fwd(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw) {{
  const int c0 = blockIdx.x * 2 * P;
  const float2* ws = shared_taps(w, c0, FLIP);
  PairT* xs = reinterpret_cast<PairT*>(shared_bytes() + KK * P * sizeof(float2));
  const int p = threadIdx.x % P, r = (threadIdx.x / P) % TH, s = threadIdx.x / (P * TH);
  const int tiles = N * ((OH + TH - 1) / TH) * ((OW + TW - 1) / TW);
  // tile t's input into buffer buf (next_tile)
  auto load = [&](int t, int buf) {{
    int n, oh0, ow0;
    tile_of(t, OH, OW, n, oh0, ow0);
    PairT* to = xs + buf * IH * XROW;
    const T* image = x + (long long)n * H * W * C + c0;
    stage_async(to, XROW, image, IH, IW, oh0 * SH - ph, ow0 * SW - pw, H, W, C);
  }};
  first_tile(tiles, load);
  for (int t = blockIdx.y, k = 0; t < tiles; t += gridDim.y, ++k) {{
    const PairT* cur = xs + (PIPE ? (k & 1) * IH * XROW : 0);
    next_tile(t, k, tiles, load);  // (its first barrier: the taps are in)
    int n, oh0, ow0;
    tile_of(t, OH, OW, n, oh0, ow0);
    float acc[SEGW][2];
#pragma unroll
    for (int o = 0; o < SEGW; ++o) acc[o][0] = acc[o][1] = 0.f;
    const PairT* xr = cur + r * SH * XROW + s * SEGW * SW * P + p;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      float a[SPAN], b[SPAN];
      load_span(xr + kh * XROW, a, b);
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const float2 wv = ws[(kh * KW + kw) * P + p];
#pragma unroll
        for (int o = 0; o < SEGW; ++o) {{
          acc[o][0] += a[o * SW + kw] * wv.x;
          acc[o][1] += b[o * SW + kw] * wv.y;
        }}
      }}
    }}
    const int oh = oh0 + r, ows = ow0 + s * SEGW;
    if (oh < OH) store_segment(y + (((long long)n * OH + oh) * OW + ows) * C + c0 + 2 * p, acc, ows, 1, OW, C);
  }}
}}
"""

_WGRAD = _COMMON + r"""
// dw[c, kh, kw] += sum over n, oh, ow of dy[n, oh, ow, c] * x[n, oh * SH - ph + kh, ow * SW - pw + kw, c] into dwt
// (float32, zeroed before). Threads: P along the channels, then KH along the kernel rows, then S along the column
// segments.
// Shared memory: the input tile [IH][XROW] pairs, then dy's [TH][GROW] (PIPE: two such pairs of tiles, as the
// forward's); at the end the block's sums [2P][KK] floats.
extern "C" __global__ void __launch_bounds__(P * KH * S) dws_wgrad(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dwt,
    int N, int C, int H, int W, int OH, int OW, int ph, int pw) {{
  unsigned char* smem = shared_bytes();
  PairT* xs = reinterpret_cast<PairT*>(smem);
  const int c0 = blockIdx.x * 2 * P;
  const int p = threadIdx.x % P, kh = (threadIdx.x / P) % KH, s = threadIdx.x / (P * KH);
  float acc[KW][2];
#pragma unroll
  for (int k = 0; k < KW; ++k) acc[k][0] = acc[k][1] = 0.f;
  const int tiles = N * ((OH + TH - 1) / TH) * ((OW + TW - 1) / TW);
  const int bufp = IH * XROW + TH * GROW;  // (a buffer's pairs: the input tile, then dy's)
  // tile t's input and dy (zeros beyond the image) into buffer buf (next_tile)
  auto load = [&](int t, int buf) {{
    int n, oh0, ow0;
    tile_of(t, OH, OW, n, oh0, ow0);
    PairT* to = xs + buf * bufp;
    const T* image = x + (long long)n * H * W * C + c0;
    const T* grad = dy + (long long)n * OH * OW * C + c0;
    stage_async(to, XROW, image, IH, IW, oh0 * SH - ph, ow0 * SW - pw, H, W, C);
    stage_async(to + IH * XROW, GROW, grad, TH, TW, oh0, ow0, OH, OW, C);
  }};
  first_tile(tiles, load);
  for (int t = blockIdx.y, k = 0; t < tiles; t += gridDim.y, ++k) {{
    const PairT* cur = xs + (PIPE ? (k & 1) * bufp : 0);
    next_tile(t, k, tiles, load);
    int n, oh0, ow0;
    tile_of(t, OH, OW, n, oh0, ow0);
    const PairT* xr = cur + kh * XROW + s * SEGW * SW * P + p;
    const PairT* gr = cur + IH * XROW + s * SEGW * P + p;
    const int rows = min(TH, OH - oh0);
#pragma unroll 1
    for (int r = 0; r < rows; ++r) {{
      float a[SPAN], b[SPAN];
      load_span(xr + r * SH * XROW, a, b);
#pragma unroll
      for (int o = 0; o < SEGW; ++o) {{
        const PairT g = gr[r * GROW + o * P];
        const float ga = cv(g.a), gb = cv(g.b);
#pragma unroll
        for (int kw = 0; kw < KW; ++kw) {{
          acc[kw][0] += ga * a[o * SW + kw];
          acc[kw][1] += gb * b[o * SW + kw];
        }}
      }}
    }}
  }}
  float* sums = reinterpret_cast<float*>(smem);
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * P * KK; i += blockDim.x) sums[i] = 0.f;
  __syncthreads();
#pragma unroll
  for (int kw = 0; kw < KW; ++kw) {{
    atomicAdd(sums + (2 * p) * KK + kh * KW + kw, acc[kw][0]);
    atomicAdd(sums + (2 * p + 1) * KK + kh * KW + kw, acc[kw][1]);
  }}
  __syncthreads();
  for (int i = threadIdx.x; i < 2 * P * KK; i += blockDim.x) atomicAdd(dwt + (long long)c0 * KK + i, sums[i]);
}}
"""

_DGRAD = _COMMON + r"""
// Backward-data at a stride over 1, by phases: dx[n, ih, iw, c] = sum over the taps (kh, kw) for which
// oh = (ih + ph - kh) / SH and ow = (iw + pw - kw) / SW are whole (and inside dy: zeros staged outside) of
// dy[n, oh, ow, c] * w[c, kh, kw]. An output meets the taps kh = kh0, kh0 + SH, ... (kh0 = (ih + ph) % SH) at dy rows
// (ih + ph) / SH, one fewer each, and likewise along the row. Threads: P along the channels, then TH along the
// tile's rows, then SW column phases q, then S segments of SEGW * SW columns; a thread owns the SEGW outputs of its
// row, phase and segment (SW columns apart), which meet the same taps and adjacent dy columns: it reads each dy row
// its taps meet once into registers, as the forward reads its input rows. Shared memory: the taps as float2 [KK][P],
// then dy's tile [DIH][DROW] pairs (PIPE: two such tiles).
#define MH ((KH + SH - 1) / SH)
#define MW ((KW + SW - 1) / SW)
#define XTW (TW * SW)
#define DIH ((TH - 1) / SH + 1 + MH)
#define DIW (TW + MW)
#define DROW PADDED_ROW(DIW, P)
#define DSPAN (SEGW + MW - 1)
extern "C" __global__ void __launch_bounds__(P * TH * SW * S) dws_dgrad(
    const T* __restrict__ dy, const T* __restrict__ w, T* __restrict__ dx,
    int N, int C, int OH, int OW, int H, int W, int ph, int pw) {{
  const int c0 = blockIdx.x * 2 * P;
  const float2* ws = shared_taps(w, c0, 0);
  PairT* gs = reinterpret_cast<PairT*>(shared_bytes() + KK * P * sizeof(float2));
  const int p = threadIdx.x % P, r = (threadIdx.x / P) % TH, q = (threadIdx.x / (P * TH)) % SW;
  const int s = threadIdx.x / (P * TH * SW);
  const int tiles = N * ((H + TH - 1) / TH) * ((W + XTW - 1) / XTW);
  // tile t's dy rows and columns (those its outputs' taps meet, from MH - 1 and MW - 1 before the first's) into
  // buffer buf (next_tile)
  auto load = [&](int t, int buf) {{
    int n, ih0, iw0;
    tile_of(t, H, W, n, ih0, iw0, XTW);
    PairT* to = gs + buf * DIH * DROW;
    const T* grad = dy + (long long)n * OH * OW * C + c0;
    stage_async(to, DROW, grad, DIH, DIW, (ih0 + ph) / SH - (MH - 1), (iw0 + pw) / SW - (MW - 1), OH, OW, C);
  }};
  first_tile(tiles, load);
  for (int t = blockIdx.y, k = 0; t < tiles; t += gridDim.y, ++k) {{
    const PairT* cur = gs + (PIPE ? (k & 1) * DIH * DROW : 0);
    next_tile(t, k, tiles, load);  // (its first barrier: the taps are in)
    int n, ih0, iw0;
    tile_of(t, H, W, n, ih0, iw0, XTW);
    const int ih = ih0 + r, kh0 = (ih + ph) % SH, kw0 = (iw0 + q + pw) % SW;
    // the tile's row of the first tap's dy row, and its column of the thread's first output's last tap
    const int row0 = (ih + ph) / SH - (ih0 + ph) / SH + MH - 1;
    const int col0 = (iw0 + q + pw) / SW - (iw0 + pw) / SW + s * SEGW;
    float acc[SEGW][2];
#pragma unroll
    for (int o = 0; o < SEGW; ++o) acc[o][0] = acc[o][1] = 0.f;
#pragma unroll
    for (int mh = 0; mh < MH; ++mh) {{
      const int kh = kh0 + SH * mh;
      if (kh < KH) {{
        float a[DSPAN], b[DSPAN];
        load_span(cur + (row0 - mh) * DROW + col0 * P + p, a, b);
#pragma unroll
        for (int mw = 0; mw < MW; ++mw) {{
          const int kw = kw0 + SW * mw;
          if (kw < KW) {{
            const float2 wv = ws[(kh * KW + kw) * P + p];
#pragma unroll
            for (int o = 0; o < SEGW; ++o) {{
              acc[o][0] += a[o + MW - 1 - mw] * wv.x;
              acc[o][1] += b[o + MW - 1 - mw] * wv.y;
            }}
          }}
        }}
      }}
    }}
    const int iws = iw0 + s * SEGW * SW + q;
    if (ih < H) store_segment(dx + (((long long)n * H + ih) * W + iws) * C + c0 + 2 * p, acc, iws, SW, W, C);
  }}
}}
"""

#: kernel -> (its source template, its function's name)
SOURCES = {"fwd-staged": (_FWD, ("dws_fwd",)), "wgrad-staged": (_WGRAD, ("dws_wgrad",)),
           "dgrad-staged": (_DGRAD, ("dws_dgrad",))}
