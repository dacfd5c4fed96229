"""The float64 direct reference: one small GEMM per kernel offset, accumulated.

It is the oracle every candidate is checked against, written for clarity, not
speed; it runs on whatever array module its inputs come from (so on the GPU the
reference is computed on the GPU, keeping verification cheap).
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


def reference(xp, p: ConvProblem, a, b):
    """float64 result of ``p``'s pass on operands ``a, b`` (see :mod:`convtune.problem`)."""
    return REFERENCE[p.pass_](xp, p, a, b)
