"""FFT convolution with frequency-major spectra: the channel product is one strided-batched GEMM.

:class:`~convtune.fft.spectral.SpectralConv` keeps spectra as the FFT library returns them,
``(batch, channels, F)``, and the channel reduction at each frequency then needs transposed copies
of both operands and of the result (CuPy's batched ``matmul`` copies non-contiguous operands).
Here every spectrum is stored frequency-major, ``(F, batch, channels)``, so at every frequency the
operands are plain row-major matrices and the reduction is **one strided-batched complex GEMM**
over the ``F`` frequencies, with the conjugations done by the GEMM's ``op`` argument and the
inverse transform's ``1/N`` by its ``alpha``. On the GPU the layout comes from one cuBLAS ``geam``
transpose per spectrum, or (``strided``) from cuFFT's advanced data layout directly; zero-extension
is one kernel that writes each element once, the inverse transform may overwrite its input (a
temporary spectrum), and an input gradient that is the whole inverse transform is written in place.

Passes per call (``W`` the weight spectrum, ``N`` the transform size)::

    forward          Y_f  = X_f @ W_f^H / N        (n x Cg) @ (Cg x Kg)
    backward-data    DX_f = DY_f @ W_f / N         (n x Kg) @ (Kg x Cg)
    backward-filter  DW_f = DY_f^H @ X_f / N       (Kg x n) @ (n x Cg), summed over batch chunks

and the spatial geometry (padding as a cyclic shift, stride by upsampling ``dy``, dilation in the
placed kernel) is that of :mod:`convtune.fft.spectral`. Groups are one GEMM per group on
sub-matrices (a leading dimension larger than the width), again without copies.

On NumPy the same layout is produced with pocketfft and explicit transposes, so the CPU checks
the arithmetic and the index bookkeeping of the same passes.
"""

from __future__ import annotations

import functools
import math

import numpy

from ..direct.geometry import batch_chunks
from ..problem import ConvProblem
from .cost import spectrum_elems
from .spectral import fft_aligned, filter_positions, is_fft_aligned, forward_positions, gather, gather_blocks

#: Above this many groups one GEMM per group costs more launches than the pointwise product saves.
MAX_GROUPS = 16

_OPS = {"N": 0, "T": 1, "C": 2}  # cublasOperation_t


