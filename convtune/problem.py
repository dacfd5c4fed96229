"""The shape-only convolution problem.

A :class:`ConvProblem` holds everything that decides *what* is computed and
nothing about *how*: no arrays, no device. The planner takes problems, plans
execute them.

Conventions (those of PyTorch and cuDNN, cross-correlation):

* input ``x``: ``(batch, in_channels, *input_size)``
* weight ``w``: ``(out_channels, in_channels // groups, *kernel_size)``
* output ``y``: ``(batch, out_channels, *output_size)`` with
  ``out = (in + 2*pad - dil*(k-1) - 1) // stride + 1`` per axis.

The three passes each map two operands to one result:

=========  ================  ==========
pass       operands          result
=========  ================  ==========
``fwd``    ``x, w``          ``y``
``dgrad``  ``dy, w``         ``dx``
``wgrad``  ``x, dy``         ``dw``
=========  ================  ==========

A problem's ``dtype`` (float32, bfloat16, float16) and ``layout`` (channels_first, channels_last)
say how its operands are stored and how accurate its result must be: :mod:`convtune.precision`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass

from . import precision

#: Version of the canonical key format; bump when :meth:`ConvProblem.key` changes.
KEY_VERSION = 1

PASSES = ("fwd", "dgrad", "wgrad")
DTYPES = precision.DTYPES
LAYOUTS = precision.LAYOUTS
#: Math mode -> maximal relative error ``||out - ref|| / ||ref||`` against float64.
MATH_TOLERANCE = {"fp32": 1e-5, "tf32": 1e-3}
MAX_RANK = 3
SUPPORTED_RANKS = (1, 2, 3)


def integral(value, name: str) -> int:
    """``value`` as an int: any integral type (Python's, NumPy's), never a bool or a float such as
    2.0 or 1.5 (PyTorch's convolutions refuse those too)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return int(value)


def per_axis(value, rank: int, name: str) -> tuple[int, ...]:
    """``value`` (an int, or a sequence of ``rank`` ints) as one int per spatial axis; ``ValueError`` naming ``name``
    otherwise."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return (int(value),) * rank
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ValueError(f"{name} must be an int or a sequence of {rank} ints, got {value!r}")
    out = tuple(integral(v, f"every entry of {name}") for v in value)
    if len(out) != rank:
        raise ValueError(f"{name} has {len(out)} entries but the problem has {rank} spatial dimension(s)")
    return out


def _fmt(values: Iterable[int]) -> str:
    return "x".join(str(v) for v in values)


@dataclass(frozen=True)
class ConvProblem:
    """One convolution layer shape and one pass; immutable and hashable.

    Examples
    --------
    >>> p = ConvProblem.make(batch=8, in_channels=3, out_channels=16,
    ...                      input_size=(32, 32), kernel_size=3, padding=1)
    >>> p.output_size
    (32, 32)
    >>> p.key()
    'ck1:conv2d:fwd:float32:fp32:n8:c3:k16:in32x32:ker3x3:s1x1:p1x1:d1x1:g1'
    """

    batch: int
    in_channels: int
    out_channels: int
    input_size: tuple[int, ...]
    kernel_size: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    dtype: str = "float32"
    math: str = "fp32"
    pass_: str = "fwd"
    layout: str = "channels_first"

    # -- construction -------------------------------------------------------------
    @classmethod
    def make(cls, *, batch, in_channels, out_channels, input_size, kernel_size,
             stride=1, padding=0, dilation=1, groups=1, dtype="float32", math="fp32",
             pass_="fwd", layout="channels_first") -> "ConvProblem":
        """Build a problem, broadcasting int stride/padding/dilation/kernel to every axis."""
        if isinstance(input_size, (numbers.Number, str, bytes)) or not isinstance(input_size, Iterable):
            raise ValueError("input_size must be a sequence with one entry per spatial dimension, "
                             f"e.g. (32, 32) for 2-D or (512,) for 1-D; got {input_size!r}")
        input_size = tuple(integral(v, "every entry of input_size") for v in input_size)
        rank = len(input_size)
        return cls(batch=integral(batch, "batch"), in_channels=integral(in_channels, "in_channels"),
                   out_channels=integral(out_channels, "out_channels"), input_size=input_size,
                   kernel_size=per_axis(kernel_size, rank, "kernel_size"), stride=per_axis(stride, rank, "stride"),
                   padding=per_axis(padding, rank, "padding"), dilation=per_axis(dilation, rank, "dilation"),
                   groups=integral(groups, "groups"), dtype=str(dtype), math=str(math), pass_=str(pass_),
                   layout=str(layout))

    def __post_init__(self):
        rank = len(self.input_size)
        if rank not in SUPPORTED_RANKS:
            if 1 <= rank <= MAX_RANK:
                raise ValueError(f"rank-{rank} convolutions are not supported yet; supported ranks: "
                                 f"{', '.join(map(str, SUPPORTED_RANKS))}")
            raise ValueError(f"input_size must have 1 to {MAX_RANK} spatial dimensions, got {self.input_size!r}")
        for name in ("kernel_size", "stride", "padding", "dilation"):
            value = getattr(self, name)
            if len(value) != rank:
                raise ValueError(f"{name} has {len(value)} entries but input_size has {rank}")
        for name in ("batch", "in_channels", "out_channels", "groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("input_size", "kernel_size", "stride", "dilation"):
            if any(v <= 0 for v in getattr(self, name)):
                raise ValueError(f"every entry of {name} must be positive, got {getattr(self, name)!r}")
        if any(v < 0 for v in self.padding):
            raise ValueError(f"padding must be non-negative, got {self.padding!r}")
        if self.in_channels % self.groups or self.out_channels % self.groups:
            raise ValueError(f"in_channels ({self.in_channels}) and out_channels ({self.out_channels}) "
                             f"must both be divisible by groups ({self.groups})")
        precision.check(self.dtype, self.layout)
        if self.math not in MATH_TOLERANCE:
            raise ValueError(f"unknown math mode {self.math!r}; acceptable modes: {', '.join(MATH_TOLERANCE)}")
        if self.pass_ not in PASSES:
            raise ValueError(f"unknown pass {self.pass_!r}; acceptable passes: {', '.join(PASSES)}")
        for axis, (n, p, k, d) in enumerate(zip(self.input_size, self.padding, self.kernel_size, self.dilation)):
            span = d * (k - 1) + 1
            if span > n + 2 * p:
                raise ValueError(f"axis {axis}: the dilated kernel spans {span} but the padded input is only "
                                 f"{n + 2 * p} ({n} + 2*{p}); lower the kernel size or dilation, or pad more")

    # -- derived shapes --------------------------------------------------------------
    @property
    def rank(self) -> int:
        return len(self.input_size)

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def output_size(self) -> tuple[int, ...]:
        return tuple((n + 2 * p - d * (k - 1) - 1) // s + 1 for n, p, k, d, s in
                     zip(self.input_size, self.padding, self.kernel_size, self.dilation, self.stride))

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def dilated_kernel(self) -> tuple[int, ...]:
        return tuple(d * (k - 1) + 1 for k, d in zip(self.kernel_size, self.dilation))

    @property
    def in_per_group(self) -> int:
        return self.in_channels // self.groups

    @property
    def out_per_group(self) -> int:
        return self.out_channels // self.groups

    @property
    def depthwise(self) -> bool:
        return self.groups > 1 and self.groups == self.in_channels

    @property
    def tolerance(self) -> float:
        """The bound on the relative error against float64: the math mode's, or the dtype's where looser."""
        return precision.tolerance(self.dtype, MATH_TOLERANCE[self.math])

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def x_shape(self) -> tuple[int, ...]:
        return (self.batch, self.in_channels, *self.input_size)

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def w_shape(self) -> tuple[int, ...]:
        return (self.out_channels, self.in_per_group, *self.kernel_size)

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def y_shape(self) -> tuple[int, ...]:
        return (self.batch, self.out_channels, *self.output_size)

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def operand_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of the two operands of this problem's pass (see the module docstring)."""
        return {"fwd": (self.x_shape, self.w_shape), "dgrad": (self.y_shape, self.w_shape),
                "wgrad": (self.x_shape, self.y_shape)}[self.pass_]

    @functools.cached_property  # (derived once: a frozen problem's shapes never change)
    def result_shape(self) -> tuple[int, ...]:
        return {"fwd": self.y_shape, "dgrad": self.x_shape, "wgrad": self.w_shape}[self.pass_]

    # -- variants ------------------------------------------------------------------
    def replace(self, **changes) -> "ConvProblem":
        return dataclasses.replace(self, **changes)

    def for_pass(self, pass_: str) -> "ConvProblem":
        return self.replace(pass_=pass_)

    def in_float32(self) -> "ConvProblem":
        """The float32 channels-first problem of the same shape, pass and math mode (what a strategy
        that reads neither this dtype nor this layout runs, see :func:`convtune.precision.bounded`)."""
        return self.replace(dtype="float32", layout="channels_first")

    # -- keys and reports ----------------------------------------------------------
    def layer_key(self) -> str:
        """Key of the layer shape alone, without pass, dtype and math mode."""
        return (f"conv{self.rank}d:n{self.batch}:c{self.in_channels}:k{self.out_channels}:"
                f"in{_fmt(self.input_size)}:ker{_fmt(self.kernel_size)}:s{_fmt(self.stride)}:"
                f"p{_fmt(self.padding)}:d{_fmt(self.dilation)}:g{self.groups}")

    def key(self) -> str:
        """Canonical, human-readable key; ``ck<KEY_VERSION>`` leads so old keys never collide. A
        channels-last problem ends in ``:channels_last`` (a channels-first one's key is as it always was)."""
        head, rest = self.layer_key().split(":", 1)
        tail = "" if self.layout == "channels_first" else f":{self.layout}"
        return f"ck{KEY_VERSION}:{head}:{self.pass_}:{self.dtype}:{self.math}:{rest}{tail}"

    @classmethod
    def from_key(cls, key: str) -> "ConvProblem":
        """Inverse of :meth:`key`."""
        parts = key.split(":")
        if len(parts) not in (14, 15) or parts[0] != f"ck{KEY_VERSION}":
            raise ValueError(f"not a convtune problem key of format version {KEY_VERSION}: {key!r}")
        layout = parts.pop() if len(parts) == 15 else "channels_first"
        _, _conv, pass_, dtype, math_, n, c, k, inp, ker, s, p, d, g = parts

        def dims(text, prefix):
            return tuple(int(v) for v in text[len(prefix):].split("x"))

        return cls(batch=int(n[1:]), in_channels=int(c[1:]), out_channels=int(k[1:]),
                   input_size=dims(inp, "in"), kernel_size=dims(ker, "ker"), stride=dims(s, "s"),
                   padding=dims(p, "p"), dilation=dims(d, "d"), groups=int(g[1:]), dtype=dtype,
                   math=math_, pass_=pass_, layout=layout)

    def flops(self) -> int:
        """Multiply-adds x 2 of the direct algorithm (the same for every pass)."""
        macs = (self.batch * self.out_channels * math.prod(self.output_size)
                * self.in_per_group * math.prod(self.kernel_size))
        return 2 * macs

    def min_bytes(self) -> int:
        """Fewest bytes a pass must move: each operand read once, the result written once."""
        item = precision.ITEMSIZE[self.dtype]
        a, b = self.operand_shapes
        return item * (math.prod(a) + math.prod(b) + math.prod(self.result_shape))

    def describe(self) -> str:
        return (f"conv{self.rank}d {self.pass_} N={self.batch} C={self.in_channels}->{self.out_channels} "
                f"in={_fmt(self.input_size)} k={_fmt(self.kernel_size)} s={_fmt(self.stride)} "
                f"p={_fmt(self.padding)} d={_fmt(self.dilation)} g={self.groups}"
                + ("" if self.dtype == "float32" else f" {self.dtype}")
                + ("" if self.layout == "channels_first" else f" {self.layout}") + f" {self.math}")
