"""Direct depthwise kernels for 3-D problems (CUDA through CuPy RawKernel), all three passes.

Depthwise 3-D convolutions with large kernels (3D UX-Net's 7x7x7, on 48^3 volumes) are where PyTorch's
``conv3d`` is slowest: it has no depthwise 3-D kernel of its own, and cuDNN's grouped engines do
about one multiply-add per clock and channel. These kernels run the 2-D tiles of
:mod:`convtune.direct.depthwise` plane by plane along depth (stride 1, any padding and dilation,
channels-first operands of float32, bfloat16 or float16 read and written in place, sums in float32; channels_last
through conversions):

* forward: a block owns a 2-D output tile (32 wide, ``rows * warps`` tall) of one ``(n, c, od)``
  plane. For each depth tap ``kd`` it loads the input plane ``od - pd + kd * dd`` with its halo into
  shared memory and adds the 2-D correlation with the filter's ``kd`` slice (held in registers, so
  a slice has at most :data:`MAX_SLICE_TAPS` taps). Backward-data is the same kernel on ``dy`` with
  the filter reversed in all three axes and padding ``dil * (k - 1) - pad``.
* filter gradient: a block owns one ``(channel, kd)`` slice of the filter and a run of ``(n, od)``
  planes; per-tap sums of the slice sit in registers (the 2-D tiled kernel's loop), one atomic add
  per tap and block.
"""

from __future__ import annotations

import math

from ..compiling import compiled_once
from ..problem import ConvProblem
from .depthwise import SMEM_LIMIT, TILE_W, TILED_MAX_WARPS, DepthwiseConv
from .depthwise_source import TILED_COMMON
from .elements import ELEMENT_TYPES

#: Most taps of one depth slice (``KH * KW``): the forward holds a slice in registers, the filter
#: gradient a slice's sums.
MAX_SLICE_TAPS = 81

_COMMON3 = TILED_COMMON + r"""
#define KD {kd}
#define DD {dd}
"""

_FWD3 = _COMMON3 + r"""
// y = x * w (correlation) over (n, c, od) planes; flip != 0 reads the filter reversed in all three axes
// (with padding dil*(k-1) - pad, the backward-data pass: dy in, dx out)
extern "C" __global__ void __launch_bounds__(TW * BY) dw3_fwd_tiled(
    const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ y,
    int N, int C, int D, int H, int W, int OD, int OH, int OW, int pd, int ph, int pw, int flip) {{
  __shared__ float tile[IN_H * IN_W];
  __shared__ float wsh[KD * KK];
  const int tiles_w = (OW + TW - 1) / TW;
  const int ow0 = (blockIdx.x % tiles_w) * TW, oh0 = (blockIdx.x / tiles_w) * TH;
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;
  const long long planes = (long long)N * C * OD;
  for (long long q = blockIdx.y; q < planes; q += gridDim.y) {{
    const int od = q % OD;
    const long long nc = q / OD;
    const int c = nc % C;
    for (int i = tid; i < KD * KK; i += TW * BY) wsh[i] = ld(w + (long long)c * KD * KK + (flip ? KD * KK - 1 - i : i));
    float acc[R];
#pragma unroll
    for (int o = 0; o < R; ++o) acc[o] = 0.f;
    for (int kd = 0; kd < KD; ++kd) {{
      const int id = od - pd + kd * DD;
      if (id < 0 || id >= D) continue;  // the same for the whole block
      __syncthreads();  // the previous plane's tile is read (and the filter written)
      load_tile(tile, x + (nc * D + id) * H * W, H, W, oh0 - ph, ow0 - pw, tid);
      __syncthreads();
      float wr[KK];
#pragma unroll
      for (int i = 0; i < KK; ++i) wr[i] = wsh[kd * KK + i];
      add_tile(acc, tile, wr, tx, ty);
    }}
    const int ow = ow0 + tx;
    if (ow < OW) {{
#pragma unroll
      for (int o = 0; o < R; ++o) {{
        const int oh = oh0 + ty * R + o;
        if (oh < OH) y[(nc * OD + od) * OH * OW + (long long)oh * OW + ow] = st(acc[o]);
      }}
    }}
    __syncthreads();  // the filter is read before the next plane's is written
  }}
}}
"""

_WGRAD3 = _COMMON3 + r"""
// dw[c, kd] += sum over the block's (n, od) planes and tiles of dy (x) x; per-tap sums of the slice in
// registers, then a warp-shuffle and shared-memory reduction, one atomic add per tap and block
extern "C" __global__ void __launch_bounds__(TW * BY) dw3_wgrad_tiled(
    const T* __restrict__ x, const T* __restrict__ dy, float* __restrict__ dwt,
    int N, int C, int D, int H, int W, int OD, int OH, int OW, int pd, int ph, int pw, int per_block) {{
  __shared__ float tile[IN_H * IN_W];
  __shared__ float gsh[TH * TW];
  __shared__ float red[BY * KK];
  const int c = blockIdx.x / KD, kd = blockIdx.x % KD;
  const long long q0 = (long long)blockIdx.y * per_block;
  const long long q1 = min((long long)N * OD, q0 + per_block);
  const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * TW + tx;
  float acc[KK];
#pragma unroll
  for (int k = 0; k < KK; ++k) acc[k] = 0.f;
  for (long long q = q0; q < q1; ++q) {{
    const int od = q % OD, n = q / OD;
    const int id = od - pd + kd * DD;
    if (id < 0 || id >= D) continue;  // the same for the whole block
    const long long nc = (long long)n * C + c;
    add_plane_grad(acc, tile, gsh, x + (nc * D + id) * H * W, dy + (nc * OD + od) * OH * OW, H, W, OH, OW, ph, pw,
                   tx, ty, tid);
  }}
  reduce_taps(acc, red, dwt + ((long long)c * KD + kd) * KK, tx, ty, tid);
}}
"""

