"""Soak test of a shared plan cache: many tuners and readers (processes) on one cache for minutes, while faults
are injected; then what was lost, tuned twice, computed wrong, failed or hung, and how fast lookups were.

    python tests/soak.py --store postgresql --tuners 32 --readers 128 --minutes 10
    python tests/soak.py --store sqlite --tuners 16 --readers 64 --minutes 10

(``bash scripts/soak.sh ARGS`` sets the test environment up and runs it; ``tests/test_soak.py`` runs it for seconds.) Each tuner works through a shared network
description (small layers, three passes each) with a runtime on the cache (the ``tune`` miss policy: it leases a
problem, tunes it and stores its plan; a problem another process is tuning is left for later). Its planner verifies
every candidate against float64 with NumPy and then sleeps ``--delay`` seconds per candidate instead of timing it on a
GPU (the candidates rank by a hash of their labels, alike in every process), so that tuners hold their leases for
as long as real ones do without loading the machine. Each reader looks random problems of the network up in the
cache (a database read each time, no memo), and runs the plan it finds against a float64 reference on a share of
its lookups (``--check-share``).

Faults, by the run's clock: PostgreSQL is restarted twice (``pg_ctl restart -m fast``, at 25% and 65% of the run)
and frozen once for ``--freeze`` seconds (SIGSTOP to every server process, at 45%); on either store, a random tuner
is SIGKILLed every ``--kill-every`` seconds and replaced.

Reported (and written to ``--out`` as JSON): plans lost (a plan a tuner stored that the cache no longer has: must be
0), duplicate tunings (a problem tuned and stored by two tuners: 0), wrong numbers (0), lookups that failed or took
over ``--hung`` seconds, in and outside fault windows, readers that stopped answering, lookup time p50/p99 outside the
fault windows (a window: from a fault's start until the reader's first good lookup after the fault's end), and each
reader's time to recover after each fault. The exit status is 1 where a must-be-zero count is not.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

# one BLAS thread per process: the float64 checks are small, and 160 processes each with a spinning BLAS thread per
# core would load the machine that the stand-in tuners are there not to load
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import numpy as np  # noqa: E402

from convtune import Runtime  # noqa: E402
from convtune.backend import get_backend  # noqa: E402
from convtune.building import build_plan, random_operands, relative_error  # noqa: E402
from convtune.cache import PlanCache  # noqa: E402
from convtune.direct.reference import reference  # noqa: E402
from convtune.errors import CacheError  # noqa: E402
from convtune.network import load_network, unique_problems  # noqa: E402
from workers import DeterministicTimer  # noqa: E402

PASSES = ("fwd", "dgrad", "wgrad")


def network_yaml(layers: int, seed: int = 0) -> str:
    """A network description of ``layers`` distinct small layers (shapes drawn from ``seed``)."""
    rng = random.Random(seed)
    seen, lines = set(), ["layers:"]
    while len(seen) < layers:
        k = rng.choice((1, 3, 5, 7))
        shape = (rng.choice((1, 2, 4)), rng.randint(2, 24), rng.randint(2, 24), rng.randint(max(k, 6), 32), k,
                 rng.choice((1, 2)))
        if shape in seen:
            continue
        seen.add(shape)
        n, c, o, size, k, s = shape
        lines.append(f"  - {{name: l{len(seen)}, batch: {n}, in_channels: {c}, out_channels: {o}, input: [{size}, "
                     f"{size}], kernel: [{k}, {k}], stride: {s}, padding: {k // 2}}}")
    return "\n".join(lines) + "\n"


def _problems(network: str):
    return [p for p, _ in unique_problems(load_network(network), PASSES)]


class _Log:
    """One process's events, one JSON line each, written as they happen (a SIGKILL loses none written)."""

    def __init__(self, path: str):
        self.fh = open(path, "a", buffering=1)

    def __call__(self, **event):
        event["t"] = time.time()
        self.fh.write(json.dumps(event) + "\n")


