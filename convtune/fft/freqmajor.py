"""FFT convolution with frequency-major spectra: the channel product is one strided-batched GEMM.

:class:`~convtune.fft.spectral.SpectralConv` keeps spectra as the FFT library returns them,
``(batch, channels, F)``, and the channel reduction at each frequency then needs transposed copies
of both operands and of the result (CuPy's batched ``matmul`` copies non-contiguous operands).
Here every spectrum is stored frequency-major, ``(F, batch, channels)``, so at every frequency the
operands are plain row-major matrices and the reduction is **one strided-batched complex GEMM**
over the ``F`` frequencies, with the conjugations done by the GEMM's ``op`` argument and the
inverse transform's ``1/N`` by its ``alpha``. On the GPU the layout comes from one cuBLAS ``geam``
transpose per spectrum, or (``strided``) from cuFFT's advanced data layout directly. Zero-extension
is one kernel that writes each element once or (``fused``) happens inside the forward transform, in
a cuFFT JIT load callback that reads the unextended operand; with ``fused`` the inverse transform's
store callback also writes only the wanted outputs (crop, strided outputs, filter taps) into the
result. The inverse transform may overwrite its input (a temporary spectrum), and an input gradient
that is the whole inverse transform is written in place. ``packed`` skips the layout change
altogether: spectra stay in cuFFT's (B, F) layout and are passed around as transposed views, and
the product is convtune's own batched complex GEMM kernel, which reads and writes rows of F
contiguous frequencies (on the H100 about two thirds of cuBLAS's speed; it wins where the
transposes cost more than that); with ``narrow``, for few channels or images,
the product on that layout is instead :mod:`convtune.fft.narrow`'s register-blocked kernel. ``own``
replaces cuFFT with convtune's own one-pass 64x64 transforms (:mod:`convtune.fft.fft64`).

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

import logging
import math

from ..direct.geometry import batch_chunks
from ..problem import ConvProblem
from . import narrow
from .arrayops import CupyOps, NumpyOps, is_cupy
from .cost import spectrum_elems
from .placement import filter_gather, forward_gather, gather_blocks, gather_positions, input_gather

log = logging.getLogger("convtune")

#: Above this many groups one GEMM per group costs more launches than the pointwise product saves.
MAX_GROUPS = 16


def unsupported_reason(problem: ConvProblem) -> str | None:
    """Why :class:`FreqMajorConv` cannot run ``problem``, or ``None``."""
    if problem.groups > MAX_GROUPS:
        return (f"{problem.groups} groups: the frequency-major product runs one GEMM per group and takes at "
                f"most {MAX_GROUPS}")
    return None


def narrow_changed(problem: ConvProblem) -> bool:
    """Did the narrow product change for ``problem``'s shape (the ``fft`` strategy's version 13, the round trips'
    version 18)? Where this executor runs it: a new candidate at a batch of 16 or less with more than 16 channels per
    group on both sides, or other blocks for one of its passes' products (:func:`convtune.fft.narrow.blocks_changed`)."""
    if unsupported_reason(problem) is not None:
        return False
    return (problem.batch <= narrow.MAX_CHANNELS < min(problem.in_per_group, problem.out_per_group) or
            narrow.blocks_changed(problem.in_per_group, problem.out_per_group, problem.batch))


