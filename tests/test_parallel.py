"""Tuning alongside other workers: leases (SQLite and PostgreSQL), the worklist, the multi-device
scheduler on fake devices, the runtime's wait for a plan another process is tuning, DDP ranks."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from convtune import ConvProblem, Planner
from convtune.cache import PlanCache
from convtune.errors import ConvtuneError
from convtune.parallel import Job, parse_devices, tune_parallel
from convtune.worklist import Worklist, rotated
from workers import DeterministicTimer, FakeGpu, broken_second_gpu, fake_gpu, mixed_gpus

TESTS = Path(__file__).parent


def python(code: str, *args, **env) -> subprocess.Popen:
    """``python -c code args`` in a new process that imports this checkout's convtune and the tests' helpers."""
    path = os.pathsep.join([str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)],
                            env=dict(os.environ, PYTHONPATH=path, **env))


def problems(n: int) -> list[ConvProblem]:
    """``n`` distinct small problems (quick to tune on the CPU)."""
    return [ConvProblem.make(batch=2, in_channels=2 + i % 3, out_channels=3, input_size=(8 + i, 9),
                             kernel_size=3, padding=1) for i in range(n)]


def runs_per_problem(url: str) -> dict[str, int]:
    """How many tuning runs each problem has in the cache (a problem tuned twice has two)."""
    from sqlalchemy import create_engine, text
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT p.key, COUNT(DISTINCT m.run_id) FROM measurements m "
                                 "JOIN problems p ON p.id = m.problem_id GROUP BY p.key")).all()
    engine.dispose()
    return dict(rows)


DEVICE = FakeGpu("0").device_info()


# -- leases --------------------------------------------------------------------------------------------
def test_a_lease_is_one_holders_until_given_back_or_run_out(cache_url, caplog):
    cache = PlanCache(cache_url)
    p = problems(1)[0]
    assert cache.take_lease(p, DEVICE, "a", 30) is None
    assert cache.take_lease(p, DEVICE, "a", 30) is None  # its own again: renewed
    assert cache.take_lease(p, DEVICE, "b", 30) == "a"
    holder, left = cache.lease_holder(p, DEVICE.key())
    assert holder == "a" and 25 < left <= 30
    cache.release_lease(p, DEVICE.key(), "b")  # not b's: nothing happens
    assert cache.take_lease(p, DEVICE, "b", 30) == "a"
    cache.release_lease(p, DEVICE.key(), "a")
    assert cache.lease_holder(p, DEVICE.key()) is None
    assert cache.take_lease(p, DEVICE, "b", 0.3) is None
    time.sleep(0.5)  # b's lease runs out: c takes it over, and says so
    with caplog.at_level("INFO", logger="convtune"):
        assert cache.take_lease(p, DEVICE, "c", 30) is None
    assert "ran out" in caplog.text and "taken over by c" in caplog.text
    assert cache.renew_leases("c", 60) == 1 and cache.lease_holder(p, DEVICE.key())[1] > 55


def test_the_worklist_defers_what_another_holds_and_reads_its_plan(tmp_path):
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    cache = PlanCache(url)
    ps = problems(3)
    cache.take_lease(ps[1], DEVICE, "other", 30)
    planner = Planner(FakeGpu("0"), DeterministicTimer(), strategies=["im2col", "reference"])
    with Worklist(cache, DEVICE, planner.tune, poll_s=0.05) as work:
        first = [work.attempt(p) for p in ps]
        assert [o.source if o else None for o in first] == ["tuned", None, "tuned"]
        assert work.deferred == [ps[1]]
        # the other worker stores its plan and gives the lease back: the deferred problem is read, not tuned
        other = PlanCache(url)
        other.put(planner.tune(ps[1]))
        other.release_lease(ps[1], DEVICE.key(), "other")
        assert [(o.problem, o.source) for o in work.finish()] == [(ps[1], "elsewhere")]
    assert runs_per_problem(url)[ps[1].key()] == 1


def test_rotated_starts_each_worker_apart():
    assert rotated(list(range(6)), 0, 2) == [0, 1, 2, 3, 4, 5]
    assert rotated(list(range(6)), 1, 2) == [3, 4, 5, 0, 1, 2]
    assert rotated([], 1, 3) == [] and rotated([1], 0, 1) == [1]


def _start_workers(url, keys, n, tmp_path, delay, ttl_s=30.0):
    procs, outs = [], []
    for i in range(n):
        out = tmp_path / f"worker{i}.json"
        code = ("import sys, workers; workers.lease_worker(sys.argv[1], sys.argv[2].split(','), sys.argv[3], "
                f"{delay}, {ttl_s})")
        procs.append(python(code, url, ",".join(keys), out, WORKER_INDEX=str(i), WORKERS=str(n)))
        outs.append(out)
    return procs, outs


@pytest.mark.postgres
def test_concurrent_postgresql_workers_never_tune_a_problem_twice(pg_server, tmp_path):
    url = pg_server.create_database(f"convtune_leases_{os.getpid()}")
    PlanCache(url)  # the schema, made once before the workers race
    keys = [p.key() for p in problems(8)]
    procs, outs = _start_workers(url, keys, 3, tmp_path, delay=0.05)
    for p in procs:
        assert p.wait(timeout=300) == 0
    reports = [json.loads(o.read_text()) for o in outs]
    assert runs_per_problem(url) == {k: 1 for k in keys}  # every problem tuned, none twice
    tuned = [sum(1 for s in r.values() if s == "tuned") for r in reports]
    assert sum(tuned) == len(keys) and sum(1 for t in tuned if t) >= 2  # the work was shared
    cache = PlanCache(url)
    assert all(cache.get(ConvProblem.from_key(k), DEVICE.key()) is not None for k in keys)


def test_an_expired_lease_is_taken_over_after_its_holder_dies(cache_url, tmp_path):
    PlanCache(cache_url)
    keys = [p.key() for p in problems(2)]
    ready = tmp_path / "ready"
    stuck = python("import sys, workers; workers.stuck_worker(sys.argv[1], sys.argv[2], 1.5, sys.argv[3])",
                   cache_url, keys[0], ready)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert stuck.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    stuck.kill()  # dies holding the lease on keys[0]
    stuck.wait()
    procs, outs = _start_workers(cache_url, keys, 1, tmp_path, delay=0.0, ttl_s=1.5)
    assert procs[0].wait(timeout=120) == 0
    assert json.loads(outs[0].read_text()) == {keys[0]: "tuned", keys[1]: "tuned"}
    assert runs_per_problem(cache_url) == {k: 1 for k in keys}


# -- the multi-device scheduler -------------------------------------------------------------------------
def test_parse_devices():
    assert parse_devices("0,1") == ["0", "1"] and parse_devices(" 3 ") == ["3"]
    for bad in ("", "a", "0,0", "-1"):
        with pytest.raises(ValueError):
            parse_devices(bad)


def test_fake_devices_share_the_problems_and_choose_a_serial_runs_plans(tmp_path):
    ps = problems(10)
    serial = PlanCache(f"sqlite:///{tmp_path / 'serial.db'}")
    planner = Planner(FakeGpu("0"), DeterministicTimer(), strategies=["im2col", "reference"])
    with Worklist(serial, DEVICE, planner.tune) as work:
        assert all(work.attempt(p).source == "tuned" for p in ps)
    url = f"sqlite:///{tmp_path / 'parallel.db'}"
    events = []
    job = Job(url, fake_gpu, tuple(p.key() for p in ps),
              {"timer": DeterministicTimer(0.05), "strategies": ["im2col", "reference"]})
    result = tune_parallel(job, ["0", "1"], lambda *e: events.append(e))
    assert not result.worker_failures  # (both open the new database at once: neither may fail on its lock)
    assert result.sources == {p.key(): "tuned" for p in ps} and result.device_key == DEVICE.key()
    assert set(result.tuned_by.values()) == {"0", "1"}  # both devices tuned
    assert runs_per_problem(url) == {p.key(): 1 for p in ps}
    parallel = PlanCache(url)
    for p in ps:  # identical winners (the timer is deterministic: no noise to differ by)
        assert parallel.get(p, DEVICE.key()).winner.label == serial.get(p, DEVICE.key()).winner.label
    assert sum(1 for e in events if e[0] == "settled") == len(ps)
    assert sorted(e[2] for e in events if e[0] == "start") == sorted(p.key() for p in ps)
    again = tune_parallel(job, ["0", "1"])  # a second run: every plan from the cache
    assert set(again.sources.values()) == {"cache"} and not again.decisions


def test_devices_of_different_kinds_are_refused_before_any_tuning(tmp_path):
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    job = Job(url, mixed_gpus, tuple(p.key() for p in problems(2)), {"timer": DeterministicTimer()})
    with pytest.raises(ConvtuneError, match="GPUs of one kind"):
        tune_parallel(job, ["0", "1"])
    assert not Path(url[len("sqlite:///"):]).exists() or runs_per_problem(url) == {}


def test_a_failing_worker_is_reported_and_the_others_finish(tmp_path):
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    ps = problems(4)
    events = []
    job = Job(url, broken_second_gpu, tuple(p.key() for p in ps), {"timer": DeterministicTimer()})
    result = tune_parallel(job, ["0", "1"], lambda *e: events.append(e))
    assert result.sources == {p.key(): "tuned" for p in ps} and set(result.tuned_by.values()) == {"0"}
    assert result.worker_failures and "cudaErrorNoDevice" in result.worker_failures[0][1]
    assert any(e[0] == "failed" and e[1] == "1" for e in events)


def test_cli_devices_needs_gpus(tmp_path):
    from click.testing import CliRunner
    from convtune.cli import main
    result = CliRunner().invoke(main, ["tune", "alexnet", "--devices", "0,1", "--backend", "numpy",
                                       "--db", str(tmp_path / "p.db")])
    assert result.exit_code != 0 and "--devices spreads the problems over GPUs" in result.output
    result = CliRunner().invoke(main, ["tune", "alexnet", "--devices", "0,x", "--db", str(tmp_path / "p.db")])
    assert result.exit_code != 0 and "--devices takes GPU indices" in result.output


# -- the runtime and DDP ranks -------------------------------------------------------------------------------
def test_the_runtime_waits_for_a_plan_another_process_is_tuning(tmp_path):
    import threading
    import convtune
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    p = problems(1)[0]
    other = PlanCache(url)
    other.take_lease(p, DEVICE, "other-rank", 30)
    runtime = convtune.Runtime(store=PlanCache(url), planner_options={"timer": DeterministicTimer()})
    backend = FakeGpu("0")
    assert repr(runtime.decision_for(p, backend, wait=False)).startswith("<held by other-rank")
    planner = Planner(backend, DeterministicTimer(), strategies=["im2col"])

    def the_other_rank():
        time.sleep(0.5)
        other.put(planner.tune(p))
        other.release_lease(p, DEVICE.key(), "other-rank")
    t = threading.Thread(target=the_other_rank)
    t.start()
    decision = runtime.decision_for(p, backend)  # waits, then reads the other's plan: not tuned here
    t.join()
    assert decision.winner.strategy == "im2col" and runtime.tuned == 0
    assert runs_per_problem(url) == {p.key(): 1}


def test_ddp_ranks_split_the_tuning_ahead(tmp_path):
    pytest.importorskip("torch")
    db = str(tmp_path / "plans.db")
    PlanCache(db)
    procs = []
    for rank in range(2):
        code = ("import sys, workers; workers.ddp_worker(int(sys.argv[1]), 2, sys.argv[2], sys.argv[3], sys.argv[4], "
                "0.05)")
        procs.append(python(code, rank, tmp_path / "init", db, tmp_path / f"rank{rank}.json"))
    for p in procs:
        assert p.wait(timeout=300) == 0
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    total = reports[0]["problems"]
    assert total == 11 and all(not r["failed"] for r in reports)  # 4 layers x 3 passes, no dgrad for the first
    assert reports[0]["tuned"] + reports[1]["tuned"] == total  # each problem tuned by one rank
    assert all(r["tuned"] >= 3 for r in reports)  # both did a share
    assert all(r["tuned"] + r["cached"] + r["elsewhere"] == total for r in reports)
    assert set(runs_per_problem(f"sqlite:///{db}").values()) == {1}
    assert sqlite3.connect(db).execute("SELECT COUNT(*) FROM leases").fetchone()[0] == 0  # all given back


def test_cli_devices_reports_the_workers_progress_and_results(tmp_path, monkeypatch):
    """The command's side of --devices (the workers are tune_parallel's, tested above on fake devices; here a
    stand-in that tunes in this process and reports as the workers do)."""
    from click.testing import CliRunner
    import convtune.cli as cli
    import convtune.cli.tuning as cli_tuning
    import convtune.parallel as parallel
    monkeypatch.setattr(cli_tuning, "backend_named", lambda name: type("FakeCupy", (FakeGpu,), {"name": "cupy"})("0"))
    seen = {}

    def stand_in(job, devices, on_event):
        seen.update(job=job, devices=devices)
        result = parallel.Result(device_key=DEVICE.key())
        planner = Planner(FakeGpu("0"), DeterministicTimer(), strategies=["im2col", "reference"])
        cache = PlanCache(job.cache_url)
        for i, key in enumerate(job.problem_keys):
            device = devices[i % len(devices)]
            on_event("start", device, key, None)
            decision = planner.tune(ConvProblem.from_key(key))
            cache.put(decision)
            result.sources[key], result.tuned_by[key] = "tuned", device
            result.decisions.append(decision)
            on_event("settled", device, key, "tuned")
        return result
    monkeypatch.setattr(parallel, "tune_parallel", stand_in)
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: a, batch: 2, in_channels: 3, out_channels: 4, input: [8, 8], kernel: 3}\n"
                   "  - {name: b, batch: 2, in_channels: 4, out_channels: 4, input: [6, 6], kernel: 3}\n")
    result = CliRunner().invoke(cli.main, ["tune", str(net), "--devices", "0,1", "--db", str(tmp_path / "p.db"),
                                           "--passes", "fwd"])
    assert result.exit_code == 0, result.output
    assert seen["devices"] == ["0", "1"] and seen["job"].backend == "cupy" and len(seen["job"].problem_keys) == 2
    assert "2 workers, on GPUs 0, 1" in result.output and "tuning on GPU 1: b fwd" in result.output
    assert "problems tuned per GPU: GPU 0: 1, GPU 1: 1" in result.output
    assert "2 tuned, 0 from the cache" in result.output and "summed over the 2 workers" in result.output
