"""The kinds of typed record a plan store keeps beside its plans, each owned (encoded and decoded) elsewhere.

========  ===============================================  ===================================
kind      what                                             owner
========  ===============================================  ===================================
trip      a layer's round-trip (kept spectra) decision     :mod:`convtune.roundtrip`
duel      the PyTorch layer's duel of a plan with PyTorch  :mod:`convtune.torch._dispatch`
fft_cost  a device's FFT cost-model calibration            :mod:`convtune.fft.cost`
broken    a stored plan that did not build where it was    :mod:`convtune.runtime` (``show``
          looked up (damaged or edited)                    marks the plan)
search    where a tuning run's own time went (its phases:  :class:`convtune.cache.PlanCache`
          listing, references, compiling), by run id       (``put``; ``explain`` shows it)
steps     a model's training steps weighed: the host's     :mod:`convtune.torch._handback`
          time to issue one and its whole time
========  ===============================================  ===================================

A SQL store keeps a record as a row of its key/value table, keyed by the kind's prefix and a hash of the
record's key text (``digits`` hexadecimal digits of SHA-256), so that a key stays within 64 characters.
"""

from __future__ import annotations

#: kind -> (key prefix, hash digits)
RECORD_KINDS = {"trip": ("trip:", 59), "duel": ("duel:", 59), "fft_cost": ("fft_cost:", 40), "broken": ("broken:", 57),
                "search": ("search:", 57), "steps": ("steps:", 58)}


def broken_key(device_key: str, problem_key: str, plan_label: str) -> str:
    """The key of a ``broken`` record: the device, the problem and the plan that did not build."""
    return f"{device_key}|{problem_key}|{plan_label}"


def record_kind(kind: str) -> tuple[str, int]:
    """The key prefix and hash length of ``kind`` (``ValueError`` naming the kinds for any other)."""
    try:
        return RECORD_KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown record kind {kind!r}; acceptable: {', '.join(RECORD_KINDS)}") from None
