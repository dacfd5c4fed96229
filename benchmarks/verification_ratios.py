"""How well a candidate's runs on the verification batch predict its time on the full problem, from stored searches.

The planner ranks candidates by their warm run on the verification batch and skips, untimed, those ``SLOW_FACTOR``
times the best there (PyTorch's convolution never: it is the point of reference). Where a rule on that ratio is
weighed (a lower factor, or one for PyTorch's call, whose first full-batch call runs PyTorch's own algorithm
search), this says what it would have done on the searches of one or more plan caches of schema 5 or later (each
measurement keeps its first and warm run on the verification batch):

* per strategy, the candidates timed on the full problem, by their warm run's ratio to the problem's best warm run
  (bins at ``--factors``): how many there were, the seconds timing them cost, and the closest any of them came to the
  problem's winner on the full problem (where that is near 1, a rule skipping the bin would have lost a winner);
* per strategy, the ratio of its ratio on the full problem to its ratio on the verification batch (the median and the
  range): below 1, the verification batch compresses the gaps (its small runs carry fixed costs).

    .venv/bin/python benchmarks/verification_ratios.py --db plans.db [--db other.db] [--factors 5,10,20,50]

(any Python that imports convtune: ``.venv/bin/python`` is the one ``bash scripts/convtune.sh`` sets up)
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict

try:
    from convtune.cache import PlanCache
    from convtune.commandline import format_table
except ImportError as exc:  # a Python without convtune or its dependencies: say which one to use
    sys.exit(f"verification_ratios.py needs convtune and its dependencies ({exc}): run it with .venv/bin/python, "
             "which `bash scripts/convtune.sh info` sets up")


def searches(url: str):
    """Each stored search's candidates that ran on the verification batch: ``(strategy, warm_run_s, median_s,
    timing_s)`` tuples (``median_s`` and ``timing_s`` ``None`` where the candidate was not timed)."""
    cache = PlanCache(url, create=False, read_only=True)
    if cache.schema_version() < 5:
        raise SystemExit(f"{url}: schema {cache.schema_version()}, before measurements kept the verification runs (5)")
    for row in cache.plan_rows():
        found = [(m["strategy"], m["warm_run_s"], m["time_median_s"], m["timing_s"])
                 for m in cache.measurement_rows(row["problem_key"], row["fingerprint"])
                 if m["warm_run_s"]]
        if found:
            yield found


def tally(all_searches, factors: list[float]) -> tuple[dict, dict]:
    """``bins[(strategy, bin)]``: [candidates timed, seconds timing them, closest ratio to the winner]; ``shrink[strategy]``:
    each timed candidate's ratio to the winner over its warm ratio on the verification batch."""
    bins: dict = defaultdict(lambda: [0, 0.0, float("inf")])
    shrink: dict = defaultdict(list)
    for found in all_searches:
        best_warm = min(warm for _s, warm, _m, _t in found)
        timed = [m for _s, _w, m, _t in found if m]
        if not timed:
            continue
        winner = min(timed)
        for strategy, warm, median, timing in found:
            if not median:
                continue
            warm_ratio, ratio = warm / best_warm, median / winner
            edge = max([f for f in factors if warm_ratio >= f], default=0.0)
            entry = bins[(strategy, edge)]
            entry[0] += 1
            entry[1] += timing or 0.0
            entry[2] = min(entry[2], ratio)
            if warm_ratio > 1.0:
                shrink[strategy].append(ratio / warm_ratio)
    return bins, shrink


def report(bins: dict, shrink: dict, factors: list[float]) -> str:
    def label(edge):
        higher = [f for f in factors if f > edge]
        return f"{edge:g}x to {higher[0]:g}x" if edge and higher else (f"{edge:g}x or more" if edge else
                                                                         f"under {factors[0]:g}x")
    rows = [(strategy, label(edge), n, f"{seconds:.2f}", f"{closest:.2f}x")
            for (strategy, edge), (n, seconds, closest) in sorted(bins.items())]
    text = ("timed candidates by their warm run on the verification batch over the best there:\n"
            + format_table(("strategy", "verification ratio", "timed", "timing s", "closest to the winner"), rows))
    rows = [(strategy, len(values), f"{statistics.median(values):.2f}", f"{min(values):.2f} to {max(values):.2f}")
            for strategy, values in sorted(shrink.items())]
    return (text + "\n\nthe full problem's ratio to the winner over the verification batch's ratio to the best "
            "(below 1: the verification batch compresses the gaps):\n"
            + format_table(("strategy", "candidates", "median", "range"), rows))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", required=True, help="a plan cache (SQLite path or URL); repeatable")
    parser.add_argument("--factors", default="5,10,20,50",
                        help="the verification ratios that bound the bins (comma-separated)")
    args = parser.parse_args(argv)
    factors = sorted(float(f) for f in args.factors.split(","))
    bins, shrink = tally([found for url in args.db for found in searches(url)], factors)
    print(report(bins, shrink, factors))
    return 0


if __name__ == "__main__":
    sys.exit(main())
