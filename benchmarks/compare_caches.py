"""Compare two plan caches (SQLite files) problem by problem: the winners' stored times (new / old), the
problems whose winners differ, the cuDNN runtime-compiled plans the new search skipped, and what each
strategy's candidates cost to search in the new one.

    python3 benchmarks/compare_caches.py NEW.db OLD.db

Used to check that a search rule loses no winner: both caches tuned from empty on the same device.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sqlite3


def winners(db: str) -> dict[str, tuple[str, str, float]]:
    c = sqlite3.connect(db)
    return {k: (s, label, t) for k, s, label, t in c.execute(
        "select q.key, p.strategy, p.label, p.time_median_s from plans p join problems q on q.id = p.problem_id")}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("new")
    ap.add_argument("old")
    ap.add_argument("--worst", type=int, default=4, help="problems to list where the new winner is slowest")
    args = ap.parse_args(argv)
    a, b = winners(args.new), winners(args.old)
    common = [k for k in a if k in b and a[k][2] and b[k][2]]
    if not common:
        raise SystemExit("no problem has a timed winner in both caches")
    ratios = sorted((a[k][2] / b[k][2], k) for k in common)
    geomean = math.exp(sum(math.log(x) for x, _ in ratios) / len(ratios))
    print(f"{len(a)} new plans, {len(b)} old, {len(common)} compared: new/old winner time geomean {geomean:.3f}, "
          f"min {ratios[0][0]:.3f}, max {ratios[-1][0]:.3f}")
    for x, k in ratios[-args.worst:]:
        print(f"   {x:.3f} {k} new {a[k][1]} old {b[k][1]}")
    print(f"   winners' labels differ on {sum(1 for k in common if a[k][1] != b[k][1])} of {len(common)}")
    c = sqlite3.connect(args.new)
    skipped = collections.Counter(json.loads(cfg)["engine"] for (cfg,) in c.execute(
        "select config from measurements where status = 'skipped' and reason like 'pruned: runtime-compiled%'"))
    print("   runtime-compiled cuDNN plans skipped, by engine:", dict(sorted(skipped.items())))
    print("   tuning time in plans:", c.execute("select round(sum(tuning_s), 1) from plans").fetchone()[0], "s")
    for row in c.execute("select strategy, count(*), round(sum(coalesce(build_s, 0) + coalesce(verify_s, 0) + "
                         "coalesce(timing_s, 0)), 1) from measurements group by strategy"):
        print("   candidates of %s: %d, %.1f s" % row)


if __name__ == "__main__":
    main()
