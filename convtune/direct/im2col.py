"""im2col + GEMM, all three passes, in batch chunks that bound the workspace.

``cols`` holds, for each sample and group, a ``(Cig*K, P)`` matrix whose row
``c*K + k`` is channel ``c`` of the padded input seen through kernel offset
``k`` (K kernel positions, P output positions), so that the forward pass is one
batched GEMM with the weight viewed as ``(G, Cog, Cig*K)``.
"""

from __future__ import annotations

import functools
import importlib
import math

from ..problem import ConvProblem
from .geometry import batch_chunks, crop_padding, kernel_offsets, pad_input


def is_pointwise_gemm(p: ConvProblem) -> bool:
    """1x1, stride 1, unpadded: the input already is the column matrix."""
    return (math.prod(p.kernel_size) == 1 and all(s == 1 for s in p.stride) and not any(p.padding))


def im2col(xp, p: ConvProblem, x_pad, nb: int, out=None):
    """Columns of a padded chunk ``x_pad`` (nb, Cin, *padded): shape (nb, G, Cig*K, P)."""
    K, P = math.prod(p.kernel_size), math.prod(p.output_size)
    if is_pointwise_gemm(p):
        return x_pad.reshape(nb, p.groups, p.in_per_group, P)
    cols = out if out is not None else xp.empty((nb, p.groups, p.in_per_group * K, P), dtype=x_pad.dtype)
    xg = x_pad.reshape(nb, p.groups, p.in_per_group, *x_pad.shape[2:])
    # every kernel offset's strided slice at once: a window view of the padded input, axes (n, g, c,
    # kernel..., output...), written into the columns by one copy (one kernel on the GPU, not K)
    shape = (nb, p.groups, p.in_per_group) + p.kernel_size + p.output_size
    spatial = xg.strides[3:]
    strides = xg.strides[:3] + tuple(st * d for st, d in zip(spatial, p.dilation)) + \
        tuple(st * s for st, s in zip(spatial, p.stride))
    cols.reshape(shape)[...] = _as_strided(xp)(xg, shape, strides)
    return cols


@functools.cache
def _as_strided(xp):
    """The array module's ``as_strided`` (imported by name: ``cupy.lib`` need not be loaded as an attribute)."""
    return importlib.import_module(f"{xp.__name__}.lib.stride_tricks").as_strided


def col2im_add(xp, p: ConvProblem, cols, dx_pad):
    """Scatter-add columns (nb, G, Cig*K, P) back into a zeroed padded gradient chunk."""
    nb = cols.shape[0]
    K = math.prod(p.kernel_size)
    cols6 = cols.reshape(nb, p.groups, p.in_per_group, K, *p.output_size)
    dg = dx_pad.reshape(nb, p.groups, p.in_per_group, *dx_pad.shape[2:])
    for flat, _offset, sl in kernel_offsets(p):
        dg[(slice(None),) * 3 + sl] += cols6[:, :, :, flat]


def _weight_matrix(p: ConvProblem, w):
    return w.reshape(p.groups, p.out_per_group, p.in_per_group * math.prod(p.kernel_size))


def forward(xp, p: ConvProblem, chunk: int, x, w, out):
    wmat = _weight_matrix(p, w)
    P = math.prod(p.output_size)
    for n0, n1 in batch_chunks(p.batch, chunk):
        cols = im2col(xp, p, pad_input(xp, x[n0:n1], p.padding), n1 - n0)
        xp.matmul(wmat, cols, out=out[n0:n1].reshape(n1 - n0, p.groups, p.out_per_group, P))
    return out


def backward_data(xp, p: ConvProblem, chunk: int, dy, w, out):
    wmat_t = xp.ascontiguousarray(xp.swapaxes(_weight_matrix(p, w), -1, -2))
    P = math.prod(p.output_size)
    if is_pointwise_gemm(p):
        for n0, n1 in batch_chunks(p.batch, chunk):
            nb = n1 - n0
            xp.matmul(wmat_t, dy[n0:n1].reshape(nb, p.groups, p.out_per_group, P),
                      out=out[n0:n1].reshape(nb, p.groups, p.in_per_group, P))
        return out
    padded = tuple(n + 2 * q for n, q in zip(p.input_size, p.padding))
    for n0, n1 in batch_chunks(p.batch, chunk):
        nb = n1 - n0
        cols = xp.matmul(wmat_t, dy[n0:n1].reshape(nb, p.groups, p.out_per_group, P))
        dx_pad = xp.zeros((nb, p.in_channels, *padded), dtype=dy.dtype)
        col2im_add(xp, p, cols, dx_pad)
        out[n0:n1] = crop_padding(dx_pad, p.padding)
    return out


def backward_filter(xp, p: ConvProblem, chunk: int, x, dy, out):
    P = math.prod(p.output_size)
    G, Cog = p.groups, p.out_per_group
    acc = None
    for n0, n1 in batch_chunks(p.batch, chunk):
        nb = n1 - n0
        cols = im2col(xp, p, pad_input(xp, x[n0:n1], p.padding), nb)
        # one GEMM per chunk with the batch folded into the reduction: (G, Cog, nb*P) @ (G, nb*P, Cig*K)
        dy_g = xp.ascontiguousarray(dy[n0:n1].reshape(nb, G, Cog, P).transpose(1, 2, 0, 3)).reshape(G, Cog, nb * P)
        cols_t = xp.ascontiguousarray(cols.transpose(1, 0, 3, 2)).reshape(G, nb * P, -1)
        part = xp.matmul(dy_g, cols_t)
        if acc is None:
            acc = part
        else:
            acc += part
    out[...] = acc.reshape(p.w_shape)
    return out


PASS_FUNCTIONS = {"fwd": forward, "dgrad": backward_data, "wgrad": backward_filter}


def workspace_bytes(p: ConvProblem, chunk: int) -> int:
    """Temporary bytes of one chunk (float32): padded input, columns and transposed copies."""
    nb = max(1, min(chunk, p.batch))
    K, P = math.prod(p.kernel_size), math.prod(p.output_size)
    padded = math.prod(n + 2 * q for n, q in zip(p.input_size, p.padding))
    cols = 0 if is_pointwise_gemm(p) else nb * p.in_channels * K * P
    pad = nb * p.in_channels * padded if any(p.padding) else 0
    extra = {"fwd": 0, "dgrad": nb * p.in_channels * padded,
             "wgrad": nb * (p.in_channels * K * P + p.out_channels * P) + p.out_channels * p.in_per_group * K}
    return 4 * (cols + pad + extra[p.pass_])
