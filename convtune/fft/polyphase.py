"""Polyphase decomposition: a strided convolution as a stride-1 one over more channels.

Per axis, with stride ``s``, padding ``p``, kernel ``k`` and ``o`` outputs, write each tap as
``t = a*s + r`` (phase ``r < s``, ``a < ka = ceil(k / s)``)::

    y[q] = sum_t xpad[q*s + t] w[t] = sum_r sum_a X_r[q + a] W_r[a]
    X_r[m] = xpad[m*s + r],   W_r[a] = w[a*s + r] (0 where a*s + r >= k)

so the strided convolution is a stride-1, unpadded correlation of the ``s`` phases of the padded
input (as extra channels) with the ``s`` phases of the kernel, on ``m = o + ka - 1`` samples: an
FFT of about ``1/s`` the length per axis, with no output computed only to be thrown away. The
backward passes follow by adjointness: the input gradient is the phases interleaved back (and the
padding cropped), the filter gradient is the kernel phases interleaved back. Channel ``c`` of the
original becomes channels ``c*S .. c*S + S - 1`` (``S`` the product of the strides), so groups stay
contiguous and the same group count holds.

Examples
--------
>>> from convtune.problem import ConvProblem
>>> p = ConvProblem.make(batch=1, in_channels=3, out_channels=8, input_size=(224, 224), kernel_size=11,
...                      stride=4, padding=2)
>>> Polyphase(p).inner.describe()
'conv2d fwd N=1 C=48->8 in=57x57 k=3x3 s=1x1 p=0x0 d=1x1 g=1 fp32'
"""

from __future__ import annotations

import math

from ..problem import ConvProblem


def applies(p: ConvProblem) -> str | None:
    """Why the decomposition does not apply to ``p``, or None."""
    if all(s == 1 for s in p.stride):
        return "stride 1: nothing to decompose"
    if any(d != 1 for d in p.dilation):
        return "dilated and strided kernels are not decomposed"
    return None


