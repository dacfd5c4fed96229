"""Replay the strategies' pruning rules (Strategy.pruned) against stored searches.

For every problem of a plan cache (``--db``, its latest tuning run per problem) or of ``convtune
explain`` output saved to a file (``--explain``, e.g. those under tests/data/searches, unpacked), each
measured candidate is put to its strategy's rules as the planner would (with the default workspace
limit as the room). A rule is safe on that evidence when every candidate it prunes was slower than
the problem's best by more than ``--margin``; a pruned candidate within the margin is printed as a
violation and the exit status is 1. Where the database recorded the search's cost (schema 2), the
seconds the pruned candidates took are summed: what the rules save. Rules that differ only in an engine's number
(cuDNN's) are also summed as one family (``engine N``).

Best evidence is an exhaustive search (``convtune tune --exhaustive``): a normal search's early
stopping leaves slow candidates with one timed run, and its rules leave pruned ones unmeasured.

A stored median is one moment's measurement. Where a violation's pruned candidate is the winner of an
exhaustive search whose winners ``benchmarks/compare_plans.py NORMAL.db EXHAUSTIVE.db`` re-timed side
by side with the normal search's (``--retimed`` that output), and there the normal search's winner was
faster by more than the margin, the rule cost nothing: the violation is printed as overturned and not
counted.

    .venv/bin/python benchmarks/check_rules.py --db plans.db
    .venv/bin/python benchmarks/check_rules.py --explain explain-output.txt
    .venv/bin/python benchmarks/check_rules.py --db EXHAUSTIVE.db --retimed COMPARE.txt
    .venv/bin/python benchmarks/check_rules.py --rounds --db plans.db

With ``--rounds`` it replays the search's two rounds instead (``Strategy.second_round``: candidates that wait until the
first round has beaten PyTorch's call by ``convtune.search.FIRST_ROUND_MARGIN``; ``Strategy.left_out_of_second_round``:
those the second round does not try): on how many problems the second round would have run, and how much slower the
plans chosen are than the full searches' winners.

(any Python that imports convtune: ``.venv/bin/python`` is the one ``bash scripts/convtune.sh`` sets up)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from types import SimpleNamespace

try:
    from convtune.planner import DEFAULT_WORKSPACE_LIMIT
    from convtune.search import first_round_settles
except ImportError as exc:  # a Python without convtune or its dependencies: say which one to use
    sys.exit(f"check_rules.py needs convtune and its dependencies ({exc}): run it with .venv/bin/python, which "
             "`bash scripts/convtune.sh info` sets up")
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy
from convtune.strategies.base import Strategy


@dataclass
class Measured:
    strategy: str
    config: object
    label: str
    median_s: float
    cost_s: float | None
    rank: int | None = None  # its place in its strategy's list (cuDNN's: the heuristics' order)


class _Backend:
    """What the rules look at: the backend's name."""

    def __init__(self, name):
        self.name = name


def has_rules(name: str) -> bool:
    """Rules that a stored search can replay: fixed ones (not those a strategy learns in the process from the
    searches before, like cuDNN's engine records: ``Strategy.rules_learned``; of such a strategy, its
    ``fixed_rule``)."""
    strategy = get_strategy(name)
    if strategy.rules_learned:
        return type(strategy).fixed_rule is not Strategy.fixed_rule
    return type(strategy).pruned is not Strategy.pruned


def replayed(strategy_name, problem, config, backend):
    """The stored candidate's rule, as a search would meet it now (a learning strategy's fixed one), or ``None``."""
    strategy = get_strategy(strategy_name)
    rule = strategy.fixed_rule if strategy.rules_learned else strategy.pruned
    return rule(problem, config, _Backend(backend), DEFAULT_WORKSPACE_LIMIT)


def from_db(url):
    from convtune.cache import PlanCache
    cache = PlanCache(url, create=False, read_only=True)
    for row in cache.plan_rows():
        backend = row["backend"]
        measured = []
        for m in cache.measurement_rows(row["problem_key"], row["fingerprint"]):
            if m["status"] not in ("ok", "winner") or not m["time_median_s"]:
                continue
            strategy = get_strategy(m["strategy"])
            config = strategy.config_type(**{k: tuple(v) if isinstance(v, list) else v
                                             for k, v in json.loads(m["config"]).items()})
            costs = [m.get(k) for k in ("build_s", "verify_s", "timing_s")]
            cost = None if all(c is None for c in costs) else sum(c or 0.0 for c in costs)
            measured.append(Measured(m["strategy"], config, m["label"], m["time_median_s"], cost, m.get("rank")))
        yield ConvProblem.from_key(row["problem_key"]), backend, measured


