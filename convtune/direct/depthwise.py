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


@functools.cache
def _kernel(cp, which: str, kh: int, kw: int):
    source = {"fwd": _FWD, "dgrad": _DGRAD, "wgrad": _WGRAD}[which].format(kh=kh, kw=kw)
    name = {"fwd": "dw_fwd", "dgrad": "dw_dgrad", "wgrad": "dw_wgrad"}[which]
    return cp.RawKernel(source, name, options=("--std=c++14",))


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
    """One problem's depthwise executor on CuPy; ``threads`` per block is the tuning axis."""

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int):
        self.cp, self.p, self.threads = cp, p, threads
        kh, kw = kernel_hw(p)
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
        if self.p.pass_ == "wgrad":
            target.fill(0)
            self.kernel(self.grid, (self.threads,), (a, b, target, *self.geo, cp.int32(self.n_per_block)))
        else:
            self.kernel(self.grid, (self.threads,), (a, b, target, *self.geo))
        if target is not out:
            out[...] = target
        return out
