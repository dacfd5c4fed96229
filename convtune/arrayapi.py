"""The array API: :func:`conv`, :func:`conv_backward_data` and :func:`conv_backward_filter` on NumPy or CuPy arrays,
with PyTorch's argument forms (``padding`` as an int, a sequence, ``"valid"`` or ``"same"``; unbatched inputs; empty
batches), each call dispatched through a runtime's lookup order (:meth:`convtune.runtime.Runtime.dispatch`)."""

from __future__ import annotations

import importlib

import numpy as np

from . import precision
from .plan import Plan
from .problem import ConvProblem, integral, per_axis

from .runtime import Runtime, default_runtime

def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _device_id(a):
    """The CUDA device a CuPy array lives on (``None`` for NumPy): built plans (cuFFT plans, cuDNN
    graphs) belong to one device, so the memo keeps one per device."""
    return getattr(getattr(a, "device", None), "id", None)


def _precision(a, b) -> dict:
    """The dtype and layout of a call's operands (they must share a dtype; the layout is ``a``'s)."""
    dtype = precision.dtype_of(a)
    if precision.dtype_of(b) != dtype:
        raise ValueError(f"the operands have dtypes {a.dtype} and {b.dtype}; convtune runs both in one dtype")
    return {"dtype": dtype, "layout": precision.layout_of(a)}


def _layer_fields(x_shape, w_shape, stride, padding, dilation, groups, math, pass_, dtype="float32",
                  layout="channels_first"):
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ValueError(f"expected input (N, C, *spatial) and weight (C_out, C_in/groups, *kernel) of the same "
                         f"rank; got shapes {tuple(x_shape)} and {tuple(w_shape)}")
    groups = integral(groups, "groups")
    if groups <= 0:
        raise ValueError(f"groups must be a positive integer, got {groups}")
    if w_shape[1] * groups != x_shape[1]:
        raise ValueError(f"weight shape {tuple(w_shape)} expects {w_shape[1] * groups} input channels with "
                         f"groups={groups}, but the input has {x_shape[1]}")
    return ConvProblem.make(batch=x_shape[0], in_channels=x_shape[1], out_channels=w_shape[0],
                            input_size=tuple(x_shape[2:]), kernel_size=tuple(w_shape[2:]), stride=stride,
                            padding=padding, dilation=dilation, groups=groups, math=math, pass_=pass_, dtype=dtype,
                            layout=layout)


def _backward_problem(x_shape, w_shape, dy, stride, padding, dilation, groups, math, pass_, **kinds):
    """The problem of a backward pass, checking that ``dy`` has the forward output's shape."""
    problem = _layer_fields(x_shape, w_shape, stride, padding, dilation, groups, math, pass_, **kinds)
    if tuple(dy.shape) != problem.y_shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but input {tuple(x_shape)} and weight {tuple(w_shape)} "
                         f"give outputs of shape {problem.y_shape}")
    return problem


# -- PyTorch's argument forms: "same"/"valid" padding, unbatched input, an empty batch ------------------

