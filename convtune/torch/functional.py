"""``convtune.torch.conv1d`` / ``conv2d`` / ``conv3d``: PyTorch's functional convolutions through convtune's
plans.

They take what ``torch.nn.functional.conv1d``/``conv2d``/``conv3d`` take, plus ``padding_mode`` (as the
modules have it) and ``math``:

* ``padding``: an int, a tuple, ``"valid"`` or ``"same"`` (an even kernel's extra zero goes on the
  right, as in PyTorch); ``padding_mode`` other than ``"zeros"`` (``reflect``, ``replicate``,
  ``circular``) pads the input first, as ``nn.Conv2d`` does;
* an unbatched input (``(C, L)``, ``(C, H, W)``, ``(C, D, H, W)``) and an empty batch;
* ``math="auto"`` (the default): ``tf32`` on CUDA tensors when ``torch.backends.cudnn.allow_tf32``
  is on (PyTorch's own default), else ``fp32``; or ``"fp32"``/``"tf32"``.

float32, bfloat16 and float16 tensors run, channels_last ones too: the plan is the one tuned for
the call's dtype and layout. Under autocast (AMP) the call's dtype is the one autocast gives a
convolution (its lower-precision dtype), so the plan of that dtype runs: convtune's plans get the
operands cast as autocast casts them, and PyTorch's own convolution gets them as they came, for
autocast itself to cast (in C++, with its cache of the weights' casts).

What convtune cannot run goes to PyTorch's own convolution, with the reason logged once (never an
error where PyTorch would have run): other dtypes, or operands of different dtypes, devices other
than CPU and CUDA, CUDA tensors without CuPy. In eager mode a layer whose passes
all tuned to PyTorch's convolution runs it directly, autograd included, so its only cost is one
lookup.

Examples
--------
>>> import torch, convtune, convtune.torch as ct
>>> x, w = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
>>> ct.conv2d(x, w, padding="same", runtime=convtune.Runtime(miss_policy="heuristic")).shape
torch.Size([2, 4, 8, 8])
"""

from __future__ import annotations

import functools
import threading

import torch
import torch.nn.functional as F

from ..runtime import Runtime
from . import _autograd, _ops  # noqa: F401  (_ops: registers torch.ops.convtune.*)
from ._bridge import bridge
from ._capture import CAPTURE_REASON, capturing
from ._dispatch import route_for
from ._executors import Fallback, Native
from ._formats import DTYPES, tensor_layout
from ._notes import say_once

__all__ = ["conv1d", "conv2d", "conv3d", "conv", "Geometry", "geometry", "resolve_math", "MATH_MODES"]

MATH_MODES = ("auto", "fp32", "tf32")
_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")

#: While tune-ahead collects a model's problems (:mod:`convtune.torch.tuning`), the list it records
#: them in; convolutions then run as PyTorch's. ``spare``, where set (by the collection and by the weighing of
#: PyTorch's steps, :func:`convtune.torch._host.step_times`), is asked first: a call it answers other than ``None``
#: for (a convolution on cuDNN's heuristic pick) has that answer as its result.
class _Collecting(threading.local):
    records = None  # (a class default: reading it on the hot path costs no failed attribute lookup)
    spare = None


_collect = _Collecting()