class _NumpyOps:
    """Frequency-major transforms and batched GEMM with NumPy (explicit transposes)."""

    def __init__(self, xp, sizes):
        self.xp, self.sizes = xp, tuple(sizes)
        self.axes = tuple(range(1, 1 + len(sizes)))
        self.spec_shape = tuple(sizes[:-1]) + (sizes[-1] // 2 + 1,)

    def embed(self, a, steps):
        """(B, *n) -> (B, *L): sample ``k`` of each axis at ``k * step``, zeros elsewhere."""
        buf = self.xp.zeros(a.shape[:1] + self.sizes, dtype=self.xp.float32)
        buf[(slice(None),) + tuple(slice(0, (n - 1) * s + 1, s) for n, s in zip(a.shape[1:], steps))] = a
        return buf

    def rfft(self, a):
        """(B, *L) real -> (F, B) complex64."""
        spec = self.xp.fft.rfftn(a, axes=self.axes).reshape(a.shape[0], -1)
        return self.xp.ascontiguousarray(spec.T, dtype=self.xp.complex64)

    def irfft(self, spec, out=None):
        """(F, B) -> (B, *L) float32, unnormalised (the 1/N is applied earlier); into ``out`` if given."""
        b = spec.shape[1]
        grid = spec.T.reshape((b,) + self.spec_shape)
        full = self.xp.fft.irfftn(grid, s=self.sizes, axes=self.axes, norm="forward")
        if out is None:
            return full.astype(self.xp.float32)
        out[...] = full
        return out

    def gemm(self, a, op_a, b, op_b, c, alpha, beta=0.0):
        """``c[f] = alpha * op(a[f]) @ op(b[f]) + beta * c[f]`` over the leading (frequency) axis."""
        prod = self._op(a, op_a) @ self._op(b, op_b)
        if beta:
            c *= beta
            c += alpha * prod
        else:
            c[...] = alpha * prod

    def _op(self, m, op):
        if op == "N":
            return m
        t = m.transpose(0, 2, 1)
        return t.conj() if op == "C" else t


class _CupyOps:
    """cuFFT plans and cuBLAS strided-batched CGEMM for the frequency-major layout.

    Two ways to get the layout (``strided``): cuFFT writes and reads it itself through its advanced
    data layout (output stride = number of transforms), or cuFFT keeps its packed layout and a
    cuBLAS ``geam`` transposes the spectrum (one extra read and write of it). On an H100
    (``benchmarks/fft_phases.py``, fbfft-L2) a strided R2C moved about 310 GB/s and a packed R2C
    plus the transpose about 880 GB/s; on 16x16 transforms the two were within 15% either way, so
    both are candidates there and the transpose is the default.
    """

    def __init__(self, xp, sizes, strided=False):
        from cupy.cuda import cufft, device
        from cupy_backends.cuda.libs import cublas
        self.xp, self.sizes, self.strided = xp, tuple(sizes), strided
        self._cufft, self._cublas, self._device = cufft, cublas, device
        self.spec_shape = tuple(sizes[:-1]) + (sizes[-1] // 2 + 1,)
        self.total, self.F = math.prod(sizes), math.prod(self.spec_shape)
        self._plans = {}  # (forward?, transforms) -> PlanNd: exactly what the plan is built from

    def _plan(self, forward: bool, batch: int):
        key = (forward, batch)
        plan = self._plans.get(key)
        if plan is None:
            cufft, L, S = self._cufft, list(self.sizes), list(self.spec_shape)
            kind = cufft.CUFFT_R2C if forward else cufft.CUFFT_C2R
            if not self.strided:  # packed layouts (no embeds: cuFFT's defaults)
                idist, odist = (self.total, self.F) if forward else (self.F, self.total)
                plan = cufft.PlanNd(L, None, 1, idist, None, 1, odist, kind, batch, "C", -1, None)
            elif forward:  # real rows in, frequency-major spectrum out
                plan = cufft.PlanNd(L, L, 1, self.total, S, batch, 1, kind, batch, "C", -1, None)
            else:
                plan = cufft.PlanNd(L, S, batch, 1, L, 1, self.total, kind, batch, "C", -1, None)
            self._plans[key] = plan
        return plan

    def embed(self, a, steps):
        """(B, *n) -> (B, *L), written once by one kernel: zeros and samples together (a zero fill
        followed by a strided copy writes the placed samples twice)."""
        n = (1,) * (3 - a.ndim) + a.shape[1:]
        L = (1,) * (3 - a.ndim) + self.sizes
        s = (1,) * (3 - a.ndim) + tuple(steps)
        out = self.xp.empty(a.shape[:1] + self.sizes, dtype=self.xp.float32)
        rows = a.shape[0] * L[0]
        shift = min(5, max(0, (L[1] - 1).bit_length()))  # up to a warp per row, fewer for short rows
        per_block = _EMBED_THREADS >> shift
        args = (self.xp.ascontiguousarray(a), out, numpy.int64(rows)) + \
            tuple(numpy.int32(v) for v in L + n + s + (shift,))
        _embed_kernel()(((rows + per_block - 1) // per_block,), (_EMBED_THREADS,), args)
        return out

    def _transpose(self, a):
        """(r, c) complex64 -> (c, r), with cuBLAS geam (row-major (r, c) is column-major (c, r))."""
        r, c = a.shape
        out = self.xp.empty((c, r), dtype=self.xp.complex64)
        one, zero = numpy.ones(1, numpy.complex64), numpy.zeros(1, numpy.complex64)
        self._cublas.cgeam(self._device.get_cublas_handle(), 1, 1, r, c, one.ctypes.data, a.data.ptr, c,
                           zero.ctypes.data, a.data.ptr, c, out.data.ptr, r)
        return out

    def rfft(self, a):
        b = a.shape[0]
        a = fft_aligned(self.xp.ascontiguousarray(a))
        shape = (self.F, b) if self.strided else (b, self.F)
        spec = self.xp.empty(shape, dtype=self.xp.complex64)
        self._plan(True, b).fft(a, spec, self._cufft.CUFFT_FORWARD)
        return spec if self.strided else self._transpose(spec)

    def irfft(self, spec, out=None):
        """May overwrite ``spec`` (cuFFT's multi-dimensional C2R does); the callers own it. ``out``,
        if given, is C-contiguous (B, *L) float32."""
        b = spec.shape[1]
        if not self.strided:
            spec = self._transpose(spec)
        target = out if out is not None and is_fft_aligned(out) else \
            self.xp.empty((b,) + self.sizes, dtype=self.xp.float32)
        self._plan(False, b).fft(spec, target, self._cufft.CUFFT_INVERSE)
        if out is None:
            return target
        if target is not out:
            out[...] = target
        return out

    def gemm(self, a, op_a, b, op_b, c, alpha, beta=0.0):
        """Row-major ``c = alpha op(a) op(b) + beta c`` per frequency, as the column-major
        ``c^T = op(b)^T op(a)^T``; a stored row-major matrix is its own transpose in column-major, so
        each operand keeps its op code and its row stride is its leading dimension."""
        m, k = (a.shape[1], a.shape[2]) if op_a == "N" else (a.shape[2], a.shape[1])
        n = b.shape[2] if op_b == "N" else b.shape[1]
        item = c.itemsize
        for arr in (a, b, c):
            if arr.strides[2] != item:
                raise ValueError("frequency-major GEMM operands need unit stride along their rows")
        alpha_h = numpy.array([alpha], dtype=numpy.complex64)
        beta_h = numpy.array([beta], dtype=numpy.complex64)
        self._cublas.cgemmStridedBatched(
            self._device.get_cublas_handle(), _OPS[op_b], _OPS[op_a], n, m, k, alpha_h.ctypes.data,
            b.data.ptr, b.strides[1] // item, b.strides[0] // item,
            a.data.ptr, a.strides[1] // item, a.strides[0] // item,
            beta_h.ctypes.data, c.data.ptr, c.strides[1] // item, c.strides[0] // item, a.shape[0])


_EMBED_SOURCE = r"""
extern "C" __global__ void convtune_fft_embed(const float* __restrict__ src, float* __restrict__ dst,
                                              long long rows, int L0, int L1, int n0, int n1, int s0, int s1,
                                              int row_shift) {
    // 2^row_shift threads per output row (image b, row r), as many rows as fit in the block; no
    // per-element index division on the common s1 == 1 path
    const int per_row = 1 << row_shift;
    long long row = (long long)blockIdx.x * (blockDim.x >> row_shift) + (threadIdx.x >> row_shift);
    if (row >= rows) return;
    const int c0 = threadIdx.x & (per_row - 1);
    long long b = row / L0;
    int r = (int)(row - b * L0);
    float* out = dst + row * L1;
    if (r % s0 != 0 || r / s0 >= n0) {
        for (int c = c0; c < L1; c += per_row) out[c] = 0.0f;
        return;
    }
    const float* in = src + (b * n0 + r / s0) * n1;
    if (s1 == 1) {
        for (int c = c0; c < L1; c += per_row) out[c] = c < n1 ? in[c] : 0.0f;
    } else {
        for (int c = c0; c < L1; c += per_row) {
            int q = c / s1;
            out[c] = (c == q * s1 && q < n1) ? in[q] : 0.0f;
        }
    }
}
"""
_EMBED_THREADS = 256


@functools.lru_cache(maxsize=None)
def _embed_kernel():
    import cupy
    return cupy.RawKernel(_EMBED_SOURCE, "convtune_fft_embed")


def _is_cupy(xp) -> bool:
    return xp.__name__ == "cupy"


class FreqMajorConv:
    """One problem's frequency-major FFT executor at fixed transform sizes; built once, called many
    times (the cuFFT plans are made on the first call of each batch chunk size and kept)."""

    def __init__(self, xp, problem: ConvProblem, sizes: tuple[int, ...], chunk: int, strided: bool = False):
        if problem.groups > MAX_GROUPS:
            raise ValueError(f"{problem.groups} groups: the frequency-major product runs one GEMM per group "
                             f"and takes at most {MAX_GROUPS}")
        self.xp, self.p, self.sizes = xp, problem, tuple(sizes)
        self.chunk = max(1, min(chunk, problem.batch))
        self.ops = _CupyOps(xp, self.sizes, strided) if _is_cupy(xp) else _NumpyOps(xp, self.sizes)
        self.F, self.total = spectrum_elems(self.sizes), math.prod(self.sizes)
        p = problem
        self._fwd_index = gather_blocks(self.sizes, forward_positions(p))
        self._wgrad_index = gather_blocks(self.sizes, filter_positions(p))
        self._dgrad_slices = (slice(None), slice(None)) + tuple(
            slice(pad, pad + n) for n, pad in zip(p.input_size, p.padding))
        # the input gradient is the whole inverse transform (no crop): it is written in place
        self._dgrad_whole = not any(p.padding) and p.input_size == self.sizes
        # sample k of an operand sits at k * step of its zero-extended L-sized buffer
        self._x_at = (1,) * p.rank
        self._dy_at = p.stride
        self._w_at = p.dilation

    # -- layout helpers ------------------------------------------------------------
    def _embed(self, a, steps):
        """``a`` (n, C, *spatial) zero-extended to (n*C, *L); no copy when it already has that size."""
        n, c = a.shape[:2]
        flat = a.reshape((n * c,) + a.shape[2:])
        if a.shape[2:] == self.sizes:  # then every step is 1: the samples fill the buffer
            return self.xp.ascontiguousarray(flat)
        return self.ops.embed(flat, steps)

    def _spectrum(self, a, steps):
        """(F, n, C) spectrum of a batch operand (n, C, *spatial)."""
        n, c = a.shape[:2]
        return self.ops.rfft(self._embed(a, steps)).reshape(self.F, n, c)

    def _groups(self, spec, per_group):
        """Per-group views (F, rows, per_group) of an (F, rows, G * per_group) spectrum."""
        return [spec[:, :, g * per_group:(g + 1) * per_group] for g in range(self.p.groups)]

    def _weight_groups(self, w):
        """Per-group (F, Kg, Cg) views of the weight spectrum (F, K, Cg)."""
        p = self.p
        spec = self._spectrum(w, self._w_at)                       # (F, K, Cg)
        return [spec[:, g * p.out_per_group:(g + 1) * p.out_per_group, :] for g in range(p.groups)]

    def _times_weight(self, a, steps, in_per_group, w_g, op_w, out_channels, out_per_group):
        """(F, nb * out_channels) spectrum of a batch chunk ``a`` times the per-group weight spectra."""
        nb = a.shape[0]
        a_g = self._groups(self._spectrum(a, steps), in_per_group)
        res = self.xp.empty((self.F, nb, out_channels), dtype=self.xp.complex64)
        for s, ws, r in zip(a_g, w_g, self._groups(res, out_per_group)):
            self.ops.gemm(s, "N", ws, op_w, r, 1.0 / self.total)
        return res.reshape(self.F, nb * out_channels)

    # -- passes ------------------------------------------------------------------
    def forward(self, x, w, out):
        p, w_g = self.p, self._weight_groups(w)
        for n0, n1 in batch_chunks(p.batch, self.chunk):
            spec = self._times_weight(x[n0:n1], self._x_at, p.in_per_group, w_g, "C", p.out_channels,
                                      p.out_per_group)
            full = self.ops.irfft(spec).reshape((n1 - n0, p.out_channels) + self.sizes)
            gather(out[n0:n1], full, self._fwd_index)
        return out

    def backward_data(self, dy, w, out):
        p, w_g = self.p, self._weight_groups(w)
        for n0, n1 in batch_chunks(p.batch, self.chunk):
            spec = self._times_weight(dy[n0:n1], self._dy_at, p.out_per_group, w_g, "N", p.in_channels,
                                      p.in_per_group)
            target = out[n0:n1]
            if self._dgrad_whole and target.flags.c_contiguous:
                self.ops.irfft(spec, out=target.reshape(((n1 - n0) * p.in_channels,) + self.sizes))
                continue
            full = self.ops.irfft(spec).reshape((n1 - n0, p.in_channels) + self.sizes)
            target[...] = full[self._dgrad_slices]
        return out

    def backward_filter(self, x, dy, out):
        p, ops, xp = self.p, self.ops, self.xp
        scale = 1.0 / self.total
        acc = xp.empty((self.F, p.out_channels, p.in_per_group), dtype=xp.complex64)
        acc_g = [acc[:, g * p.out_per_group:(g + 1) * p.out_per_group, :] for g in range(p.groups)]
        for i, (n0, n1) in enumerate(batch_chunks(p.batch, self.chunk)):
            dy_g = self._groups(self._spectrum(dy[n0:n1], self._dy_at), p.out_per_group)
            x_g = self._groups(self._spectrum(x[n0:n1], self._x_at), p.in_per_group)
            for ds, xs, a in zip(dy_g, x_g, acc_g):
                ops.gemm(ds, "C", xs, "N", a, scale, beta=0.0 if i == 0 else 1.0)
        full = ops.irfft(acc.reshape(self.F, p.out_channels * p.in_per_group))
        gather(out, full.reshape((p.out_channels, p.in_per_group) + self.sizes), self._wgrad_index)
        return out

    def __call__(self, a, b, out):
        return {"fwd": self.forward, "dgrad": self.backward_data, "wgrad": self.backward_filter}[self.p.pass_](a, b, out)


def workspace_bytes(p: ConvProblem, sizes: tuple[int, ...], chunk: int) -> int:
    """Temporary bytes of one call: the zero-extended real buffers, the three spectra, the inverse
    transform's output, and cuFFT's work area (counted as large as the largest spectrum)."""
    nb = max(1, min(chunk, p.batch))
    F, total = spectrum_elems(sizes), math.prod(sizes)
    rows = (nb * p.in_channels, nb * p.out_channels, p.out_channels * p.in_per_group)
    spectra = 8 * F * sum(rows)
    real = 4 * total * (sum(rows) + max(rows))
    return spectra + real + 8 * F * max(rows)
