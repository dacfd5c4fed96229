"""The persistent plan cache on SQLite and on a real PostgreSQL server."""

import multiprocessing

import pytest
from sqlalchemy import text

import convtune
from convtune import CandidateOutcome, ConvProblem, Decision, TimingStats
from convtune.backend import DeviceInfo, get_backend
from convtune.cache import PlanCache, read_export, resolve_url, write_export
from convtune.errors import CacheError
from conftest import FailingTimer, FakeTimer

GPU_A = DeviceInfo("cupy", "NVIDIA H100 80GB HBM3", "9.0", 132, 85 << 30, "13000", "13000", "12000", "130000",
                   "91900", "2.4.6", "14.2.0")
GPU_B = DeviceInfo(**{**GPU_A.as_dict(), "driver": "13010"})  # a driver upgrade: another fingerprint


def problem(i=0, pass_="fwd"):
    return ConvProblem.make(batch=2 + i, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3,
                            pass_=pass_)


def decision(p, device=GPU_A, winner_ms=1.0, strategy="fft", config=None):
    def outcome(label, status, ms, strat, cfg):
        timing = TimingStats(ms / 1e3, ms / 1e5, ms / 1e3, 25) if ms is not None else None
        return CandidateOutcome(strat, cfg, label, status, workspace_bytes=1 << 20, error=3e-7, timing=timing)
    config = config or {"sizes": [16, 16], "product": "gemm", "chunk": p.batch}
    win = outcome(f"{strategy}[{config}]", "winner", winner_ms, strategy, config)
    other = outcome("im2col[chunk=2]", "ok", winner_ms * 2, "im2col", {"chunk": 2})
    bad = CandidateOutcome("fft", {"sizes": [9, 9]}, "fft[sizes=9x9]", "rejected", error=float("inf"),
                           reason="error inf over the fp32 tolerance")
    unsup = CandidateOutcome("cudnn", {}, "cudnn[*]", "unsupported", reason="no GPU")
    return Decision(p, device, win, (win, other, bad, unsup), "measured", 1.5)


def test_round_trip(cache_url):
    cache = PlanCache(cache_url)
    d = decision(problem())
    cache.put(d)
    fresh = PlanCache(cache_url)
    got = fresh.get(problem(), GPU_A.key())
    assert got.source == "cache"
    assert got.winner.strategy == "fft" and got.winner.config == d.winner.config
    assert got.winner.timing.median_s == pytest.approx(1e-3) and got.winner.error == pytest.approx(3e-7)
    assert got.device == GPU_A
    assert fresh.get(problem(1), GPU_A.key()) is None
    assert fresh.counts() == {"devices": 1, "problems": 1, "measurements": 4, "plans": 1}
    rows = fresh.measurement_rows(problem().key(), GPU_A.key())
    assert {r["status"] for r in rows} == {"winner", "ok", "rejected", "unsupported"}
    assert [r for r in rows if r["status"] == "rejected"][0]["error"] is None  # inf is stored as NULL ...
    assert "not finite" in [r for r in rows if r["status"] == "rejected"][0]["reason"]  # ... and said so


def test_one_read_per_key_per_process(cache_url):
    PlanCache(cache_url).put(decision(problem()))
    cache = PlanCache(cache_url)
    for _ in range(5):
        assert cache.get(problem(), GPU_A.key()) is not None
        assert cache.get(problem(1), GPU_A.key()) is None
    assert cache.reads == 2


def test_device_fingerprint_separates_plans(cache_url):
    cache = PlanCache(cache_url)
    cache.put(decision(problem(), GPU_A))
    assert cache.get(problem(), GPU_B.key()) is None  # a driver upgrade does not reuse old plans
    assert len(cache.plan_rows()) == 1  # ... which are still listed
    cache.put(decision(problem(), GPU_B, winner_ms=0.5))
    assert {r["fingerprint"] for r in cache.plan_rows()} == {GPU_A.key(), GPU_B.key()}
    assert {r["driver"] for r in cache.device_rows()} == {"13000", "13010"}


