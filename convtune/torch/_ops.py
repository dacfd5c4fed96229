"""The three registered operators, their fake tensors and their autograd.

``torch.ops.convtune.conv_fwd(input, weight, bias, stride, padding, dilation, groups, math)``,
``conv_dgrad(grad_output, weight, input_size, ...)`` and ``conv_wgrad(input, grad_output,
weight_size, ...)`` are plain ``torch.library`` definitions (cheaper per call than the
``custom_op`` decorator). Each has a fake implementation that returns exactly the real result's
shape and strides (channels_last where an operand is, see
:func:`~convtune.torch._formats.result_format`), so ``torch.compile(fullgraph=True)`` traces
them, and autograd whose backward calls the other two operators. The backward-data and
backward-filter passes are convolutions themselves, so the backward of each op is again made of
the three ops: double backward comes for free (:func:`gradients` is the one formula).

In eager mode the layer does not go through the dispatcher at all (:mod:`convtune.torch._autograd`).
"""

from __future__ import annotations

import torch

from ..strategies.pytorch import native_pass
from ._autograd import bias_grad, gradients
from ._dispatch import route_for
from ._formats import DTYPES, result_format, tensor_layout

__all__ = ["conv_fwd", "conv_dgrad", "conv_wgrad"]


def _out_size(n, k, s, p, d):
    return (n + 2 * p - d * (k - 1) - 1) // s + 1


def _direct(pass_, a, b, bias, x_shape, w_shape, stride, padding, dilation, groups):
    """PyTorch's own computation, for what no route serves: empty tensors, dtypes convtune does not run,
    and geometry PyTorch itself refuses (its error is the user's)."""
    out = native_pass(pass_, x_shape, w_shape, stride, padding, dilation, groups)(a, b, bias)
    return out.contiguous(memory_format=result_format(a, b))


def _runs_here(a, b) -> bool:
    return a.dtype in DTYPES and b.dtype == a.dtype and a.numel() > 0 and b.numel() > 0


# -- the implementations (shared by the ops and the eager functions) ------------------------------
def conv_fwd(input, weight, bias, stride, padding, dilation, groups, math, runtime=None):
    stride, padding, dilation = tuple(stride), tuple(padding), tuple(dilation)
    if _runs_here(input, weight) and (bias is None or bias.dtype == input.dtype):
        try:
            route = route_for(input.shape, weight.shape, stride, padding, dilation, groups, math, input.device,
                              runtime, input.dtype, tensor_layout(input, weight))
        except ValueError:
            pass
        else:
            return route.run("fwd", input, weight, bias)
    return _direct("fwd", input, weight, bias, input.shape, weight.shape, stride, padding, dilation, groups)


def conv_dgrad(grad_output, weight, input_size, stride, padding, dilation, groups, math, runtime=None):
    stride, padding, dilation, input_size = tuple(stride), tuple(padding), tuple(dilation), tuple(input_size)
    if _runs_here(grad_output, weight):
        try:
            route = route_for(torch.Size(input_size), weight.shape, stride, padding, dilation, groups, math,
                              grad_output.device, runtime, grad_output.dtype, tensor_layout(grad_output, weight))
        except ValueError:
            pass
        else:
            return route.run("dgrad", grad_output, weight)
    return _direct("dgrad", grad_output, weight, None, input_size, weight.shape, stride, padding, dilation, groups)


def conv_wgrad(input, grad_output, weight_size, stride, padding, dilation, groups, math, runtime=None):
    stride, padding, dilation, weight_size = tuple(stride), tuple(padding), tuple(dilation), tuple(weight_size)
    if _runs_here(input, grad_output):
        try:
            route = route_for(input.shape, torch.Size(weight_size), stride, padding, dilation, groups, math,
                              input.device, runtime, input.dtype, tensor_layout(input))
        except ValueError:
            pass
        else:
            return route.run("wgrad", input, grad_output)
    if input.numel() == 0 or grad_output.numel() == 0:  # nothing summed: a zero gradient
        return torch.empty(weight_size, dtype=input.dtype, device=input.device,
                           memory_format=result_format(input, grad_output)).zero_()
    return _direct("wgrad", input, grad_output, None, input.shape, weight_size, stride, padding, dilation, groups)