def tuner(url: str, problems: list, out: str, name: str, end: float, delay: float, seed: int) -> None:
    log = _Log(out)
    backend = get_backend("numpy")
    device_key = backend.device_info().key()
    runtime = Runtime(store=PlanCache(url, lazy=True), miss_policy="tune",
                      planner_options={"timer": DeterministicTimer(delay), "strategies": ["im2col", "fft"]})
    todo = list(problems)
    random.Random(seed).shuffle(todo)
    log(started=name)
    while todo and time.time() < end:
        later = []
        for problem in todo:
            if time.time() >= end:
                break
            before = runtime.tuned
            try:
                found = runtime.decision_for(problem, backend, ahead=True, wait=False)
            except Exception as exc:  # counted: a tuner never stops on an error
                log(error=f"{type(exc).__name__}: {exc}"[:300], problem=problem.key())
                later.append(problem)
                time.sleep(0.5)
                continue
            if runtime.tuned > before:  # (a plan the cache did not take stays in the runtime, unsaved)
                log(tuned=problem.key(), stored=(device_key, problem.key()) not in runtime._unsaved)
            elif found is None or not hasattr(found, "winner"):  # (held by another tuner: later)
                later.append(problem)
        todo = later
        if todo:
            time.sleep(0.5)
    log(done=name)


def reader(url: str, problems: list, out: str, name: str, end: float, interval: float, check_share: float,
           seed: int) -> None:
    log = _Log(out)
    backend = get_backend("numpy")
    device_key = backend.device_info().key()
    store = PlanCache(url, lazy=True)  # (as a training process opens it: a server that refuses is asked again)
    rng = random.Random(seed)
    log(started=name)
    while time.time() < end:
        problem = rng.choice(problems)
        store.forget_memo()  # (a read of the database each time: the memo would answer from the second on)
        started = time.perf_counter()
        try:
            decision = store.get(problem, device_key, fresh=True)
        except Exception as exc:
            log(lookup=time.perf_counter() - started, failed=f"{type(exc).__name__}: {exc}"[:300],
                cache_error=isinstance(exc, CacheError))
        else:
            ms = time.perf_counter() - started
            wrong = None
            if decision is not None and rng.random() < check_share:
                plan = build_plan(decision, backend)
                a, b = random_operands(backend, problem, rng.randrange(1 << 30))
                err = relative_error(np, plan(a, b), reference(np, problem, a.astype(np.float64),
                                                               b.astype(np.float64)))
                wrong = not err <= problem.tolerance
            log(lookup=ms, found=decision is not None, **({} if wrong is None else {"checked": True, "wrong": wrong}))
        time.sleep(rng.uniform(0.5, 1.5) * interval)
    log(done=name)


