"""Replay cuDNN's learned rules on stored searches, problem by problem in tuning order: the rule on runtime-compiled
engines (``convtune.strategies.cudnn.CompileRecord``, see ``RTC_TRIALS``) and the rule on the plans compiled ahead
(``EngineRecord``, see ``ENGINE_TRIALS``). Says which plans they would have skipped, what those cost the search, which
skipped plans came within 3% of their problem's winner, and which problems' best plan left would have been more than
1% slower than their best (what the rules would have lost).

Stored searches do not say which plans the frontend compiles at run time: the engines are given (``--engines``,
default the ones a probe of cuDNN's build times found on the H100). A runtime-compiled plan's build time is its stored
``build_s``: its build while listing, which searches now count as the candidate's (``Strategy.built_elsewhere_s``); in
searches stored before that, its build at the verification batch (a compilation as long as the one while listing,
whose own time those searches did not store per plan); taken as slow where a search stored neither. A plan's place in
the heuristics' list is its stored ``rank``.

    python benchmarks/replay_cudnn_rules.py plans.db [more.db ...]
    python benchmarks/replay_cudnn_rules.py --duel plans.db [more.db ...]   (a rule weighed and not adopted: duel())
    python benchmarks/replay_cudnn_rules.py --seed earlier.db plans.db   (starting from what earlier.db's searches taught)

(tests/data/searches holds searches to replay, gzipped.)
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sqlite3
from dataclasses import dataclass, field

from convtune.strategies.cudnn_rules import CompileRecord, EngineRecord, trial_ratio

RUNTIME_COMPILED = (19, 69, 70, 71, 72, 77, 78)


@dataclass
class Replay:
    """What the rules would have done to one database's searches."""

    plans: int = 0  #: cuDNN plans the searches tried
    rtc_skipped: int = 0
    engine_skipped: int = 0
    #: skipped plans within 3% of their problem's winner: (rule, engine, problem key, time / winner's)
    lost: list = field(default_factory=list)
    #: problems whose fastest plan left is over 1% slower than their fastest: (problem key, ratio)
    worse: list = field(default_factory=list)
    cudnn_s: float = 0.0  #: seconds the cuDNN plans cost the searches (build, verification, timing)
    saved_s: float = 0.0  #: of which the skipped plans'


def _first_search(rows):
    """Of a problem's measurement rows (each with its run id fifth), those of its first search."""
    first = min(row[4] for row in rows)
    return [row for row in rows if row[4] == first]


