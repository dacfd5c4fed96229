"""Replay cuDNN's learned rule on runtime-compiled engines (``convtune.strategies.cudnn.CompileRecord``) on stored
searches, problem by problem in tuning order: which plans it would have skipped, and which of those came within
3% of their problem's winner (what it would have lost).

Stored searches do not say which plans the frontend compiles at run time: the engines are given (``--engines``,
default the ones a probe of cuDNN's build times found on the H100). A plan's build
time is its stored ``build_s``: its build at the verification batch (a compilation as long as the one the cuDNN
strategy times when it lists the plan; the full batch's plan was built then, and its build in ``build_s`` is a
lookup), or taken as slow where a search did not store it.

    python benchmarks/replay_rtc_rule.py plans.db [more.db ...]
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3

from convtune.strategies.cudnn import CompileRecord, trial_ratio

RUNTIME_COMPILED = (19, 69, 70, 71, 72, 77, 78)


def replay(db: str, engines) -> tuple[int, list]:
    c = sqlite3.connect(db)
    records: dict = {}
    skipped, lost = 0, []
    for pid, pass_, dtype, layout, key in c.execute(
            "select id, pass_, dtype, layout, key from problems order by id"):
        rows = c.execute("select strategy, config, status, time_median_s, run_id, build_s, error from measurements "
                         "where problem_id = ?", (pid,)).fetchall()
        if not rows:
            continue
        first = min(r[4] for r in rows)  # the first search of the problem
        rows = [r for r in rows if r[4] == first]
        best = min((r[3] for r in rows if r[3] and r[2] in ("ok", "winner")), default=None)
        if best is None:
            continue
        closest: dict = {}
        builds: dict = {}
        for strategy, config, status, median, _run, build_s, error in rows:
            engine = json.loads(config).get("engine") if strategy == "cudnn" else None
            ratio = trial_ratio(status, median, error, best) if engine in engines else None
            if ratio is not None:  # (as the strategy's observe counts it)
                closest[engine] = min(ratio, closest.get(engine, math.inf))
                builds.setdefault(engine, []).append(build_s if build_s is not None else math.inf)
        for engine, ratio in closest.items():
            record = records.setdefault((engine, pass_, dtype, layout), CompileRecord())
            if record.skip_reason() is not None:
                skipped += 1
                if ratio < 1.03:
                    lost.append((engine, key, ratio))
            else:
                record.builds.extend(builds[engine])
                record.tried(ratio)
    return skipped, lost


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", nargs="+")
    ap.add_argument("--engines", default=",".join(map(str, RUNTIME_COMPILED)))
    args = ap.parse_args(argv)
    engines = {int(e) for e in args.engines.split(",")}
    for db in args.dbs:
        skipped, lost = replay(db, engines)
        print(f"{db}: {skipped} runtime-compiled plans skipped, {len(lost)} of them within 3% of the winner")
        for engine, key, ratio in lost:
            print(f"   eng{engine} {ratio:.3f}x {key}")


if __name__ == "__main__":
    main()
