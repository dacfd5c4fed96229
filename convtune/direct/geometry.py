"""Index geometry shared by the spatial-domain paths.

For kernel offset ``k`` (a tuple, one entry per axis) the input positions that
meet it, over all outputs, form one strided slice of the padded input:
``k*dil : k*dil + stride*(out-1) + 1 : stride``.
"""

from __future__ import annotations

import functools
import itertools

from ..problem import ConvProblem


@functools.lru_cache(maxsize=4096)
def kernel_offsets(problem: ConvProblem) -> tuple:
    """``(flat_index, offset, spatial_slices)`` for every kernel offset, row-major (made once per problem:
    executors walk them on every call)."""
    ranges = [range(k) for k in problem.kernel_size]
    return tuple((flat, offset, tuple(slice(k * d, k * d + s * (o - 1) + 1, s) for k, d, s, o in
                                      zip(offset, problem.dilation, problem.stride, problem.output_size)))
                 for flat, offset in enumerate(itertools.product(*ranges)))


def pad_input(xp, x, padding):
    """Zero-pad the spatial axes of ``x`` (N, C, *spatial) symmetrically; no copy when unpadded."""
    if not any(padding):
        return x
    # a zero fill and one slice copy (the array modules' ``pad`` costs tens of microseconds of Python per call)
    out = xp.zeros(x.shape[:2] + tuple(n + 2 * p for n, p in zip(x.shape[2:], padding)), dtype=x.dtype)
    out[(slice(None), slice(None)) + tuple(slice(p, p + n) for n, p in zip(x.shape[2:], padding))] = x
    return out


def crop_padding(x_pad, padding):
    """Inverse of :func:`pad_input`: a view of the unpadded region."""
    if not any(padding):
        return x_pad
    return x_pad[(slice(None), slice(None)) + tuple(slice(p, x_pad.shape[2 + i] - p) for i, p in enumerate(padding))]


def batch_chunks(batch: int, chunk: int):
    """Yield ``(start, stop)`` covering ``range(batch)`` in pieces of at most ``chunk``."""
    chunk = max(1, min(chunk, batch))
    for start in range(0, batch, chunk):
        yield start, min(batch, start + chunk)