def replay(db: str, runtime_compiled, records: tuple[dict, dict] | None = None) -> Replay:
    """The rules replayed on ``db``'s searches; ``records``: the ``(compile_records, engine_records)`` to start from
    (what earlier searches taught, :func:`seeded`), updated in place as the searches teach more."""
    c = sqlite3.connect(db)
    compile_records, engine_records = records if records is not None else ({}, {})
    r = Replay()
    for pid, pass_, dtype, layout, math_mode, key in c.execute(
            "select id, pass_, dtype, layout, math, key from problems order by id"):
        rows = c.execute("select strategy, config, status, time_median_s, run_id, build_s, error, rank, "
                         "coalesce(build_s, 0) + coalesce(verify_s, 0) + coalesce(timing_s, 0) from measurements "
                         "where problem_id = ?", (pid,)).fetchall()
        if not rows:
            continue
        rows = _first_search(rows)
        timed = [row[3] for row in rows if row[3] and row[2] in ("ok", "winner")]
        if not timed:
            continue
        best = min(timed)
        left = min((row[3] for row in rows if row[0] != "cudnn" and row[3] and row[2] in ("ok", "winner")),
                   default=math.inf)
        compiled: dict = {}
        ahead: dict = {}
        builds: dict = {}
        for strategy, config, status, median, _run, build_s, error, rank, cost in rows:
            engine = json.loads(config).get("engine") if strategy == "cudnn" else None
            if engine is None:
                continue
            r.plans += 1
            r.cudnn_s += cost
            if engine in runtime_compiled:
                rule, reason = "runtime-compiled", compile_records.get((engine, pass_, dtype, layout),
                                                                       CompileRecord()).skip_reason()
            else:
                rule, reason = "engine", engine_records.get((engine, pass_, dtype, layout, math_mode),
                                                            EngineRecord()).skip_reason(rank if rank is not None
                                                                                        else 0)
            if reason is not None:
                r.saved_s += cost
                if rule == "engine":
                    r.engine_skipped += 1
                else:
                    r.rtc_skipped += 1
                if median and median < 1.03 * best:
                    r.lost.append((rule, engine, key, median / best))
                continue
            if median and status in ("ok", "winner"):
                left = min(left, median)
            ratio = trial_ratio(status, median, error, best)  # (as the strategy's observe counts it)
            if ratio is None:
                continue
            closest = compiled if engine in runtime_compiled else ahead
            closest[engine] = min(ratio, closest.get(engine, math.inf))
            if engine in runtime_compiled:
                builds.setdefault(engine, []).append(build_s if build_s is not None else math.inf)
        if left > 1.01 * best:
            r.worse.append((key, left / best))
        for engine, ratio in compiled.items():
            record = compile_records.setdefault((engine, pass_, dtype, layout), CompileRecord())
            record.builds.extend(builds[engine])
            record.tried(ratio)
        for engine, ratio in ahead.items():
            engine_records.setdefault((engine, pass_, dtype, layout, math_mode), EngineRecord()).tried(ratio)
    return r


def seeded(dbs, runtime_compiled) -> tuple[dict, dict]:
    """The records that replaying ``dbs``' searches, one after another, leaves: what a process that had tuned them
    would start the next search with (``--seed``). Weighed as a prior from a plan cache's earlier searches on the
    device and not adopted: across models the records, keyed by pass, dtype, layout and math mode, save little and
    lose winners. On the committed H100 searches: ConvNeXt-T seeded with ResNet-50's and the public suite's searches
    skips 33 of 328 plans (2 of 17 s) where alone it skips 22 (1 s); ResNet-50 seeded with ConvNeXt-T's and the
    suite's skips 180 of 744 (8 of 15 s) against 136 (6 s), and leaves a 3x3 forward pass 3.0% slower; the suite
    seeded with ConvNeXt-T's, then ResNet-50's skips 104 of 493 (22 of 56 s) against 91 (16 s), and leaves 5 problems
    over 1% slower (seeded in the other order, 75 and one problem: what the records hold depends on the order). A search seeded with the same problems' earlier search loses nothing (the suite's second
    exhaustive search: 135 of 567 skipped, 32 of 60 s), but those plans are in the cache already."""
    records: tuple[dict, dict] = ({}, {})
    for db in dbs:
        replay(db, runtime_compiled, records)
    return records


def _copied(records: tuple[dict, dict]) -> tuple[dict, dict]:
    return tuple({k: copy.deepcopy(v) for k, v in part.items()} for part in records)


@dataclass
class Duel:
    """What a first duel would have done to one database's searches: PyTorch's call against the heuristics' first
    ``first`` cuDNN plans, the rest of cuDNN's plans searched only where the best of those came within ``near`` of
    PyTorch's time (a rule weighed for half-precision problems, not adopted: see :func:`duel`)."""

    problems: int = 0
    stopped: int = 0  #: problems whose cuDNN search the duel would have stopped
    cost_s: float = 0.0  #: seconds the searches' candidates cost (build, verification, timing)
    saved_s: float = 0.0  #: of which the stopped searches' plans beyond the first
    regret: float = 1.0  #: the sum over problems of the best time left over the sum of the best
    worst: float = 1.0  #: the largest ratio of a problem's best time left to its best