class Geometry:
    """A layer's geometry as the ops take it: per-axis stride and dilation, the symmetric ``padding``
    the op applies, and ``pre_pad`` (``F.pad`` widths and mode) for what it cannot (padding modes
    other than zeros, the uneven half of ``"same"``)."""

    __slots__ = ("rank", "stride", "padding", "dilation", "pre_pad", "pad_mode")

    def __init__(self, rank, kernel, stride, padding, dilation, padding_mode):
        def per_axis(value, name):
            value = (value,) * rank if isinstance(value, int) else tuple(int(v) for v in value)
            if len(value) != rank:
                raise ValueError(f"{name} must be an int or {rank} ints, got {value!r}")
            return value
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {', '.join(_PADDING_MODES)}, got {padding_mode!r}")
        self.rank = rank
        self.stride, self.dilation = per_axis(stride, "stride"), per_axis(dilation, "dilation")
        if isinstance(padding, str):
            if padding == "valid":
                sides = [(0, 0)] * rank
            elif padding == "same":
                if any(s != 1 for s in self.stride):
                    raise ValueError("padding='same' is not supported for strided convolutions")
                totals = [d * (k - 1) for d, k in zip(self.dilation, kernel)]
                sides = [(t // 2, t - t // 2) for t in totals]
            else:
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
        else:
            sides = [(p, p) for p in per_axis(padding, "padding")]
        self.pad_mode = padding_mode
        if padding_mode != "zeros":
            self.padding = (0,) * rank
            widths = sides
        else:
            self.padding = tuple(left for left, _right in sides)
            widths = [(0, right - left) for left, right in sides]
        # F.pad takes (last axis left, right, next-to-last axis left, right, ...)
        pads = [v for left, right in reversed(widths) for v in (left, right)]
        self.pre_pad = pads if any(pads) else None


_GEOMETRIES: dict[tuple, Geometry] = {}


def geometry(rank, kernel, stride, padding, dilation, padding_mode) -> Geometry:
    """The :class:`Geometry` of these arguments, made once per distinct layer (the modules' attributes
    are tuples; while ``torch.compile`` traces, it is made anew)."""
    key = (rank, kernel, stride, padding, dilation, padding_mode)
    geom = _GEOMETRIES.get(key)
    if geom is None:
        geom = Geometry(*key)
        if not torch.compiler.is_compiling():
            _GEOMETRIES[key] = geom
    return geom


def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


#: ``torch.backends.cudnn``'s flags, read without the module property's detour (a call's hot path reads them)
_cudnn_benchmark, _cudnn_allow_tf32 = torch._C._get_cudnn_benchmark, torch._C._get_cudnn_allow_tf32


def resolve_math(math: str, x, compiling: bool = False) -> str:
    """``'auto'``: ``'tf32'`` for CUDA tensors when ``torch.backends.cudnn.allow_tf32`` is on, else ``'fp32'``.
    While ``torch.compile`` traces, the flag is read through ``torch.backends.cudnn`` (Dynamo traces
    that property and guards on it; the raw getter, which returns a bool, breaks the graph)."""
    if math == "auto":
        if not x.is_cuda:
            return "fp32"
        return "tf32" if (torch.backends.cudnn.allow_tf32 if compiling else _cudnn_allow_tf32()) else "fp32"
    if math not in MATH_MODES:
        raise ValueError(f"unknown math mode {math!r}; acceptable: {', '.join(MATH_MODES)}")
    return math


def _unsupported(x, weight, bias, rank, compiling: bool, device_check: bool = True, cast=None) -> str | None:
    """Why convtune leaves this call to PyTorch (``None``: it runs it); ``cast``: the dtype autocast casts
    the operands to (:func:`autocast_dtype`). Under ``torch.compile`` a missing CuPy is found when the op
    runs (its route falls back then), not while tracing; ``device_check`` off asks about everything but
    the device (shapes found on the meta device)."""
    if rank not in (1, 2, 3):
        return f"{rank}-D convolutions are not supported"
    if cast is not None:  # autocast casts every floating-point operand to it
        if not weight.is_floating_point() or (bias is not None and not bias.is_floating_point()):
            kinds = ", ".join(str(t.dtype) for t in (x, weight, bias) if t is not None)
            return f"operands of dtypes {kinds}: convtune runs convolutions whose operands share one dtype"
        dtype = cast
    elif weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        kinds = ", ".join(str(t.dtype) for t in (x, weight, bias) if t is not None)
        return f"operands of dtypes {kinds}: convtune runs convolutions whose operands share one dtype"
    else:
        dtype = x.dtype
    if dtype not in DTYPES:
        return f"dtype {dtype}: convtune runs float32, bfloat16 and float16 convolutions"
    if not device_check or x.is_cpu:  # (the tensor's flags: asking for its device makes an object)
        return None
    if x.is_cuda:
        return None if compiling else _cuda_reason()
    return f"device {x.device.type}: convtune runs CPU and CUDA tensors"


@functools.cache
def _cuda_reason() -> str | None:
    try:
        bridge("cuda")
    except Exception as exc:  # BackendError (no CuPy), or a CUDA library that fails to load
        return str(exc)
    return None


def conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, padding_mode="zeros",
         math="auto", runtime: Runtime | None = None):
    """A 1-D, 2-D or 3-D convolution (by ``weight``'s rank) through convtune's plans; see the module docstring."""
    rank = weight.dim() - 2
    geom = geometry(rank, tuple(weight.shape[2:]), _hashable(stride), _hashable(padding), _hashable(dilation),
                    padding_mode)
    return run(input, weight, bias, geom, groups, math, runtime)


def _of_rank(rank: int, name: str):
    """``torch.nn.functional.conv1d``/``conv2d``/``conv3d`` through convtune's plans (the weight's rank is
    checked)."""
    def conv_nd(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, padding_mode="zeros",
                math="auto", runtime: Runtime | None = None):
        if weight.dim() != rank + 2:
            raise ValueError(f"{name} expects a {rank + 2}-D weight (C_out, C_in/groups, *kernel), got shape "
                             f"{tuple(weight.shape)}")
        return conv(input, weight, bias, stride, padding, dilation, groups, padding_mode=padding_mode, math=math,
                    runtime=runtime)
    conv_nd.__name__ = conv_nd.__qualname__ = name
    conv_nd.__doc__ = f"``torch.nn.functional.{name}`` through convtune's plans (see the module docstring)."
    return conv_nd


conv1d = _of_rank(1, "conv1d")
conv2d = _of_rank(2, "conv2d")
conv3d = _of_rank(3, "conv3d")


#: Is autocast on for any device? (One call, where asking per device costs several.)
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def autocast_dtype(x):
    """The dtype autocast gives a convolution of ``x`` where it is on for ``x``'s device (its lower-precision
    dtype, as ``torch.autocast`` casts ``conv2d``'s operands), else ``None``. float64 is not cast (autocast
    leaves it alone: the convolution runs in float64)."""
    if not _any_autocast():
        return None
    device = x.device.type
    if device in ("cpu", "cuda") and x.is_floating_point() and x.dtype is not torch.float64 and \
            torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return None


def _cast(x, weight, bias, dtype):
    """The operands cast to ``dtype`` as autocast casts a convolution's (as they are for ``None``)."""
    if dtype is None:
        return x, weight, bias
    return x.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype)