# -- the faults ---------------------------------------------------------------------------------------------------
class Postgres:
    """A throwaway server (``pgserver.PgServer``) that can be restarted and frozen."""

    def __init__(self, max_connections: int):
        from pgserver import PgServer
        self.server = PgServer()
        self.opts = (f"-c listen_addresses=127.0.0.1 -p {self.server.port} -k {self.server.dir} -c fsync=off "
                     f"-c max_connections={max_connections}")

    def start(self) -> str:
        s = self.server
        s._run(s.initdb, "-D", s.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
        self._ctl("start")
        return s.create_database("soak")

    def _ctl(self, *args):
        s = self.server
        s._run(s.pg_ctl, "-D", s.data, "-o", self.opts, "-l", os.path.join(s.dir, "log"), "-w", *args)

    def restart(self):
        self._ctl("-m", "fast", "restart")

    def pids(self) -> list[int]:
        return self.server.pids()

    def freeze(self, seconds: float):
        pids = self.pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    def stop(self):
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.server.stop()


def _init(url: str) -> None:
    """Create the cache's tables (in a child process: the supervisor holds no connection when it forks)."""
    PlanCache(url).counts()


def run(args) -> dict:
    work = tempfile.mkdtemp(prefix="convtune-soak-")
    network = os.path.join(work, "network.yaml")
    with open(network, "w") as fh:
        fh.write(network_yaml(args.layers))
    problems = _problems(network)  # (parsed once: the workers are forked with it)
    # (a tuner holds a second connection for its leases' heartbeat, and a SIGKILLed one's linger a while)
    pg = Postgres(max_connections=3 * (args.tuners + args.readers) + 50) if args.store == "postgresql" else None
    procs: dict[str, multiprocessing.Process] = {}
    try:
        url = pg.start() if pg is not None else f"sqlite:///{os.path.join(work, 'plans.db')}"
        ctx = multiprocessing.get_context("fork")
        child = ctx.Process(target=_init, args=(url,))
        child.start()
        child.join()
        start = time.time() + 5
        end = start + args.minutes * 60

        def spawn(role: str, index: int):
            name = f"{role}{index}"
            if role == "tuner":
                target, extra = tuner, (args.delay, index)
            else:
                target, extra = reader, (args.interval, args.check_share, 10_000 + index)
            p = ctx.Process(target=target, args=(url, problems, os.path.join(work, name + ".jsonl"), name, end) +
                            extra, daemon=True)
            p.start()
            procs[name] = p

        for i in range(args.readers):
            spawn("reader", i)
        for i in range(args.tuners):
            spawn("tuner", i)
        print(f"soak: {args.store}, {args.tuners} tuners, {args.readers} readers, {len(problems)} problems, "
              f"{args.minutes:g} min; logs in {work}", file=sys.stderr, flush=True)
        faults, kills = inject(args, pg, procs, spawn, start, end)
        stragglers, crashed = [], []
        killed = {k["tuner"] for k in kills}
        for name, p in procs.items():
            p.join(max(0.1, end + 60 - time.time()))
            if p.is_alive():
                stragglers.append(name)
            elif p.exitcode != 0 and name not in killed:
                crashed.append(name)
        report = analyse(work, url, args, problems, faults, kills, stragglers, start, end)
        report["crashed"] = crashed
        report["ok"] = report["ok"] and not crashed
    finally:
        for p in procs.values():
            if p.is_alive():
                p.kill()
        if pg is not None:
            pg.stop()
    report["logs"] = work
    if report["ok"] and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        report["logs"] = None
    return report


def inject(args, pg, procs, spawn, start, end):
    """The faults, until ``end``: ``(faults, kills)``, each with its times."""
    faults, kills, schedule = [], [], []
    if pg is not None:
        schedule = [(start + 0.25 * (end - start), "restart"), (start + 0.45 * (end - start), "freeze"),
                    (start + 0.65 * (end - start), "restart")]
    next_kill, next_tuner = start + args.kill_every, args.tuners
    rng = random.Random(7)
    while time.time() < end:
        now = time.time()
        if schedule and now >= schedule[0][0]:
            _, kind = schedule.pop(0)
            t0 = time.time()
            try:
                pg.restart() if kind == "restart" else pg.freeze(args.freeze)
                faults.append({"kind": kind, "start": t0, "end": time.time()})
            except Exception as exc:
                faults.append({"kind": kind, "start": t0, "end": time.time(), "error": str(exc)})
            print(f"soak: {kind} at {t0 - start:.0f} s, {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        elif now >= next_kill:
            alive = [n for n, p in procs.items() if n.startswith("tuner") and p.is_alive()]
            if alive:
                victim = rng.choice(alive)
                os.kill(procs[victim].pid, signal.SIGKILL)
                kills.append({"tuner": victim, "t": now})
                spawn("tuner", next_tuner)
                next_tuner += 1
            next_kill += args.kill_every
        time.sleep(0.2)
    return faults, kills


# -- the report ---------------------------------------------------------------------------------------------------
def _events(work: str):
    for name in sorted(os.listdir(work)):
        if name.endswith(".jsonl"):
            with open(os.path.join(work, name)) as fh:
                for line in fh:
                    try:
                        yield name[:-6], json.loads(line)
                    except json.JSONDecodeError:  # (a line cut by a SIGKILL)
                        pass


def _percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def analyse(work, url, args, problems, faults, kills, stragglers, start, end) -> dict:
    tuned: dict[str, list[str]] = {}  # problem -> the tuners that tuned and stored it
    unsaved, tuner_errors, lookups = 0, [], {}
    for name, e in _events(work):
        if "tuned" in e and not e["stored"]:
            unsaved += 1
        elif "tuned" in e:
            tuned.setdefault(e["tuned"], []).append(name)
        elif "error" in e:
            tuner_errors.append(e["error"])
        elif "lookup" in e:
            lookups.setdefault(name, []).append(e)
    # plans lost: every plan a tuner stored, read back from the cache now
    store, device_key = PlanCache(url), get_backend("numpy").device_info().key()
    by_key = {p.key(): p for p in problems}
    lost = [k for k in tuned if store.get(by_key[k], device_key, fresh=True) is None]
    stored = store.counts().get("plans")
    duplicates = {k: names for k, names in tuned.items() if len(names) > 1}
    # fault windows per reader: from the fault's start to the reader's first good lookup after its end
    recovery = {f"{f['kind']}@{f['start'] - start:.0f}s": [] for f in faults}
    outside, inside_failed, outside_failed, hung, wrong, checked, found = [], 0, 0, 0, 0, 0, 0
    examples = []
    for name, events in lookups.items():
        windows = []
        for f in faults:
            after = [e["t"] for e in events if e["t"] - e["lookup"] >= f["end"] and "failed" not in e]
            windows.append((f["start"], min(after) if after else end))
            if after:  # (a reader with no good lookup after the fault's end, the run's end first: no figure)
                recovery[f"{f['kind']}@{f['start'] - start:.0f}s"].append(min(after) - f["end"])
        for e in events:
            began = e["t"] - e["lookup"]
            in_window = any(a <= began <= b or a <= e["t"] <= b for a, b in windows)
            if e["lookup"] > args.hung:
                hung += 1
            if "failed" in e:
                if in_window:
                    inside_failed += 1
                else:
                    outside_failed += 1
                    if len(examples) < 5:
                        examples.append(e["failed"])
                continue
            found += e.get("found", False)
            checked += e.get("checked", False)
            wrong += e.get("wrong", False)
            if not in_window:
                outside.append(e["lookup"] * 1e3)
    report = {
        "store": args.store, "tuners": args.tuners, "readers": args.readers, "minutes": args.minutes,
        "problems": len(problems), "plans_stored": stored, "tuned": len(tuned), "plans_lost": len(lost),
        "duplicate_tunings": len(duplicates), "duplicates": dict(list(duplicates.items())[:5]),
        "tuned_not_stored": unsaved, "tuner_errors": len(tuner_errors), "tuner_error_examples": tuner_errors[:5],
        "tuners_killed": len(kills), "faults": faults,
        "lookups": sum(len(v) for v in lookups.values()), "lookups_found": found, "results_checked": checked,
        "wrong_results": wrong, "failed_in_fault_windows": inside_failed, "failed_outside": outside_failed,
        "failed_outside_examples": examples, "hung_lookups": hung, "hung_readers": stragglers,
        "lookup_ms_p50": _percentile(outside, 0.5), "lookup_ms_p99": _percentile(outside, 0.99),
        "lookup_ms_max": max(outside) if outside else None,
        "recovery_s": {k: {"median": statistics.median(v), "max": max(v)} for k, v in recovery.items() if v},
        "machine": f"{os.cpu_count()} cores",
    }
    report["ok"] = not (lost or duplicates or wrong or outside_failed or hung or stragglers)
    return report


def summary(r: dict) -> str:
    lines = [f"store {r['store']}: {r['tuners']} tuners, {r['readers']} readers, {r['minutes']:g} min, "
             f"{r['problems']} problems, {r['tuned']} tuned, {r['plans_stored']} plans stored, "
             f"{r['tuners_killed']} tuners SIGKILLed",
             f"tunings the cache did not take (the server down): {r['tuned_not_stored']}; tuner errors "
             f"{r['tuner_errors']}",
             f"plans lost {r['plans_lost']}, duplicate tunings {r['duplicate_tunings']}, wrong results "
             f"{r['wrong_results']} of {r['results_checked']} checked",
             f"lookups {r['lookups']} ({r['lookups_found']} found): failed {r['failed_outside']} outside fault windows, "
             f"{r['failed_in_fault_windows']} inside; hung {r['hung_lookups']}; readers that stopped: "
             f"{len(r['hung_readers'])}; processes that crashed: {len(r.get('crashed', []))}",
             f"lookup time outside fault windows: p50 {r['lookup_ms_p50']:.2f} ms, p99 {r['lookup_ms_p99']:.2f} ms, "
             f"max {r['lookup_ms_max']:.1f} ms" if r["lookup_ms_p50"] is not None else "no lookups"]
    for kind, v in r["recovery_s"].items():
        lines.append(f"recovery after {kind}: median {v['median']:.1f} s, slowest reader {v['max']:.1f} s")
    lines.append("OK" if r["ok"] else "FAILED")
    return "\n".join(lines)


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="sqlite")
    parser.add_argument("--tuners", type=int, default=16)
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--layers", type=int, default=3000, help="layers in the network (three problems each)")
    parser.add_argument("--delay", type=float, default=1.0, help="seconds a tuner spends per candidate")
    parser.add_argument("--interval", type=float, default=0.5, help="mean seconds between a reader's lookups")
    parser.add_argument("--check-share", type=float, default=0.05,
                        help="share of a reader's lookups that found a plan whose plan it runs against float64")
    parser.add_argument("--kill-every", type=float, default=30, help="seconds between SIGKILLs of a tuner")
    parser.add_argument("--freeze", type=float, default=20, help="seconds PostgreSQL is frozen (SIGSTOP)")
    parser.add_argument("--hung", type=float, default=30, help="a lookup longer than this many seconds hung")
    parser.add_argument("--out", help="write the report here as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the processes' logs (kept anyway on a failure)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    report = run(args)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    print(summary(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