def test_retuning_replaces_the_plan_and_keeps_every_measurement(cache_url):
    cache = PlanCache(cache_url)
    cache.put(decision(problem(), winner_ms=2.0))
    cache.put(decision(problem(), winner_ms=1.0, strategy="im2col", config={"chunk": 1}))
    rows = cache.plan_rows()
    assert len(rows) == 1 and rows[0]["strategy"] == "im2col"
    assert cache.counts()["measurements"] == 8


def test_strategy_version_change_is_a_miss(cache_url, monkeypatch):
    cache = PlanCache(cache_url)
    cache.put(decision(problem()))
    monkeypatch.setattr("convtune.cache.store.strategy_versions", lambda: "fft2,im2col1")
    assert PlanCache(cache_url).get(problem(), GPU_A.key()) is None
    assert PlanCache(cache_url).plan_rows()[0]["current_versions"] is False


def test_versions_that_changed_only_the_hosts_work_keep_every_plan():
    """Versions whose launches replay from CUDA graphs (depthwise 9, fft-row 5, fft-plane 3) changed no kernel and
    no time: plans those strategies won under the version before still hold, where a version that changed kernels
    (fft-row 4; depthwise 10, the vectorized channels-last kernel, and 11, its loads and configurations, for
    channels-last layers' forward and backward-data passes only; 12, the staged channels-last kernels, for
    channels-last layers at stride 1 whose channels they take, and 13 and 14, their double-buffered configurations and
    their tiles and grids, for the same layers; 15 and 16, the configurations over 48 KiB, for those whose tiles need
    it; 17, the staged kernels at stride 2, for the strided layers they take) does not."""
    from convtune.strategies import strategy_versions, versions_agree
    current = strategy_versions()
    row = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(4096,), kernel_size=1001, padding=500,
                           groups=8)
    plane = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(56, 56), kernel_size=31, padding=15,
                             groups=8)
    for winner, problem, new, old in (("depthwise", plane, "depthwise17", "depthwise8"), ("fft-row", row, "fft-row5",
                                      "fft-row4"), ("fft-plane", plane, "fft-plane3", "fft-plane2")):
        assert new in current, current
        assert versions_agree(current.replace(new, old), problem, winner, current), (winner, old)
    assert not versions_agree(current.replace("fft-row5", "fft-row3"), row, "fft-row", current)
    last = plane.replace(layout="channels_last", kernel_size=(7, 7), padding=(3, 3))
    assert not versions_agree(current.replace("depthwise17", "depthwise9"), last, "depthwise", current)
    assert versions_agree(current.replace("depthwise17", "depthwise9"), plane.replace(layout="channels_last"),
                          "depthwise", current)  # (31x31: over the vectorized and staged kernels' 81 taps)
    # version 11 changed the vectorized kernel's candidates alone (6 channels: not the staged kernels', 12)
    six = last.replace(in_channels=6, out_channels=6, groups=6)
    assert not versions_agree(current.replace("depthwise17", "depthwise10"), six, "depthwise", current)
    assert versions_agree(current.replace("depthwise17", "depthwise10"), six.replace(pass_="wgrad"), "depthwise",
                          current)
    assert versions_agree(current.replace("depthwise17", "depthwise10"), last.replace(dilation=(2, 2), padding=(6, 6)),
                          "depthwise", current)  # (dilated: neither the vectorized kernel's nor the staged ones')
    # version 12 added the staged kernels: every pass of the channels-last layers they take
    assert not versions_agree(current.replace("depthwise17", "depthwise11"), last.replace(pass_="wgrad"),
                              "depthwise", current)
    # version 13 added their double-buffered configurations: the same layers, and no others
    assert not versions_agree(current.replace("depthwise17", "depthwise12"), last, "depthwise", current)
    assert versions_agree(current.replace("depthwise17", "depthwise12"), six, "depthwise", current)
    # version 14 changed their tiles' rows and filter gradient's grid: the same layers, and no others
    assert not versions_agree(current.replace("depthwise17", "depthwise13"), last.replace(pass_="wgrad"), "depthwise",
                              current)
    assert versions_agree(current.replace("depthwise17", "depthwise13"), six, "depthwise", current)
    # version 15 added their configurations of 100 KiB a block: the same layers, and no others
    assert not versions_agree(current.replace("depthwise17", "depthwise14"), last, "depthwise", current)
    assert versions_agree(current.replace("depthwise17", "depthwise14"), six, "depthwise", current)
    # version 16 offered them where the device holds their tile: the layers whose tile there needs more than 48 KiB
    # (ConvNeXt-T's stage 1; not 14x14, nor 8 channels, a block of 4 pairs)
    stage1 = last.replace(in_channels=96, out_channels=96, groups=96, dtype="bfloat16")
    assert not versions_agree(current.replace("depthwise17", "depthwise15"), stage1, "depthwise", current)
    for other in (stage1.replace(input_size=(14, 14)), last):
        assert versions_agree(current.replace("depthwise17", "depthwise15"), other, "depthwise", current)
    # version 17 ran the staged kernels at stride 2: every pass of the strided layers they take, and no others
    strided = stage1.replace(input_size=(28, 28), kernel_size=(3, 3), padding=(1, 1), stride=(2, 2))
    for pass_ in ("fwd", "dgrad", "wgrad"):
        assert not versions_agree(current.replace("depthwise17", "depthwise16"), strided.replace(pass_=pass_),
                                  "depthwise", current)
    for other in (stage1, strided.replace(dilation=(2, 2))):
        assert versions_agree(current.replace("depthwise17", "depthwise16"), other, "depthwise", current)