def padding_sides(padding, kernel, dilation, stride) -> list[tuple[int, int]]:
    """Zeros before and after each spatial axis for ``padding``: an int, a sequence, ``'valid'`` or
    ``'same'`` (an even kernel's extra zero after, as in PyTorch; stride 1 only)."""
    rank = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * rank
        if padding == "same":
            if any(s != 1 for s in per_axis(stride, rank, "stride")):
                raise ValueError("padding='same' is not supported for strided convolutions")
            totals = [d * (k - 1) for d, k in zip(per_axis(dilation, rank, "dilation"), kernel)]
            return [(t // 2, t - t // 2) for t in totals]
        raise ValueError(f"invalid padding string {padding!r}; acceptable: 'valid', 'same', or integers")
    return [(p, p) for p in per_axis(padding, rank, "padding")]


def _general(a, w, padding):
    """Does this call need :func:`_normalized` (a string padding, an unbatched or empty input)?"""
    return isinstance(padding, str) or a.ndim == w.ndim - 1 or (a.ndim == w.ndim and a.shape[0] == 0)


def _normalized(x_like, w, stride, padding, dilation):
    """``(unbatched, left pads, right extra per axis)`` of a call in PyTorch's forms."""
    if w.ndim < 3:
        raise ValueError(f"expected a weight (C_out, C_in/groups, *kernel); got shape {tuple(w.shape)}")
    unbatched = len(x_like) == w.ndim - 1
    sides = padding_sides(padding, tuple(w.shape[2:]), dilation, stride)
    return unbatched, tuple(left for left, _ in sides), tuple(right - left for left, right in sides)


def _xp(a):
    return importlib.import_module("cupy") if type(a).__module__.startswith("cupy") else np


def _pad_after(xp, a, extra):
    if not any(extra):
        return a
    return xp.pad(a, [(0, 0), (0, 0)] + [(0, e) for e in extra])


def _into(out, result):
    if out is None:
        return result
    out[...] = result
    return out


def _conv_general(x, w, stride, padding, dilation, groups, math, plan, out, runtime):
    xp = _xp(x)
    unbatched, pads, extra = _normalized(x.shape, w, stride, padding, dilation)
    xb = _pad_after(xp, x[None] if unbatched else x, extra)
    if xb.shape[0] == 0:  # an empty batch: an empty result, as in PyTorch
        problem = _layer_fields((1, *xb.shape[1:]), w.shape, stride, pads, dilation, groups, math, "fwd")
        y = xp.zeros((0, *problem.y_shape[1:]), dtype=x.dtype)
    else:
        y = conv(xb, w, stride, pads, dilation, groups, math=math, plan=plan, runtime=runtime)
    return _into(out, y[0] if unbatched else y)


def _ranks_agree(a_name, a_shape, b_name, b_shape, w_shape) -> None:
    """Two operands of a pass and the weight: both batched ``(N, C, *spatial)`` or both unbatched ``(C, *spatial)``, of
    the weight's rank (``ValueError`` naming the shapes, as PyTorch refuses them)."""
    rank = len(w_shape)
    if len(a_shape) != len(b_shape) or len(a_shape) not in (rank, rank - 1):
        raise ValueError(f"expected {a_name} and {b_name} both (N, C, *spatial) or both unbatched (C, *spatial), of "
                         f"the rank of the weight {tuple(w_shape)}; got shapes {tuple(a_shape)} and {tuple(b_shape)}")


def _dgrad_general(dy, w, x_shape, stride, padding, dilation, groups, math, plan, out, runtime):
    _ranks_agree("x_shape", x_shape, "dy", dy.shape, w.shape)
    xp = _xp(dy)
    unbatched, pads, extra = _normalized(x_shape, w, stride, padding, dilation)
    full = (1, *x_shape) if unbatched else tuple(x_shape)
    padded = (*full[:2], *(n + e for n, e in zip(full[2:], extra)))
    dyb = dy[None] if unbatched else dy
    if full[0] == 0:
        dx = xp.zeros(full, dtype=dy.dtype)
    else:
        dx = conv_backward_data(dyb, w, padded, stride, pads, dilation, groups, math=math, plan=plan, runtime=runtime)
        dx = dx[(slice(None), slice(None), *(slice(0, n) for n in full[2:]))]
    return _into(out, dx[0] if unbatched else dx)


def _wgrad_general(x, dy, w_shape, stride, padding, dilation, groups, math, plan, out, runtime):
    _ranks_agree("x", x.shape, "dy", dy.shape, w_shape)
    xp = _xp(x)
    w_like = np.empty(w_shape, dtype=np.uint8)  # only its shape is read
    unbatched, pads, extra = _normalized(x.shape, w_like, stride, padding, dilation)
    xb = _pad_after(xp, x[None] if unbatched else x, extra)
    dyb = dy[None] if unbatched else dy
    if xb.shape[0] == 0:  # nothing summed: a zero gradient
        dw = xp.zeros(tuple(w_shape), dtype=x.dtype)
    else:
        dw = conv_backward_filter(xb, dyb, w_shape, stride, pads, dilation, groups, math=math, plan=plan,
                                  runtime=runtime)
    return _into(out, dw)


def conv(x, w, stride=1, padding=0, dilation=1, groups=1, *, math="fp32", plan: Plan | None = None, out=None,
         runtime: Runtime | None = None):
    """Forward convolution (cross-correlation, as in PyTorch) through a tuned plan.

    Parameters
    ----------
    x : array (N, C_in, *spatial) or, unbatched, (C_in, *spatial); NumPy or CuPy; float32 or float16;
        channels-last strides make a channels_last problem (see :mod:`convtune.precision`)
    w : array (C_out, C_in // groups, *kernel), of ``x``'s dtype
    stride, dilation : int or sequence of ints, per spatial axis
    padding : int, sequence of ints, ``'valid'`` or ``'same'`` (stride 1; an even kernel's extra zero
        goes after, as in PyTorch)
    groups : int
    math : {'fp32', 'tf32'}
    plan : Plan, optional
        Use this plan and skip the lookup.
    out : array, optional
        Written in place and returned.

    Returns
    -------
    array (N, C_out, *out_spatial), of the same kind as ``x``.

    Examples
    --------
    >>> import numpy as np, convtune
    >>> x = np.random.rand(2, 3, 8, 8).astype(np.float32)
    >>> w = np.random.rand(4, 3, 3, 3).astype(np.float32)
    >>> convtune.conv(x, w, padding=1).shape
    (2, 4, 8, 8)
    """
    if _general(x, w, padding):
        return _conv_general(x, w, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("fwd", x.shape, w.shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups, math,
           type(x), x.dtype, w.dtype, x.strides, _device_id(x))
    rt = runtime or default_runtime()

    def make():
        return _layer_fields(x.shape, w.shape, stride, padding, dilation, groups, math, "fwd", **_precision(x, w))
    return rt.dispatch(sig, make, x, w, plan, out)


def conv_backward_data(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, *, math="fp32",
                       plan: Plan | None = None, out=None, runtime: Runtime | None = None):
    """Gradient with respect to the input: ``dx`` of shape ``x_shape`` from ``dy`` and ``w``.

    ``x_shape`` is needed because with a stride several input sizes give the same output size.
    """
    x_shape = tuple(x_shape)
    if isinstance(padding, str) or dy.ndim == w.ndim - 1 or (x_shape and x_shape[0] == 0):
        return _dgrad_general(dy, w, x_shape, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("dgrad", dy.shape, w.shape, x_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           math, type(dy), dy.dtype, w.dtype, dy.strides, _device_id(dy))
    rt = runtime or default_runtime()

    def make():
        return _backward_problem(x_shape, w.shape, dy, stride, padding, dilation, groups, math, "dgrad",
                                 **_precision(dy, w))
    return rt.dispatch(sig, make, dy, w, plan, out)


def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, *, math="fp32",
                         plan: Plan | None = None, out=None, runtime: Runtime | None = None):
    """Gradient with respect to the weight: ``dw`` of shape ``w_shape`` from ``x`` and ``dy``."""
    w_shape = tuple(w_shape)
    if isinstance(padding, str) or x.ndim == len(w_shape) - 1 or (x.ndim == len(w_shape) and x.shape[0] == 0):
        return _wgrad_general(x, dy, w_shape, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("wgrad", x.shape, dy.shape, w_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           math, type(x), x.dtype, dy.dtype, x.strides, _device_id(x))
    rt = runtime or default_runtime()

    def make():
        return _backward_problem(x.shape, w_shape, dy, stride, padding, dilation, groups, math, "wgrad",
                                 **_precision(x, dy))
    return rt.dispatch(sig, make, x, dy, plan, out)