_SOURCES = {"fwd": (_FWD3, "dw3_fwd_tiled"), "wgrad": (_WGRAD3, "dw3_wgrad_tiled")}


def source(which: str, kernel: tuple, dilation: tuple, rows: int, by: int, dtype: str = "float32") -> str:
    """The CUDA source of kernel ``which`` (``fwd``, ``wgrad``) for operands of ``dtype`` (bfloat16 as its 16 bits;
    sums in float32, the filter gradient's into float32 memory)."""
    (kd, kh, kw), (dd, dh, dw) = kernel, dilation
    return ELEMENT_TYPES[dtype] + _SOURCES[which][0].format(kd=kd, kh=kh, kw=kw, dd=dd, dh=dh, dw=dw, rows=rows, by=by)


@compiled_once
def _kernel(cp, which: str, kernel: tuple, dilation: tuple, rows: int, by: int, dtype: str = "float32"):
    code, name = source(which, kernel, dilation, rows, by, dtype), _SOURCES[which][1]
    compiled = cp.RawKernel(code, name, options=("--std=c++14",))
    compiled.compile()  # at build time, so no first call pays for NVRTC (the planner compares first runs)
    return compiled


def forward_form(p: ConvProblem) -> tuple:
    """``(input size, output size, padding)`` of the pass's forward form (backward-data: ``dy`` in, ``dx``
    out, padding ``dil * (k - 1) - pad``, which may be negative: the tile loader bounds-checks)."""
    if p.pass_ == "dgrad":
        padding = tuple((k - 1) * d - q for q, k, d in zip(p.padding, p.kernel_size, p.dilation))
        return p.output_size, p.input_size, padding
    return p.input_size, p.output_size, p.padding


def warps(p: ConvProblem, rows: int) -> int:
    """Warps per block: enough to cover the (forward form's) output height, at most 8."""
    return max(1, min(TILED_MAX_WARPS, math.ceil(forward_form(p)[1][1] / rows)))


def smem_bytes(p: ConvProblem, rows: int, by: int) -> int:
    """Static shared memory of a block: the input tile with its halo, plus the filter (forward) or the dy
    tile and the per-warp partial sums (filter gradient)."""
    kd, kh, kw = p.kernel_size
    _, dh, dw = p.dilation
    th = rows * by
    floats = (th + (kh - 1) * dh) * (TILE_W + (kw - 1) * dw)
    floats += th * TILE_W + by * kh * kw if p.pass_ == "wgrad" else kd * kh * kw
    return 4 * floats


def reason(p: ConvProblem, rows: int) -> str | None:
    """Why these kernels cannot run ``p`` with ``rows`` outputs per thread (``None`` when they can)."""
    if p.rank != 3:
        return "the 3-D depthwise kernels are for 3-D problems"
    if not (p.groups == p.in_channels == p.out_channels):
        return "not a depthwise convolution with channel multiplier 1 (groups == in == out channels)"
    if any(s != 1 for s in p.stride):
        return "the 3-D depthwise kernels need stride 1"
    if p.kernel_size[1] * p.kernel_size[2] > MAX_SLICE_TAPS:
        return (f"a kernel slice of {p.kernel_size[1]}x{p.kernel_size[2]} taps is over {MAX_SLICE_TAPS} (the 3-D "
                "depthwise kernels hold a slice in registers)")
    if smem_bytes(p, rows, warps(p, rows)) > SMEM_LIMIT:
        return "the input tile with its halo exceeds 48 KiB of shared memory"
    return None


class Depthwise3dConv(DepthwiseConv):
    """One 3-D depthwise problem's executor on CuPy: ``rows`` outputs per thread and ``threads // 32`` warps
    per block (:func:`warps`); called (arrays) and launched (addresses) as the 2-D tiled executor is."""

    def __init__(self, cp, p: ConvProblem, threads: int, sm_count: int, rows: int):
        why = reason(p, rows)
        if why:
            raise ValueError(f"3-D depthwise kernel: {why}")
        by = threads // TILE_W
        if threads % TILE_W or not 1 <= by <= 32:
            raise ValueError(f"3-D depthwise kernel: threads must be a multiple of {TILE_W} up to 1024, not {threads}")
        self.cp, self.p, self.threads, self.variant = cp, p, threads, "tiled"
        self.block, self.smem, self.int_args = (TILE_W, by), 0, None
        dt = self._operands(cp, p)
        (D, H, W), (OD, OH, OW), (pd, ph, pw) = forward_form(p)
        kd = p.kernel_size[0]
        if p.pass_ == "wgrad":
            self.kernel = _kernel(cp, "wgrad", p.kernel_size, p.dilation, rows, by, dt)
            planes = p.batch * OD
            slices = max(1, min(planes, math.ceil(8 * sm_count / (p.in_channels * kd))))
            per_block = math.ceil(planes / slices)
            self.grid = (p.in_channels * kd, math.ceil(planes / per_block))
            self.args = (p.batch, p.in_channels, D, H, W, OD, OH, OW, pd, ph, pw, per_block)
            return
        self.kernel = _kernel(cp, "fwd", p.kernel_size, p.dilation, rows, by, dt)
        tiles = math.ceil(OW / TILE_W) * math.ceil(OH / (rows * by))
        self.grid = (tiles, min(p.batch * p.in_channels * OD, 65535))
        self.args = (p.batch, p.in_channels, D, H, W, OD, OH, OW, pd, ph, pw, int(p.pass_ == "dgrad"))
