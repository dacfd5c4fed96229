"""A plan cache as deployments use it: readers beside writers, read-only copies, PostgreSQL that stops,
restarts and freezes, plans stored by others, backups, hostile text, huge problems, foreign files."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from click.testing import CliRunner

import convtune
from convtune import ConvProblem, MemoryPlanStore, Runtime
from convtune.cache import PlanCache, read_export, write_export
from convtune.cli import main
from convtune.errors import CacheError
from conftest import FailingTimer, FakeTimer
from test_cache import GPU_A, decision, problem

HERE = os.path.dirname(os.path.abspath(__file__))


def run_cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def sqlite_url(tmp_path, name="plans.db"):
    return f"sqlite:///{tmp_path / name}"


# -- 1. readers never wait on a writer ---------------------------------------------------------------
def test_a_read_answered_locked_at_once_is_read_again(tmp_path):
    # SQLite may answer "database is locked" without waiting (another process making the file a WAL
    # database, or recovering its WAL): two tuning workers opening a new cache at once met this
    from sqlalchemy import text
    from sqlalchemy.exc import OperationalError
    from convtune.cache.connect import Database
    db = Database(sqlite_url(tmp_path))
    calls = []

    def flaky(conn):
        calls.append(1)
        if len(calls) < 3:
            raise OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))
        return conn.execute(text("SELECT 7")).scalar()
    assert db.read(flaky) == 7 and len(calls) == 3

    def always_locked(conn):
        raise OperationalError("SELECT", {}, sqlite3.OperationalError("database is locked"))
    impatient = Database(sqlite_url(tmp_path), busy_timeout_s=0.2)  # past its busy timeout the error stands
    start = time.monotonic()
    with pytest.raises(CacheError, match="locked"):
        impatient.read(always_locked)
    assert 0.2 <= time.monotonic() - start < 5


def test_a_lookup_returns_while_another_process_holds_the_write_lock(tmp_path):
    url = sqlite_url(tmp_path)
    PlanCache(url).put(decision(problem()))
    writer = sqlite3.connect(tmp_path / "plans.db", timeout=1, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("INSERT INTO convtune_meta (key, value) VALUES ('held', 'by a tuner')")
    try:
        started = time.monotonic()
        reader = PlanCache(url, busy_timeout_s=5)
        assert reader.get(problem(), GPU_A.key()) is not None
        assert reader.get(problem(7), GPU_A.key()) is None
        shown = run_cli("show", "--db", tmp_path / "plans.db")
        assert shown.exit_code == 0 and "1 plan(s)" in shown.output
        assert time.monotonic() - started < 2.0
    finally:
        writer.execute("ROLLBACK")
        writer.close()


# -- 2. read-only caches ---------------------------------------------------------------------------------
def test_a_cache_opened_read_only_serves_lookups_and_stores_nothing(tmp_path, caplog):
    url = sqlite_url(tmp_path)
    PlanCache(url).put(decision(problem()))
    cache = PlanCache(url, read_only=True)
    assert cache.read_only and cache.get(problem(), GPU_A.key()).winner.strategy == "fft"
    runtime = Runtime(store=cache, planner_options={"timer": FakeTimer()})
    x, w = np.ones((3, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    with caplog.at_level("WARNING", logger="convtune"):
        for _ in range(3):
            convtune.conv(x, w, runtime=runtime)  # a miss: tuned, kept in memory, not stored
            convtune.conv(x[:2], w, runtime=Runtime(store=cache, planner_options={"timer": FakeTimer()}))
    assert caplog.text.count("is read-only") == 1
    assert PlanCache(url).counts()["plans"] == 1
    with pytest.raises(CacheError, match="read-only"):
        cache.import_records([])  # an explicit write says so: nothing can be stored


def _in_a_read_only_mount(tmp_path, script):
    """Run ``script`` (Python) with ``tmp_path/src`` bind-mounted read-only at ``tmp_path/ro`` in a user
    namespace; skip where the kernel refuses that."""
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no user namespaces here to make a read-only mount: {probe.stderr.decode().strip()}")
    (tmp_path / "ro").mkdir()
    body = tmp_path / "script.py"
    body.write_text(textwrap.dedent(script))
    cmd = (f"mount --bind {tmp_path / 'src'} {tmp_path / 'ro'} && mount -o remount,bind,ro {tmp_path / 'ro'} && "
           f"{sys.executable} {body}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE)]))
    return subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, env=env, timeout=120)


def test_a_cache_on_a_read_only_mount_serves_show_and_lookups(tmp_path):
    (tmp_path / "src").mkdir()
    url = sqlite_url(tmp_path / "src")
    cache = PlanCache(url)
    cache.put(decision(problem()))
    writer = PlanCache(url)  # a second connection that never checkpoints: the WAL holds a plan
    writer.put(decision(problem(1)))
    done = _in_a_read_only_mount(tmp_path, f"""
        import numpy as np, convtune
        from click.testing import CliRunner
        from convtune.cache import PlanCache
        from convtune.cli import main
        from test_cache import GPU_A, problem
        cache = PlanCache("{tmp_path / 'ro' / 'plans.db'}")
        print("read_only", cache.read_only, cache.db.read_only_reason)
        print("plans", cache.get(problem(), GPU_A.key()) is not None, cache.counts()["plans"])
        print("show", CliRunner().invoke(main, ["show", "--db", "{tmp_path / 'ro' / 'plans.db'}"]).output.splitlines()[-1])
        rt = convtune.Runtime(store=cache, miss_policy="heuristic")
        print("lookup", convtune.conv(np.ones((1, 3, 8, 8), np.float32), np.ones((2, 3, 3, 3), np.float32),
                                      runtime=rt).shape)
    """)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "read_only True" in out and "plans True 2" in out and "2 plan(s)" in out and "lookup (1, 2, 6, 6)" in out


# -- 3. PostgreSQL that stops, restarts and freezes ------------------------------------------------------
@pytest.fixture
def own_pg():
    """A PostgreSQL server of this test alone (it is stopped and frozen)."""
    from pgserver import PgServer
    try:
        server = PgServer().start()
    except (FileNotFoundError, OSError, subprocess.CalledProcessError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests must run in CI: {exc}")
        pytest.skip(str(exc))
    yield server
    for pid in server.pids():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    server.stop()


def _pg(server, args):
    server._run(server.pg_ctl, "-D", server.data, *args)


@pytest.mark.postgres
def test_postgres_stopped_and_restarted_under_a_tuner_and_a_lookup(own_pg):
    url = own_pg.create_database("deploy")
    cache = PlanCache(url, timeout_s=2)
    cache.db.retry_s, cache.db.cooldown_s = 3.0, 0.5
    cache.put(decision(problem()))
    _pg(own_pg, ["-m", "fast", "stop"])
    started = time.monotonic()
    with pytest.raises(CacheError, match="failed"):
        cache.put(decision(problem(1)))  # retried with backoff, then a clear error
    assert time.monotonic() - started < 6
    # a runtime lookup does not fail the call: the miss policy serves it, with one warning
    runtime = Runtime(store=cache, miss_policy="heuristic")
    time.sleep(0.6)
    started = time.monotonic()
    y = convtune.conv(np.ones((1, 3, 8, 8), np.float32), np.ones((2, 3, 3, 3), np.float32), runtime=runtime)
    assert y.shape == (1, 2, 6, 6) and time.monotonic() - started < 5
    opts = f"-c listen_addresses=127.0.0.1 -p {own_pg.port} -k {own_pg.dir} -c fsync=off"
    # a writer that starts while the server is down gets through once it is back
    time.sleep(0.6)
    result = {}
    writer = threading.Thread(target=lambda: result.update(run_id=cache.put(decision(problem(2)))))
    writer.start()
    time.sleep(0.5)
    _pg(own_pg, ["-o", opts, "-l", os.path.join(own_pg.dir, "log"), "-w", "start"])
    writer.join(10)
    assert result.get("run_id")
    assert PlanCache(url).counts()["plans"] == 2  # the first plan and the one written across the restart


@pytest.mark.postgres
def test_postgres_frozen_under_a_lookup_and_show(own_pg):
    url = own_pg.create_database("frozen")
    PlanCache(url).put(decision(problem()))
    cache = PlanCache(url, timeout_s=1.5)
    cache.db.cooldown_s = 1.0
    pids = own_pg.pids()
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(CacheError, match="no answer within"):
            cache.get(problem(5), GPU_A.key())
        assert time.monotonic() - started < 4
        started = time.monotonic()
        with pytest.raises(CacheError, match="not answering"):  # the cool-down: no second wait
            cache.get(problem(6), GPU_A.key())
        assert time.monotonic() - started < 0.5
        runtime = Runtime(store=cache, miss_policy="heuristic", planner_options={"timer": FailingTimer()})
        y = convtune.conv(np.ones((1, 3, 8, 8), np.float32), np.ones((2, 3, 3, 3), np.float32), runtime=runtime)
        assert y.shape == (1, 2, 6, 6) and time.monotonic() - started < 4
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    time.sleep(1.1)
    assert cache.get(problem(), GPU_A.key()) is not None  # nothing lost, served again after the cool-down
    shown = run_cli("show", "--db", url.replace("postgresql+psycopg://", "postgresql://"))
    assert shown.exit_code == 0 and "1 plan(s)" in shown.output


# -- 4. plans stored after a miss are seen ------------------------------------------------------------------
def test_a_miss_is_asked_again_after_its_ttl(tmp_path, monkeypatch):
    clock = [1000.0]  # the cache's clock, moved by the test (a loaded machine's real one varies by seconds)
    monkeypatch.setattr("convtune.cache.store.time.monotonic", lambda: clock[0])
    url = sqlite_url(tmp_path)
    ours = PlanCache(url, miss_ttl_s=0.3)
    assert ours.get(problem(), GPU_A.key()) is None
    PlanCache(url).put(decision(problem()))  # another process tunes it meanwhile
    clock[0] += 0.29
    assert ours.get(problem(), GPU_A.key()) is None  # still within the miss's TTL: no database read
    clock[0] += 0.02
    assert ours.get(problem(), GPU_A.key()) is not None


def _store_in_another_process(url, p):
    code = (f"import sys; sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]\n"
            "from convtune.cache import PlanCache\nfrom convtune import ConvProblem, Planner\n"
            "from conftest import FakeTimer\n"
            f"PlanCache({url!r}).put(Planner('numpy', FakeTimer(), strategies=['fft']).tune(ConvProblem.from_key({p.key()!r})))")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_a_heuristic_runtime_picks_up_a_plan_another_process_tuned(tmp_path):
    url = sqlite_url(tmp_path)
    runtime = Runtime(store=PlanCache(url, miss_ttl_s=0.2), miss_policy="heuristic", miss_ttl_s=0.2)
    x, w = np.ones((2, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    convtune.conv(x, w, runtime=runtime)
    assert next(iter(runtime._memo.values())).source == "heuristic"
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    _store_in_another_process(url, p)
    time.sleep(0.25)
    convtune.conv(x, w, runtime=runtime)
    plan = next(iter(runtime._memo.values()))
    assert plan.source == "cache" and plan.strategy == "fft"


# -- 5. backups -----------------------------------------------------------------------------------------------
def test_backup_after_a_killed_tuner_holds_every_committed_plan(tmp_path):
    url = sqlite_url(tmp_path)
    PlanCache(url)
    code = (f"import sys; sys.path[:0] = [{HERE!r}, {os.path.dirname(HERE)!r}]\n"
            "from convtune.cache import PlanCache\nfrom test_cache import decision, problem\n"
            f"cache = PlanCache({url!r})\n"
            "for i in range(10000):\n    cache.put(decision(problem(i)))\n    print(i, flush=True)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    committed = -1
    for line in child.stdout:
        committed = int(line)
        if committed >= 20:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    out = tmp_path / "copy.db"
    result = run_cli("backup", out, "--db", tmp_path / "plans.db")
    assert result.exit_code == 0, result.output
    assert not os.path.exists(f"{out}-wal")
    copy = PlanCache(str(out), read_only=True)
    assert copy.counts()["plans"] >= committed + 1
    again = run_cli("backup", out, "--db", tmp_path / "plans.db")
    assert again.exit_code == 1 and "exists" in again.output


@pytest.mark.postgres
def test_backup_of_a_postgres_cache_is_one_sqlite_file(pg_server, tmp_path):
    url = pg_server.create_database(f"backup_{os.getpid()}")
    PlanCache(url).put(decision(problem()))
    result = run_cli("backup", tmp_path / "pg.db", "--db", url.replace("postgresql+psycopg://", "postgresql://"))
    assert result.exit_code == 0, result.output
    assert PlanCache(str(tmp_path / "pg.db"), read_only=True).get(problem(), GPU_A.key()) is not None


# -- 6. text that reaches terminals and spreadsheets ------------------------------------------------------------
HOSTILE = "fft[\x1b]0;pwned\x07\x1b[31m]"


def _records_with(label, tmp_path):
    url = sqlite_url(tmp_path, "src.db")
    PlanCache(url).put(decision(problem()))
    records = PlanCache(url).export_records()
    records[0]["label"] = label
    return records


def test_imports_refuse_control_characters_and_name_the_record(tmp_path):
    path = tmp_path / "hostile.json"
    path.write_text(write_export(_records_with(HOSTILE, tmp_path), "json"))
    result = run_cli("import", path, "--db", tmp_path / "plans.db")
    assert result.exit_code == 1 and "plan 1 of the export has control characters in 'label'" in result.output
    assert "\x1b" not in result.output


def test_show_and_explain_escape_what_a_database_holds(tmp_path):
    url = sqlite_url(tmp_path)
    cache = PlanCache(url)
    cache.put(decision(problem()))
    with cache.engine.begin() as conn:  # a database written by other means
        from sqlalchemy import text
        conn.execute(text("UPDATE plans SET label = :l"), {"l": HOSTILE})
        conn.execute(text("UPDATE measurements SET reason = :l"), {"l": HOSTILE})
    shown = run_cli("show", "--db", tmp_path / "plans.db")
    explained = run_cli("explain", problem().key(), "--db", tmp_path / "plans.db", "--device", "H100")
    for output in (shown.output, explained.output):
        assert "\x1b" not in output and "\x07" not in output and "\\x1b]0;pwned\\x07" in output


def test_csv_exports_neutralise_formulas_and_imports_restore_them(tmp_path):
    formula = "=HYPERLINK(\"http://example.com\",\"x\")"
    records = _records_with(formula, tmp_path)
    text = write_export(records, "csv")
    import csv
    import io
    raw = list(csv.DictReader(io.StringIO(text)))[0]
    assert raw["label"] == "'" + formula  # a spreadsheet shows it as text
    assert raw["time_median_s"] == "0.001"  # numbers stay numbers
    assert read_export(text)[0]["label"] == formula


# -- 7. huge problems -----------------------------------------------------------------------------------------------
HUGE = """layers:
  - {name: huge, batch: 100000, in_channels: 64, out_channels: 64, input: [224, 224], kernel: 3, padding: 1}
