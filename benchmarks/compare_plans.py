"""Plan quality of one tuning run against another (e.g. pruned and early-stopped vs --exhaustive).

For every problem both plan caches hold on this device, the two winners are compared. The stored
medians come from two runs (two moments, two noise levels), so where the winners differ both are
built and timed again here, alternately, ``--rounds`` times each (median of medians), on the same
operands, each called as the planner timed it (into a result array made once, unless its strategy
makes its own): the sums of the winners' times, and their ratio, are then measured in one process.
Where the winners are the same plan, its re-timed median counts on both sides. A's winner is also timed a second
time in every round (A'), so that the ratio A/A' states the comparison's noise beside A/B.
`convtune bench-model MODEL --db A --against B --rounds R --null` compares the same caches by whole training steps.

    PYTHONPATH=. python benchmarks/compare_plans.py RULES.db EXHAUSTIVE.db [--backend numpy]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from convtune import precision
from convtune.backend import get_backend
from convtune.cache import PlanCache
from convtune.planner import build_plan, random_operands
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy
from convtune.timing import default_timer


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="plan cache A (e.g. the normal search)")
    ap.add_argument("b", help="plan cache B (e.g. the exhaustive search)")
    ap.add_argument("--backend", default="numpy")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    backend = get_backend(args.backend)
    device = backend.device_info().key()
    a, b = PlanCache(args.a, create=False, read_only=True), PlanCache(args.b, create=False, read_only=True)
    keys = sorted({r["problem_key"] for r in a.plan_rows(fingerprint=device) if r["current_versions"]}
                  & {r["problem_key"] for r in b.plan_rows(fingerprint=device) if r["current_versions"]})
    if not keys:
        sys.exit(f"no problem has a current plan in both caches on {device}")
    timer = default_timer(backend, adaptive=False)
    sums = {"a": 0.0, "b": 0.0, "a2": 0.0, "a_stored": 0.0, "b_stored": 0.0}
    differ = 0
    print(f"{'problem':70s} {'A plan':34s} {'B plan':34s} {'A ms':>8s} {'B ms':>8s}")
    for key in keys:
        problem = ConvProblem.from_key(key)
        da, db = a.get(problem, device), b.get(problem, device)
        sums["a_stored"] += da.winner.median_s or 0.0
        sums["b_stored"] += db.winner.median_s or 0.0
        x, w = random_operands(backend, problem, 1)
        plans = {"a": build_plan(da, backend), "b": build_plan(db, backend)}
        # called as the planner timed them: into a result array made once, or (a strategy that allocates
        # its own result, PyTorch's) making their own; making it on every call would time an allocation
        out = precision.empty_result(backend.xp, problem)
        targets = {side: None if get_strategy(plans[side].strategy).allocates_result else out for side in plans}
        same = da.winner.label == db.winner.label
        differ += not same
        times = {"a": [], "b": [], "a2": []}
        for _ in range(args.rounds):
            for side in ("a", "a2") if same else ("a", "b", "a2"):
                plan = plans["a" if side == "a2" else side]
                target = targets["a" if side == "a2" else side]
                times[side].append(timer(lambda: plan(x, w, target), backend, label=plan.label).median_s)
        ta = statistics.median(times["a"])
        tb = ta if same else statistics.median(times["b"])
        sums["a"] += ta
        sums["b"] += tb
        sums["a2"] += statistics.median(times["a2"])
        print(f"{problem.describe()[:70]:70s} {da.winner.label[:34]:34s} {db.winner.label[:34]:34s} "
              f"{ta * 1e3:8.3f} {tb * 1e3:8.3f}" + ("" if same else "  (differ)"))
    print(f"{len(keys)} problems, {differ} with different winners")
    print(f"sum of the winners' times, re-timed here: A {sums['a'] * 1e3:.3f} ms, B {sums['b'] * 1e3:.3f} ms, "
          f"A/B {sums['a'] / sums['b']:.4f}; A timed again: A/A' {sums['a'] / sums['a2']:.4f} (the noise)")
    print(f"(as stored by each run: A {sums['a_stored'] * 1e3:.3f} ms, B {sums['b_stored'] * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