def autocast(x, weight, bias):
    """The operands as autocast gives them to a convolution where it is on for their device, else as they
    are."""
    return _cast(x, weight, bias, autocast_dtype(x))


def route_key(x, weight, geom: Geometry, groups: int, math: str, runtime) -> tuple:
    """The key of a patched layer's call (a tune-ahead's ``Problem.route_key``): its route's arguments
    (:func:`~convtune.torch._dispatch.route_for`), the layer's runtime last."""
    return (tuple(x.shape), tuple(weight.shape), geom.stride, geom.padding, geom.dilation, groups, math, x.device,
            x.dtype, tensor_layout(x, weight), runtime)


def _pytorch(x, weight, bias, geom: Geometry, groups):
    conv_fn = (F.conv1d, F.conv2d, F.conv3d)[geom.rank - 1]
    return conv_fn(x, weight, bias, geom.stride, geom.padding, geom.dilation, groups)


def run(input, weight, bias, geom: Geometry, groups: int, math: str, runtime: Runtime | None, owner=None):
    """The convolution of ``input`` (batched or not) with the layer's ``geom``: pre-padding, then
    convtune's route (eager), its registered op (under ``torch.compile``) or PyTorch's convolution."""
    rank = geom.rank
    unbatched = input.dim() == rank + 1
    x = input.unsqueeze(0) if unbatched else input
    if geom.pre_pad is not None:
        x = F.pad(x, geom.pre_pad, mode="constant" if geom.pad_mode == "zeros" else geom.pad_mode)
    compiling = torch.compiler.is_compiling()
    cast = autocast_dtype(x)
    if compiling:  # (the registered op takes the operands autocast would give the convolution)
        x, weight, bias = _cast(x, weight, bias, cast)
        cast = None
    reason = _unsupported(x, weight, bias, rank, compiling, cast=cast) if x.dim() == rank + 2 else None
    if reason is not None or x.dim() != rank + 2:
        if reason is not None and not compiling:
            say_once(f"unsupported:{reason}", "convtune: PyTorch's convolution runs this call: %s", reason)
        y = _pytorch(x, weight, bias, geom, groups)  # PyTorch's own result, or its own error for a bad rank
    elif compiling:  # the registered op: traced through its fake, run by its implementation
        y = torch.ops.convtune.conv_fwd(x, weight, bias, geom.stride, geom.padding, geom.dilation, groups,
                                        resolve_math(math, x, compiling=True))
    else:
        y = _dispatch(x, weight, bias, geom, groups, resolve_math(math, x), runtime, owner, cast)
    return y.squeeze(0) if unbatched else y