def from_explain(path):
    text = open(path).read()
    for block in text.split("\n== ")[1:]:
        lines = block.splitlines()
        key = re.search(r"\[(ck\d+:[^\]]+)\]", lines[0]).group(1)
        backend = "cupy" if lines[1].strip().startswith("on gpu:") else "numpy"
        measured = []
        for line in lines[2:]:
            parts = line.split()
            if len(parts) < 3 or parts[1] not in ("ok", "winner"):
                continue
            name, _, rest = parts[0].partition("[")
            config = get_strategy(name).config_type.from_label(rest[:-1]) if has_rules(name) else None
            measured.append(Measured(name, config, parts[0], float(parts[2]) * 1e-3, None))
        yield ConvProblem.from_key(key), backend, measured


def from_compare(path):
    """compare_plans.py's table: (problem description, A label, B label, A s, B s) per row, the text
    columns as printed (cut to their widths: 70, 34, 34)."""
    rows = []
    for line in open(path):
        if len(line) < 142 or line.startswith("problem "):
            continue
        times = line[141:].split()
        try:
            a_ms, b_ms = float(times[0]), float(times[1])
        except (IndexError, ValueError):
            continue
        rows.append((line[:70].rstrip(), line[71:105].rstrip(), line[106:140].rstrip(), a_ms * 1e-3, b_ms * 1e-3))
    return rows


def overturned(retimed, problem: str, label: str, margin: float):
    """The re-timed row where ``label`` (B's winner) took more than ``margin`` longer than A's, or None."""
    for desc, a_label, b_label, a_s, b_s in retimed:
        if problem[:70].rstrip() == desc and label.startswith(b_label) and b_s > a_s * (1 + margin):
            return a_label, a_s, b_s
    return None


def families(rules: dict) -> dict:
    """The rules that differ only in an engine's number (cuDNN's: ``engine 45 on a bfloat16 depthwise layer``), each
    family under its name with ``engine N``: what one clause of a rule pruned in all."""
    grouped = defaultdict(list)
    for name, r in rules.items():
        family = re.sub(r"\bengine \d+\b", "engine N", name)
        if family != name:
            grouped[family].append(r)
    return {family: members for family, members in grouped.items() if len(members) > 1}