def test_a_version_change_of_a_strategy_that_cannot_serve_the_problem_keeps_its_plan(cache_url, monkeypatch):
    """The key carries every strategy's version; a plan stored under versions that differ only in
    strategies that cannot serve its problem's shape (the depthwise kernels, for a dense layer) is still
    this convtune's plan. Where they can, or the winner's own version changed, it is a miss."""
    from convtune.strategies import strategy_versions, versions_agree
    current = strategy_versions()
    older = current.replace("depthwise17", "depthwise3")
    assert older != current
    dense, depthwise = problem(), ConvProblem.make(batch=2, in_channels=4, out_channels=4, input_size=(9, 9),
                                                   kernel_size=3, groups=4)
    assert versions_agree(older, dense, "fft", current) and not versions_agree(older, depthwise, "fft", current)
    assert not versions_agree(older, dense, "depthwise", current)  # the winner's own version changed
    assert not versions_agree(current.replace("fft13", "fft7"), dense, "im2col", current)  # FFT serves every shape
    # fft 9 changed the transforms of candidates that only kernels wider than 3 get, fft 10 the 3-D problems'
    # candidates, fft 11 half-precision and channels_last problems', fft 12 tf32 ones', fft 13 small batches with
    # many channels and the narrow product's blocks (see FftStrategy.changes); the shapes below have channels and
    # a batch the narrow product does not take, but few: fft 13 changed their blocks
    many_images = dict(batch=17, in_channels=32, out_channels=32)
    few, dense = dense, dense.replace(**many_images)
    assert not versions_agree(current.replace("fft13", "fft12"), few, "im2col", current)
    wide = ConvProblem.make(**many_images, input_size=(9, 9), kernel_size=(5, 3))
    cube = ConvProblem.make(**many_images, input_size=(5, 5, 5), kernel_size=3)
    half = dense.replace(dtype="bfloat16", layout="channels_last")
    assert versions_agree(current.replace("fft13", "fft8"), dense, "im2col", current)
    assert not versions_agree(current.replace("fft13", "fft8"), wide, "im2col", current)
    assert versions_agree(current.replace("fft13", "fft9"), wide, "im2col", current)
    assert not versions_agree(current.replace("fft13", "fft9"), cube, "im2col", current)
    assert versions_agree(current.replace("fft13", "fft10"), cube, "im2col", current)
    assert not versions_agree(current.replace("fft13", "fft10"), half, "im2col", current)
    # fft 12: tf32 problems' candidates (the packed product's TF32 form)
    assert versions_agree(current.replace("fft13", "fft11"), half, "im2col", current)
    assert not versions_agree(current.replace("fft13", "fft11"), dense.replace(math="tf32"), "im2col", current)
    # fft 13: the narrow product at a batch of 16 or less with many channels on both sides
    assert versions_agree(current.replace("fft13", "fft12"), dense.replace(math="tf32"), "im2col", current)
    many = ConvProblem.make(batch=8, in_channels=32, out_channels=32, input_size=(9, 9), kernel_size=5)
    assert not versions_agree(current.replace("fft13", "fft12"), many, "im2col", current)
    assert versions_agree(current.replace("fft13", "fft12"), many.replace(batch=17), "im2col", current)
    assert not versions_agree(older.replace(",torch", ",x").split(",x")[0], dense, "fft", current)  # torch added
    assert versions_agree(older + ",retired9", dense, "fft", current)  # a strategy no longer registered
    assert not versions_agree(older + ",retired9", dense, "retired", current)  # ... cannot have won it
    monkeypatch.setattr("convtune.cache.store.strategy_versions", lambda: older)
    cache = PlanCache(cache_url)
    cache.put(decision(dense))
    cache.put(decision(depthwise))
    monkeypatch.undo()
    fresh = PlanCache(cache_url)
    assert fresh.get(dense, GPU_A.key()).winner.strategy == "fft"
    assert fresh.get(depthwise, GPU_A.key()) is None
    assert {r["problem_key"]: r["current_versions"] for r in fresh.plan_rows()} == {dense.key(): True,
                                                                                     depthwise.key(): False}
    assert fresh.plan_row(dense.key(), GPU_A.key())["strategy_versions"] == older
    fresh.put(decision(dense, winner_ms=0.5))  # tuned again: the plan of the current versions is preferred
    again = PlanCache(cache_url)
    assert again.get(dense, GPU_A.key()).winner.timing.median_s == pytest.approx(0.5e-3)
    assert again.plan_row(dense.key(), GPU_A.key())["strategy_versions"] == current


