"""Kept spectra: a layer's training step (forward and both gradients) as one FFT round trip that keeps the
spectra of the forward's operands for the backward (:class:`~convtune.roundtrip.RoundTrip`), for the layers whose
module asks for it (``keep_spectra``)."""

from __future__ import annotations

import logging

import torch

from .. import roundtrip
from ..roundtrip.ledger import spectra_bytes
from ..text import human_bytes
from ._bridge import bridge
from ._duel import TORCH_DTYPES
from ._formats import CONTIGUOUS, dense_as, layout_format
from ._notes import say_once


class Trips(dict):
    """A route's round trips: ``keep_spectra`` mode -> :class:`~convtune.roundtrip.RoundTrip`, or ``None`` for the
    per-pass plans, resolved on first use (:meth:`resolve`)."""

    __slots__ = ("problem", "runtime", "device", "captures", "kept_bytes", "duelled", "_ledger")

    def __init__(self, problem, runtime, device, captures):
        super().__init__()
        self.problem, self.runtime, self.device, self.captures = problem, runtime, device, captures
        self.kept_bytes = None  # what this layer's spectra held the last time it kept them
        self.duelled = False  # 'auto': the round trip has met the per-pass plans in the layer (Route.duel_trip)
        self._ledger = None

    def ledger(self):
        """The device's :class:`~convtune.roundtrip.ledger.KeptLedger` (the runtime's; looked up once)."""
        if self._ledger is None:
            br = bridge(self.device.type)
            self._ledger = self.runtime.kept_ledger(str(self.device),
                                                    lambda: br.call(self.device.index, br.backend.free_memory_bytes))
        return self._ledger

    def room(self) -> bool:
        """Would this layer's spectra (as large as the last time it kept them; before that, yes) fit the device's
        kept-spectra budget now? Where not, the call runs the per-pass plans (said once)."""
        if self.kept_bytes is None or self.ledger().admits(self.kept_bytes):
            return True
        self._no_room()
        return False

    def _no_room(self) -> None:
        kept = self.ledger()
        say_once(f"kept-room:{self.problem.key()}:{self.device}", "convtune: %s on %s runs its per-pass plans "
                 "where its spectra (%s) do not fit beside the other layers' (%s held of a %s budget: "
                 "Runtime(kept_budget=...))", self.problem.describe(), self.device, human_bytes(self.kept_bytes),
                 human_bytes(kept.held), human_bytes(kept.budget), level=logging.INFO)

    def resolve(self, mode):
        """The round trip this layer runs under ``keep_spectra=mode`` (``True``: the measured winner whether or
        not it pays; ``'auto'``: where it pays), or ``None`` for the per-pass plans (the reason logged once)."""
        if mode in self:
            return self[mode]
        problem, trip, reason = self.problem, None, None
        try:
            reason = roundtrip.unsupported_reason(problem)
            if reason is None:
                br = bridge(self.device.type)
                with self.runtime._lock:
                    decision = br.call(self.device.index, self.runtime.round_trip_for, problem, br.backend, False,
                                       mode == "auto")  # ('auto': measured only where a pass transforms)
                if decision is None or decision.winner is None:
                    reason = decision.reason if decision is not None else "no round-trip decision (miss policy)"
                elif mode == "auto" and not decision.pays:
                    reason = f"it does not pay here ({decision.reason})"
                else:  # convtune's own transforms read and write the layer as it is (bfloat16 as its 16 bits), the
                    # block trips a float32 layer in either layout; other trips are float32 channels-first, a
                    # half-precision or channels_last layer's conversions PyTorch's (forward and backward)
                    native = decision.config.own or decision.config.product == "block"
                    trip = br.call(self.device.index, roundtrip.RoundTrip, problem if native else problem.in_float32(),
                                   decision.config, br.backend)
        except Exception as exc:  # a failure is a reason for the per-pass plans, never an error
            trip, reason = None, f"{type(exc).__name__}: {exc}"
        if trip is None:
            say_once(f"trip:{problem.key()}:{self.device}:{mode}", "convtune: %s on %s runs its per-pass plans, "
                     "not a round trip with kept spectra: %s", problem.describe(), self.device, reason,
                     level=logging.INFO)
        self[mode] = trip
        return trip

    def drop(self, exc: Exception) -> None:
        """A round trip that failed when it ran: this layer runs its per-pass plans from now on (said once)."""
        say_once(f"trip-failed:{self.problem.key()}:{self.device}", "convtune: the round trip of %s on %s failed "
                 "(%s: %s); it runs its per-pass plans", self.problem.describe(), self.device, type(exc).__name__, exc)
        for mode in list(self):
            self[mode] = None

    def forward(self, trip, x, w, bias):
        """``(y, held)``: the forward pass through ``trip``, keeping the spectra for :meth:`backward`, counted on the
        device's ledger (:class:`~convtune.roundtrip.ledger.Held`; ``None`` where they do not fit: the backward then
        runs the per-pass plans)."""
        br = bridge(self.device.type)
        dtype, fmt = _trip_format(trip)
        a, b = dense_as(x, dtype, fmt), dense_as(w, dtype, fmt)
        y = torch.empty(self.problem.y_shape, dtype=dtype, device=x.device, memory_format=fmt)
        spectra = br.call(self.device.index, lambda: trip.kept_forward(br.array(a), br.array(b), br.array(y))[1])
        if not trip.recordable and x.is_cuda:  # a capture records PyTorch's convolution instead
            self.captures.warm("fwd", x, w)
        y = self._as_layer(y, x.dtype)
        if bias is not None:
            y += bias.view((1, -1) + (1,) * self.problem.rank)
        self.kept_bytes = spectra_bytes(spectra)
        held = self.ledger().hold(spectra, self.kept_bytes)
        if held is None:
            self._no_room()
        else:
            say_once(f"kept:{self.problem.key()}:{self.device}", "convtune: %s on %s keeps %s of spectra from its "
                     "forward pass to its backward", self.problem.describe(), self.device,
                     human_bytes(self.kept_bytes), level=logging.INFO)
        return y, held

    def backward(self, trip, spectra, dy, need_dx: bool, need_dw: bool, x=None, w=None):
        """``(dx, dw)`` (``None`` where not needed) from ``dy`` and the forward's spectra (``x`` and ``w``, the
        forward's operands, for warming PyTorch's convolution for captures only)."""
        br = bridge(self.device.type)
        p = self.problem
        dtype = dy.dtype
        held, fmt = _trip_format(trip)
        g = dense_as(dy, held, fmt)
        dx = torch.empty(p.x_shape, dtype=held, device=dy.device, memory_format=fmt) if need_dx else None
        dw = torch.empty(p.w_shape, dtype=held, device=dy.device, memory_format=fmt) if need_dw else None
        br.call(self.device.index, lambda: trip.kept_backward(
            spectra, br.array(g), br.array(dx) if need_dx else None, br.array(dw) if need_dw else None,
            need_dx, need_dw))
        dx = None if dx is None else self._as_layer(dx, dtype)
        dw = None if dw is None else self._as_layer(dw, dtype)
        if not trip.recordable and dy.is_cuda:  # (the per-pass route's backward passes, in this thread)
            if need_dx and w is not None:
                self.captures.warm("dgrad", dy, w)
            if need_dw and x is not None:
                self.captures.warm("wgrad", x, dy)
        return dx, dw

    def _as_layer(self, result, dtype):
        """A round trip's float32 channels-first result in the layer's dtype and layout (one pass; itself for a
        float32 channels-first layer)."""
        if dtype == result.dtype and self.problem.layout == "channels_first":
            return result
        return result.to(dtype=dtype, memory_format=layout_format(self.problem))


def _trip_format(trip):
    """The dtype and memory format ``trip`` reads and writes: the layer's own where its transforms are convtune's
    (:class:`~convtune.roundtrip.RoundTrip` built for the layer's problem), else float32 channels-first."""
    if trip.problem.dtype == "float32" and trip.problem.layout == "channels_first":
        return torch.float32, CONTIGUOUS
    return TORCH_DTYPES[trip.problem.dtype], layout_format(trip.problem)