class FreqMajorConv:
    """One problem's frequency-major FFT executor at fixed transform sizes; built once, called many
    times (the cuFFT plans are made on the first call of each batch chunk size and kept)."""

    def __init__(self, xp, problem: ConvProblem, sizes: tuple[int, ...], chunk: int, strided: bool = False,
                 fused: bool = False, packed: bool = False, own: bool = False, narrow: bool = False,
                 tf32: bool = False):
        reason = unsupported_reason(problem)
        if reason is not None:
            raise ValueError(reason)
        self.xp, self.p, self.sizes = xp, problem, tuple(sizes)
        self.chunk = max(1, min(chunk, problem.batch))
        if packed and not is_cupy(xp):
            raise ValueError("the packed product is a CUDA kernel (GPU only)")
        if own and not is_cupy(xp):
            raise ValueError("convtune's own transforms are CUDA kernels (GPU only)")
        # a half-precision or channels_last problem: convtune's own transforms read and write its operands as they
        # lie (float32 storage of bfloat16 values, or its 16 bits), everything between in float32
        self.io = (problem.dtype, problem.layout) != ("float32", "channels_first")
        if self.io and not own:
            raise ValueError(f"a {problem.dtype} {problem.layout} problem runs here with convtune's own transforms "
                             "only (they read and write it; the others run its float32 channels-first problem "
                             "between conversions)")
        self.ops = CupyOps(xp, self.sizes, strided, fused, packed, own, narrow, tf32) if is_cupy(xp) else \
            NumpyOps(xp, self.sizes)
        self.ops.round_bfloat16 = problem.dtype == "bfloat16"
        self.F, self.total = self.ops.F, self.ops.total
        p = problem
        # each gather twice: as slice copies, and as the (offset mod L, step, count) of the fused store
        self._fwd_geometry, self._fwd_index = self._gather(forward_gather(p))
        self._wgrad_geometry, self._wgrad_index = self._gather(filter_gather(p))
        self._dgrad_geometry, self._dgrad_index = self._gather(input_gather(p))
        # the input gradient is the whole inverse transform (no crop): it is written in place
        self._dgrad_whole = not any(p.padding) and p.input_size == self.sizes
        # sample k of an operand sits at k * step of its zero-extended L-sized buffer
        self._x_at = (1,) * p.rank
        self._dy_at = p.stride
        self._w_at = p.dilation

    # -- layout helpers ------------------------------------------------------------
    def _gather(self, spec):
        geometry = tuple((offset % L, step, count) for (offset, step, count), L in zip(spec, self.sizes))
        return geometry, gather_blocks(self.sizes, gather_positions(spec))

    def _spectrum(self, a, steps):
        """(F, n, C) spectrum of a batch operand (n, C, *spatial), zero-extended to L (sample k of
        an axis at k * step)."""
        n, c = a.shape[:2]
        if self.ops.own:  # (convtune's kernels take the operand as it lies)
            return self.ops.rfft(a, steps).reshape(self.F, n, c)
        return self.ops.rfft(a.reshape((n * c,) + a.shape[2:]), steps).reshape(self.F, n, c)

    def _groups(self, spec, per_group):
        """Per-group views (F, rows, per_group) of an (F, rows, G * per_group) spectrum (one group: the spectrum
        itself, no view made: a CuPy view costs microseconds of host time on every pass)."""
        if self.p.groups == 1:
            return [spec]
        return [spec[:, :, g * per_group:(g + 1) * per_group] for g in range(self.p.groups)]

    def _weight_groups(self, ws):
        """Per-group (F, Kg, Cg) views of the weight spectrum (F, K, Cg) (one group: itself)."""
        p = self.p
        if p.groups == 1:
            return [ws]
        return [ws[:, g * p.out_per_group:(g + 1) * p.out_per_group, :] for g in range(p.groups)]

    def _times_weight(self, s, in_per_group, w_g, op_w, out_channels, out_per_group):
        """(F, nb * out_channels) product of a batch chunk's spectrum ``s`` (F, nb, channels) and the
        per-group weight spectra."""
        nb = s.shape[1]
        res = self.ops.empty_spectrum(nb, out_channels)
        for a, ws, r in zip(self._groups(s, in_per_group), w_g, self._groups(res, out_per_group)):
            self.ops.gemm(a, "N", ws, op_w, r, 1.0 / self.total)
        return res.reshape(self.F, nb * out_channels)

    # -- spectra: what a round trip keeps between passes -----------------------------
    def x_spectrum(self, x):
        """(F, n, C) spectrum of the input (or of a batch chunk of it)."""
        return self._spectrum(x, self._x_at)

    def dy_spectrum(self, dy):
        """(F, n, K) spectrum of the output gradient (upsampled by the stride)."""
        return self._spectrum(dy, self._dy_at)

    def w_spectrum(self, w):
        """(F, K, Cg) spectrum of the weight (dilated)."""
        return self._spectrum(w, self._w_at)

    def forward_from(self, xs, ws, out):
        """``out`` (nb, K, *out) from the spectra of a batch chunk's input and of the weight."""
        p = self.p
        spec = self._times_weight(xs, p.in_per_group, self._weight_groups(ws), "C", p.out_channels,
                                  p.out_per_group)
        return self.ops.irfft_into(spec, out, self._fwd_geometry, self._fwd_index)

    def backward_data_from(self, dys, ws, out):
        """``out`` (nb, C, *in) from the spectra of a batch chunk's output gradient and of the weight."""
        p = self.p
        spec = self._times_weight(dys, p.out_per_group, self._weight_groups(ws), "N", p.in_channels,
                                  p.in_per_group)
        if self._dgrad_whole and out.flags.c_contiguous and not self.ops.own:
            self.ops.irfft(spec, out=out.reshape((out.shape[0] * p.in_channels,) + self.sizes))
            return out
        return self.ops.irfft_into(spec, out, self._dgrad_geometry, self._dgrad_index)

    def backward_filter_from(self, pairs, out):
        """``out`` (K, Cg, *k) from ``(dy spectrum, x spectrum)`` of each batch chunk, summed over them."""
        p, ops = self.p, self.ops
        scale = 1.0 / self.total
        acc = ops.empty_spectrum(p.out_channels, p.in_per_group)
        acc_g = self._weight_groups(acc)
        for i, (dys, xs) in enumerate(pairs):
            for ds, s, a in zip(self._groups(dys, p.out_per_group), self._groups(xs, p.in_per_group), acc_g):
                ops.gemm(ds, "C", s, "N", a, scale, beta=0.0 if i == 0 else 1.0)
        ops.irfft_into(acc.reshape(self.F, p.out_channels * p.in_per_group), out, self._wgrad_geometry,
                       self._wgrad_index)
        return out

    # -- passes ------------------------------------------------------------------
    def forward(self, x, w, out):
        ws = self.w_spectrum(w)
        for n0, n1 in batch_chunks(self.p.batch, self.chunk):
            self.forward_from(self.x_spectrum(x[n0:n1]), ws, out[n0:n1])
        return out

    def backward_data(self, dy, w, out):
        ws = self.w_spectrum(w)
        for n0, n1 in batch_chunks(self.p.batch, self.chunk):
            self.backward_data_from(self.dy_spectrum(dy[n0:n1]), ws, out[n0:n1])
        return out

    def backward_filter(self, x, dy, out):
        pairs = ((self.dy_spectrum(dy[n0:n1]), self.x_spectrum(x[n0:n1]))
                 for n0, n1 in batch_chunks(self.p.batch, self.chunk))  # one chunk's spectra alive at a time
        return self.backward_filter_from(pairs, out)

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