def test_a_version_that_changed_some_shapes_keeps_the_other_shapes_plans():
    """im2col's version 3 changed its 1x1 problems only (the GPU's bare cuBLAS calls), version 4 their forward and
    backward-data (cuBLASLt from CUDA graphs): a plan stored under im2col2 holds for a 3x3 layer, whichever strategy
    won it, and not for a 1x1 layer; one stored under im2col3 holds for a 1x1 filter gradient, not for its forward;
    an unknown older or a newer version, or a strategy whose tag carries an outside library's version, changes every
    shape."""
    from convtune.strategies import strategy_versions, versions_agree
    current = strategy_versions()
    assert "im2col4" in current
    older = current.replace("im2col4", "im2col2")
    dense = problem()
    pointwise = ConvProblem.make(batch=2, in_channels=8, out_channels=4, input_size=(9, 9), kernel_size=1)
    strided_pointwise = pointwise.replace(stride=(2, 2))
    assert versions_agree(older, dense, "im2col", current) and versions_agree(older, dense, "fft", current)
    assert not versions_agree(older, pointwise, "im2col", current)
    assert not versions_agree(older, pointwise, "cudnn", current)  # im2col serves it, and changed for it
    assert versions_agree(older, strided_pointwise, "im2col", current)  # stride 2: not the cuBLAS path
    three = current.replace("im2col4", "im2col3")
    assert not versions_agree(three, pointwise, "im2col", current)
    assert not versions_agree(three, pointwise.for_pass("dgrad"), "im2col", current)
    assert versions_agree(three, pointwise.for_pass("wgrad"), "im2col", current)  # (still cuBLAS's loop)
    assert versions_agree(three, dense, "im2col", current)
    assert not versions_agree(current.replace("im2col4", "im2col1"), dense, "im2col", current)
    assert not versions_agree(current.replace("im2col4", "im2col5"), dense, "im2col", current)  # a later convtune's
    torch_tag = next(t for t in current.split(",") if t.startswith("torch"))
    assert not versions_agree(current.replace(torch_tag, "torch1@0.0.1"), dense, "torch", current)


