"""A newcomer's first hour: progress in logs, options checked first, hints that work as printed,
explain that says what its numbers mean, info, an interrupted bench, report charts."""

import json
import logging
import shlex
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import convtune
from convtune import CandidateOutcome, Decision, MemoryPlanStore, Runtime, TimingStats
from convtune.cache import PlanCache
from convtune.cli import main
from convtune.planner import Planner
from conftest import FakeTimer
from test_cache import GPU_A, problem

EXAMPLE_DB = Path(__file__).resolve().parent.parent / "plans.db.example"
HUGE = """layers:
  - {name: fits, batch: 2, in_channels: 3, out_channels: 4, input: [9, 9], kernel: 3}
  - {name: huge, batch: 100000, in_channels: 64, out_channels: 64, input: [224, 224], kernel: 3, padding: 1}
"""


def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


def run_hint(hint: str):
    """A command the CLI printed, run exactly as printed."""
    args = shlex.split(hint)
    assert args[0] == "convtune", hint
    return run(*args[1:])


pytestmark = pytest.mark.usefixtures("fake_default_timer")


def test_tune_prints_progress_lines_where_stderr_is_no_terminal(tmp_path):
    result = run("tune", "starter", "--passes", "fwd", "--db", tmp_path / "p.db", "--backend", "numpy")
    assert result.exit_code == 0
    lines = [line for line in result.output.splitlines() if line.startswith("tuning ")]
    assert lines[0].startswith("tuning 1/5: conv3x3 fwd") and lines[-1].startswith("tuning 5/5: long1d fwd")


@pytest.mark.parametrize("args, message", [
    (["--keep-spectra", "--keep-limit", "lots"], "cannot read the size 'lots'"),
    (["--workspace-limit", "huge"], "cannot read the size 'huge'"),
    (["--passes", "fwd,back"], "unknown pass"),
    (["--strategies", "winograd"], "unknown strategy 'winograd'"),
    (["--keep-spectra", "--passes", "fwd"], "use it with --passes fwd,dgrad,wgrad"),
])
def test_options_are_checked_before_anything_is_tuned(tmp_path, monkeypatch, args, message):
    tuned = []
    monkeypatch.setattr(Planner, "tune", lambda self, p: tuned.append(p))
    result = run("tune", "starter", "--db", tmp_path / "p.db", "--backend", "numpy", *args)
    assert result.exit_code == 1 and message in result.output and tuned == []


