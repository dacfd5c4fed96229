"""``convtune.torch.Conv1d``/``Conv2d``/``Conv3d`` and ``patch``/``unpatch``.

The modules subclass ``nn.Conv1d``/``nn.Conv2d``/``nn.Conv3d``: same constructor (plus ``math`` and
``runtime``), same parameters and ``state_dict`` both ways; only the convolution itself goes
through convtune (:func:`convtune.torch.functional.run`).

:func:`patch` turns a model's convolutions into convtune's in place: each eligible module's class
becomes the convtune subclass of its class (``nn.Conv2d`` -> ``convtune.torch.Conv2d``; a plain
subclass of ``nn.Conv2d`` that keeps its forward gets a convtune subclass of its own). The module
object stays the same one, so its parameters, buffers, hooks, device, the optimizer's references
and ``state_dict`` keys are all kept; :func:`unpatch` gives each its class back. A module that
overrides ``forward`` (its own convolution code) or is still lazy is left alone, and the reason is
logged.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Callable

from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin

from ..runtime import Runtime
from .functional import MATH_MODES, geometry, run

log = logging.getLogger("convtune")

__all__ = ["Conv1d", "Conv2d", "Conv3d", "patch", "unpatch"]


def _check_math(math: str) -> str:
    if math not in MATH_MODES:
        raise ValueError(f"unknown math mode {math!r}; acceptable: {', '.join(MATH_MODES)}")
    return math


#: ``keep_spectra`` values: run a training step's three passes as one FFT round trip that keeps the
#: spectra of the forward pass for the backward ones (:mod:`convtune.roundtrip`) never, always (where the
#: round trip runs the layer), or where the planner measured that it pays.
KEEP_SPECTRA = (False, True, "auto")
#: the drop-in's default: per-pass plans. (``'auto'`` as the default made ``convtune:slak-t``'s training step 1.2x
#: slower on an H200: its verdicts, timed on the device alone, took round trips whose host work a host-bound step
#: pays. With the trips' duels in the layer it ties the per-pass plans, 6.53x PyTorch against 6.69x, for 19 s more
#: tuning; see BENCHMARKS.md.)
DEFAULT_KEEP_SPECTRA = False


def _check_keep(keep) -> bool | str:
    if not (keep is True or keep is False or keep == "auto"):  # (1 == True: not ``in KEEP_SPECTRA``)
        raise ValueError(f"keep_spectra must be one of {', '.join(map(repr, KEEP_SPECTRA))}, got {keep!r}")
    return keep


class _Convtune:
    """What a convtune convolution module adds to its ``nn.ConvNd`` base: the convolution itself."""

    #: ``'auto'`` (TF32 where ``torch.backends.cudnn.allow_tf32`` allows it, on CUDA), ``'fp32'`` or ``'tf32'``
    convtune_math = "auto"
    #: the :class:`~convtune.runtime.Runtime` to look plans up in (``None``: the default runtime)
    convtune_runtime: Runtime | None = None
    #: ``False``, ``True`` or ``'auto'``: keep the forward's FFT spectra for the backward passes (see :data:`KEEP_SPECTRA`)
    convtune_keep_spectra = DEFAULT_KEEP_SPECTRA
    #: the class this one stands in for (what :func:`unpatch` restores)
    _convtune_base: type = nn.Module

    def __init__(self, *args, math: str = "auto", runtime: Runtime | None = None, keep_spectra=DEFAULT_KEEP_SPECTRA,
                 **kwargs):
        """The base class's arguments, plus ``math``, ``runtime`` and ``keep_spectra``."""
        super().__init__(*args, **kwargs)
        self.convtune_math, self.convtune_runtime = _check_math(math), runtime
        self.convtune_keep_spectra = _check_keep(keep_spectra)

    def _conv_forward(self, input, weight, bias):
        geom = geometry(len(self.kernel_size), self.kernel_size, self.stride, self.padding, self.dilation,
                        self.padding_mode)
        return run(input, weight, bias, geom, self.groups, self.convtune_math, self.convtune_runtime, self)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", math={self.convtune_math!r}"


class Conv1d(_Convtune, nn.Conv1d):
    """``nn.Conv1d`` through convtune's plans.

    Examples
    --------
    >>> import torch, convtune, convtune.torch as ct
    >>> layer = ct.Conv1d(3, 8, 5, padding="same", runtime=convtune.Runtime(miss_policy="heuristic"))
    >>> layer(torch.randn(2, 3, 40)).shape
    torch.Size([2, 8, 40])
    """

    _convtune_base = nn.Conv1d


class Conv2d(_Convtune, nn.Conv2d):
    """``nn.Conv2d`` through convtune's plans.

    Examples
    --------
    >>> import torch, convtune, convtune.torch as ct
    >>> layer = ct.Conv2d(3, 8, 3, padding=1, runtime=convtune.Runtime(miss_policy="heuristic"))
    >>> layer(torch.randn(2, 3, 16, 16)).shape
    torch.Size([2, 8, 16, 16])
    """

    _convtune_base = nn.Conv2d


