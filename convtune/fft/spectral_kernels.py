"""CUDA kernels of :class:`~convtune.fft.spectral.SpectralConv`'s GPU path: the depthwise pointwise
products with the inverse transform's scale folded in, the filter gradient's batch sum, and the
gather of the output from the circular result, each one launch with arguments made once, where
CuPy's array operations took a kernel (and a temporary) per step: a conjugate, a scale, a product, a
sum over the batch, one slice copy per wrapped block of the gather.

Spectra are rows of ``per`` complex64 values (a depthwise layer's channels times its frequencies),
one row per sample.
"""

from __future__ import annotations

import functools

import numpy

_THREADS = 256
#: Most blocks of a grid-stride launch.
_MAX_BLOCKS = 65535

_SOURCE = r"""
extern "C" __global__ void convtune_spec_mul(const float2* __restrict__ a, const float2* __restrict__ b,
                                             float2* __restrict__ y, long long total, long long per,
                                             int conj_b, float s) {
    // y[n, j] = a[n, j] * b[j] (conj(b[j]) with conj_b) * s
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        float2 u = a[i], v = b[i % per];
        if (conj_b) v.y = -v.y;
        y[i] = make_float2((u.x * v.x - u.y * v.y) * s, (u.x * v.y + u.y * v.x) * s);
    }
}

extern "C" __global__ void convtune_spec_corr(const float2* __restrict__ a, const float2* __restrict__ b,
                                              float2* __restrict__ y, int n, long long per, float s,
                                              int accumulate) {
    // y[j] (+)= s * sum_k conj(a[k, j]) * b[k, j]
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < per;
         j += (long long)gridDim.x * blockDim.x) {
        float re = 0.0f, im = 0.0f;
        for (int k = 0; k < n; ++k) {
            float2 u = a[k * per + j], v = b[k * per + j];
            re += u.x * v.x + u.y * v.y;
            im += u.x * v.y - u.y * v.x;
        }
        float2 r = make_float2(re * s, im * s);
        if (accumulate) { float2 o = y[j]; r.x += o.x; r.y += o.y; }
        y[j] = r;
    }
}

__device__ __forceinline__ int convtune_wrap(int v, int L) {
    // v mod L in [0, L): one add or subtract on the common path
    if (v < 0) { v += L; if (v < 0) v = (v % L + L) % L; }
    else if (v >= L) { v -= L; if (v >= L) v %= L; }
    return v;
}

__device__ __forceinline__ void convtune_gather_row(const float* __restrict__ full, float* __restrict__ out,
                                                    long long row, int L0, int L1, int c0, int c1, int o0, int s0,
                                                    int o1, int s1, int c, int c_end, int step) {
    // elements c, c + step, ... < c_end of output row (b, q0): the row's source worked out once, no 64-bit
    // division per element
    long long b = row / c0;
    int q0 = (int)(row - b * c0);
    const float* in = full + (b * L0 + convtune_wrap(q0 * s0 - o0, L0)) * L1;
    float* o = out + row * c1;
    for (; c < c_end; c += step) o[c] = in[convtune_wrap(c * s1 - o1, L1)];
}

extern "C" __global__ void convtune_spec_gather(const float* __restrict__ full, float* __restrict__ out,
                                                long long rows, int L0, int L1, int c0, int c1,
                                                int o0, int s0, int o1, int s1, int row_shift) {
    // out (B, c0, c1) from full (B, L0, L1): out[b, q0, q1] = full[b, (q0 s0 - o0) mod L0, (q1 s1 - o1) mod L1];
    // short rows (row_launch): 2^row_shift threads per row, as many rows as fit in the block
    const int per_row = 1 << row_shift;
    long long row = (long long)blockIdx.x * (blockDim.x >> row_shift) + (threadIdx.x >> row_shift);
    if (row >= rows) return;
    convtune_gather_row(full, out, row, L0, L1, c0, c1, o0, s0, o1, s1, threadIdx.x & (per_row - 1), c1, per_row);
}

extern "C" __global__ void convtune_spec_gather_long(const float* __restrict__ full, float* __restrict__ out,
                                                     long long rows, int L0, int L1, int c0, int c1,
                                                     int o0, int s0, int o1, int s1, int seg_len) {
    // long rows: a block per segment of seg_len elements of a row, all its threads on it
    unsigned int segs = (c1 + seg_len - 1) / seg_len, seg = blockIdx.x % segs;
    long long row = blockIdx.x / segs;
    if (row >= rows) return;
    int c = seg * seg_len + threadIdx.x;
    convtune_gather_row(full, out, row, L0, L1, c0, c1, o0, s0, o1, s1, c, min(c1, (int)(seg + 1) * seg_len),
                        blockDim.x);
}
"""


