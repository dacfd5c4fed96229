"""The ratios of a ``convtune bench-model`` document (:mod:`convtune.bench.model`), without PyTorch: the CLI
prints them and ``benchmarks/bench_tables.py`` tabulates them from the JSON.

A convtune mode is set against each PyTorch mode; with ``--null`` each PyTorch mode also ran twice, its copy
named with :data:`AGAIN`, and the copy is set against the original (PyTorch against itself: the noise of every
other ratio). With ``--against DB`` each convtune mode also ran on the plans of another cache (an ``--exhaustive``
tune's, say), named with :data:`AGAINST`, and that copy is set against it: above 1, this cache's plans are faster;
below, the other's are (the regret of this cache's search). Ratios are peer time over convtune time (above 1:
convtune faster).
"""

from __future__ import annotations

import math
import statistics

from ..timing import HOST_BOUND

#: The suffix of a PyTorch mode's second copy (``null``): the same step, timed again.
AGAIN = "-again"
#: The suffix of a convtune mode's copy on another plan cache's plans (``against``).
AGAINST = "-against"


def kind(mode: str) -> str:
    """The mode a copy stands for (``torch-fp32-again``: ``torch-fp32``; ``convtune-fp32-against``:
    ``convtune-fp32``)."""
    for suffix in (AGAIN, AGAINST):
        if mode.endswith(suffix):
            return mode[:-len(suffix)]
    return mode


def pairs(doc: dict):
    """``(name, ours, peer)``: each convtune mode against each PyTorch mode, each PyTorch copy against its
    original, each convtune mode against its copy on another cache's plans (the modes' records, failed ones left
    out)."""
    modes = {m["mode"]: m for m in doc["modes"] if "failed" not in m and m.get("step_ms")}
    for name, m in modes.items():
        if name.endswith(AGAIN) and kind(name) in modes:
            yield f"{name} vs {kind(name)}", m, modes[kind(name)]
    for name, m in modes.items():
        if name.endswith(AGAINST) and kind(name) in modes:
            yield f"{kind(name)} vs {name}", modes[kind(name)], m
    for ours in (m for n, m in modes.items() if n.startswith("convtune") and not n.endswith(AGAINST)):
        for peer in (m for n, m in modes.items() if n.startswith("torch") and not n.endswith(AGAIN)):
            yield f"{ours['mode']} vs {peer['mode']}", ours, peer


def speedups(doc: dict) -> dict:
    """Step-time ratios (medians): each convtune mode against each PyTorch mode (above 1: convtune faster),
    each PyTorch copy (``null``) against its original."""
    return {name: peer["step_ms"] / ours["step_ms"] for name, ours, peer in pairs(doc)
            if math.isfinite(peer["step_ms"])}


def paired(doc: dict) -> dict:
    """The same ratios round by round (interleaved runs): ``{name: (median, lowest, highest)}`` of the
    rounds' ratios of median steps, over the rounds both modes ran."""
    out = {}
    for name, ours, peer in pairs(doc):
        rounds = list(zip(ours.get("round_ms", ()), peer.get("round_ms", ())))
        if len(rounds) >= 2:
            ratios = [p / o for o, p in rounds]
            out[name] = (statistics.median(ratios), min(ratios), max(ratios))
    return out


def host_bound(doc: dict) -> list[str]:
    """The PyTorch modes (not their copies) of a run on a GPU, eager, whose steps were host-bound
    (:data:`HOST_BOUND`): there a faster convolution shortens no step, and a patched layer's host work lengthens it."""
    if not str(doc.get("device", "")).startswith("cuda") or doc.get("graph"):
        return []
    return [m["mode"] for m in doc["modes"] if m["mode"].startswith("torch") and not m["mode"].endswith(AGAIN)
            and "failed" not in m and m.get("step_ms") and m.get("host_ms") is not None
            and m["host_ms"] >= HOST_BOUND * m["step_ms"]]