def _flags_as_measured(x, math: str) -> bool:
    """Do the process's cuDNN flags match those the ``torch`` plans were measured with (benchmark on,
    TF32 as the math mode says)? Always on the CPU."""
    return not x.is_cuda or cudnn_flags_as_measured(math)


def cudnn_flags_as_measured(math: str) -> bool:
    """:func:`_flags_as_measured` of a CUDA call in math mode ``math``."""
    return _cudnn_benchmark() and _cudnn_allow_tf32() == (math == "tf32")


def _dispatch(x, weight, bias, geom: Geometry, groups, math, runtime, owner, cast=None):
    """The call through its route: the one place that decides what a call runs, eager or recorded by a CUDA graph
    (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``). ``cast``: autocast's dtype for it (the operands
    are as they came: PyTorch's own convolution gets them so, under the same autocast; convtune's plans get them
    cast).

    A recorded call runs what an eager call of the same kind left in the route (resolved, duelled and weighed outside
    the capture: warm-up steps before a capture, as PyTorch's recipe has them), each pass's plan where it records
    safely (:meth:`~convtune.torch._dispatch.Route.run`); where no eager call has resolved the route yet, PyTorch's
    own convolution and autograd (no lookup, tuning, duel or measurement runs on a capturing stream), said once."""
    records = _collect.records
    if records is not None:
        x, weight, bias = _cast(x, weight, bias, cast)
        records.append((owner, x, weight, geom, groups, math))
        spare = _collect.spare
        y = spare(owner, x, weight, bias, geom, groups, math) if spare is not None else None
        return _pytorch(x, weight, bias, geom, groups) if y is None else y
    if x.numel() == 0 or weight.numel() == 0:
        return _pytorch(x, weight, bias, geom, groups)
    try:
        route = route_for(x.shape, weight.shape, geom.stride, geom.padding, geom.dilation, groups, math, x.device,
                          runtime, cast or x.dtype, tensor_layout(x, weight))
    except ValueError:  # geometry PyTorch refuses too: its error is the user's
        return _pytorch(x, weight, bias, geom, groups)
    training = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or
                                            (bias is not None and bias.requires_grad))
    # (PyTorch's own call, first: a capture records the same; the capture check is a CUDA call)
    if not training:
        executor = route.fwd_infer or route.fwd_exec
        kind = executor.__class__
        if (kind is Fallback or kind is Native) and executor.retry_at is None and \
                (kind is Fallback or _flags_as_measured(x, math)):
            return _pytorch(x, weight, bias, geom, groups)  # PyTorch's own call, as measured: no detour
        x, weight, bias = _cast(x, weight, bias, cast)
        if not capturing(x):
            return route.infer(x, weight, bias)
        if route.fwd_infer is not None:  # what an eager inference call runs (Route.infer), where it records
            return route.capture.run("fwd", route.fwd_infer, x, weight, bias)
        if route.fwd_exec is None or route.fwd_exec.retry_at is not None:
            return _not_captured(x, weight, bias, geom, groups)
        return route.run("fwd", x, weight, bias)
    need_dx, need_dw = x.requires_grad, weight.requires_grad
    keep = getattr(owner, "convtune_keep_spectra", False)  # (plain modules and the functional ops: per-pass)
    # a training step that needs both gradients: one round trip, if any (a layer whose round trip resolved to none
    # takes the per-pass paths, PyTorch's own call included, without a detour)
    both = bool(keep) and need_dx and need_dw and route.trips.get(keep, True) is not None
    if route.verdicts.get((need_dx, need_dw)) and not both and _flags_as_measured(x, math):
        return _pytorch(x, weight, bias, geom, groups)  # PyTorch's convolution won every pass, as below
    x, weight, bias = _cast(x, weight, bias, cast)
    captured = capturing(x)
    if both:
        # recorded: the round trip its eager calls run, never a new one
        trip = route.trips.get(keep) if captured else route.trips.resolve(keep)
        if trip is not None and keep == "auto" and not captured and not route.trips.duelled:
            trip = _duel_trip(route, trip, geom, groups, math, runtime)
        y = _kept(route, trip, x, weight, bias, geom, groups, captured) if trip is not None else None
        if y is not None:
            return y
    if captured:
        verdict = route.verdicts.get((need_dx, need_dw))
        if verdict:
            if _flags_as_measured(x, math):
                return _pytorch(x, weight, bias, geom, groups)
        elif verdict is None:  # (no eager training call of this kind weighed its plans)
            return _not_captured(x, weight, bias, geom, groups)
    elif route.native_for_grads(need_dx, need_dw) and _flags_as_measured(x, math):
        # PyTorch's convolution won every pass and runs as it was measured: its own autograd, no detour
        return _pytorch(x, weight, bias, geom, groups)
    return _autograd.eager_forward(x, weight, bias, route)