class Polyphase:
    """The stride-1 problem a strided one becomes, and the rearrangements between the two."""

    def __init__(self, problem: ConvProblem):
        reason = applies(problem)
        if reason is not None:
            raise ValueError(f"polyphase decomposition of {problem.describe()}: {reason}")
        p = self.p = problem
        self.s = p.stride
        self.S = math.prod(p.stride)
        self.ka = tuple(-(-k // s) for k, s in zip(p.kernel_size, p.stride))
        self.m = tuple(o + a - 1 for o, a in zip(p.output_size, self.ka))
        self.inner = p.replace(in_channels=p.in_channels * self.S, input_size=self.m, kernel_size=self.ka,
                               stride=(1,) * p.rank, padding=(0,) * p.rank)

    def _split(self, shape_lead, per_axis):
        """Shapes that split each spatial axis ``(count * s)`` into ``(count, s)`` and the axis order that
        moves the phases next to the channel axis: (lead..., C, count..., s...) <-> (lead..., C, s..., count...)."""
        r = self.p.rank
        split = tuple(v for c, s in zip(per_axis, self.s) for v in (c, s))
        lead = len(shape_lead)
        counts = [lead + 2 * i for i in range(r)]
        phases = [lead + 2 * i + 1 for i in range(r)]
        return shape_lead + split, tuple(range(lead)) + tuple(phases) + tuple(counts)

    def _input_window(self):
        """(slices into x, slices into the padded phase grid) of the input positions the phases hold:
        padded position i holds x[i - pad]; positions past ``m*s`` feed no output and are left out."""
        inside, padded = [slice(None)] * 2, [slice(None)] * 2
        for n, pad, m, s in zip(self.p.input_size, self.p.padding, self.m, self.s):
            hi = min(n, m * s - pad)
            inside.append(slice(0, hi))
            padded.append(slice(pad, pad + hi))
        return tuple(inside), tuple(padded)

    def _pack(self, xp, a, counts, src, dst):
        """``a[src]`` placed at ``dst`` in a zero grid of ``counts*s`` per axis, whose phases become
        channels: (lead, C*S, *counts)."""
        lead, c = a.shape[:2]
        grid = xp.zeros((lead, c) + tuple(n * s for n, s in zip(counts, self.s)), dtype=a.dtype)
        grid[dst] = a[src]
        shape, order = self._split((lead, c), counts)
        return xp.ascontiguousarray(grid.reshape(shape).transpose(order)).reshape((lead, c * self.S) + counts)

    def pack_input(self, xp, x):
        """(N, C, *n) -> (N, C*S, *m): the phases of the padded input."""
        inside, padded = self._input_window()
        return self._pack(xp, x, self.m, inside, padded)

    def pack_weight(self, xp, w):
        """(K, Cg, *k) -> (K, Cg*S, *ka): the kernel's phases (taps past the kernel are zeros)."""
        taps = (slice(None), slice(None)) + tuple(slice(0, k) for k in self.p.kernel_size)
        return self._pack(xp, w, self.ka, (Ellipsis,), taps)

    def _interleave(self, xp, packed, channels, counts):
        """(lead, C*S, *counts) -> (lead, C, *(counts*s)): the inverse of the packing above."""
        lead = packed.shape[0]
        r = self.p.rank
        phased = packed.reshape((lead, channels) + self.s + counts)
        # (lead, C, s..., count...) -> (lead, C, count0, s0, count1, s1, ...)
        order = (0, 1) + tuple(v for i in range(r) for v in (2 + r + i, 2 + i))
        return phased.transpose(order).reshape((lead, channels) + tuple(c * s for c, s in zip(counts, self.s)))

    def unpack_input_grad(self, xp, packed, out):
        """Gradient of the phases (N, C*S, *m) -> gradient of the input, written into ``out`` (N, C, *n)."""
        grid = self._interleave(xp, packed, self.p.in_channels, self.m)
        inside, padded = self._input_window()
        if any(d.stop < n for d, n in zip(inside[2:], self.p.input_size)):
            out[...] = 0  # inputs past the last output's reach get no gradient
        out[inside] = grid[padded]
        return out

    def unpack_weight_grad(self, xp, packed, out):
        """Gradient of the kernel phases (K, Cg*S, *ka) -> gradient of the kernel into ``out`` (K, Cg, *k)."""
        grid = self._interleave(xp, packed, self.p.in_per_group, self.ka)
        out[...] = grid[(slice(None), slice(None)) + tuple(slice(0, k) for k in self.p.kernel_size)]
        return out


class PolyphaseConv:
    """Runs a strided problem's pass through an executor of the stride-1 problem :class:`Polyphase` makes."""

    def __init__(self, xp, problem: ConvProblem, make_inner):
        self.xp, self.poly = xp, Polyphase(problem)
        self.inner = make_inner(self.poly.inner)

    def __call__(self, a, b, out):
        xp, poly, pass_ = self.xp, self.poly, self.poly.p.pass_
        if pass_ == "fwd":
            return self.inner(poly.pack_input(xp, a), poly.pack_weight(xp, b), out)
        if pass_ == "dgrad":
            packed = xp.empty(poly.inner.x_shape, dtype=out.dtype)
            return poly.unpack_input_grad(xp, self.inner(a, poly.pack_weight(xp, b), packed), out)
        packed = xp.empty(poly.inner.w_shape, dtype=out.dtype)
        return poly.unpack_weight_grad(xp, self.inner(poly.pack_input(xp, a), b, packed), out)


def workspace_bytes(p: ConvProblem, inner_bytes: int) -> int:
    """The inner plan's workspace plus the packed operands and the packed result."""
    poly = Polyphase(p)
    q = poly.inner
    packed = 4 * (math.prod(q.x_shape) * 2 + math.prod(q.w_shape) * 2)
    return inner_bytes + packed
