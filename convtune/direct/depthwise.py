"""Direct depthwise convolution kernels (CUDA through CuPy RawKernel), all three passes.

Depthwise: ``groups == in_channels == out_channels``; each channel is convolved
with its own kernel. The data is read and written about once per pass, so these
are memory-bound; the kernel size is a compile-time constant so the loops unroll
and the filter gradient's per-tap accumulators stay in registers.

* forward and backward-data: one thread per output element (grid-stride), the
  taps read through the cache; backward-data gathers, so no atomics;
* backward-filter: one block per (channel, batch slice); each thread sums its
  positions into ``KH*KW`` registers, warps reduce by shuffles, one atomic add
  per warp and tap.
"""

from __future__ import annotations

import functools
import math

from ..problem import ConvProblem

#: Largest kernel (taps) whose filter gradient keeps one accumulator per tap in registers.
MAX_TAPS = 81

_COMMON = r"""
#define KH {kh}
#define KW {kw}
struct Geo {{ int N, C, H, W, OH, OW, sh, sw, ph, pw, dh, dw; }};
#define GEO_PARAMS int N, int C, int H, int W, int OH, int OW, int sh, int sw, int ph, int pw, int dh, int dw
#define GEO_INIT const Geo g = {{N, C, H, W, OH, OW, sh, sw, ph, pw, dh, dw}}
"""

_FWD = _COMMON + r"""
extern "C" __global__ void dw_fwd(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
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
    const float* xp = x + nc * g.H * g.W;
    const float* wp = w + c * KH * KW;
    float acc = 0.f;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      const int ih = oh * g.sh - g.ph + kh * g.dh;
      if (ih < 0 || ih >= g.H) continue;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const int iw = ow * g.sw - g.pw + kw * g.dw;
        if (iw >= 0 && iw < g.W) acc += __ldg(xp + ih * g.W + iw) * __ldg(wp + kh * KW + kw);
      }}
    }}
    y[i] = acc;
  }}
}}
"""

_FWD_TILED = _COMMON + r"""
// stride 1: a block computes a TILE_H x 32 output tile of one (n, c) plane from a shared-memory copy
// of the input tile and its halo (zero outside the image); each thread computes TILE_H / 8 rows.
#define TILE_W 32
#define TILE_H 32
extern "C" __global__ void dw_fwd_tiled(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, GEO_PARAMS) {{
  GEO_INIT;
  extern __shared__ float tile[];
  __shared__ float wsh[KH * KW];
  const int in_w = TILE_W + (KW - 1) * g.dw, in_h = TILE_H + (KH - 1) * g.dh;
  const int tiles_w = (g.OW + TILE_W - 1) / TILE_W;
  const int ow0 = (blockIdx.x % tiles_w) * TILE_W, oh0 = (blockIdx.x / tiles_w) * TILE_H;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  const long long planes = (long long)g.N * g.C;
  for (long long nc = blockIdx.y; nc < planes; nc += gridDim.y) {{
    const int c = nc % g.C;
    const float* xp = x + nc * g.H * g.W;
    for (int i = tid; i < KH * KW; i += nthreads) wsh[i] = w[c * KH * KW + i];
    for (int i = tid; i < in_h * in_w; i += nthreads) {{
      const int ih = oh0 - g.ph + i / in_w, iw = ow0 - g.pw + i % in_w;
      tile[i] = (ih >= 0 && ih < g.H && iw >= 0 && iw < g.W) ? __ldg(xp + ih * g.W + iw) : 0.f;
    }}
    __syncthreads();
    const int ow = ow0 + threadIdx.x;
    for (int r = threadIdx.y; r < TILE_H; r += blockDim.y) {{
      const int oh = oh0 + r;
      float acc = 0.f;
#pragma unroll
      for (int kh = 0; kh < KH; ++kh) {{
#pragma unroll
        for (int kw = 0; kw < KW; ++kw)
          acc += tile[(r + kh * g.dh) * in_w + threadIdx.x + kw * g.dw] * wsh[kh * KW + kw];
      }}
      if (oh < g.OH && ow < g.OW) y[nc * g.OH * g.OW + oh * g.OW + ow] = acc;
    }}
    __syncthreads();
  }}
}}
"""

_DGRAD = _COMMON + r"""
extern "C" __global__ void dw_dgrad(const float* __restrict__ dy, const float* __restrict__ w,
                                    float* __restrict__ dx, GEO_PARAMS) {{
  GEO_INIT;
  const long long total = (long long)g.N * g.C * g.H * g.W;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)blockDim.x * gridDim.x) {{
    const int iw = i % g.W;
    const long long t = i / g.W;
    const int ih = t % g.H;
    const long long nc = t / g.H;
    const int c = nc % g.C;
    const float* dp = dy + nc * g.OH * g.OW;
    const float* wp = w + c * KH * KW;
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
        if (ow < g.OW) acc += __ldg(dp + oh * g.OW + ow) * __ldg(wp + kh * KW + kw);
      }}
    }}
    dx[i] = acc;
  }}
}}
"""