"""


def test_a_problem_that_does_not_fit_fails_cleanly_with_its_reason(tmp_path, fake_default_timer):
    net = tmp_path / "huge.yaml"
    net.write_text(HUGE)
    result = run_cli("tune", net, "--db", tmp_path / "plans.db", "--passes", "fwd", "--backend", "numpy",
                     "--workspace-limit", "none")
    assert result.exit_code == 1 and "FAILED huge fwd" in result.output
    rows = PlanCache(str(tmp_path / "plans.db")).measurement_rows(
        ConvProblem.make(batch=100000, in_channels=64, out_channels=64, input_size=(224, 224), kernel_size=3,
                         padding=1).key())
    assert rows and all("TiB for its operands and result" in r["reason"] for r in rows if r["status"] == "failed")


def test_workspaces_are_checked_against_free_memory_before_they_are_made(monkeypatch):
    from convtune.backend import get_backend
    from convtune.planner import Planner
    backend = get_backend("numpy")
    p = ConvProblem.make(batch=8, in_channels=16, out_channels=16, input_size=(32, 32), kernel_size=3, padding=1)
    monkeypatch.setattr(type(backend), "free_memory_bytes", lambda self: 4 * p.min_bytes())
    d = Planner(backend, FakeTimer(), workspace_limit=None, strategies=["im2col"]).tune(p)
    over = [o for o in d.outcomes if o.status == "over_budget"]
    assert over and all("memory left beside the operands" in o.reason for o in over)


# -- 8. arguments as PyTorch takes them ---------------------------------------------------------------------------
def _rt():
    return Runtime(store=MemoryPlanStore(), planner_options={"timer": FakeTimer(), "strategies": ["im2col"]})


@pytest.mark.parametrize("kwargs, message", [
    (dict(stride=(1.5, 1)), "stride must be an integer"),
    (dict(stride=2.0), "stride must be an int"),
    (dict(groups=2.0), "groups must be an integer"),
    (dict(groups=-1), "groups must be a positive integer"),
    (dict(dilation=True), "dilation must be an int"),
    (dict(padding="full"), "invalid padding string"),
    (dict(padding="same", stride=2), "not supported for strided"),
])
def test_arguments_pytorch_refuses_are_refused_by_name(kwargs, message):
    x, w = np.ones((2, 4, 8, 8), np.float32), np.ones((4, 2, 3, 3), np.float32)
    with pytest.raises(ValueError, match=message):
        convtune.conv(x, w, **{"groups": 2, **kwargs}, runtime=_rt())


def test_numpy_integers_are_integers():
    x, w = np.ones((2, 4, 8, 8), np.float32), np.ones((4, 2, 3, 3), np.float32)
    y = convtune.conv(x, w, stride=np.int64(2), padding=(np.int32(1), 1), groups=np.int16(2), runtime=_rt())
    assert y.shape == (2, 4, 4, 4)


@pytest.mark.parametrize("padding, dilation", [("same", 1), ("same", (1, 2)), ("valid", 1)])
@pytest.mark.parametrize("kernel", [(3, 3), (4, 2)])
@pytest.mark.parametrize("unbatched", [False, True])
def test_string_padding_and_unbatched_inputs_match_pytorch(padding, dilation, kernel, unbatched):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 10), dtype=np.float32)
    w = rng.standard_normal((4, 3, *kernel), dtype=np.float32)
    tx = torch.from_numpy(x).requires_grad_()
    tw = torch.from_numpy(w).requires_grad_()
    xin, txin = (x[0], tx[0]) if unbatched else (x, tx)
    ty = torch.nn.functional.conv2d(txin, tw, padding=padding, dilation=dilation)
    dy = rng.standard_normal(tuple(ty.shape), dtype=np.float32)
    ty.backward(torch.from_numpy(dy))
    rt, kw = _rt(), dict(padding=padding, dilation=dilation)
    y = convtune.conv(xin, w, **kw, runtime=rt)
    dx = convtune.conv_backward_data(dy, w, xin.shape, **kw, runtime=rt)
    dw = convtune.conv_backward_filter(xin, dy, w.shape, **kw, runtime=rt)
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dx, (tx.grad[0] if unbatched else tx.grad).numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, tw.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_an_empty_batch_gives_empty_results_and_a_zero_filter_gradient():
    x, w = np.ones((0, 3, 8, 8), np.float32), np.ones((4, 3, 3, 3), np.float32)
    rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": FailingTimer()})
    assert convtune.conv(x, w, padding=1, runtime=rt).shape == (0, 4, 8, 8)
    assert convtune.conv_backward_data(np.ones((0, 4, 8, 8), np.float32), w, x.shape, padding=1,
                                       runtime=rt).shape == (0, 3, 8, 8)
    dw = convtune.conv_backward_filter(x, np.ones((0, 4, 8, 8), np.float32), w.shape, padding=1, runtime=rt)
    assert dw.shape == w.shape and not dw.any()


def test_numpy_layers_take_same_padding_and_unbatched_input():
    layer = convtune.Conv2d(3, 4, (4, 3), padding="same", seed=0, runtime=_rt())
    y = layer(np.ones((3, 9, 9), np.float32))
    assert y.shape == (4, 9, 9)
    assert layer.backward(np.ones_like(y)).shape == (3, 9, 9) and layer.grad_bias.shape == (4,)


# -- 9. files that are not what they claim -------------------------------------------------------------------------
def test_another_applications_database_is_refused_untouched(tmp_path):
    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    conn.commit()
    conn.close()
    before = foreign.read_bytes()
    result = run_cli("tune", "alexnet", "--db", foreign, "--backend", "numpy")
    assert result.exit_code == 1 and "database of another application (tables: customers)" in result.output
    assert foreign.read_bytes() == before and not os.path.exists(f"{foreign}-wal")


def test_a_missing_directory_is_an_error_except_for_the_default_location(tmp_path, monkeypatch):
    result = run_cli("tune", "alexnet", "--db", tmp_path / "no" / "such" / "plans.db", "--backend", "numpy")
    assert result.exit_code == 1 and "does not exist" in result.output
    assert not (tmp_path / "no").exists()
    monkeypatch.delenv("CONVTUNE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    PlanCache()
    assert (tmp_path / "xdg" / "convtune" / "plans.db").exists()


@pytest.mark.parametrize("content, message", [
    ("", "the file is empty"),
    ("[]", "not a convtune plan export"),
    ("[{\"problem_key\": 1}]", "not a convtune plan export"),
])
def test_imports_of_what_is_not_an_export_fail(tmp_path, content, message):
    path = tmp_path / "in.json"
    path.write_text(content)
    result = run_cli("import", path, "--db", tmp_path / "plans.db")
    assert result.exit_code == 1 and message in result.output


def test_a_truncated_csv_imports_nothing_and_names_the_record(tmp_path):
    url = sqlite_url(tmp_path, "src.db")
    src = PlanCache(url)
    for i in range(6):
        src.put(decision(problem(i)))
    lines = write_export(src.export_records(), "csv").splitlines()
    path = tmp_path / "cut.csv"
    path.write_text("\n".join(lines[:5] + [lines[5][:40]]) + "\n")  # header, 4 plans, half of the 5th
    result = run_cli("import", path, "--db", tmp_path / "plans.db")
    assert result.exit_code == 1 and "plan 5 of the export" in result.output
    assert PlanCache(str(tmp_path / "plans.db")).counts()["plans"] == 0


@pytest.mark.parametrize("field, value", [("batch", "2.5"), ("kernel", "[3.9, 3]"), ("batch", "true"),
                                          ("stride", "1.0")])
def test_network_files_refuse_non_integral_sizes(tmp_path, field, value):
    entry = {"name": "l", "batch": "2", "in_channels": "3", "out_channels": "4", "input": "[9, 9]", "kernel": "3"}
    entry[field] = value
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {" + ", ".join(f"{k}: {v}" for k, v in entry.items()) + "}\n")
    result = run_cli("tune", net, "--db", tmp_path / "plans.db", "--backend", "numpy")
    name = {"kernel": "kernel_size"}.get(field, field)
    assert result.exit_code == 1 and f"{name} must be an int" in result.output.replace("every entry of ", "")


def test_json_exports_stay_exact(tmp_path):
    records = _records_with("fft[plain]", tmp_path)
    doc = json.loads(write_export(records, "json"))
    assert doc["plans"][0]["label"] == "fft[plain]"


def test_commands_that_store_refuse_a_read_only_cache_before_any_work(tmp_path, monkeypatch):
    url = sqlite_url(tmp_path)
    PlanCache(url)
    real = PlanCache.__init__

    def read_only_init(self, *args, **kwargs):
        real(self, *args, **{**kwargs, "read_only": True})
    monkeypatch.setattr(PlanCache, "__init__", read_only_init)
    result = run_cli("tune", "alexnet", "--db", tmp_path / "plans.db", "--backend", "numpy")
    assert result.exit_code == 1 and "is read-only (opened read-only)" in result.output


def test_a_directory_given_as_the_cache_is_a_one_line_error(tmp_path):
    """show, info and tune, and a runtime's lookup, on a directory: a convtune error that says what to give (was a
    sqlite3 'disk I/O error' traceback)."""
    from click.testing import CliRunner
    from convtune.cli import main
    folder = tmp_path / "plans.db"
    folder.mkdir()
    for args in (["show"], ["info"], ["tune", "starter", "--passes", "fwd", "--backend", "numpy"]):
        result = CliRunner().invoke(main, [*args, "--db", str(folder)])
        assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception,
                                                                                            SystemExit)
        assert "is a directory, not a plan cache file" in result.output, result.output
    with pytest.raises(CacheError, match="is a directory"):
        PlanCache(str(folder))


def test_a_wal_cache_file_copied_alone_where_sqlite_cannot_add_its_files_serves_show_and_lookups(tmp_path):
    """plans.db copied alone onto read-only media: SQLite cannot make its -wal and -shm files beside it (here their
    names are taken by directories, which stops root as a read-only mount stops anyone). It opens immutable:
    show and a runtime's lookups work (both failed with 'unable to open database file')."""
    from click.testing import CliRunner
    from convtune.cli import main
    from convtune.backend import get_backend
    from convtune.problem import ConvProblem
    source = tmp_path / "src.db"
    assert CliRunner().invoke(main, ["tune", "starter", "--passes", "fwd", "--db", str(source), "--backend",
                                     "numpy", "--strategies", "im2col"]).exit_code == 0
    assert sqlite3.connect(source).execute("PRAGMA journal_mode").fetchone() == ("wal",)
    shipped = tmp_path / "media"
    shipped.mkdir()
    db = shipped / "plans.db"
    db.write_bytes(source.read_bytes())
    (shipped / "plans.db-wal").mkdir()
    (shipped / "plans.db-shm").mkdir()
    shown = CliRunner().invoke(main, ["show", "--db", str(db)])
    assert shown.exit_code == 0 and "5 plan(s)" in shown.output, shown.output
    cache = PlanCache(str(db))
    assert cache.read_only and "cannot make its -wal and -shm files" in cache.db.read_only_reason
    problem = ConvProblem.from_key(cache.plan_rows()[0]["problem_key"])
    runtime = Runtime(store=cache, miss_policy="error")
    assert runtime.plan_for(problem, get_backend("numpy")).strategy == "im2col"