def test_a_version_beside_an_outside_librarys_keeps_the_shapes_it_did_not_change():
    """The torch strategy's version 2 changed how bfloat16 problems are timed, nothing else: under the same
    PyTorch, a plan stored under torch1 holds for a float32 problem and not for a bfloat16 one; under another
    PyTorch it holds for neither."""
    from convtune.strategies import strategy_versions, versions_agree
    current = strategy_versions()
    torch_tag = next(t for t in current.split(",") if t.startswith("torch"))
    assert torch_tag.startswith("torch2@")
    library = torch_tag.partition("@")[2]
    older = current.replace(torch_tag, f"torch1@{library}")
    dense = problem()
    half = dense.replace(dtype="bfloat16")
    assert versions_agree(older, dense, "torch", current) and versions_agree(older, dense, "im2col", current)
    assert not versions_agree(older, half, "torch", current) and not versions_agree(older, half, "im2col", current)
    other = current.replace(torch_tag, "torch1@0.0.1")
    assert not versions_agree(other, dense, "im2col", current)


def test_a_failed_tuning_is_recorded_without_a_plan(cache_url):
    d = decision(problem())
    failed = Decision(d.problem, d.device, CandidateOutcome("", {}, "", "failed"), d.outcomes[2:], "measured", 0.1)
    cache = PlanCache(cache_url)
    cache.put(failed)
    assert cache.counts()["plans"] == 0 and cache.counts()["measurements"] == 2


def _writer(url, worker, n):
    cache = PlanCache(url)
    for i in range(n):
        cache.put(decision(problem(worker * n + i)))   # distinct problems
        cache.put(decision(problem(1000), winner_ms=1.0 + worker))  # all fight over one plan


def _run_writers(url, workers, n):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(url, w, n)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    return [p.exitcode for p in procs]


def test_eight_concurrent_writers_lose_nothing(cache_url):
    PlanCache(cache_url)  # create the schema once
    n = 5
    assert _run_writers(cache_url, 8, n) == [0] * 8
    counts = PlanCache(cache_url).counts()
    assert counts["plans"] == 8 * n + 1
    assert counts["problems"] == 8 * n + 1
    assert counts["measurements"] == 8 * n * 2 * 4
    assert counts["devices"] == 1