# -- the registered operators ------------------------------------------------------------------
_lib = torch.library.Library("convtune", "DEF")
_GEOMETRY = "int[] stride, int[] padding, int[] dilation, int groups, str math"
_lib.define(f"conv_fwd(Tensor input, Tensor weight, Tensor? bias, {_GEOMETRY}) -> Tensor")
_lib.define(f"conv_dgrad(Tensor grad_output, Tensor weight, SymInt[] input_size, {_GEOMETRY}) -> Tensor")
_lib.define(f"conv_wgrad(Tensor input, Tensor grad_output, SymInt[] weight_size, {_GEOMETRY}) -> Tensor")
_lib.impl("conv_fwd", conv_fwd, "CompositeExplicitAutograd")
_lib.impl("conv_dgrad", conv_dgrad, "CompositeExplicitAutograd")
_lib.impl("conv_wgrad", conv_wgrad, "CompositeExplicitAutograd")


def _empty_result(shape, a, b):
    return torch.empty(shape, dtype=a.dtype, device=a.device, memory_format=result_format(a, b))


@torch.library.register_fake("convtune::conv_fwd", lib=_lib)
def _conv_fwd_fake(input, weight, bias, stride, padding, dilation, groups, math):
    spatial = [_out_size(input.shape[2 + i], weight.shape[2 + i], stride[i], padding[i], dilation[i])
               for i in range(input.dim() - 2)]
    return _empty_result((input.shape[0], weight.shape[0], *spatial), input, weight)


@torch.library.register_fake("convtune::conv_dgrad", lib=_lib)
def _conv_dgrad_fake(grad_output, weight, input_size, stride, padding, dilation, groups, math):
    return _empty_result(input_size, grad_output, weight)


@torch.library.register_fake("convtune::conv_wgrad", lib=_lib)
def _conv_wgrad_fake(input, grad_output, weight_size, stride, padding, dilation, groups, math):
    return _empty_result(weight_size, input, grad_output)


def _op_calls(geometry, x_shape, w_shape):
    ops = torch.ops.convtune
    return (lambda x, w: ops.conv_fwd(x, w, None, *geometry),
            lambda dy, w: ops.conv_dgrad(dy, w, x_shape, *geometry),
            lambda x, dy: ops.conv_wgrad(x, dy, w_shape, *geometry))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], inputs[1])
    ctx.size = inputs[2]  # bias (forward), input_size (dgrad) or weight_size (wgrad)
    ctx.geometry = inputs[3:]


def _fwd_backward(ctx, grad):
    x, w = ctx.saved_tensors
    dx, dw = gradients("fwd", ctx.needs_input_grad, x, w, grad, *_op_calls(ctx.geometry, x.shape, w.shape))
    return dx, dw, bias_grad(grad) if ctx.needs_input_grad[2] else None, None, None, None, None, None


def _dgrad_backward(ctx, grad):
    dy, w = ctx.saved_tensors
    d_dy, dw = gradients("dgrad", ctx.needs_input_grad, dy, w, grad, *_op_calls(ctx.geometry, ctx.size, w.shape))
    return d_dy, dw, None, None, None, None, None, None


def _wgrad_backward(ctx, grad):
    x, dy = ctx.saved_tensors
    dx, d_dy = gradients("wgrad", ctx.needs_input_grad, x, dy, grad, *_op_calls(ctx.geometry, x.shape, ctx.size))
    return dx, d_dy, None, None, None, None, None, None


torch.library.register_autograd("convtune::conv_fwd", _fwd_backward, setup_context=_setup, lib=_lib)
torch.library.register_autograd("convtune::conv_dgrad", _dgrad_backward, setup_context=_setup, lib=_lib)
torch.library.register_autograd("convtune::conv_wgrad", _wgrad_backward, setup_context=_setup, lib=_lib)
