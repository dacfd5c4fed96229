"""The CLI through click's CliRunner, with a fake timer so tuning is quick."""

import json
import re

import pytest
from click.testing import CliRunner

from convtune.cli import main
from convtune.commandline import parse_size

TINY = """layers:
  - {name: small3x3, batch: 2, in_channels: 3, out_channels: 4, input: [10, 10], kernel: [3, 3], padding: 1}
  - {name: again3x3, batch: 2, in_channels: 3, out_channels: 4, input: [10, 10], kernel: [3, 3], padding: 1}
  - {name: long1d, batch: 2, in_channels: 2, out_channels: 2, input: [40], kernel: [15], padding: 7, groups: 2}
"""


pytestmark = pytest.mark.usefixtures("fake_default_timer")


@pytest.fixture
def net(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


@pytest.fixture
def db(tmp_path):
    return str(tmp_path / "plans.db")


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def test_tune_then_second_run_is_all_cache_hits(net, db):
    first = run("tune", net, "--db", db, "--backend", "numpy")
    assert first.exit_code == 0, first.output
    assert "6 tuned, 0 from the cache" in first.output  # 2 distinct shapes (again3x3 repeats small3x3) x 3 passes
    second = run("tune", net, "--db", db, "--backend", "numpy")
    assert second.exit_code == 0
    assert "nothing was timed" in second.output and "tuned " not in second.output.split("layer")[1]


def test_tune_keep_spectra_decides_each_layer_once(net, db):
    first = run("tune", net, "--db", db, "--backend", "numpy", "--keep-spectra")
    assert first.exit_code == 0, first.output
    assert "2 round-trip verdicts" in run("info", "--db", db).output
    rows = [l for l in first.stdout.splitlines() if "fft-trip[" in l]
    assert len(rows) == 2 and all(l.rstrip().endswith("tuned") for l in rows)  # 2 distinct layer shapes
    # the fake timer gives every candidate 1 s: a round trip (1 s) beats three per-pass plans (3 s)
    assert all("keep spectra" in l for l in rows)
    second = run("tune", net, "--db", db, "--backend", "numpy", "--keep-spectra")
    assert second.exit_code == 0, second.output
    assert all(l.rstrip().endswith("cache") for l in second.stdout.splitlines() if "fft-trip[" in l)
    again = run("tune", net, "--db", db, "--backend", "numpy", "--keep-spectra", "--retune")
    assert all(l.rstrip().endswith("tuned") for l in again.stdout.splitlines() if "fft-trip[" in l)
    bad = run("tune", net, "--db", db, "--backend", "numpy", "--keep-spectra", "--passes", "fwd")
    assert bad.exit_code == 1 and "--passes fwd,dgrad,wgrad" in bad.output


def test_tune_table_lists_each_distinct_problem(net, db):
    result = run("tune", net, "--db", db, "--passes", "fwd,wgrad", "--backend", "numpy")
    assert result.exit_code == 0
    lines = [l for l in result.stdout.splitlines() if l.startswith(("small3x3", "long1d"))]
    assert len(lines) == 4  # 2 shapes x 2 passes; again3x3 shares small3x3's
    assert "small3x3 (+1)" in result.stdout


def test_retune_measures_again(net, db):
    run("tune", net, "--db", db, "--passes", "fwd", "--backend", "numpy")
    again = run("tune", net, "--db", db, "--passes", "fwd", "--retune", "--backend", "numpy")
    assert "2 tuned, 0 from the cache" in again.output


def test_builtin_network_with_batch_override_and_math(db):
    result = run("tune", "wav2vec2", "--db", db, "--passes", "fwd", "--batch", "1", "--math", "tf32",
                 "--strategies", "im2col", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    assert "7 tuned" in result.output
    show = run("show", "--db", db, "--math", "tf32")
    assert show.output.count("im2col[") == 7 and "tf32" in show.output


def test_show_filters_and_marks_status(net, db):
    run("tune", net, "--db", db, "--backend", "numpy")
    out = run("show", "--db", db).output
    assert "current" in out and "6 plan(s)" in out
    assert "1 plan(s)" in run("show", "--db", db, "--pass", "wgrad", "--problem", "ker15").output
    assert "no plans match" in run("show", "--db", db, "--device", "no-such-gpu").output


def test_explain_by_layer_and_by_key(net, db):
    run("tune", net, "--db", db, "--backend", "numpy")
    out = run("explain", "small3x3", "--net", net, "--db", db, "--pass", "fwd").output
    assert "winner" in out and "im2col[" in out and "fft[" in out
    assert "fastest of" in out or "only candidate" in out
    # where the search's own time went, stored with the run (listing the candidates, the float64 reference)
    assert "the search took" in out and "its own work beside the candidates': " in out and "reference" in out
    from convtune.cache import PlanCache
    searches = PlanCache(db, create=False, read_only=True).records("search")
    assert len(searches) == 6 and all(d["phases"] and d["tuning_s"] >= sum(d["phases"].values()) for d in searches)
    key = [l for l in run("show", "--db", db).output.splitlines() if "ker15" in l and "dgrad" in l][0].split()[0]
    out = run("explain", key, "--db", db).output
    assert "dgrad" in out and "candidate" in out


def test_explain_errors(net, db):
    run("tune", net, "--db", db, "--passes", "fwd", "--backend", "numpy")
    assert "no layer named" in run("explain", "nope", "--net", net, "--db", db).output
    bad = run("explain", "nope", "--db", db)
    assert bad.exit_code != 0 and "not a problem key" in bad.output


def _without_export_time(text):
    return re.sub(r'"exported_at": "[^"]*"', '"exported_at": ""', text)


def test_export_import_round_trip(net, db, tmp_path):
    run("tune", net, "--db", db, "--backend", "numpy")
    for fmt in ("json", "csv"):
        out = tmp_path / f"plans.{fmt}"
        assert run("export", "--db", db, "--format", fmt, "-o", out).exit_code == 0
        other = str(tmp_path / f"other-{fmt}.db")
        imported = run("import", out, "--db", other)
        assert imported.exit_code == 0 and "6 added" in imported.output
        # the same plans, whatever second each export was written in
        assert _without_export_time(run("export", "--db", other, "--format", fmt).output) == \
            _without_export_time(run("export", "--db", db, "--format", fmt).output)
    doc = json.loads(run("export", "--db", db).output)
    assert doc["format"] == "convtune-plans" and len(doc["plans"]) == 6


def test_info_lists_backends_strategies_and_cache(db):
    from convtune.strategies import get_strategy
    out = run("info", "--db", db).output
    fft = f"fft v{get_strategy('fft').version}"
    assert "numpy: cpu:" in out and "strategies: " in out and fft in out and "plan cache:" in out


@pytest.mark.parametrize("args, message", [
    (["tune", "resnet51"], "unknown network 'resnet51'"),
    (["tune", "{bad}"], "unknown network"),
    (["tune", "MALFORMED"], "malformed YAML"),
    (["tune", "INVALID"], "dilated kernel spans"),
    (["tune", "alexnet", "--db", "postgresql://nobody@127.0.0.1:1/none"], "cannot open the plan cache"),
    (["tune", "alexnet", "--db", "mysql://x@y/z"], "unsupported database"),
    (["tune", "alexnet", "--passes", "forward"], "unknown pass(es) 'forward'"),
    (["tune", "alexnet", "--workspace-limit", "lots"], "cannot read the size"),
    (["tune", "alexnet", "--batch", "0"], "--batch takes positive integers"),
    (["tune", "alexnet", "--batch", "8,x"], "--batch takes positive integers"),
    (["tune", "alexnet", "--strategies", "winograd"], "unknown strategy 'winograd'"),
    (["show", "--db", "MISSING"], "no plan cache at"),
    (["import", "MISSING"], "cannot read"),
    (["import", "GARBAGE"], "not a convtune plan export"),
    (["export", "--db", "MISSING"], "no plan cache at"),
])
def test_bad_input_is_one_line_and_non_zero(tmp_path, db, args, message):
    if "postgresql" in " ".join(args):
        pytest.importorskip("psycopg")
    (tmp_path / "malformed.yaml").write_text("layers: [ {name: a, batch: 1\n")
    (tmp_path / "invalid.yaml").write_text(
        "layers: [{name: a, batch: 1, in_channels: 1, out_channels: 1, input: [4], kernel: [9]}]")
    (tmp_path / "garbage.json").write_text('{"hello": 1}')
    subst = {"MALFORMED": tmp_path / "malformed.yaml", "INVALID": tmp_path / "invalid.yaml",
             "MISSING": tmp_path / "missing.db", "GARBAGE": tmp_path / "garbage.json"}
    args = [str(subst.get(a, a)) for a in args]
    if "--db" not in args and args[0] == "tune":
        args += ["--db", db]
    result = run(*args)
    assert result.exit_code != 0
    assert message in result.output, result.output
    assert len([l for l in result.output.splitlines() if l.startswith("Error")]) == 1


def test_parse_size():
    assert parse_size("4GiB") == 4 << 30
    assert parse_size("512MB") == 512 * 10 ** 6
    assert parse_size("1e9") == 10 ** 9
    assert parse_size("none") is None


def test_calibrate_measures_stores_and_info_shows_it(db, calibrations):
    out = run("calibrate", "--db", db, "--backend", "numpy", "--elements", "4096").output
    assert re.search(r"factors \(per counted flop, powers of 2 = 1\): pow2 1\.00, smooth [\d.]+, other [\d.]+", out)
    assert "4099" in out and "80x80" in out
    assert "FFT calibration for cpu:" in run("info", "--db", db).output


def test_json_exports_carry_fft_calibrations_and_csv_says_it_does_not(net, db, tmp_path, calibrations):
    from convtune.cache import PlanCache
    from convtune.fft import cost
    run("tune", net, "--db", db, "--backend", "numpy")
    cost.store_calibration(PlanCache(db), "gpu:test-device", {"source": "t", "pow2": 1.0, "smooth": 1.5, "other": 3.5})
    out = tmp_path / "plans.json"
    run("export", "--db", db, "-o", out)
    assert json.loads(out.read_text())["fft_calibrations"]["gpu:test-device"]["smooth"] == 1.5
    other = str(tmp_path / "other.db")
    cost.store_calibration(PlanCache(other), "gpu:test-device-2", {"source": "local", "pow2": 1.0, "smooth": 1.2,
                                                                   "other": 2.0})
    imported = run("import", out, "--db", other).output
    assert "FFT calibrations: 1 added, 0 kept as they were" in imported
    assert cost.stored_calibrations(PlanCache(other))["gpu:test-device"]["other"] == 3.5
    assert "FFT calibrations: 0 added, 1 kept" in run("import", out, "--db", other).output
    assert "CSV holds plans only; the 1 FFT calibration(s) and 0 round-trip verdict(s) are not in it" in \
        run("export", "--db", db, "--format", "csv", "-o", tmp_path / "p.csv").output
    # a damaged calibration stops the import before anything is written
    doc = json.loads(out.read_text())
    doc["fft_calibrations"]["gpu:bad"] = {"pow2": 1.0}
    _import_is_refused(tmp_path, doc, "lacks positive factors for smooth, other")


def _import_is_refused(tmp_path, doc, message):
    """Importing the export ``doc`` fails with ``message`` and writes nothing."""
    from convtune.cache import PlanCache
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    third = str(tmp_path / "third.db")
    result = run("import", bad, "--db", third)
    assert result.exit_code != 0 and message in result.output
    assert PlanCache(third).counts()["plans"] == 0


def test_json_exports_carry_round_trip_verdicts(net, db, tmp_path):
    """Verdicts of `tune --keep-spectra` travel with the plans (JSON), a local one is kept, and a
    damaged one stops the import before anything is written."""
    from convtune.backend import get_backend
    from convtune.cache import PlanCache
    run("tune", net, "--db", db, "--backend", "numpy", "--keep-spectra")
    out = tmp_path / "plans.json"
    run("export", "--db", db, "-o", out)
    doc = json.loads(out.read_text())
    assert len(doc["round_trips"]) == 2
    other = str(tmp_path / "other.db")
    imported = run("import", out, "--db", other)
    assert imported.exit_code == 0 and "round-trip verdicts: 2 added, 0 kept" in imported.output
    assert PlanCache(other).records("trip") == PlanCache(db).records("trip")
    again = run("import", out, "--db", other).output
    assert "round-trip verdicts: 0 added, 2 kept" in again
    # a runtime on the imported cache follows the verdict without timing anything
    from convtune import Runtime
    from convtune.roundtrip import TripDecision
    from conftest import FailingTimer
    trip = TripDecision.from_dict(doc["round_trips"][0])
    rt = Runtime(store=PlanCache(other), planner_options={"timer": FailingTimer()})
    assert rt.round_trip_for(trip.problem, get_backend("numpy")) == trip
    assert "round-trip verdict(s) are not in it" in \
        run("export", "--db", db, "--format", "csv", "-o", tmp_path / "p.csv").output
    doc["round_trips"][1] = {"problem": "nonsense"}
    _import_is_refused(tmp_path, doc, "round-trip verdict 1 of the export is malformed")


@pytest.mark.parametrize("change, message", [
    (dict(strategy="winograd"), "unknown strategy 'winograd'"),
    (dict(strategy=5), "unknown strategy '5'"),
    (dict(config="{not json"), "its configuration is not JSON"),
    (dict(config="[1, 2]"), "not a JSON object"),
    (dict(config='{"chunk": 0}'), "chunk must be a whole number of at least 1"),
    (dict(time_median_s=float("nan")), "not a finite, non-negative number"),
    (dict(time_median_s="inf"), "not a finite, non-negative number"),
    (dict(time_spread_s=-1.0), "not a finite, non-negative number"),
    (dict(repeats=10 ** 30), "out of range"),
    (dict(workspace_bytes=1.5), "not a whole number"),
])
def test_an_import_that_would_break_lookups_is_refused_whole(net, db, tmp_path, change, message):
    """Each plan of an import is checked as the runtime will use it; the first bad one refuses the import, named,
    and nothing is written (these were accepted, then broke lookups)."""
    run("tune", net, "--db", db, "--backend", "numpy", "--strategies", "im2col")
    out = tmp_path / "plans.json"
    run("export", "--db", db, "-o", out)
    doc = json.loads(out.read_text())
    doc["plans"][1].update(change)
    _import_is_refused(tmp_path, doc, message)
    assert "plan 2" in run("import", tmp_path / "bad.json", "--db", tmp_path / "fourth.db").output


def test_a_nan_calibration_is_refused(net, db, tmp_path):
    out = tmp_path / "plans.json"
    run("tune", net, "--db", db, "--backend", "numpy")
    run("export", "--db", db, "-o", out)
    doc = json.loads(out.read_text())
    doc["fft_calibrations"] = {"gpu:nan": {"pow2": 1.0, "smooth": float("nan"), "other": 2.0}}
    _import_is_refused(tmp_path, doc, "lacks positive factors for smooth")


def test_where_the_tuning_time_went_adds_up_to_the_total():
    """``tune``'s closing table names every second: the candidates' build, verification and timing per strategy,
    the searches' phases, the searches' time none of those name, and the time outside the searches (the cache,
    leases); its rows add up to the total. With several workers the time outside is not shown (the seconds are
    summed over them)."""
    from types import SimpleNamespace

    from convtune.cli.tuning import _where_the_time_went

    def outcome(strategy, build, verify, timing):
        return SimpleNamespace(strategy=strategy, timing=object(), status="ok", reason="", build_s=build,
                               verify_s=verify, timing_s=timing)
    first, second = (SimpleNamespace(describe=lambda n=n: f"problem {n}") for n in (1, 2))
    decisions = [SimpleNamespace(tuning_s=2.0, phases={"the float64 reference": 0.2}, problem=second,
                                 outcomes=[outcome("cudnn", 0.0, 0.25, 0.75)]),
                 SimpleNamespace(tuning_s=3.0, phases={"listing cudnn": 0.5}, problem=first,
                                 outcomes=[outcome("cudnn", 0.25, 0.5, 0.75), outcome("torch", 0.0, None, 0.0)])]
    text, longest = _where_the_time_went(decisions, 6.0).split("\nthe longest searches:\n")
    assert longest.splitlines() == ["     3.0 s  problem 1 (cudnn 1.5 s of it)", "     2.0 s  problem 2 (cudnn 1.0 s of it)"]
    totals = {line[:40].strip(): float(line.split()[-1]) for line in text.splitlines()[3:]}
    assert totals == {"cudnn": 2.5, "torch": 0.0, "listing cudnn": 0.5, "the float64 reference": 0.2,
                      "the searches' other work": 1.8, "outside the searches (the cache, leases)": 1.0}, text
    assert sum(totals.values()) == pytest.approx(6.0)
    assert "outside the searches" not in _where_the_time_went(decisions, 6.0, workers=2)


def test_tune_compiles_the_next_problems_ahead_while_one_is_searched(net, db, monkeypatch):
    import threading
    import time

    from convtune.strategies import register, unregister
    from test_planner import correct, make_strategy

    monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
    prepared = []

    def slow(a, b, out, p, reference):
        time.sleep(0.02)  # (a search that takes a while: the thread gets ahead of it)
        return correct(a, b, out, p, reference)

    class Compiling(make_strategy("t-compiles-ahead", slow)):
        def prepare(self, p, configs, backend):
            prepared.append((p.key(), threading.current_thread().name))
    Compiling.name = "t-compiles-ahead"
    register(Compiling)
    try:
        result = run("tune", net, "--db", db, "--strategies", "t-compiles-ahead")
    finally:
        unregister("t-compiles-ahead")
    assert result.exit_code == 0, result.output
    keys = {k for k, _t in prepared}
    assert len(keys) == 6  # two shapes, three passes: each prepared, by its search or ahead of it
    assert any(t == "convtune-compile-ahead" for _k, t in prepared)
    assert "6 tuned" in result.output
