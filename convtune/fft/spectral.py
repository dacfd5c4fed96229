"""Spectral convolution, all three passes, on any NumPy-compatible array module.

With ``L`` per axis chosen as in :mod:`convtune.fft.sizes`, ``x0`` the unpadded
input zero-extended to ``L``, ``wd`` the dilated kernel and ``p`` the padding:

* forward:        ``y[q]  = irfft(X · conj(W))[(q*s - p) mod L]``
* backward-data:  ``dx[i] = irfft(DYu · W)[i + p]``, ``DYu`` the transform of
  ``dy`` upsampled by the stride (zeros between samples)
* backward-filter: ``dw[k] = irfft(Σ_n X · conj(DYu))[(k*dil - p) mod L]``

The channel reduction at every frequency is a batched complex matrix product
(``gemm``) or, for few channels per group, a broadcast product (``pointwise``).
Batches are processed in chunks of ``chunk`` samples to bound the workspace.
"""

from __future__ import annotations

import functools
import math

from ..direct.geometry import batch_chunks
from ..problem import ConvProblem
from .arrayops import CupyOps
from .cost import spectrum_elems
from .placement import fft_aligned, filter_gather, forward_gather, gather, gather_blocks, gather_positions, input_gather
from .spectral_kernels import Kernels

PRODUCTS = ("gemm", "pointwise")
#: ``pointwise`` materialises per-channel-pair products: only for few channels per group.
POINTWISE_MAX_PAIRS = 16


def pointwise_applies(problem: ConvProblem) -> bool:
    """Does the ``pointwise`` product take ``problem`` (at most :data:`POINTWISE_MAX_PAIRS` channel pairs a group)?"""
    return problem.in_per_group * problem.out_per_group <= POINTWISE_MAX_PAIRS


def consuming_irfftn(xp):
    """``irfftn(spec, s=, axes=, norm=)`` that may overwrite ``spec``, for spectra the caller made and
    drops (every product and sum here): on CuPy, ``cupyx.scipy.fft.irfftn`` with ``overwrite_x``,
    which skips the copy ``cupy.fft`` makes of every complex-to-real input (cuFFT's C2R may overwrite
    it) -- a read and a write of the whole spectrum per inverse transform; elsewhere the array
    module's own."""
    if xp.__name__ == "cupy":
        import cupyx.scipy.fft
        return functools.partial(cupyx.scipy.fft.irfftn, overwrite_x=True)
    return xp.fft.irfftn


def _dilate_kernel(xp, w, p: ConvProblem):
    if all(d == 1 for d in p.dilation):
        return w
    wd = xp.zeros(w.shape[:2] + p.dilated_kernel, dtype=w.dtype)
    wd[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in p.dilation)] = w
    return wd


def _upsample(xp, dy, p: ConvProblem):
    """``dy`` with ``stride - 1`` zeros between samples (a view-free no-op at stride 1)."""
    if all(s == 1 for s in p.stride):
        return dy
    shape = tuple((o - 1) * s + 1 for o, s in zip(p.output_size, p.stride))
    up = xp.zeros(dy.shape[:2] + shape, dtype=dy.dtype)
    up[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in p.stride)] = dy
    return up


def _contract(xp, a, b, product):
    """``out[n, g, i, f] = Σ_j a[n, g, j, f] · b[g, i, j, f]``."""
    if product == "gemm":
        at = a.transpose(1, 3, 0, 2)                 # (G, F, n, J)
        bt = b.transpose(0, 3, 2, 1)                 # (G, F, J, I)
        return xp.ascontiguousarray(xp.matmul(at, bt).transpose(2, 0, 3, 1))
    n, g, j, f = a.shape
    out = a[:, :, 0:1, :] * b[None, :, :, 0, :]  # one pass when there is one channel per group (depthwise)
    for jj in range(1, j):
        out += a[:, :, jj:jj + 1, :] * b[None, :, :, jj, :]
    return out