@pytest.mark.parametrize("row", ["0", "2"])
def test_a_schema_version_row_below_the_tables_upgrades_without_harm(tmp_path, row):
    """A version row lower than the tables it stands for (edited, or a restore gone wrong): the upgrade adds only
    what is missing (it failed with 'duplicate column name'), and a retry's backup gets a name of its own (the
    failed upgrade's backup made the next command refuse)."""
    from click.testing import CliRunner
    from convtune.cli import main
    from convtune.cache import migrate
    db = tmp_path / "p.db"
    tune = ["tune", "starter", "--passes", "fwd", "--db", str(db), "--backend", "numpy", "--strategies", "im2col"]
    assert CliRunner().invoke(main, tune).exit_code == 0
    for attempt in range(2):
        with sqlite3.connect(db) as conn:
            conn.execute("UPDATE convtune_meta SET value = ? WHERE key = 'schema_version'", (row,))
        result = CliRunner().invoke(main, tune)
        assert result.exit_code == 0 and "all 5 plans came from the cache" in result.output, result.output
    assert PlanCache(str(db)).schema_version() == migrate.SCHEMA_VERSION
    assert len(list(tmp_path.glob(f"p.db.schema{row}-*.bak"))) == 2


def test_the_memory_check_heeds_the_process_own_address_space_limit(monkeypatch):
    """`ulimit -v` (RLIMIT_AS) bounds what the planner thinks it may allocate, as the host's and the cgroup's do."""
    import resource
    from convtune import backend
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert backend.address_space_left() is None
    with open("/proc/self/statm") as fh:
        mapped = int(fh.read().split()[0]) * resource.getpagesize()
    monkeypatch.setattr(resource, "getrlimit", lambda which: (mapped + (64 << 20), resource.RLIM_INFINITY))
    left = backend.address_space_left()
    assert 0 < left <= 64 << 20 and backend.host_memory_available() <= left