class Conv3d(_Convtune, nn.Conv3d):
    """``nn.Conv3d`` through convtune's plans.

    Examples
    --------
    >>> import torch, convtune, convtune.torch as ct
    >>> layer = ct.Conv3d(3, 8, 3, padding=1, runtime=convtune.Runtime(miss_policy="heuristic"))
    >>> layer(torch.randn(2, 3, 4, 8, 8)).shape
    torch.Size([2, 8, 4, 8, 8])
    """

    _convtune_base = nn.Conv3d


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_REPLACEMENTS: dict[type, type] = {nn.Conv1d: Conv1d, nn.Conv2d: Conv2d, nn.Conv3d: Conv3d}


def _replacement(cls: type) -> tuple[type | None, str]:
    """The convtune class standing in for ``cls``, or ``None`` and why there is none."""
    if issubclass(cls, _Convtune):
        return None, "already patched"
    if cls in _REPLACEMENTS:
        return _REPLACEMENTS[cls], ""
    base = next((b for b in _CONVS if issubclass(cls, b)), None)
    if base is None:
        return None, "not a Conv1d, Conv2d or Conv3d"
    if issubclass(cls, LazyModuleMixin):
        return None, "a lazy module: patch it after its first forward pass has made its parameters"
    if cls.forward is not base.forward or cls._conv_forward is not base._conv_forward:
        return None, f"{cls.__qualname__} has a forward of its own"
    made = type(f"Convtune{cls.__name__}", (_Convtune, cls),
                {"_convtune_base": cls, "__module__": __name__, "__doc__": f"{cls.__qualname__} through convtune."})
    _REPLACEMENTS[cls] = made
    return made, ""


def _post_order(module: nn.Module, prefix: str = ""):
    """``(qualified name, module)`` pairs, children before their parent, each module once."""
    seen = set()

    def visit(mod, name):
        if id(mod) in seen:
            return
        seen.add(id(mod))
        for child_name, child in mod.named_children():
            yield from visit(child, f"{name}.{child_name}" if name else child_name)
        yield name, mod
    yield from visit(module, prefix)


def patch(model: nn.Module, filter: Callable[[nn.Module, str], bool] | None = None, math: str = "auto",
          runtime: Runtime | None = None, keep_spectra=DEFAULT_KEEP_SPECTRA) -> list[str]:
    """Make ``model``'s ``Conv1d``/``Conv2d``/``Conv3d`` modules (children first, ``model`` itself too) run through
    convtune, in place; returns the qualified names of those it changed (``''`` is ``model``).

    ``filter(module, name)`` picks among the eligible modules. ``math``: ``'auto'`` follows
    ``torch.backends.cudnn.allow_tf32`` on CUDA (see :mod:`convtune.torch.functional`).
    ``keep_spectra`` (``False`` by default: per-pass plans only; ``True``, ``'auto'``): a training step's three
    passes as one FFT round trip keeping the forward's spectra (see :data:`KEEP_SPECTRA`).

    Examples
    --------
    >>> import torch, convtune, convtune.torch as ct
    >>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 8, 3))
    >>> ct.patch(model)
    ['0', '2']
    >>> type(model[0]).__name__, ct.unpatch(model)
    ('Conv2d', ['0', '2'])
    """
    _check_math(math)
    _check_keep(keep_spectra)
    swapped = []
    for name, module in _post_order(model):
        if not isinstance(module, _CONVS):
            continue
        cls, reason = _replacement(type(module))
        if cls is None:
            if reason != "already patched":
                log.info("convtune.torch.patch: %s (%s) left as it is: %s", name or "the model",
                         type(module).__qualname__, reason)
            continue
        if filter is not None and not filter(module, name):
            continue
        module.__class__ = cls
        module.convtune_math, module.convtune_runtime = math, runtime
        module.convtune_keep_spectra = keep_spectra
        swapped.append(name)
    return swapped


def unpatch(model: nn.Module) -> list[str]:
    """Give every convtune convolution module in ``model`` its original class back; returns their names."""
    restored = []
    for name, module in _post_order(model):
        if isinstance(module, _Convtune):
            restore(module)
            restored.append(name)
    return restored


#: What :func:`patch` sets on a module besides its class.
_PATCHED_ATTRS = ("convtune_math", "convtune_runtime", "convtune_keep_spectra")


def restore(module: _Convtune) -> None:
    """Give one convtune convolution module its original class back (see :func:`unpatch`)."""
    module.__class__ = module._convtune_base
    for attr in _PATCHED_ATTRS:
        module.__dict__.pop(attr, None)


@contextlib.contextmanager
def restored_for_a_while(modules):
    """The convtune convolution ``modules`` with their original classes inside the block, patched as they were again
    after it (whatever the block raises): what a step timed without the drop-in in those layers runs."""
    saved = [(m, m.__class__, {a: m.__dict__[a] for a in _PATCHED_ATTRS if a in m.__dict__}) for m in modules]
    for m in modules:
        restore(m)
    try:
        yield
    finally:
        for m, cls, attrs in saved:
            m.__class__ = cls
            m.__dict__.update(attrs)
