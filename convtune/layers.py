"""Layer objects for NumPy or CuPy training loops: ``Conv1d`` and ``Conv2d``.

Each keeps its weight (and bias), runs its forward pass through the runtime's
plan lookup, and on ``backward(dy)`` stores ``grad_weight``/``grad_bias`` and
returns the input gradient.

``keep_spectra`` (``False`` by default, ``True`` or ``'auto'``): run the layer's three passes as
one FFT round trip that keeps the spectra of ``x``, ``w`` and ``dy`` between them
(:mod:`convtune.roundtrip`), always, or where the planner measured that it beats the three
per-pass plans (the decision is stored in the plan cache). The kept spectra hold memory from the
forward pass until ``backward``; a frozen layer that never runs ``backward`` can call
``release_spectra()``.

Examples
--------
>>> import numpy as np
>>> from convtune import Conv2d
>>> layer = Conv2d(3, 8, 3, padding=1, seed=0)
>>> x = np.random.default_rng(0).standard_normal((2, 3, 10, 10), dtype=np.float32)
>>> y = layer(x)
>>> dx = layer.backward(np.ones_like(y))
>>> dx.shape, layer.grad_weight.shape
((2, 3, 10, 10), (8, 3, 3, 3))
"""

from __future__ import annotations

import math as _math

from . import roundtrip
from .backend import backend_for, get_backend
from .arrayapi import _layer_fields, conv, conv_backward_data, conv_backward_filter, padding_sides
from .runtime import Runtime, default_runtime

#: ``keep_spectra`` values: keep the FFT spectra between a layer's passes never, always, or where it pays.
KEEP_SPECTRA = (False, True, "auto")