@functools.lru_cache(maxsize=None)
def _kernel(name: str):
    import cupy
    return cupy.RawKernel(_SOURCE, name)


def _grid(total: int) -> tuple[int]:
    return (max(1, min((total + _THREADS - 1) // _THREADS, _MAX_BLOCKS)),)


#: A row at least this long gets blocks of its own, one per segment of :data:`SEGMENT` elements.
LONG_ROW = 4 * _THREADS
SEGMENT = 8 * _THREADS


def long_row(length: int) -> bool:
    """Does a row of ``length`` elements get blocks of its own (the kernels' ``_long`` forms)?"""
    return length >= LONG_ROW


def row_launch(rows: int, length: int, threads: int = _THREADS) -> tuple[tuple[int], int, int]:
    """``(grid, row_shift, seg_len)`` of a kernel that writes ``rows`` rows of ``length`` elements (the
    embedding, the gather). A short row gets ``2**row_shift`` threads (up to a warp), a block several rows;
    a long one (``seg_len`` > 0) a block per segment of ``seg_len`` elements, all its threads on it. (One
    warp per row, the earlier layout, left a 16k-long 1-D layer's 512 rows 16k threads: its embedding and
    gather ran at a third of the memory bandwidth on the H100.)"""
    if long_row(length):
        return (max(1, rows * -(-length // SEGMENT)),), 0, SEGMENT
    shift = min(5, max(0, (length - 1).bit_length()))
    per_block = threads >> shift
    return (max(1, -(-rows // per_block)),), shift, 0


class Kernels:
    """One executor's launches; grids and scalar arguments are made once per shape."""

    def __init__(self, xp, sizes: tuple[int, ...]):
        self.xp, self.sizes = xp, tuple(sizes)
        self._args = {}

    def _launch(self, name, key, make):
        held = self._args.get(key)
        if held is None:
            held = self._args[key] = make()
        return _kernel(name), held

    def multiply(self, a, b, scale: float, conj_b: bool):
        """``a[n, j] * b[j] * scale`` (``conj(b[j])`` with ``conj_b``): ``a`` (n, ...) and ``b`` C-contiguous
        complex64, ``b`` one sample's size; a new array of ``a``'s shape."""
        per, total = b.size, a.size
        kernel, (grid, args) = self._launch("convtune_spec_mul", ("mul", total, per, conj_b, scale), lambda: (
            _grid(total), (numpy.int64(total), numpy.int64(per), numpy.int32(conj_b), numpy.float32(scale))))
        y = self.xp.empty(a.shape, dtype=self.xp.complex64)
        kernel(grid, (_THREADS,), (a, b, y) + args)
        return y

    def correlate(self, a, b, scale: float, into=None):
        """``scale * sum_n conj(a[n]) * b[n]`` of two C-contiguous complex64 (n, ...) arrays, shaped as
        one sample; added to ``into`` where given."""
        n, per = a.shape[0], a.size // a.shape[0]
        kernel, (grid, args) = self._launch("convtune_spec_corr", ("corr", n, per, scale), lambda: (
            _grid(per), (numpy.int32(n), numpy.int64(per), numpy.float32(scale))))
        y = into if into is not None else self.xp.empty(a.shape[1:], dtype=self.xp.complex64)
        kernel(grid, (_THREADS,), (a, b, y) + args + (numpy.int32(into is not None),))
        return y

    def gather(self, full, out, geometry) -> bool:
        """``out`` (B, *counts), C-contiguous float32, from the circular result ``full`` (B, *sizes) by
        ``geometry`` (offset, step, count) per axis: element q of an axis reads (q*step - offset) mod L.
        1-D and 2-D only: ``False`` (nothing done) otherwise."""
        if len(self.sizes) > 2 or not out.flags.c_contiguous:
            return False
        key = ("gather", out.shape, tuple(geometry))

        def make():
            L = (1,) * (2 - len(self.sizes)) + self.sizes
            g = ((0, 1, 1),) * (2 - len(geometry)) + tuple(geometry)
            rows = out.size // g[1][2]
            grid, shift, seg_len = row_launch(rows, g[1][2])
            values = L + (g[0][2], g[1][2], g[0][0], g[0][1], g[1][0], g[1][1], seg_len or shift)
            return grid, (numpy.int64(rows),) + tuple(numpy.int32(v) for v in values)
        name = "convtune_spec_gather_long" if long_row(out.shape[-1]) else "convtune_spec_gather"
        kernel, (grid, args) = self._launch(name, key, make)
        kernel(grid, (_THREADS,), (self.xp.ascontiguousarray(full), out) + args)
        return True