def test_concurrent_schema_creation(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    assert _run_writers(url, 8, 1) == [0] * 8
    assert PlanCache(url).counts()["plans"] == 9


def test_schema_version_mismatch_is_a_clear_error(cache_url):
    cache = PlanCache(cache_url)
    with cache.engine.begin() as conn:
        conn.execute(text("UPDATE convtune_meta SET value = '99' WHERE key = 'schema_version'"))
    with pytest.raises(CacheError, match="schema version 99, made by a newer convtune"):
        PlanCache(cache_url)


def test_tables_without_a_version_are_refused(cache_url):
    cache = PlanCache(cache_url)
    with cache.engine.begin() as conn:
        conn.execute(text("DROP TABLE convtune_meta"))
    with pytest.raises(CacheError, match="no schema version"):
        PlanCache(cache_url)


def test_garbage_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(CacheError, match="cannot open the plan cache"):
        PlanCache(str(bad))


def test_missing_database_without_create(tmp_path):
    with pytest.raises(CacheError, match="no plan cache at"):
        PlanCache(str(tmp_path / "absent.db"), create=False)
    assert not (tmp_path / "absent.db").exists()


def test_unreachable_server_is_a_clear_error():
    pytest.importorskip("psycopg")
    with pytest.raises(CacheError, match="cannot open the plan cache"):
        PlanCache("postgresql://nobody@127.0.0.1:1/none")


def test_url_forms(tmp_path, monkeypatch):
    assert resolve_url(str(tmp_path / "x.db")) == f"sqlite:///{tmp_path / 'x.db'}"
    assert resolve_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert resolve_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    monkeypatch.setenv("CONVTUNE_DB", str(tmp_path / "env.db"))
    assert resolve_url(None).endswith("env.db")
    monkeypatch.delenv("CONVTUNE_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert resolve_url(None) == f"sqlite:///{tmp_path / 'convtune' / 'plans.db'}"
    with pytest.raises(CacheError, match="unsupported database 'mysql'"):
        PlanCache("mysql://u@h/db")


def test_sqlite_runs_in_wal_mode(tmp_path):
    cache = PlanCache(str(tmp_path / "wal.db"))
    with cache.engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() > 0


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_export_then_import_reproduces_the_plan_table(cache_url, tmp_path, fmt):
    src = PlanCache(cache_url)
    for i in range(3):
        src.put(decision(problem(i)))
    src.put(decision(problem(0, "wgrad"), GPU_B, winner_ms=0.25))
    text_out = write_export(src.export_records(), fmt)
    dst = PlanCache(str(tmp_path / f"dst-{fmt}.db"))
    report = dst.import_records(read_export(text_out))
    assert report["added"] == 4 and not report["conflicts"]
    assert dst.export_records() == src.export_records()
    again = dst.import_records(read_export(text_out))
    assert again["identical"] == 4


def test_import_keeps_the_better_measured_plan_and_reports_conflicts(tmp_path):
    ours = PlanCache(str(tmp_path / "ours.db"))
    theirs = PlanCache(str(tmp_path / "theirs.db"))
    ours.put(decision(problem(0), winner_ms=2.0))
    ours.put(decision(problem(1), winner_ms=1.0))
    theirs.put(decision(problem(0), winner_ms=1.0, strategy="im2col", config={"chunk": 1}))  # faster: taken
    theirs.put(decision(problem(1), winner_ms=3.0, strategy="im2col", config={"chunk": 1}))  # slower: kept ours
    report = ours.import_records(read_export(write_export(theirs.export_records(), "json")))
    assert report["replaced"] == 1 and report["kept"] == 1 and len(report["conflicts"]) == 2
    by_key = {r["problem_key"]: r for r in ours.plan_rows()}
    assert by_key[problem(0).key()]["strategy"] == "im2col"
    assert by_key[problem(1).key()]["strategy"] == "fft"


@pytest.mark.parametrize("content, message", [
    ("{\"format\": \"other\"}", "not a convtune plan export"),
    ("{\"format\": \"convtune-plans\", \"format_version\": 7, \"plans\": []}", "format version 7"),
    ("{not json", "not valid JSON"),
    ("a,b\n1,2\n", "CSV columns"),
])
def test_malformed_exports_are_refused(content, message):
    with pytest.raises(CacheError, match=message):
        read_export(content)


def test_runtime_reads_the_cache_and_times_nothing_on_a_hit(tmp_path):
    import numpy as np
    url = str(tmp_path / "rt.db")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 9, 9), dtype=np.float32)
    w = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
    first = convtune.Runtime(store=PlanCache(url), planner_options={"timer": FakeTimer()})
    y1 = convtune.conv(x, w, runtime=first)
    assert first.tuned == 1
    # a new process: a new cache object and runtime; the hit must not time anything
    second = convtune.Runtime(store=PlanCache(url), planner_options={"timer": FailingTimer()})
    y2 = convtune.conv(x, w, runtime=second)
    assert second.tuned == 0 and second.store.reads == 1
    np.testing.assert_array_equal(y1, y2)


def test_use_cache_sets_the_default_runtime(tmp_path):
    previous = convtune.set_default_runtime(None)
    try:
        rt = convtune.use_cache(str(tmp_path / "default.db"), timer=FakeTimer())
        assert convtune.default_runtime() is rt
        p = problem()
        convtune.tune(p)
        assert PlanCache(str(tmp_path / "default.db")).get(p, get_backend("numpy").device_info().key()) is not None
    finally:
        convtune.set_default_runtime(previous)


