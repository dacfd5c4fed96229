"""The NumPy model of :mod:`convtune.fft.rowconv`'s kernels: their algorithm step by step in float64 (the Stockham
passes, the packing of a real row two samples to a point, the pair unpacking and packing, the shifts), which the CPU
tests check against float64 FFTs and direct convolution, so the index arithmetic the kernels share is tested where no
GPU is."""

from __future__ import annotations

import numpy

from ..problem import ConvProblem
from .rowconv import reason, shifts, transform_size
from .rowsource import radices


def _stockham(z, inverse: bool, large=()):
    """Unnormalised DFT of each row of ``z`` (rows, M) by the kernels' Stockham passes (autosort: natural order)."""
    rows, m = z.shape
    sign = 1.0 if inverse else -1.0
    ns = 1
    for r in radices(m, large):
        b = numpy.arange(m // r)
        k = b % ns
        w = numpy.exp(sign * 1j * numpy.pi * 2.0 * k / (ns * r))  # (the kernels: a table, or sincospif and powers)
        v = numpy.stack([z[:, b + q * (m // r)] * w ** q for q in range(r)], axis=1)
        dft = numpy.exp(sign * 2j * numpy.pi * numpy.outer(numpy.arange(r), numpy.arange(r)) / r)
        v = numpy.einsum("sq,nqb->nsb", dft, v)
        out = numpy.empty_like(z)
        d = (b - k) * r + k
        for s in range(r):
            out[:, d + s * ns] = v[:, s]
        z, ns = out, ns * r
    return z


def _twiddle(f, m):
    """``exp(-i pi f / M)``: the real transform's half-length twiddle of frequency ``f``."""
    return numpy.exp(-1j * numpy.pi * f / m)


def _unpack(zf, zm, tw):
    """Frequencies ``f`` and ``M - f`` of the real row's spectrum from ``Z[f]`` and ``Z[(M - f) mod M]`` of its packed
    complex row (``tw``: :func:`_twiddle`; ``f = 0`` gives ``A[0]`` and ``A[M]``)."""
    e = 0.5 * (zf + numpy.conj(zm))
    o = -0.5j * (zf - numpy.conj(zm))
    t = tw * o
    return e + t, numpy.conj(e - t)


def _pack(yf, ym, tw):
    """The inverse's packed complex row at ``f`` and ``M - f`` from the spectrum's ``Y[f]`` and ``Y[M - f]``."""
    s = yf + numpy.conj(ym)
    d = yf - numpy.conj(ym)
    return s + 1j * numpy.conj(tw) * d, numpy.conj(s) + 1j * tw * numpy.conj(d)


def _pairs(m):
    f = numpy.arange(m // 2 + 1)
    return f, _twiddle(f, m)


def model_spectrum(rows, L: int):
    """Real spectra ``(R, M + 1)`` of ``rows`` (R, n) zero-extended to ``L``, as the kernels make them."""
    m = L // 2
    a = numpy.zeros((rows.shape[0], L))
    a[:, :rows.shape[1]] = rows
    z = _stockham(a[:, 0::2] + 1j * a[:, 1::2], inverse=False)
    f, tw = _pairs(m)
    af, am = _unpack(z[:, f], z[:, (m - f) % m], tw)
    spec = numpy.empty((rows.shape[0], m + 1), dtype=complex)
    spec[:, m - f] = am
    spec[:, f] = af
    return spec


def model_inverse(spec, L: int):
    """The real rows ``(R, L)`` of spectra ``(R, M + 1)``, divided by ``L``, as the kernels make them."""
    m = L // 2
    f, tw = _pairs(m)
    pf, pm = _pack(spec[:, f], spec[:, m - f], tw)
    z = numpy.empty((spec.shape[0], m), dtype=complex)
    z[:, (m - f[1:])] = pm[:, 1:]  # (f = 0's partner would be M: not a point of the row)
    z[:, f] = pf
    z = _stockham(z, inverse=True) / L
    out = numpy.empty((spec.shape[0], L))
    out[:, 0::2], out[:, 1::2] = z.real, z.imag
    return out


def model(p: ConvProblem, a, b, L: int | None = None):
    """``p``'s pass on float64 channels-first operands ``a``, ``b`` by the kernels' algorithm (the CPU's check of it)."""
    L = transform_size(p) if L is None else L
    why = reason(p, L)
    if why:
        raise ValueError(why)
    n_batch, channels = p.batch, p.in_channels
    shift = shifts(p, L)
    if p.pass_ == "wgrad":
        xs = model_spectrum(a.reshape(n_batch * channels, -1), L).reshape(n_batch, channels, -1)
        dys = model_spectrum(b.reshape(n_batch * channels, -1), L).reshape(n_batch, channels, -1)
        rows, length = model_inverse((numpy.conj(dys) * xs).sum(axis=0), L), p.kernel_size[0]
        out_shape = p.w_shape
    else:
        spec = model_spectrum(a.reshape(n_batch * channels, -1), L).reshape(n_batch, channels, -1)
        ws = model_spectrum(b.reshape(channels, -1), L)
        product = spec * (numpy.conj(ws) if p.pass_ == "fwd" else ws)
        rows = model_inverse(product.reshape(n_batch * channels, -1), L)
        length = p.output_size[0] if p.pass_ == "fwd" else p.input_size[0]
        out_shape = p.result_shape
    t = (numpy.arange(length) + shift) % L
    return rows[:, t].reshape(out_shape)