class _ConvNd:
    rank = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, *, math="fp32", backend="numpy", seed=None, runtime: Runtime | None = None,
                 keep_spectra=False):
        def per_axis(v, name):
            v = (v,) * self.rank if isinstance(v, int) else tuple(v)
            if len(v) != self.rank:
                raise ValueError(f"{name} must be an int or {self.rank} ints, got {v!r}")
            return v
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must be divisible "
                             f"by groups ({groups})")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = per_axis(kernel_size, "kernel_size")
        self.stride, self.dilation = per_axis(stride, "stride"), per_axis(dilation, "dilation")
        # 'valid' and 'same' as PyTorch has them: symmetric padding where it is, else the string
        sides = padding_sides(padding, self.kernel_size, self.dilation, self.stride)
        symmetric = all(left == right for left, right in sides)
        self.padding = tuple(left for left, _ in sides) if symmetric else padding
        if keep_spectra not in KEEP_SPECTRA:
            raise ValueError(f"keep_spectra must be one of {', '.join(map(repr, KEEP_SPECTRA))}, got {keep_spectra!r}")
        self.math, self.runtime, self.keep_spectra = math, runtime, keep_spectra
        self._trip = None  # (input shape, RoundTrip or None for per-pass plans), once decided
        xp = get_backend(backend).xp
        rng = xp.random.default_rng(seed)
        fan_in = in_channels // groups * _math.prod(self.kernel_size)
        bound = 1.0 / _math.sqrt(fan_in)  # PyTorch's default initialisation range
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = (rng.random(shape, dtype=xp.float32) * 2 - 1) * bound
        self.bias = (rng.random((out_channels,), dtype=xp.float32) * 2 - 1) * bound if bias else None
        self.grad_weight = None
        self.grad_bias = None
        self._x = None

    def _args(self):
        return dict(stride=self.stride, padding=self.padding, dilation=self.dilation, groups=self.groups,
                    math=self.math, runtime=self.runtime)

    def forward(self, x):
        """``y = conv(x, weight) + bias``; keeps ``x`` for :meth:`backward`. ``x`` is (N, C, *spatial)
        or, unbatched, (C, *spatial)."""
        if x.ndim not in (self.rank + 1, self.rank + 2):
            raise ValueError(f"{type(self).__name__} expects input of rank {self.rank + 2} (N, C, *spatial) or "
                             f"{self.rank + 1} (C, *spatial), got shape {tuple(x.shape)}")
        self._x = x
        trip = self._round_trip(x)
        y = trip.forward(x, self.weight) if trip else conv(x, self.weight, **self._args())
        if self.bias is not None:
            y += self.bias.reshape((-1,) + (1,) * self.rank)
        return y

    __call__ = forward

    def backward(self, dy):
        """Store ``grad_weight`` (and ``grad_bias``) and return ``dx``."""
        if self._x is None:
            raise RuntimeError("backward() called before forward()")
        x = self._x
        trip = self._kept_trip()
        kept = trip is not None and trip.holding  # spectra of this forward pass to use
        if kept:
            self.grad_weight = trip.backward_filter(dy)
        else:
            self.grad_weight = conv_backward_filter(x, dy, self.weight.shape, **self._args())
        if self.bias is not None:  # summed over every axis but the channels'
            channel_axis = dy.ndim - self.rank - 1
            self.grad_bias = dy.sum(axis=tuple(a for a in range(dy.ndim) if a != channel_axis))
        if kept:
            return trip.backward_data(dy)
        return conv_backward_data(dy, self.weight, x.shape, **self._args())

    def _round_trip(self, x):
        """The :class:`~convtune.roundtrip.RoundTrip` this layer keeps spectra with, or ``None``:
        ``keep_spectra=True`` always (where the round trip supports the layer), ``'auto'`` where
        the planner measured that it pays (:meth:`~convtune.runtime.Runtime.round_trip_for`)."""
        if not self.keep_spectra:
            return None
        if isinstance(self.padding, str) or x.ndim != self.rank + 2 or x.shape[0] == 0:
            if self.keep_spectra is True:
                raise ValueError("keep_spectra=True needs a batched, non-empty input and symmetric padding; "
                                 "use keep_spectra='auto' or False")
            return None  # per-pass plans: round trips run batched problems with symmetric padding
        shape = tuple(x.shape)
        if self._trip is not None and self._trip[0] == shape:
            return self._trip[1]
        backend = backend_for(x, self.weight)
        problem = _layer_fields(shape, self.weight.shape, self.stride, self.padding, self.dilation, self.groups,
                                self.math, "fwd")
        auto = self.keep_spectra == "auto"
        if not auto:
            reason = roundtrip.unsupported_reason(problem)
            if reason is not None:
                raise ValueError(f"keep_spectra=True: {reason}; use keep_spectra='auto' or False")
        decision = (self.runtime or default_runtime()).round_trip_for(problem, backend, where_spectral=auto)
        if auto:
            config = decision.config if decision is not None and decision.pays else None
        else:  # the measured winner whether or not it pays, else the cheapest by the cost model
            config = decision.config if decision is not None and decision.winner is not None else \
                roundtrip.trip_candidates(problem, backend)[0]
        trip = roundtrip.RoundTrip(problem, config, backend) if config is not None else None
        self._trip = (shape, trip)
        return trip

    def _kept_trip(self):
        """The round trip decided for the last input shape, or ``None``."""
        return self._trip[1] if self._trip is not None else None

    def release_spectra(self):
        """Drop the spectra kept since the last forward pass (nothing to do without ``keep_spectra``)."""
        trip = self._kept_trip()
        if trip is not None:
            trip.release()

    def parameters(self):
        """``[(parameter, gradient), ...]`` for a hand-written optimiser step."""
        pairs = [(self.weight, self.grad_weight)]
        if self.bias is not None:
            pairs.append((self.bias, self.grad_bias))
        return pairs

    def __repr__(self):
        return (f"{type(self).__name__}({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
                f"math={self.math!r})")


class Conv1d(_ConvNd):
    """1-D convolution layer over (N, C, L) inputs."""
    rank = 1


class Conv2d(_ConvNd):
    """2-D convolution layer over (N, C, H, W) inputs."""
    rank = 2