def test_round_trip_decisions_are_stored_and_reused(cache_url):
    """A layer's kept-spectra decision goes to the cache (meta rows, no schema change); a new runtime
    on the same cache reads it and times nothing."""
    import numpy as np
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(12, 12), kernel_size=5, padding=2)
    first = convtune.Runtime(store=PlanCache(cache_url), planner_options={"timer": FakeTimer(times={"fft-trip": 1e-3})})
    be = get_backend("numpy")
    made = first.round_trip_for(p.for_pass("wgrad"), be)  # any pass names the layer
    assert made.pays and made.problem == p and first.tuned == 3  # the three per-pass plans, tuned first
    second = convtune.Runtime(store=PlanCache(cache_url), planner_options={"timer": FailingTimer()})
    got = second.round_trip_for(p, be)
    assert got == made and second.tuned == 0
    assert len(PlanCache(cache_url).records("trip")) == 1
    layer = convtune.Conv2d(3, 4, 5, padding=2, seed=0, runtime=second, keep_spectra="auto")
    y = layer(np.random.default_rng(0).standard_normal(p.x_shape, dtype=np.float32))
    assert layer._trip[1] is not None and layer._trip[1].config == made.config and y.shape == p.y_shape


def test_a_half_precision_layers_round_trip_decision_is_stored_apart_and_reused(cache_url):
    """A bfloat16 channels_last layer's kept-spectra decision (its float32 trip between conversions, roundtrip v8)
    is stored under its own key, beside the float32 layer's, and read back by a new runtime without timing."""
    be = get_backend("numpy")
    plain = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(12, 12), kernel_size=5, padding=2)
    half = plain.replace(dtype="bfloat16", layout="channels_last")
    first = convtune.Runtime(store=PlanCache(cache_url), planner_options={"timer": FakeTimer(times={"fft-trip": 1e-3})})
    made = {p: first.round_trip_for(p, be) for p in (plain, half)}
    assert all(d.pays and d.winner is not None for d in made.values()) and made[half].problem == half
    assert len(PlanCache(cache_url).records("trip")) == 2
    second = convtune.Runtime(store=PlanCache(cache_url), planner_options={"timer": FailingTimer()})
    assert second.round_trip_for(half, be) == made[half] and second.tuned == 0


def test_the_cool_down_after_failures_starts_at_a_second_and_doubles_to_its_cap():
    """A database that failed is left alone 1 s, then 2, 4, ... up to cooldown_s: back within a second or two of a
    restart, and asked only now and then while it stays down."""
    from convtune.cache.connect import cooldown
    assert [cooldown(n, 30.0) for n in range(1, 8)] == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert cooldown(1, 0.5) == 0.5 and cooldown(10 ** 6, 30.0) == 30.0


def test_call_threads_are_kept_and_a_hung_call_keeps_only_its_own():
    """PostgreSQL's calls run under deadlines on kept daemon threads: sequential calls reuse one thread, and a call
    that hangs (a frozen server) keeps its thread while the next call gets another."""
    import threading
    from convtune.cache.connect import _Callers

    def ours():
        return sum(t.name == "convtune-cache-call" for t in threading.enumerate())
    callers, before = _Callers(), ours()
    for i in range(200):
        box, done = callers.call(lambda i=i: i)
        assert done.wait(5) and box["value"] == i
    assert ours() - before == 1
    hang = threading.Event()
    _box, hung = callers.call(hang.wait)
    assert not hung.wait(0.1)
    box, done = callers.call(lambda: 1 / 0)
    assert done.wait(5) and isinstance(box["error"], ZeroDivisionError) and ours() - before == 2
    hang.set()
    assert hung.wait(5)


def test_leases_not_given_back_are_warned_of_once(caplog):
    """A cache that stops answering while a process gives its leases back: one warning (each lease runs out by
    itself), the rest at DEBUG, not one warning per lease from every process of a cluster."""
    import logging
    from convtune.errors import CacheError
    from convtune.worklist import Leases

    class Down:
        def release_lease(self, problem, device_key, holder):
            raise CacheError("postgresql://cache/plans is not answering")
    leases = Leases(Down(), ttl_s=90)
    with caplog.at_level(logging.DEBUG, logger="convtune"):
        for n in (1, 2, 3):
            leases.release(problem(n), "dev")
    said = [r for r in caplog.records if "could not give back the lease" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING, logging.DEBUG, logging.DEBUG]
    assert "runs out in 90 s" in said[0].getMessage()
