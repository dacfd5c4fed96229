"""The eager autograd functions: classic ``torch.autograd.Function``s bound to a layer's route.

In eager mode the layer does not go through the dispatcher at all: :class:`_Forward`, :class:`_Backward` and
:class:`_KeptForward`, bound to a layer's :class:`~convtune.torch._dispatch.Route`, run its executors with the
formula the registered operators use too (:func:`gradients`), for about a fifth of the dispatcher's host cost per
call (on a 2-core x86 host: 7 µs against 35 µs for a registered op with registered autograd). A route is any
object with ``run``, ``native_backward`` and ``trips`` (:class:`~convtune.torch._kept.Trips`: ``forward``, ``backward``
and ``drop``).
"""

from __future__ import annotations

import torch

__all__ = ["gradients", "bias_grad", "eager_forward", "kept_forward"]


def gradients(pass_: str, needs, a, b, grad, fwd, dgrad, wgrad):
    """Gradients of a pass's result with respect to its two operands ``a`` and ``b``, given
    ``grad`` (the loss's gradient with respect to that result), in terms of the three passes
    ``fwd(x, w)``, ``dgrad(dy, w)`` and ``wgrad(x, dy)``; ``None`` where ``needs`` says no.

    Each pass is bilinear and the three are each other's adjoints: ``<fwd(x, w), dy> = <x,
    dgrad(dy, w)> = <w, wgrad(x, dy)>``.
    """
    if pass_ == "fwd":  # y = fwd(x, w)
        return (dgrad(grad, b) if needs[0] else None, wgrad(a, grad) if needs[1] else None)
    if pass_ == "dgrad":  # dx = dgrad(dy, w)
        return (fwd(grad, b) if needs[0] else None, wgrad(grad, a) if needs[1] else None)
    # dw = wgrad(x, dy)
    return (dgrad(b, grad) if needs[0] else None, fwd(a, grad) if needs[1] else None)


def bias_grad(grad):
    return grad.sum(dim=(0, *range(2, grad.dim())))


# -- eager mode: autograd functions bound to a route ------------------------------------------------
def _eager_calls(route):
    if not torch.is_grad_enabled():  # a plain backward (no create_graph): the route's passes, no autograd nodes
        run = route.run
        return (lambda x, w: run("fwd", x, w), lambda dy, w: run("dgrad", dy, w), lambda x, dy: run("wgrad", x, dy))
    return (lambda x, w: _Forward.apply(x, w, None, route),
            lambda dy, w: _Backward.apply(dy, w, route, "dgrad"),
            lambda x, dy: _Backward.apply(x, dy, route, "wgrad"))


class _Forward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, bias, route):
        ctx.save_for_backward(x, w)
        ctx.route = route
        return route.run("fwd", x, w, bias)

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if needs[0] and needs[1] and not torch.is_grad_enabled():  # (a plain backward: no double backward)
            both = ctx.route.native_backward(grad, x, w, needs[2])  # one call of PyTorch's, where it gives both
            if both is not None:
                return (*both, None)
        dx, dw = gradients("fwd", needs, x, w, grad, *_eager_calls(ctx.route))
        return dx, dw, bias_grad(grad) if needs[2] else None, None


class _Backward(torch.autograd.Function):
    """A backward pass (``'dgrad'`` or ``'wgrad'``) as a differentiable function of its two operands."""

    @staticmethod
    def forward(ctx, a, b, route, pass_):
        ctx.save_for_backward(a, b)
        ctx.route, ctx.pass_ = route, pass_
        return route.run(pass_, a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return (*gradients(ctx.pass_, ctx.needs_input_grad, a, b, grad, *_eager_calls(ctx.route)), None, None)


class _KeptForward(torch.autograd.Function):
    """The forward pass of a layer with kept spectra (:meth:`~convtune.torch._kept.Trips.resolve`): its
    backward transforms the incoming gradient once and computes both gradients from the spectra the
    forward kept (held by this autograd context, freed with it). A second backward of the same graph
    (``retain_graph``) and a double backward (``create_graph``) run the per-pass plans instead."""

    @staticmethod
    def forward(ctx, x, w, bias, route, trip):
        ctx.save_for_backward(x, w)
        ctx.route, ctx.trip = route, trip
        y, ctx.held = route.trips.forward(trip, x, w, bias)  # (the spectra and their bytes on the ledger, or None)
        return y

    @staticmethod
    def backward(ctx, grad):
        x, w = ctx.saved_tensors
        held, ctx.held = ctx.held, None
        needs = ctx.needs_input_grad
        try:
            if held is not None and not torch.is_grad_enabled():
                try:
                    dx, dw = ctx.route.trips.backward(ctx.trip, held.spectra, grad, needs[0], needs[1], x, w)
                    return dx, dw, bias_grad(grad) if needs[2] else None, None, None
                except Exception as exc:  # the per-pass plans (or PyTorch's fallbacks) give the gradients instead
                    ctx.route.trips.drop(exc)
        finally:
            if held is not None:
                held.release()  # (once the spectra are used: their bytes leave the ledger)
        dx, dw = gradients("fwd", needs, x, w, grad, *_eager_calls(ctx.route))
        return dx, dw, bias_grad(grad) if needs[2] else None, None, None


eager_forward = _Forward.apply
kept_forward = _KeptForward.apply