def _batch_correlate(xp, a, b, product):
    """``out[g, i, j, f] = Σ_n a[n, g, i, f] · b[n, g, j, f]`` (the filter-gradient reduction)."""
    if product == "gemm":
        at = a.transpose(1, 3, 2, 0)                 # (G, F, I, n)
        bt = b.transpose(1, 3, 0, 2)                 # (G, F, n, J)
        return xp.matmul(at, bt).transpose(0, 2, 3, 1)
    return (a[:, :, :, None, :] * b[:, :, None, :, :]).sum(axis=0)



def _cufft_ops(xp, sizes):
    """On CuPy, the frequency-major executor's packed cuFFT operations
    (:class:`~convtune.fft.arrayops.CupyOps`): the zero-extension (with a stride's or a dilation's
    spacing) in one kernel, and R2C/C2R plans made once per batch size and kept by the executor, in place
    of ``cupy.fft``'s per-call work (one zero fill and copy per padded axis, its plan cache's lookup:
    about a millisecond of host time per pass of a 51x51 depthwise layer on the H100). ``None``
    elsewhere (the array module's own FFT)."""
    if getattr(xp, "__name__", "") != "cupy":
        return None
    return CupyOps(xp, sizes, packed=True)


class SpectralConv:
    """One problem's FFT executor at fixed transform sizes; built once, called many times."""

    def __init__(self, xp, problem: ConvProblem, sizes: tuple[int, ...], product: str, chunk: int):
        if product not in PRODUCTS:
            raise ValueError(f"unknown product {product!r}; acceptable: {', '.join(PRODUCTS)}")
        self.xp, self.p, self.sizes, self.product = xp, problem, tuple(sizes), product
        self._c2r = consuming_irfftn(xp)
        self.chunk = max(1, min(chunk, problem.batch))
        self.axes = tuple(range(2, 2 + problem.rank))
        self.spec_shape = tuple(sizes[:-1]) + (sizes[-1] // 2 + 1,)
        self.F = spectrum_elems(self.sizes)
        p = problem
        # forward output q reads circular index (q*s - pad) mod L; filter tap k reads (k*dil - pad) mod L
        self._fwd_index = gather_blocks(self.sizes, gather_positions(forward_gather(p)))
        self._wgrad_index = gather_blocks(self.sizes, gather_positions(filter_gather(p)))
        self._dgrad_slices = tuple(slice(pad, pad + n) for n, pad in zip(p.input_size, p.padding))
        self._gpu = _cufft_ops(xp, self.sizes)
        self._kernels = None
        if self._gpu is not None:
            self._kernels = Kernels(xp, self.sizes)
        # a depthwise layer's products are elementwise: one kernel each on the GPU (spectral_kernels)
        self._elementwise = self._kernels is not None and product == "pointwise" and \
            problem.in_per_group == 1 and problem.out_per_group == 1

    # -- transforms --------------------------------------------------------------
    def _rfft(self, a, steps=None):
        """Spectrum of a batch operand (n, C, *spatial), grouped: (n, G, C // G, F); ``steps``: sample
        ``k`` of each axis placed at ``k * step`` (a stride's upsampling, a dilation), on the GPU only
        (see :meth:`_rfft_upsampled`)."""
        n, c = a.shape[:2]
        if self._gpu is not None:  # one embedding kernel and a cuFFT plan made once (see _cufft_ops)
            rows = a.reshape((n * c,) + a.shape[2:])
            spec = self._gpu.rfft(rows, steps or (1,) * self.p.rank).T  # (n*C, F), C-contiguous
        else:
            spec = self.xp.fft.rfftn(fft_aligned(a), s=self.sizes, axes=self.axes)
        return spec.reshape(n, self.p.groups, c // self.p.groups, self.F)

    def _rfft_upsampled(self, dy):
        """:meth:`_rfft` of ``dy`` upsampled by the stride (zeros between samples)."""
        if self._gpu is not None:
            return self._rfft(dy, self.p.stride)
        return self._rfft(_upsample(self.xp, dy, self.p))

    def _irfft(self, spec, channels, prescaled=False):
        """Inverse transform, which may overwrite ``spec`` (every caller's is a temporary of its own);
        ``prescaled``: the 1/N of the inverse is already in ``spec`` (folded into the small weight
        spectrum), so the transform leaves its output unscaled and no extra pass over the full-size
        output is made."""
        n = spec.shape[0]
        if self._gpu is not None:
            full = self._gpu.irfft(spec.reshape(n * channels, self.F).T)  # unnormalised
            if not prescaled:
                full *= 1.0 / math.prod(self.sizes)
            return full.reshape((n, channels) + self.sizes)
        spec = spec.reshape(n, channels, *self.spec_shape)
        return self._c2r(spec, s=self.sizes, axes=self.axes, norm="forward" if prescaled else "backward")

    def _weight_spectrum(self, w, scale=1.0):
        """(G, Cog, Cig, F) spectrum of the dilated kernel, times ``scale``."""
        p = self.p
        if self._gpu is not None:
            spec = self._gpu.rfft(w.reshape((-1,) + w.shape[2:]), p.dilation).T
        else:
            spec = self.xp.fft.rfftn(_dilate_kernel(self.xp, w, p), s=self.sizes, axes=self.axes)
        if scale != 1.0:
            spec *= scale
        return spec.reshape(p.groups, p.out_per_group, p.in_per_group, self.F)

    def _gather(self, target, full, geometry, blocks):
        """``target`` from the circular result ``full``: one kernel on the GPU (1-D and 2-D, a dense
        target), else the slice copies of ``blocks``."""
        if self._kernels is None or not self._kernels.gather(full, target, geometry):
            gather(target, full, blocks)

    # -- passes ------------------------------------------------------------------
    def forward(self, x, w, out):
        xp, p = self.xp, self.p
        scale = 1.0 / math.prod(self.sizes)
        if self._elementwise:  # X * conj(W) / N in one kernel
            ws = self._weight_spectrum(w)
            product = lambda xs: self._kernels.multiply(xs, ws, scale, conj_b=True)  # noqa: E731
        else:
            w_conj = xp.conj(self._weight_spectrum(w, scale))
            product = lambda xs: _contract(xp, xs, w_conj, self.product)  # noqa: E731
        geometry = forward_gather(p)
        for n0, n1 in batch_chunks(p.batch, self.chunk):
            y_spec = product(self._rfft(x[n0:n1]))
            self._gather(out[n0:n1], self._irfft(y_spec, p.out_channels, prescaled=True), geometry, self._fwd_index)
        return out

    def backward_data(self, dy, w, out):
        xp, p = self.xp, self.p
        scale = 1.0 / math.prod(self.sizes)
        if self._elementwise:  # DY * W / N in one kernel (one channel per group: W is its own transpose)
            ws = self._weight_spectrum(w)
            product = lambda dys: self._kernels.multiply(dys, ws, scale, conj_b=False)  # noqa: E731
        else:
            w_t = self._weight_spectrum(w, scale).transpose(0, 2, 1, 3)  # (G, Cig, Cog, F)
            product = lambda dys: _contract(xp, dys, w_t, self.product)  # noqa: E731
        geometry = input_gather(p)
        crop = (slice(None), slice(None)) + self._dgrad_slices
        for n0, n1 in batch_chunks(p.batch, self.chunk):
            full = self._irfft(product(self._rfft_upsampled(dy[n0:n1])), p.in_channels, prescaled=True)
            if self._kernels is None or not self._kernels.gather(full, out[n0:n1], geometry):
                out[n0:n1] = full[crop]
        return out

    def backward_filter(self, x, dy, out):
        xp, p = self.xp, self.p
        acc = None
        if self._elementwise:  # sum_n conj(DY) * X / N in one kernel per chunk (the 1/N of the inverse)
            for n0, n1 in batch_chunks(p.batch, self.chunk):
                acc = self._kernels.correlate(self._rfft_upsampled(dy[n0:n1]), self._rfft(x[n0:n1]),
                                              1.0 / math.prod(self.sizes), into=acc)
            dw_full = self._irfft(acc, p.in_per_group, prescaled=True)
        else:
            for n0, n1 in batch_chunks(p.batch, self.chunk):
                dy_conj = xp.conj(self._rfft_upsampled(dy[n0:n1]))
                part = _batch_correlate(xp, dy_conj, self._rfft(x[n0:n1]), self.product)
                if acc is None:
                    acc = part
                else:
                    acc += part
            dw_full = self._irfft(xp.ascontiguousarray(acc).reshape(p.out_channels, p.in_per_group, self.F),
                                  p.in_per_group)
        self._gather(out, dw_full, filter_gather(p), self._wgrad_index)
        return out

    def __call__(self, a, b, out):
        return {"fwd": self.forward, "dgrad": self.backward_data, "wgrad": self.backward_filter}[self.p.pass_](a, b, out)


class SpectralKept(SpectralConv):
    """:class:`SpectralConv` split at its spectra, for round trips that keep them between passes
    (:mod:`convtune.roundtrip`): the whole batch at once, the interface of the frequency-major
    executor (``x_spectrum``, ``w_spectrum``, ``dy_spectrum``, ``*_from``). With the ``pointwise``
    product this is the kept-spectra round trip of depthwise and few-channel grouped layers, whose
    groups the frequency-major GEMMs cannot take."""

    def __init__(self, xp, problem: ConvProblem, sizes: tuple[int, ...], product: str):
        super().__init__(xp, problem.for_pass("fwd"), sizes, product, problem.batch)

    def x_spectrum(self, x):
        return self._rfft(x)

    def w_spectrum(self, w):
        """The weight's spectrum with the inverse transforms' 1/N folded in (the forward and the input
        gradient both divide by N; the filter gradient does not read it)."""
        return self._weight_spectrum(w, 1.0 / math.prod(self.sizes))

    def dy_spectrum(self, dy):
        return self._rfft_upsampled(dy)

    def forward_from(self, xs, ws, out):
        y_spec = _contract(self.xp, xs, self.xp.conj(ws), self.product)
        gather(out, self._irfft(y_spec, self.p.out_channels, prescaled=True), self._fwd_index)
        return out

    def backward_data_from(self, dys, ws, out):
        dx_spec = _contract(self.xp, dys, ws.transpose(0, 2, 1, 3), self.product)
        out[...] = self._irfft(dx_spec, self.p.in_channels, prescaled=True)[
            (slice(None), slice(None)) + self._dgrad_slices]
        return out

    def backward_filter_from(self, pairs, out):
        """``pairs``: ``[(dy spectrum, x spectrum)]`` (batch parts, summed)."""
        xp, p = self.xp, self.p
        acc = None
        for dys, xs in pairs:
            part = _batch_correlate(xp, xp.conj(dys), xs, self.product)
            acc = part if acc is None else acc + part
        dw_full = self._irfft(xp.ascontiguousarray(acc).reshape(p.out_channels, p.in_per_group, self.F),
                              p.in_per_group)
        gather(out, dw_full, self._wgrad_index)
        return out


def workspace_bytes(p: ConvProblem, sizes: tuple[int, ...], chunk: int) -> int:
    """Temporary bytes: spectra (complex64) with their transposed copies, and the real transform buffers."""
    nb = max(1, min(chunk, p.batch))
    F, total = spectrum_elems(sizes), math.prod(sizes)
    spectra = 8 * F * (2 * nb * p.in_channels + 2 * p.out_channels * p.in_per_group + 2 * nb * p.out_channels)
    real = 4 * total * max(nb * p.in_channels, nb * p.out_channels, p.out_channels * p.in_per_group)
    return spectra + 2 * real