def test_a_failed_layers_hint_runs_as_printed(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(HUGE)
    db = tmp_path / "p.db"
    result = run("tune", net, "--passes", "fwd", "--math", "tf32", "--db", db, "--backend", "numpy")
    assert result.exit_code == 1
    (line,) = [line for line in result.output.splitlines() if line.startswith("FAILED huge fwd")]
    hint = line.split("see `")[1].rstrip("`")
    shown = run_hint(hint)
    assert shown.exit_code == 0 and "failed" in shown.output and "operands and result" in shown.output


def test_explain_points_to_the_batch_sizes_that_were_measured(tmp_path):
    db = tmp_path / "p.db"
    assert run("tune", "starter", "--passes", "fwd", "--batch", "2", "--db", db, "--backend", "numpy").exit_code == 0
    result = run("explain", "conv3x3", "--net", "starter", "--pass", "fwd", "--db", db)  # the file's batch: 4
    assert result.exit_code == 0 and "measured at batch size 2 (not" not in result.output  # no --batch was given
    assert "measured at batch size 2:" in result.output
    (hint,) = [line.strip() for line in result.output.splitlines() if line.strip().startswith("convtune explain")]
    shown = run_hint(hint)
    assert "winner" in shown.output and "no measurements" not in shown.output
    by_key = run("explain", convtune.ConvProblem.make(batch=7, in_channels=16, out_channels=32, input_size=(32, 32),
                                                      kernel_size=3, padding=1).key(), "--db", db)
    (hint,) = [line.strip() for line in by_key.output.splitlines() if line.strip().startswith("convtune explain")]
    assert "winner" in run_hint(hint).output


def test_explain_shows_a_shipped_caches_device_without_being_asked():
    rows = PlanCache(str(EXAMPLE_DB), create=False, read_only=True).plan_rows()
    key = rows[0]["problem_key"]
    result = run("explain", key, "--db", EXAMPLE_DB)
    assert result.exit_code == 0
    assert "not measured on this machine; measured on gpu:NVIDIA H100" in result.output
    assert "winner" in result.output and "interquartile range" in result.output and " MiB" in result.output


def _close_call(tmp_path):
    p = problem()
    timing = lambda ms, spread: TimingStats(ms / 1e3, spread / 1e3, ms / 1e3, 25)  # noqa: E731
    win = CandidateOutcome("fft", {"sizes": [16, 16]}, "fft[a]", "winner", 0, 3e-7, timing(1.00, 0.10))
    near = CandidateOutcome("im2col", {"chunk": 2}, "im2col[b]", "ok", 0, 3e-7, timing(1.05, 0.02))
    cache = PlanCache(str(tmp_path / "p.db"))
    cache.put(Decision(p, GPU_A, win, (win, near), "measured", 1.0))
    return p


def test_explain_flags_a_win_within_noise(tmp_path):
    p = _close_call(tmp_path)
    result = run("explain", p.key(), "--db", tmp_path / "p.db", "--device", "H100")
    assert "WITHIN NOISE" in result.output and "1.05x faster" in result.output


def test_tune_says_not_timed_for_a_lone_candidate(tmp_path):
    result = run("tune", "starter", "--passes", "fwd", "--strategies", "torch", "--db", tmp_path / "p.db",
                 "--backend", "numpy")
    assert result.exit_code == 0 and "not timed" in result.output and "only one" in result.output


def test_info_prints_hints_whole_and_where_the_cache_location_came_from(monkeypatch, tmp_path):
    monkeypatch.delenv("CONVTUNE_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    result = run("info")
    assert "(the default location; --db or $CONVTUNE_DB choose another)" in result.output
    if "cupy: unavailable" in result.output:
        assert "'convtune[cuda13]' or 'convtune[cuda12]'" in result.output
    assert "(given by --db)" in run("info", "--db", tmp_path / "x.db").output


def test_an_interrupted_bench_says_where_its_results_are(tmp_path, monkeypatch):
    import convtune.bench.runner as runner

    def interrupted(layers, *args, checkpoint=None, **kwargs):
        checkpoint({"format": "convtune-bench", "layers": [], "complete": False})
        raise KeyboardInterrupt
    monkeypatch.setattr(runner, "run_bench", interrupted)
    out = tmp_path / "r.json"
    result = run("bench", "starter", "--backend", "numpy", "--db", tmp_path / "p.db", "-o", out)
    assert result.exit_code == 1 and f"the layers measured before it are in {out}" in result.output
    assert json.loads(out.read_text())["complete"] is False


def test_the_runtime_says_what_it_tuned_on_a_miss(caplog):
    rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": FakeTimer()})
    x, w = np.ones((2, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    with caplog.at_level(logging.INFO, logger="convtune"):
        convtune.conv(x, w, runtime=rt)
        convtune.conv(x[:1], w, runtime=rt)
    tuned = [r for r in caplog.records if "was not in the plan cache: tuned it in" in r.getMessage()]
    assert [r.levelno for r in tuned] == [logging.WARNING, logging.INFO]
    assert "convtune tune NETWORK" in tuned[0].getMessage()


def test_report_charts_have_linear_axes_from_zero_and_the_page_every_pass(tmp_path):
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from convtune.bench.report import layer_figure
    out = tmp_path / "r.json"
    assert run("bench", "starter", "--layers", "conv3x3,long1d", "--repeats", "3", "--backend", "numpy",
               "--db", tmp_path / "p.db", "-o", out).exit_code == 0
    doc = json.loads(out.read_text())
    fig = layer_figure(doc, plt)
    ax = fig.axes[0]
    assert ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0
    # the y-axis label fits the figure
    fig.canvas.draw()
    label, frame = ax.yaxis.label.get_window_extent(), fig.bbox
    assert frame.y0 <= label.y0 and label.y1 <= frame.y1 and frame.x0 <= label.x0
    assert "vs torch-fft" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)
    # a peer with no figure on any layer has no entry in the legend
    for entry in doc["layers"]:
        entry["round_trip"].pop("torch-fft", None)
    fig = layer_figure(doc, plt)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "vs torch-fp32" in legend and "vs torch-fft" not in legend
    plt.close(fig)
    assert run("report", out, "-o", tmp_path / "rep").exit_code == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert all(f"<td>{p}</td>" in page for p in ("fwd", "dgrad", "wgrad", "round trip"))
    # a sweep-only report has no empty layer table
    sweep = tmp_path / "s.json"
    assert run("bench", "--sweep", "--sweep-kernels", "3", "--sweep-inputs", "6", "--sweep-settings", "2x3",
               "--repeats", "3", "--backend", "numpy", "--db", tmp_path / "p.db", "-o", sweep).exit_code == 0
    assert run("report", sweep, "-o", tmp_path / "rep2").exit_code == 0
    page = (tmp_path / "rep2" / "index.html").read_text()
    assert "Synthetic sweep" in page and "<h2>Layers" not in page


def test_the_demo_hints_commands_that_run_as_printed_and_keeps_one_file(tmp_path, monkeypatch):
    """The demo's "Next:" names its plan cache (not a literal DB), runs as printed, and the demo leaves one file
    beside the plan cache (made anew each time), no temporary directory; its cached second pass prints no progress
    line, and it explains a winner that won clearly (or none)."""
    monkeypatch.setenv("CONVTUNE_DB", str(tmp_path / "plans.db"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    result = run("demo", "--backend", "numpy")
    assert result.exit_code == 0, result.output
    second = result.output.split("2. the same again")[1].split("3. why")[0]
    assert "tuning 1/" not in second and "all 15 plans came from the cache" in second
    (line,) = [line for line in result.output.splitlines() if line.startswith("Next: `")]
    hint = line.split("`")[1]
    assert str(tmp_path / "demo-plans.db") in hint and "DB" not in hint
    shown = run_hint(hint)
    # (it shows the demo's plans: which strategy won each is the timings' business, PyTorch's call most of the time)
    assert shown.exit_code == 0 and f"15 plan(s) in sqlite:///{tmp_path / 'demo-plans.db'}" in shown.output, \
        shown.output
    assert not list((tmp_path / "tmp").iterdir())
    assert run("demo", "--backend", "numpy").exit_code == 0  # made anew: its first run tunes again
    assert (tmp_path / "demo-plans.db").exists()


def test_hints_name_the_command_as_the_user_runs_it(monkeypatch):
    from convtune import commandline
    assert commandline.command("show", "--db", "my plans.db") == "convtune show --db 'my plans.db'"
    monkeypatch.setattr(commandline, "PROG", "bash scripts/convtune.sh")
    assert commandline.explain_hint("conv1", "resnet18", "fwd") == \
        "bash scripts/convtune.sh explain conv1 --net resnet18 --pass fwd"


def test_a_win_inside_the_noise_is_not_a_clear_win():
    from convtune.cli.tuning import clear_win
    row = dict(time_median_s=1.0, time_spread_s=0.05, repeats=5, speedup_next=1.5)
    assert clear_win(row)
    assert not clear_win({**row, "repeats": 1})  # decided on one timed run
    assert not clear_win({**row, "time_spread_s": 0.6})  # a spread over a tenth of the median
    assert not clear_win({**row, "speedup_next": 1.04})  # the runner-up within the spread


def test_tune_pending_with_nothing_pending_says_so(tmp_path):
    result = run("tune", "--pending", "--db", tmp_path / "p.db", "--backend", "numpy")
    assert result.exit_code == 0 and "nothing is pending" in result.output and "all 0 plans" not in result.output


def test_export_does_not_overwrite_a_file_unless_asked(tmp_path):
    db, out = tmp_path / "p.db", tmp_path / "plans.json"
    run("tune", "starter", "--passes", "fwd", "--db", db, "--backend", "numpy")
    out.write_text("mine")
    refused = run("export", "--db", db, "-o", out)
    assert refused.exit_code == 1 and "exists; --force replaces it" in refused.output and out.read_text() == "mine"
    assert run("export", "--db", db, "-o", out, "--force").exit_code == 0 and out.read_text().startswith("{")


def _bench_table(tmp_path, monkeypatch, records):
    """``convtune bench``'s table for results of one layer whose passes are ``records`` (a stand-in bench)."""
    import convtune.bench.runner as runner

    def fake(layers, *args, checkpoint=None, **kwargs):
        doc = {"format": "convtune-bench", "complete": True, "sweep": [], "copy_bandwidth_GBps": None,
               "dispatch_overhead": {"overhead_us": 1.0},
               "layers": [{"name": "conv3x3", "passes": records}]}
        checkpoint(doc)
        return doc
    monkeypatch.setattr(runner, "run_bench", fake)
    return run("bench", "starter", "--passes", "fwd", "--no-keep-spectra", "--backend", "numpy",
               "--db", tmp_path / "p.db", "-o", tmp_path / "r.json")


def test_bench_calls_a_plan_that_is_pytorchs_call_pytorchs_own_and_a_close_ratio_noise(tmp_path, monkeypatch):
    peer = {"median_ms": 1.0, "spread_ms": 0.02, "repeats": 5, "error": 0.0}
    fwd = {"convtune": {"plan": "torch[benchmark]", "median_ms": 0.2, "spread_ms": 0.5, "error": 0.0},
           "peers": {"torch-fp32": peer, "torch-fp32-ref": {"not_applicable": "a float32 problem"},
                     "torch-fft": {"not_applicable": "a 3x3 kernel"}}, "drop_in": {}, "paired": {}}
    result = _bench_table(tmp_path, monkeypatch, {"fwd": fwd})
    assert result.exit_code == 0, result.output
    assert "(PyTorch's own)" in result.output and "5.00x" not in result.output
    fwd["convtune"] = {"plan": "im2col[chunk=2]", "median_ms": 0.98, "spread_ms": 0.05, "error": 0.0}
    result = _bench_table(tmp_path, monkeypatch, {"fwd": fwd})
    assert "(1.02x, within noise)" in result.output
    fwd["convtune"] = {"plan": "im2col[chunk=2]", "median_ms": 0.5, "spread_ms": 0.01, "error": 0.0}
    assert "(2.00x)" in _bench_table(tmp_path, monkeypatch, {"fwd": fwd}).output


def test_a_busy_machine_is_said_to_be_busy(monkeypatch):
    from convtune import commandline
    monkeypatch.setattr(commandline.os, "getloadavg", lambda: (9.5, 9.0, 9.0))
    monkeypatch.setattr(commandline.os, "cpu_count", lambda: 2)
    assert "busy while it tuned (load 9.5 on 2 cores)" in commandline.busy_note(" while it tuned")
    monkeypatch.setattr(commandline.os, "getloadavg", lambda: (1.0, 1.0, 1.0))
    assert commandline.busy_note() is None


def test_tunes_table_marks_a_win_on_one_run_and_a_win_inside_the_noise(tmp_path):
    result = run("tune", "starter", "--passes", "fwd", "--db", tmp_path / "p.db", "--backend", "numpy")
    assert result.exit_code == 0 and "(one run)" in result.output  # the fake timer times each candidate once


def test_explain_keeps_its_lines_readable(tmp_path):
    """Reasons wrap in their column: no line runs to the hundreds of characters a long reason made."""
    db = tmp_path / "p.db"
    run("tune", "starter", "--passes", "wgrad", "--db", db, "--backend", "numpy")
    shown = run("explain", "conv3x3", "--net", "starter", "--pass", "wgrad", "--db", db)
    assert shown.exit_code == 0 and "pruned: 3x3 kernel on the CPU" in shown.output
    assert max(len(line) for line in shown.output.splitlines()) <= 170
