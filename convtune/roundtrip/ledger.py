"""What the layers' kept spectra hold at once, against a budget.

A layer that keeps spectra holds them from its forward pass to its backward: in a training step every such layer's
spectra are held together, before the first backward frees any. A :class:`KeptLedger` (one per device, kept by the
:class:`~convtune.runtime.Runtime`) counts those bytes: a layer's forward takes its bytes before keeping its spectra,
and runs its per-pass plans where they do not fit; its backward gives them back, and so does its :class:`Held` when
it is freed without a backward (a step whose loss is never differentiated).

>>> ledger = KeptLedger(100)
>>> a, b = ledger.hold(("x", "w"), 60), ledger.hold(("x", "w"), 60)
>>> b is None, ledger.held, ledger.refused
(True, 60, 1)
>>> a.release(); ledger.held, ledger.peak
(0, 60)
"""

from __future__ import annotations

import threading

from ..text import human_bytes

#: The default budget: this share of the device memory free when a layer first keeps spectra on it.
DEFAULT_SHARE = 0.25


def spectra_bytes(spectra) -> int:
    """The bytes of the arrays in ``spectra`` (an array, or tuples and lists of them; anything else counts 0)."""
    if isinstance(spectra, (tuple, list)):
        return sum(spectra_bytes(s) for s in spectra)
    return int(getattr(spectra, "nbytes", 0) or 0)


class KeptLedger:
    """Bytes of kept spectra held at once on one device, against ``budget`` (``None``: no limit). ``held``, ``peak``
    (the most held at once so far) and ``refused`` (forward passes that ran their per-pass plans for want of room) say
    what the layers kept."""

    def __init__(self, budget: int | None):
        if budget is not None and budget < 0:
            raise ValueError(f"a kept-spectra budget is a number of bytes (or None: no limit), got {budget!r}")
        self.budget = budget
        self.held = self.peak = self.refused = 0
        # (re-entrant: a Held freed by the garbage collector gives its bytes back in whatever thread, whatever it holds)
        self._lock = threading.RLock()

    def fits(self, nbytes: int) -> bool:
        """Would ``nbytes`` more fit now?"""
        return self.budget is None or self.held + nbytes <= self.budget

    def admits(self, nbytes: int) -> bool:
        """:meth:`fits`, counting a refusal where not (a forward pass that will not keep its spectra)."""
        with self._lock:
            if self.fits(nbytes):
                return True
            self.refused += 1
            return False

    def hold(self, spectra, nbytes: int) -> Held | None:
        """``spectra``, their ``nbytes`` counted until :meth:`Held.release`, or ``None`` (counted as refused) where
        they do not fit."""
        with self._lock:
            if not self.admits(nbytes):
                return None
            self.held += nbytes
            self.peak = max(self.peak, self.held)
        return Held(spectra, nbytes, self)

    def _give(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes

    def describe(self) -> str:
        budget = "no limit" if self.budget is None else human_bytes(self.budget)
        return (f"kept spectra: {human_bytes(self.held)} held, at most {human_bytes(self.peak)} at once, budget "
                f"{budget}; {self.refused} forward pass(es) ran their per-pass plans for want of room")


class Held:
    """Spectra a layer keeps for its backward, counted on their ledger until :meth:`release` (the backward's, or
    when this object is freed)."""

    __slots__ = ("spectra", "nbytes", "_ledger")

    def __init__(self, spectra, nbytes: int, ledger: KeptLedger):
        self.spectra, self.nbytes, self._ledger = spectra, nbytes, ledger

    def release(self) -> None:
        """Drop the spectra and give their bytes back (once)."""
        ledger, self._ledger, self.spectra = self._ledger, None, None
        if ledger is not None:
            ledger._give(self.nbytes)

    def __del__(self):
        self.release()