def test_a_tampered_stored_plan_falls_back_and_show_marks_it(tmp_path, caplog):
    """A plan edited in the database so that it no longer builds: the lookup serves the heuristic's plan with one
    warning (no exception that is not convtune's), notes it beside the plan, and `show` marks the plan and says why."""
    import logging
    from click.testing import CliRunner
    from convtune.backend import get_backend
    from convtune.cli import main
    from convtune.problem import ConvProblem
    db = tmp_path / "p.db"
    assert CliRunner().invoke(main, ["tune", "starter", "--passes", "fwd", "--db", str(db), "--backend", "numpy",
                                     "--strategies", "im2col"]).exit_code == 0
    with sqlite3.connect(db) as conn:
        plan_id, key = conn.execute("SELECT plans.id, problems.key FROM plans JOIN problems ON plans.problem_id = "
                                    "problems.id ORDER BY plans.id LIMIT 1").fetchone()
        conn.execute("UPDATE plans SET config = ? WHERE id = ?", ('{"chunk": 2, "edited": 1}', plan_id))
    runtime = Runtime(store=PlanCache(str(db)), miss_policy="tune")
    with caplog.at_level(logging.WARNING, logger="convtune"):
        plan = runtime.plan_for(ConvProblem.from_key(key), get_backend("numpy"))
    assert plan.source == "heuristic" and "does not build" in caplog.text
    shown = CliRunner().invoke(main, ["show", "--db", str(db)])
    assert shown.exit_code == 0 and "current; did not build" in shown.output, shown.output
    assert "did not build where it was looked up (ValueError: unknown" in shown.output and "'edited'" in shown.output