def duel(db: str, first: int = 4, near: float = 1.01) -> Duel:
    """The first duel replayed on a stored search (its first search of each problem). Why it is not adopted: where it
    loses nothing it saves little, and where it saves it loses. ResNet-50 under AMP on the H100 (committed): 4 of 64
    searches stopped, 5 of 174 s saved (cuDNN's first plans come within 1% of PyTorch's on most of its bfloat16
    problems, so the rest is searched). In float32 (committed): 15 of 69 stopped, and a problem left 2.47x slower
    (cuDNN's first plans can be far from its best). ConvNeXt-T under AMP on an H200: 13 of 23 stopped, 7 of 34 s of
    candidates saved (and part of the 19 s its cuDNN plans took to list), a problem left 5% slower."""
    c = sqlite3.connect(db)
    d = Duel()
    best_sum = left_sum = 0.0
    for (pid,) in c.execute("select id from problems order by id").fetchall():
        rows = c.execute("select strategy, status, time_median_s, rank, run_id, coalesce(build_s, 0) + "
                         "coalesce(verify_s, 0) + coalesce(timing_s, 0) from measurements where problem_id = ?",
                         (pid,)).fetchall()
        if not rows:
            continue
        rows = _first_search(rows)
        t = {i: row[2] if row[1] in ("ok", "winner") and row[2] else math.inf for i, row in enumerate(rows)}
        best = min(t.values())
        if best == math.inf:
            continue
        later = {i for i, row in enumerate(rows) if row[0] == "cudnn" and (row[3] is None or row[3] >= first)}
        ahead = min((t[i] for i, row in enumerate(rows) if row[0] == "cudnn" and i not in later), default=math.inf)
        torch_s = min((t[i] for i, row in enumerate(rows) if row[0] == "torch"), default=math.inf)
        stop = ahead > near * torch_s
        left = min(t[i] for i in t if not (stop and i in later))
        d.problems += 1
        d.stopped += stop
        d.cost_s += sum(row[5] for row in rows)
        d.saved_s += sum(rows[i][5] for i in later) if stop else 0.0
        best_sum, left_sum = best_sum + best, left_sum + left
        d.worst = max(d.worst, left / best)
    d.regret = left_sum / best_sum if best_sum else 1.0
    return d


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dbs", nargs="+")
    ap.add_argument("--engines", default=",".join(map(str, RUNTIME_COMPILED)),
                    help="the engines whose plans are runtime-compiled")
    ap.add_argument("--duel", action="store_true", help="replay the first duel instead (see duel())")
    ap.add_argument("--seed", action="append", default=[], metavar="DB",
                    help="replay these searches first (repeatable): each DB then starts from the records they leave, "
                         "as a process that had tuned them would")
    args = ap.parse_args(argv)
    engines = {int(e) for e in args.engines.split(",")}
    seeds = seeded(args.seed, engines) if args.seed else None
    for db in args.dbs:
        if args.duel:
            d = duel(db)
            print(f"{db}: a first duel would stop {d.stopped} of {d.problems} cuDNN searches, saving {d.saved_s:.0f} of "
                  f"{d.cost_s:.0f} s; the best plans left sum to {d.regret:.4f}x the best, the worst problem "
                  f"{d.worst:.3f}x")
            continue
        r = replay(db, engines, _copied(seeds) if seeds else None)
        print(f"{db}: of {r.plans} cuDNN plans ({r.cudnn_s:.0f} s), {r.rtc_skipped} runtime-compiled and "
              f"{r.engine_skipped} compiled ahead skipped ({r.saved_s:.0f} s); {len(r.lost)} skipped within 3% of "
              f"their problem's winner; {len(r.worse)} problems left over 1% slower")
        for rule, engine, key, ratio in r.lost:
            print(f"   skipped by the {rule} rule: eng{engine} {ratio:.3f}x {key}")
        for key, ratio in r.worse:
            print(f"   left {ratio:.3f}x slower: {key}")


if __name__ == "__main__":
    main()
