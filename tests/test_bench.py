"""convtune bench and report on the CPU: peers absent and said so, results file, figures."""

import json

import pytest
from click.testing import CliRunner

from convtune.bench.runner import round_trip, speedup
from convtune.cli import main

NET = """layers:
  - {name: small, batch: 2, in_channels: 4, out_channels: 4, input: [10, 10], kernel: [5, 5], padding: 2}
  - {name: one-d, batch: 2, in_channels: 4, out_channels: 4, input: [30], kernel: [9], groups: 4}
"""


pytestmark = pytest.mark.usefixtures("fake_default_timer")


@pytest.fixture
def results(tmp_path):
    net = tmp_path / "net.yaml"
    net.write_text(NET)
    out = tmp_path / "results.json"
    res = CliRunner().invoke(main, ["bench", str(net), "--sweep", "--sweep-kernels", "3,5", "--sweep-inputs", "6,8",
                                    "--sweep-settings", "2x3", "--repeats", "3", "--backend", "numpy",
                                    "--db", str(tmp_path / "plans.db"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return res, json.loads(out.read_text()), out


def test_bench_writes_results_with_errors_and_absent_peers(results):
    res, doc, _ = results
    assert doc["format"] == "convtune-bench" and doc["backend"] == "numpy"
    assert [l["name"] for l in doc["layers"]] == ["small", "one-d"]
    assert len(doc["sweep"]) == 4
    for entry in doc["layers"] + doc["sweep"]:
        assert set(entry["passes"]) == {"fwd", "dgrad", "wgrad"}
        for rec in entry["passes"].values():
            assert rec["convtune"]["error"] < 1e-5 and rec["convtune"]["median_ms"] > 0
            assert rec["peers"]["torch-fp32"] == {"absent": "no GPU: the peers are cuDNN-based and need CUDA"}
        per_pass = sum(r["convtune"]["median_ms"] for r in entry["passes"].values())
        kept = entry["kept_spectra"]
        assert max(kept["errors"].values()) < 1e-5 and kept["median_ms"] > 0
        if kept["pays"]:  # the layer's round trip is the kept-spectra one, and the per-pass total is kept too
            assert entry["round_trip"]["convtune"] == kept["median_ms"] and entry["round_trip_plan"] == kept["plan"]
            assert entry["round_trip_per_pass_ms"] == pytest.approx(per_pass)
        else:
            assert entry["round_trip"]["convtune"] == pytest.approx(per_pass) and "round_trip_plan" not in entry
    assert doc["peers"]["cudnn-best"]["available"] is False
    assert "peer torch-fp32 absent" in res.output and "round trip" in res.output
    assert doc["dispatch_overhead"]["calls"] > 0


def test_bench_uses_the_cache_the_second_time(tmp_path, results):
    _, doc, _ = results
    assert {rec["convtune"]["source"] for e in doc["layers"] for rec in e["passes"].values()} == {"measured"}
    net = tmp_path / "net.yaml"
    res = CliRunner().invoke(main, ["bench", str(net), "--repeats", "3", "--backend", "numpy",
                                    "--db", str(tmp_path / "plans.db"), "-o", str(tmp_path / "again.json")])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "again.json").read_text())
    assert {rec["convtune"]["source"] for e in again["layers"] for rec in e["passes"].values()} == {"cache"}
    # the round-trip decisions come from the cache too: the same verdicts, with their tuning-time figures
    assert [e["kept_spectra"]["decision"] for e in again["layers"]] == [e["kept_spectra"]["decision"]
                                                                        for e in doc["layers"]]


def test_report_makes_figures_and_a_page(results, tmp_path):
    _, _, out = results
    res = CliRunner().invoke(main, ["report", str(out), "-o", str(tmp_path / "rep")])
    assert res.exit_code == 0, res.output
    files = {p.name for p in (tmp_path / "rep").iterdir()}
    assert {"layers.png", "heatmap-c3-b2.png", "index.html"} <= files
    for name in ("layers.png", "heatmap-c3-b2.png"):
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "no GPU" in page and "small" in page and "heatmap-c3-b2.png" in page


def test_round_trip_and_speedup():
    passes = {p: {"convtune": {"median_ms": 1.0}, "peers": {"torch-fp32": {"median_ms": 3.0},
                                                            "cudnn-best": {"absent": "x"}}}
              for p in ("fwd", "dgrad", "wgrad")}
    totals = round_trip(passes)
    assert totals == {"convtune": 3.0, "torch-fp32": 9.0, "cudnn-best": None}
    assert speedup(totals, "torch-fp32") == 3.0 and speedup(totals, "cudnn-best") is None


@pytest.mark.parametrize("args, message", [
    (["bench"], "give a NETWORK, --sweep, or both"),
    (["bench", "alexnet", "--layers", "conv9"], "no layer(s) named conv9"),
    (["bench", "--sweep", "--sweep-kernels", "3,x"], "--sweep-kernels takes"),
    (["bench", "--sweep", "--sweep-settings", "32"], "is not BATCHxCHANNELS"),
    (["report", "MISSING"], "cannot read"),
    (["report", "NOTBENCH"], "not a convtune bench results file"),
])
def test_bench_and_report_bad_input(tmp_path, args, message):
    (tmp_path / "other.json").write_text('{"format": "something-else"}')
    args = [{"MISSING": str(tmp_path / "none.json"), "NOTBENCH": str(tmp_path / "other.json")}.get(a, a) for a in args]
    res = CliRunner().invoke(main, args + (["--db", str(tmp_path / "p.db")] if args[0] == "bench" else []))
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