def rounds(where, found) -> tuple[int, int, float]:
    """Replay the search's two rounds (``Strategy.second_round``, ``convtune.search.first_round_settles``) on one
    source's problems: those where a measured candidate would wait (today's pruning rules leave out what they prune),
    how many would have run the second round, the waiting candidates' stored cost, and the plans chosen (without the
    second round where it does not run, without what it leaves out where it does) against the full searches' winners (the sums of their medians over every problem of the source: the
    step a model would take). Prints a line for ``where`` and every problem whose plan chosen is slower than its full
    search's winner (the second round not run, or what it leaves out);
    returns (problems with a waiting candidate, second rounds run, the chosen plans' sum over the winners')."""
    waiting_problems = second = waited = left_out = 0
    chosen = best_sum = saved = left_out_s = 0.0
    lost = []
    for problem, backend, measured in found:
        measured = [m for m in measured if not (has_rules(m.strategy) and replayed(m.strategy, problem, m.config,
                                                                                    backend))]
        if not measured:
            continue
        best = min(m.median_s for m in measured)
        best_sum += best
        later = [m for m in measured if m.rank is not None
                 and get_strategy(m.strategy).second_round(problem, m.config, m.rank) is not None]
        first = [m for m in measured if m not in later]
        if not later or not any(get_strategy(m.strategy).always_timed for m in first):
            chosen += best  # (nothing waits where PyTorch's call is not a candidate)
            continue
        waiting_problems += 1
        if first_round_settles([SimpleNamespace(label=m.label, strategy=m.strategy,
                                                timing=SimpleNamespace(median_s=m.median_s)) for m in first]) is None:
            second += 1
            left = [m for m in later if get_strategy(m.strategy).left_out_of_second_round(problem, m.config,
                                                                                           m.rank) is not None]
            left_out += len(left)
            left_out_s += sum(m.cost_s or 0.0 for m in left)
            pick = min(m.median_s for m in measured if m not in left)
        else:
            pick = min(m.median_s for m in first)
            waited += len(later)
            saved += sum(m.cost_s or 0.0 for m in later)
        chosen += pick
        if pick > best:
            lost.append((problem.describe(), pick / best))
    if waiting_problems:
        print(f"{where}: {waiting_problems} problems with a waiting candidate, the second round run on {second}; "
              f"{waited} candidates left waiting ({saved:.1f} s of their stored search cost), {left_out} left out of the "
              f"second rounds run ({left_out_s:.1f} s); over every problem, the plans chosen sum to "
              f"{chosen / best_sum:.4f}x the full searches' winners")
        for desc, ratio in lost:
            print(f"  {desc}: {ratio:.3f}x its full search's winner")
    return waiting_problems, second, chosen / best_sum if best_sum else 1.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", action="append", default=[], help="a plan cache (repeatable)")
    ap.add_argument("--explain", action="append", default=[], help="saved `convtune explain` output (repeatable)")
    ap.add_argument("--margin", type=float, default=0.03, help="a pruned candidate this close to the best "
                    "(relative) is a violation [0.03]")
    ap.add_argument("--retimed", action="append", default=[], help="compare_plans.py output (normal search "
                    "as A, exhaustive as B) whose side-by-side times overrule a stored median (repeatable)")
    ap.add_argument("--rounds", action="store_true", help="replay the search's second round instead "
                    "(Strategy.second_round): where it would have run, and what its absence cost (--db only)")
    args = ap.parse_args(argv)
    retimed = [row for path in args.retimed for row in from_compare(path)]
    if not args.db and not args.explain:
        ap.error("give --db or --explain")
    if args.rounds:
        for url in args.db:
            rounds(url, from_db(url))
        return 0
    sources = [(u, from_db(u)) for u in args.db] + [(p, from_explain(p)) for p in args.explain]
    rules = defaultdict(lambda: {"pruned": 0, "problems": set(), "closest": float("inf"), "cost": 0.0})
    violations, problems, total_cost = [], 0, 0.0
    for where, found in sources:
        for problem, backend, measured in found:
            if not measured:
                continue
            problems += 1
            best = min(m.median_s for m in measured)
            total_cost += sum(m.cost_s or 0.0 for m in measured)
            for m in measured:
                if not has_rules(m.strategy):
                    continue
                rule = replayed(m.strategy, problem, m.config, backend)
                if rule is None:
                    continue
                r = rules[f"{m.strategy}: {rule.split(':')[0]}"]
                r["pruned"] += 1
                r["problems"].add(problem.key())
                r["closest"] = min(r["closest"], m.median_s / best)
                r["cost"] += m.cost_s or 0.0
                if m.median_s <= best * (1 + args.margin):
                    over = overturned(retimed, problem.describe(), m.label, args.margin)
                    if over:
                        print(f"overturned {where}: {problem.describe()}: {m.label} pruned at {m.median_s / best:.3f}x "
                              f"the stored best, but re-timed side by side it took {over[2] * 1e3:.3f} ms against "
                              f"{over[0]}'s {over[1] * 1e3:.3f} ms")
                        continue
                    violations.append((where, problem.describe(), m.label, m.median_s / best))
    print(f"{problems} problems with measured candidates")
    for name, r in sorted(rules.items()):
        print(f"  {name}\n    pruned {r['pruned']} candidates in {len(r['problems'])} problems; the closest took "
              f"{r['closest']:.2f}x the best" + (f"; their search cost {r['cost']:.1f} s of {total_cost:.1f} s"
                                                 if total_cost else ""))
    for family, members in sorted(families(rules).items()):
        print(f"  {family} ({len(members)} rules)\n    pruned {sum(r['pruned'] for r in members)} candidates in "
              f"{len(set().union(*(r['problems'] for r in members)))} problems; the closest took "
              f"{min(r['closest'] for r in members):.2f}x the best"
              + (f"; their search cost {sum(r['cost'] for r in members):.1f} s of {total_cost:.1f} s"
                 if total_cost else ""))
    for where, problem, label, ratio in violations:
        print(f"VIOLATION {where}: {problem}: {label} pruned at {ratio:.3f}x the best")
    if not violations:
        print(f"no pruned candidate within {args.margin:.0%} of its problem's best")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
