"""The float64 reference: one small GEMM per kernel offset, accumulated.

It is the oracle every candidate is checked against, written for clarity, not
speed; it runs on whatever array module its inputs come from (so on the GPU the
reference is computed on the GPU, keeping verification cheap).

A kernel of many taps (:data:`SPECTRAL_TAPS`) at stride and dilation 1 would cost one GEMM launch per tap (2,601 for
51x51: about a second per problem on an H200, 7 s of SLaK-T's tune); there the reference is the same sums taken
through float64 FFTs of the padded length, where circular wrap-around cannot reach the result (their error is
around 1e-15, far inside every tolerance): :func:`spectral_reference`, checked against the direct sums in the tests.
"""

from __future__ import annotations

import math

from ..problem import ConvProblem
from .geometry import crop_padding, kernel_offsets, pad_input


def _grouped(a, groups, spatial_from=2):
    return a.reshape(a.shape[0], groups, a.shape[1] // groups, *a.shape[spatial_from:])


def reference_forward(xp, p: ConvProblem, x, w):
    x = pad_input(xp, x.astype(xp.float64), p.padding)
    w = w.astype(xp.float64).reshape(p.groups, p.out_per_group, p.in_per_group, *p.kernel_size)
    xg = _grouped(x, p.groups)
    n_out = math.prod(p.output_size)
    y = xp.zeros((p.batch, p.groups, p.out_per_group, n_out), dtype=xp.float64)
    for _flat, offset, sl in kernel_offsets(p):
        xs = xg[(slice(None),) * 3 + sl].reshape(p.batch, p.groups, p.in_per_group, n_out)
        y += xp.matmul(w[(Ellipsis,) + offset], xs)
    return y.reshape(p.y_shape)


def reference_backward_data(xp, p: ConvProblem, dy, w):
    w = w.astype(xp.float64).reshape(p.groups, p.out_per_group, p.in_per_group, *p.kernel_size)
    dyg = dy.astype(xp.float64).reshape(p.batch, p.groups, p.out_per_group, -1)
    padded = tuple(n + 2 * q for n, q in zip(p.input_size, p.padding))
    dx = xp.zeros((p.batch, p.groups, p.in_per_group, *padded), dtype=xp.float64)
    for _flat, offset, sl in kernel_offsets(p):
        wt = xp.swapaxes(w[(Ellipsis,) + offset], -1, -2)
        dx[(slice(None),) * 3 + sl] += xp.matmul(wt, dyg).reshape(p.batch, p.groups, p.in_per_group, *p.output_size)
    return xp.ascontiguousarray(crop_padding(dx.reshape(p.batch, p.in_channels, *padded), p.padding))


def reference_backward_filter(xp, p: ConvProblem, x, dy):
    x = pad_input(xp, x.astype(xp.float64), p.padding)
    xg = _grouped(x, p.groups)
    n_out = math.prod(p.output_size)
    dyg = dy.astype(xp.float64).reshape(p.batch, p.groups, p.out_per_group, n_out)
    dw = xp.zeros((p.groups, p.out_per_group, p.in_per_group, *p.kernel_size), dtype=xp.float64)
    for _flat, offset, sl in kernel_offsets(p):
        xs = xg[(slice(None),) * 3 + sl].reshape(p.batch, p.groups, p.in_per_group, n_out)
        dw[(Ellipsis,) + offset] = xp.matmul(dyg, xp.swapaxes(xs, -1, -2)).sum(axis=0)
    return dw.reshape(p.w_shape)


REFERENCE = {"fwd": reference_forward, "dgrad": reference_backward_data, "wgrad": reference_backward_filter}

#: Kernels of at least this many taps, at stride and dilation 1, are referenced through FFTs (11x11 and larger).
SPECTRAL_TAPS = 121
#: ... where the filter's spectrum, in complex128, stays within this (a dense large kernel's would not).
SPECTRAL_BYTES = 1 << 30


def spectral_applies(p: ConvProblem) -> bool:
    """Is ``p`` referenced through FFTs (:func:`spectral_reference`)?"""
    if math.prod(p.kernel_size) < SPECTRAL_TAPS or any(s != 1 for s in p.stride) or any(d != 1 for d in p.dilation):
        return False
    padded = [n + 2 * q for n, q in zip(p.input_size, p.padding)]
    bins = math.prod(padded[:-1]) * (padded[-1] // 2 + 1)
    return 16 * bins * p.out_channels * p.in_per_group <= SPECTRAL_BYTES


def spectral_reference(xp, p: ConvProblem, a, b):
    """The float64 result of ``p``'s pass (stride and dilation 1) through FFTs of the padded input's length ``L``.
    Forward ``y[i] = sum_k x[i+k] w[k]`` is a correlation, backward-data ``dx[j] = sum_k dy[j-k] w[k]`` a
    convolution, backward-filter ``dw[k] = sum_i x[i+k] dy[i]`` a correlation; each index they read stays below
    ``L`` (the output is ``L - k + 1`` long), so the circular products of length ``L`` are the linear ones."""
    size = tuple(n + 2 * q for n, q in zip(p.input_size, p.padding))
    axes = tuple(range(-p.rank, 0))
    g, cig, cog = p.groups, p.in_per_group, p.out_per_group

    def spectrum(v, *lead):  # rfftn over the spatial axes, zero-extended to ``size``, channels split by group
        f = xp.fft.rfftn(v.astype(xp.float64), s=size, axes=axes)
        return f.reshape(*lead, -1), f.shape[-p.rank:]

    def signal(f, bins, lead):
        return xp.fft.irfftn(f.reshape(*lead, *bins), s=size, axes=axes)

    if p.pass_ == "fwd":
        x, w = a, b
        xf, bins = spectrum(pad_input(xp, x, p.padding), p.batch, g, cig)
        wf, _ = spectrum(w.reshape(g, cog, cig, *p.kernel_size), g, cog, cig)
        y = signal(xp.einsum("ngcf,gocf->ngof", xf, xp.conj(wf)), bins, (p.batch, p.out_channels))
        return xp.ascontiguousarray(y[(Ellipsis,) + tuple(slice(0, o) for o in p.output_size)])
    if p.pass_ == "dgrad":
        dy, w = a, b
        dyf, bins = spectrum(dy.reshape(p.batch, g, cog, *p.output_size), p.batch, g, cog)
        wf, _ = spectrum(w.reshape(g, cog, cig, *p.kernel_size), g, cog, cig)
        dx = signal(xp.einsum("ngof,gocf->ngcf", dyf, wf), bins, (p.batch, p.in_channels))
        return xp.ascontiguousarray(crop_padding(dx, p.padding))
    x, dy = a, b
    xf, bins = spectrum(pad_input(xp, x, p.padding), p.batch, g, cig)
    dyf, _ = spectrum(dy.reshape(p.batch, g, cog, *p.output_size), p.batch, g, cog)
    dw = signal(xp.einsum("ngof,ngcf->gocf", xp.conj(dyf), xf), bins, (p.out_channels, cig))
    return xp.ascontiguousarray(dw[(Ellipsis,) + tuple(slice(0, k) for k in p.kernel_size)])


def reference(xp, p: ConvProblem, a, b):
    """float64 result of ``p``'s pass on operands ``a, b`` (see :mod:`convtune.problem`)."""
    if spectral_applies(p):
        return spectral_reference(xp, p, a, b)
    return REFERENCE[p.pass_](xp, p, a, b)