_WGRAD = _COMMON + r"""
extern "C" __global__ void dw_wgrad(const float* __restrict__ x, const float* __restrict__ dy,
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
    const float grad = __ldg(dy + nc * plane + q);
    const float* xp = x + nc * g.H * g.W;
#pragma unroll
    for (int kh = 0; kh < KH; ++kh) {{
      const int ih = oh * g.sh - g.ph + kh * g.dh;
      const bool row = ih >= 0 && ih < g.H;
#pragma unroll
      for (int kw = 0; kw < KW; ++kw) {{
        const int iw = ow * g.sw - g.pw + kw * g.dw;
        if (row && iw >= 0 && iw < g.W) acc[kh * KW + kw] += grad * __ldg(xp + ih * g.W + iw);
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


_SOURCES = {"fwd": (_FWD, "dw_fwd"), "dgrad": (_DGRAD, "dw_dgrad"), "wgrad": (_WGRAD, "dw_wgrad"),
            "tiled": (_FWD_TILED, "dw_fwd_tiled")}
TILE = 32
#: Shared memory a block may take without opting in to more.
SMEM_LIMIT = 48 * 1024


@functools.cache
def _kernel(cp, which: str, kh: int, kw: int):
    source, name = _SOURCES[which]
    kernel = cp.RawKernel(source.format(kh=kh, kw=kw), name, options=("--std=c++14",))
    kernel.compile()  # at build time, so no first call pays for NVRTC (the planner compares first runs)
    return kernel


def tiled_smem_bytes(p: ConvProblem) -> int:
    kh, kw = kernel_hw(p)
    dh, dw = (1, p.dilation[0]) if p.rank == 1 else p.dilation
    return 4 * (TILE + (kh - 1) * dh) * (TILE + (kw - 1) * dw)


def tiled_reason(p: ConvProblem) -> str | None:
    """Why the tiled kernel cannot run ``p`` (``None`` when it can)."""
    if p.rank != 2:
        return "the tiled kernel is for 2-D problems"
    if p.pass_ == "wgrad":
        return "the tiled kernel computes forward and backward-data"
    if any(s != 1 for s in p.stride):
        return "the tiled kernel needs stride 1"
    if p.pass_ == "dgrad" and any(q > (k - 1) * d for q, k, d in zip(p.padding, p.kernel_size, p.dilation)):
        return "backward-data as a flipped forward needs padding <= dilation*(kernel-1)"
    if tiled_smem_bytes(p) > SMEM_LIMIT:
        return "the input tile with its halo exceeds 48 KiB of shared memory"
    return None


def _geometry(cp, p: ConvProblem) -> tuple:
    """The kernels' geometry arguments, as int32 (2-D view; rank 1 has a height-1 axis)."""
    def two(values, fill):
        return (fill, *values) if p.rank == 1 else tuple(values)
    values = (p.batch, p.in_channels, *two(p.input_size, 1), *two(p.output_size, 1), *two(p.stride, 1),
              *two(p.padding, 0), *two(p.dilation, 1))
    return tuple(cp.int32(v) for v in values)


def kernel_hw(p: ConvProblem) -> tuple[int, int]:
    return (1, p.kernel_size[0]) if p.rank == 1 else tuple(p.kernel_size)


class DepthwiseConv:
    """One problem's depthwise executor on CuPy.

    ``variant`` ``simple``: one thread per output (``threads`` per block); ``tiled``: stride-1 2-D
    problems through shared-memory tiles, backward-data as the forward of ``dy`` with the flipped
    filter and padding ``dil*(k-1) - pad``.
    """

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int, variant: str = "simple"):
        self.cp, self.p, self.threads, self.variant = cp, p, threads, variant
        kh, kw = kernel_hw(p)
        if variant == "tiled":
            reason = tiled_reason(p)
            if reason:
                raise ValueError(f"tiled depthwise kernel: {reason}")
            self.kernel = _kernel(cp, "tiled", kh, kw)
            if p.pass_ == "dgrad":  # the flipped forward maps dy (output-sized) to dx (input-sized)
                flip_pad = tuple((k - 1) * d - q for q, k, d in zip(p.padding, p.kernel_size, p.dilation))
                fwd = p.replace(input_size=p.output_size, padding=flip_pad, pass_="fwd")
            else:
                fwd = p
            self.geo = _geometry(cp, fwd)
            oh, ow = fwd.output_size
            self.grid = (math.ceil(ow / TILE) * math.ceil(oh / TILE), min(p.batch * p.in_channels, 65535))
            self.smem = tiled_smem_bytes(fwd)
            return
        self.kernel = _kernel(cp, p.pass_, kh, kw)
        self.geo = _geometry(cp, p)
        if p.pass_ == "wgrad":
            # enough (channel, batch slice) blocks to fill the chip about four times over
            slices = max(1, min(p.batch, math.ceil(4 * sm_count / p.in_channels)))
            self.n_per_block = math.ceil(p.batch / slices)
            self.grid = (p.in_channels, math.ceil(p.batch / self.n_per_block))
        else:
            total = math.prod(p.result_shape)
            self.grid = (min(math.ceil(total / threads), 32 * sm_count),)

    def __call__(self, a, b, out):
        cp = self.cp
        a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
        target = out if out.flags.c_contiguous else cp.empty(out.shape, dtype=cp.float32)
        if self.variant == "tiled":
            w = b[:, :, ::-1, ::-1].copy() if self.p.pass_ == "dgrad" else b
            self.kernel(self.grid, (TILE, 8), (a, w, target, *self.geo), shared_mem=self.smem)
        elif self.p.pass_ == "wgrad":
            target.fill(0)
            self.kernel(self.grid, (self.threads,), (a, b, target, *self.geo, cp.int32(self.n_per_block)))
        else:
            self.kernel(self.grid, (self.threads,), (a, b, target, *self.geo))
        if target is not out:
            out[...] = target
        return out