def _kept(route, trip, x, weight, bias, geom: Geometry, groups, captured: bool):
    """A training call through the layer's round trip with kept spectra. Where it fails eagerly: ``None`` (the
    per-pass plans then run the call); recorded, where it does not record: PyTorch's convolution. Where its spectra
    would not fit the device's kept-spectra budget: ``None`` too."""
    if not route.trips.room():
        return None
    if not captured:
        try:
            return _autograd.kept_forward(x, weight, bias, route, trip)
        except Exception as exc:  # never an error where PyTorch would have run: the per-pass plans
            route.trips.drop(exc)
            return None
    why = None
    if route.capture.trip_failed:
        pass
    elif not trip.recordable:
        why = "its products call cuBLAS, which CuPy refuses on a capturing stream"
    else:
        try:
            return _autograd.kept_forward(x, weight, bias, route, trip)
        except Exception as exc:  # it failed to record (this capture keeps going)
            why = f"{type(exc).__name__}: {exc}"
    if why is not None:
        route.capture.trip_failed = True
        say_once(f"trip-capture:{route.problem.key()}", "convtune: the round trip of %s is not recorded in "
                 "CUDA graphs (%s): PyTorch's convolution is recorded for the layer", route.problem.describe(), why)
    # (PyTorch's convolution for its passes ran outside captures: Trips.forward, Trips.backward)
    return _pytorch(x, weight, bias, geom, groups)


class _PerPass:
    """Stands in for a layer's module in its round trip's duel: the per-pass plans (no kept spectra)."""

    convtune_keep_spectra = False


def _duel_trip(route, trip, geom: Geometry, groups, math, runtime):
    """``keep_spectra='auto'``, the first training call: the round trip against the per-pass plans, each a whole
    training call of the layer (:meth:`~convtune.torch._dispatch.Route.duel_trip`); the trip, or ``None``, kept for
    the layer's later calls."""
    grads: dict = {}

    def kept(a, b):
        _duel_gradients(_kept(route, trip, a, b, None, geom, groups, False), a, b, grads)

    def per_pass(a, b):
        _duel_gradients(_dispatch(a, b, None, geom, groups, math, runtime, _PerPass), a, b, grads)
    with torch.autocast(route.device.type, enabled=False):  # (the operands are in the layer's dtype already)
        trip = route.duel_trip(trip, kept, per_pass)
    route.trips.duelled = True
    route.trips["auto"] = trip
    return trip


def _duel_gradients(y, a, b, grads: dict) -> tuple:
    """The gradients of a training call's result ``y`` with respect to its operands ``a`` and ``b``, as a duel of
    round trip and per-pass plans takes them: from a random gradient of ``y``, made once (``grads``), through the
    backward of a scalar (a backward given a gradient tensor has PyTorch import its symbolic shapes and SymPy on its
    first call: seconds, once per process)."""
    if y is None:
        raise RuntimeError("the round trip did not run")
    if "dy" not in grads:
        grads["dy"] = torch.randn_like(y)
    return torch.autograd.grad((y * grads["dy"]).sum(), (a, b))


def _not_captured(x, weight, bias, geom: Geometry, groups):
    say_once("capture", "convtune: %s", CAPTURE_REASON)
    return _pytorch(x, weight, bias, geom, groups)
