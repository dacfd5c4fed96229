"""Layer objects for NumPy or CuPy training loops: ``Conv1d`` and ``Conv2d``.

Each keeps its weight (and bias), runs its forward pass through the runtime's
plan lookup, and on ``backward(dy)`` stores ``grad_weight``/``grad_bias`` and
returns the input gradient.

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

from .backend import get_backend
from .runtime import Runtime, conv, conv_backward_data, conv_backward_filter


class _ConvNd:
    rank = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, *, math="fp32", backend="numpy", seed=None, runtime: Runtime | None = None):
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
        self.stride, self.padding = per_axis(stride, "stride"), per_axis(padding, "padding")
        self.dilation = per_axis(dilation, "dilation")
        self.math, self.runtime = math, runtime
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
        """``y = conv(x, weight) + bias``; keeps ``x`` for :meth:`backward`."""
        if x.ndim != self.rank + 2:
            raise ValueError(f"{type(self).__name__} expects input of rank {self.rank + 2} (N, C, *spatial), "
                             f"got shape {tuple(x.shape)}")
        self._x = x
        y = conv(x, self.weight, **self._args())
        if self.bias is not None:
            y += self.bias.reshape((1, -1) + (1,) * self.rank)
        return y

    __call__ = forward

    def backward(self, dy):
        """Store ``grad_weight`` (and ``grad_bias``) and return ``dx``."""
        if self._x is None:
            raise RuntimeError("backward() called before forward()")
        x = self._x
        self.grad_weight = conv_backward_filter(x, dy, self.weight.shape, **self._args())
        if self.bias is not None:
            self.grad_bias = dy.sum(axis=(0, *range(2, dy.ndim)))
        return conv_backward_data(dy, self.weight, x.shape, **self._args())

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
