"""convtune bench and report on the CPU: peers absent and said so, results file, figures."""

import json
import re

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
            # PyTorch's CPU convolution is the CPU's peer (PyTorch is installed where the tests run)
            assert rec["peers"]["torch-fp32"]["error"] < 1e-5 and rec["peers"]["torch-fp32"]["median_ms"] > 0
            assert rec["peers"]["torch-tf32"] == {"absent": "TF32 is a GPU mode"}
            # the pass through a patched PyTorch layer (its route: the plan, or PyTorch's own where it won)
            assert rec["drop_in"]["error"] < 1e-5 and rec["drop_in"]["median_ms"] > 0 and rec["drop_in"]["route"]
            assert rec["peers"]["torch-fp32-ref"] == {"not_applicable": "a float32 problem: torch-fp32 is its "
                                                                        "PyTorch peer"}
            # the layer's pass and PyTorch's timed again side by side (both medians and the paired ratio), where
            # their separate medians are within 2x of each other
            pair, ratio = rec["paired"], rec["peers"]["torch-fp32"]["median_ms"] / rec["drop_in"]["median_ms"]
            if 0.5 <= ratio <= 2:
                assert pair["peer"] == "torch-fp32" and pair["contender"] == "drop-in" and pair["repeats"] == 3
                assert pair["median_ms"] > 0 and pair["peer_ms"] > 0 and pair["ratio"] > 0
            else:
                assert pair == {"skipped": "the separate medians differ by more than 2x: timing them side by side "
                                           "would decide nothing"}
        per_pass = sum(r["convtune"]["median_ms"] for r in entry["passes"].values())
        assert entry["round_trip"]["drop-in"] == pytest.approx(sum(r["drop_in"]["median_ms"]
                                                                   for r in entry["passes"].values()))
        kept = entry["kept_spectra"]
        assert max(kept["errors"].values()) < 1e-5 and kept["median_ms"] > 0
        if kept["pays"]:  # the layer's round trip is the kept-spectra one, and the per-pass total is kept too
            assert entry["round_trip"]["convtune"] == kept["median_ms"] and entry["round_trip_plan"] == kept["plan"]
            assert entry["round_trip_per_pass_ms"] == pytest.approx(per_pass)
        else:
            assert entry["round_trip"]["convtune"] == pytest.approx(per_pass) and "round_trip_plan" not in entry
    assert doc["peers"]["cudnn-best"]["available"] is False
    assert "peer torch-tf32 absent" in res.output and "round trip" in res.output and "drop-in ms" in res.output
    assert doc["peers"]["cudnn-best"] == {"available": False, "reason": "no GPU: cuDNN needs CUDA"}
    assert doc["dispatch_overhead"]["calls"] > 0
    # the torch-fft peer (PyTorch is installed where the tests run): FFT-class layers only, with floors
    small, one_d = doc["layers"]
    assert doc["peers"]["torch-fft"] == {"available": True} and doc["copy_bandwidth_GBps"] > 0
    for rec in small["passes"].values():
        assert rec["peers"]["torch-fft"] == {"not_applicable": "a kernel under 7 per axis: nobody writes an FFT "
                                                               "convolution for it"} and "floor_ms" not in rec
    for rec in one_d["passes"].values():
        assert rec["peers"]["torch-fft"]["error"] < 1e-5 and rec["peers"]["torch-fft"]["median_ms"] > 0
        assert 0 < rec["floor_ms"] < rec["convtune"]["median_ms"]
    trip = one_d["torch_fft_round_trip"]
    assert max(trip["errors"].values()) < 1e-5 and one_d["round_trip"]["torch-fft"] == trip["median_ms"]
    assert one_d["round_trip_floor_ms"] == pytest.approx(2 * one_d["passes"]["fwd"]["floor_ms"])
    # a kept-spectra trip that pays is also timed whole, side by side with the peer's trip
    for entry in doc["layers"] + doc["sweep"]:
        kept, pair = entry.get("kept_spectra") or {}, entry.get("round_trip_paired")
        if kept.get("pays") and (entry.get("torch_fft_round_trip") or {}).get("median_ms"):
            assert pair["peer"] == "torch-fft" and pair["contender"] == "convtune" and pair["ratio"] > 0
            assert pair["median_ms"] > 0 and pair["peer_ms"] > 0
        else:
            assert pair is None
    assert "torch-fft ms (ratio)" in res.output and "floor ms" in res.output and "side by side" in res.output
    # the per-pass parity count of both contenders against PyTorch (the layers' passes, not the sweep's)
    for name in ("convtune", "drop-in"):
        assert re.search(rf"^{name}: \d+ of 6 passes within 1.03x of torch-fp32's time", res.output, re.M), res.output
    # how many passes were timed side by side depends on the machine's load (a pass whose separate medians are over
    # 2x apart is not); the line says how many there were, whatever their number
    paired = sum("ratio" in rec["paired"] for entry in doc["layers"] for rec in entry["passes"].values())
    said = rf" \({paired} of them timed side by side" if paired else r"(;|$)"
    assert re.search(rf"^drop-in: \d+ of 6 passes within 1.03x of torch-fp32's time{said}", res.output, re.M), \
        res.output


def test_parity_counts_the_passes_within_the_bound_and_names_the_rest():
    from convtune.bench.report import parity

    def rec(torch_ms, ours, drop_in=None):
        return {"peers": {"torch-fp32": {"median_ms": torch_ms}}, "convtune": {"median_ms": ours},
                "drop_in": {"median_ms": drop_in} if drop_in else {"failed": "x"}}
    results = {"layers": [{"name": "a", "passes": {"fwd": rec(1.0, 1.03, 0.5), "dgrad": rec(1.0, 1.1, 1.2)}},
                          {"name": "b", "passes": {"wgrad": rec(None, 1.0, 1.0)}}],
               "sweep": [{"name": "s", "passes": {"fwd": rec(1.0, 9.0)}}]}
    got = parity(results)
    none = {"null": {}, "noise": {}}
    assert got["convtune"] == {"within": 1, "passes": 2, "paired": 0, "below": [("a", "dgrad", 0.909)], **none}
    assert got["drop-in"] == {"within": 1, "passes": 2, "paired": 0, "below": [("a", "dgrad", 0.833)], **none}
    # a side-by-side measurement decides for the contender it names, over the two separate medians
    results["layers"][0]["passes"]["dgrad"]["paired"] = {"peer": "torch-fp32", "contender": "drop-in", "ratio": 0.99}
    results["layers"][0]["passes"]["fwd"]["paired"] = {"peer": "torch-fp32", "contender": "drop-in", "ratio": 0.95}
    got = parity(results)
    assert got["drop-in"] == {"within": 1, "passes": 2, "paired": 2, "below": [("a", "fwd", 0.95)], **none}
    assert got["convtune"]["paired"] == 0 and got["convtune"]["within"] == 1
    # a pairing with another peer (torch-tf32 for a tf32 problem) does not stand for torch-fp32's
    results["layers"][0]["passes"]["fwd"]["paired"]["peer"] = "torch-tf32"
    assert parity(results)["drop-in"]["paired"] == 1
    assert parity(results, peer="torch-tf32")["drop-in"] == {"within": 0, "passes": 1, "paired": 1,
                                                             "below": [("a", "fwd", 0.95)], **none}
    # the peer timed against itself in the same turns: reported beside a pass below, never counted as within
    results["layers"][0]["passes"]["fwd"]["paired"]["null_ratio"] = 0.94
    results["layers"][0]["passes"]["dgrad"]["paired"].update(peer="torch-tf32", null_ratio=1.01)
    got = parity(results, peer="torch-tf32")["drop-in"]
    assert got["within"] == 1 and got["below"] == [("a", "fwd", 0.95)]
    assert got["null"] == {("a", "fwd"): 0.94, ("a", "dgrad"): 1.01} and got["noise"] == {("a", "fwd"): 0.94}
    results["layers"][0]["passes"]["fwd"]["paired"]["null_ratio"] = 0.97  # nearer 1 than the pass: not noise
    assert parity(results, peer="torch-tf32")["drop-in"]["noise"] == {}


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


# -- the torch-fft peer itself ----------------------------------------------------------------------------
PEER_FORMS = {  # (input size, kernel, keyword arguments)
    "2d-depthwise-same": ((2, 6, 13, 11), (6, 1, 7, 7), dict(padding=3, groups=6)),
    "2d-depthwise-multiplier": ((2, 3, 12, 12), (6, 1, 7, 9), dict(padding=(2, 4), groups=3)),
    "2d-dense-dilated": ((2, 4, 16, 15), (5, 4, 4, 3), dict(padding=(3, 1), dilation=(2, 3))),
    "2d-groups": ((1, 4, 14, 14), (6, 2, 7, 7), dict(padding=0, groups=2)),
    "1d-long-full": ((2, 3, 40), (3, 1, 40), dict(padding=39, groups=3)),
    "3d-dense": ((1, 2, 9, 8, 10), (3, 2, 7, 7, 7), dict(padding=3)),
    "2d-padding-beyond-the-kernel": ((1, 2, 9, 10), (2, 1, 7, 7), dict(padding=(8, 2), groups=2)),
}


@pytest.mark.parametrize("form", sorted(PEER_FORMS))
def test_the_torch_fft_peer_is_pytorchs_convolution_with_its_gradients(form):
    torch = pytest.importorskip("torch")
    from convtune.bench import torchfft
    from convtune.problem import ConvProblem
    x_shape, w_shape, kw = PEER_FORMS[form]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(w_shape, generator=gen, dtype=torch.float64, requires_grad=True)
    conv = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d, 5: torch.nn.functional.conv3d}[x.dim()]
    expected = conv(x, w, **kw)
    problem = ConvProblem.make(batch=x_shape[0], in_channels=x_shape[1], out_channels=w_shape[0],
                               input_size=x_shape[2:], kernel_size=w_shape[2:], **kw)
    assert torchfft.unsupported_reason(problem) is None
    sizes = []
    rfftn = torch.fft.rfftn

    def recording(t, s=None, dim=None):
        sizes.append(tuple(s))
        return rfftn(t, s=s, dim=dim)
    torch.fft.rfftn = recording
    try:
        y = torchfft.fft_conv(torch, x, w, problem)
    finally:
        torch.fft.rfftn = rfftn
    # the transforms are as small as a linear convolution allows: n + k - 1 of the unpadded input per
    # axis (padding up to k - 1 is a shift of the crop), padded only by what goes beyond that
    from convtune.fft.sizes import next_smooth
    beyond = [max(0, p - (k - 1)) for p, k in zip(problem.padding, problem.dilated_kernel)]
    assert sizes[0] == tuple(next_smooth(n + 2 * e + k - 1) for n, e, k in
                             zip(problem.input_size, beyond, problem.dilated_kernel))
    torch.testing.assert_close(y, expected, rtol=1e-10, atol=1e-10)
    dy = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad(y, (x, w), dy)
    torch.testing.assert_close(grads, torch.autograd.grad(expected, (x, w), dy), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("math", ["fp32", "tf32"])
def test_the_torch_fft_peer_runs_in_the_problems_math_mode_whatever_ran_before(math):
    """The torch-tf32 peer turns PyTorch's TF32 switches on; the torch-fft peer's passes and round trip set them to
    their problem's math mode on every run (on the GPU a dense layer's complex product ran in TF32 otherwise)."""
    torch = pytest.importorskip("torch")
    import numpy as np
    from convtune.bench import torchfft
    from convtune.problem import ConvProblem
    p = ConvProblem.make(batch=1, in_channels=2, out_channels=2, input_size=(12,), kernel_size=(7,), padding=3,
                         math=math)
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal(p.x_shape, dtype=np.float32), rng.standard_normal(p.w_shape, dtype=np.float32)
    dy = rng.standard_normal(p.y_shape, dtype=np.float32)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    runs = [torchfft.make_pass(torch, p, x, w), torchfft.make_pass(torch, p.for_pass("dgrad"), dy, w),
            torchfft.make_pass(torch, p.for_pass("wgrad"), x, dy), torchfft.round_trip(torch, p, x, w, dy)]
    try:
        for run in runs:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = math == "fp32"
            run()
            assert torch.backends.cuda.matmul.allow_tf32 is (math == "tf32")
            assert torch.backends.cudnn.allow_tf32 is (math == "tf32")
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def test_the_torch_fft_peer_is_for_fft_class_layers_only():
    from convtune.bench import torchfft
    from convtune.problem import ConvProblem
    big = dict(batch=2, in_channels=4, out_channels=4, input_size=(32, 32), kernel_size=9, padding=4)
    assert torchfft.unsupported_reason(ConvProblem.make(**big)) is None
    assert "strided" in torchfft.unsupported_reason(ConvProblem.make(**{**big, "stride": 2}))
    assert "under 7" in torchfft.unsupported_reason(ConvProblem.make(**{**big, "kernel_size": (9, 5)}))
    assert torchfft.unsupported_reason(ConvProblem.make(**{**big, "kernel_size": (9, 4), "dilation": 2})) is None
    assert "float16" in torchfft.unsupported_reason(ConvProblem.make(**big, dtype="float16"))
    # the floor: each operand and the result once, at the given bandwidth; a round trip moves six tensors
    p = ConvProblem.make(**big)
    assert torchfft.floor_ms(p, 1e9) == pytest.approx(p.min_bytes() / 1e9 * 1e3)
    assert torchfft.floor_ms(p, None) is None


def test_a_half_precision_bench_has_pytorch_in_its_dtype_and_in_float32(tmp_path, fake_default_timer):
    pytest.importorskip("torch")
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: l, batch: 2, in_channels: 4, out_channels: 4, input: [10, 10], kernel: 3, "
                   "padding: 1}\n")
    out = tmp_path / "half.json"
    res = CliRunner().invoke(main, ["bench", str(net), "--dtype", "bfloat16", "--layout", "channels_last",
                                    "--repeats", "3", "--backend", "numpy", "--db", str(tmp_path / "p.db"),
                                    "-o", str(out)])
    assert res.exit_code == 0, res.output
    for rec in json.loads(out.read_text())["layers"][0]["passes"].values():
        ours = rec["convtune"]  # timed as training runs it: the PyTorch layer on bfloat16 channels_last tensors
        assert ours["via"].startswith("convtune.torch") and ours["error"] <= 2 ** -7 and ours["median_ms"] > 0
        same, ref = rec["peers"]["torch-fp32"], rec["peers"]["torch-fp32-ref"]
        # PyTorch in bfloat16 is within bfloat16's bound; in float32 on the same rounded operands, far inside it
        assert 1e-5 < same["error"] <= 2 ** -7 and ref["error"] < 1e-5 and ref["median_ms"] > 0
        # the layer's call (convtune's, in half precision) timed again side by side with PyTorch in bfloat16
        if "skipped" not in rec["paired"]:
            assert rec["paired"]["contender"] == "convtune" and rec["paired"]["peer"] == "torch-fp32"
            assert rec["paired"]["ratio"] > 0 and rec["paired"]["repeats"] == 3
    assert "torch-fp32-ref ms (ratio)" in res.output
    assert re.search(r"^convtune: \d+ of 3 passes within 1.03x of torch-fp32's time", res.output, re.M), res.output


def test_a_peer_that_cannot_be_built_is_its_failure_not_the_benchs(fake_timer):
    """The cuDNN peer tunes when it is made: a problem no engine takes (a 3-D or long 1-D layer on the H100)
    raised TuningError out of the bench and stopped it; it is that peer's failure, and the others still run."""
    from convtune import ConvProblem, MemoryPlanStore, Runtime
    from convtune.backend import get_backend
    from convtune.bench.peers import Peer
    from convtune.bench.runner import bench_pass
    from convtune.errors import TuningError

    def no_engine(problem, a, b):
        raise TuningError("no candidate survived for it:\n  cudnn[*]: unsupported (rank 3)")
    backend = get_backend("numpy")
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": fake_timer})
    rec = bench_pass(p, backend, rt, fake_timer, [Peer("cudnn-best", no_engine)])
    assert rec["peers"]["cudnn-best"] == {"failed": "TuningError: no candidate survived for it: cudnn[*]: "
                                                    "unsupported (rank 3)"}
    assert rec["convtune"]["error"] < 1e-5


@pytest.mark.parametrize("drop_in_s, paired", [(1.1e-3, True), (0.4e-3, False)])
def test_a_pass_is_timed_side_by_side_with_pytorch_where_their_medians_are_close(drop_in_s, paired):
    """After tuning, the PyTorch layer's pass and the parity peer are timed again in turns (``interleaved``), and
    the record keeps both medians and the median of the per-repeat ratios; where the separate medians are more
    than 2x apart nothing is timed again (the verdict is not in doubt)."""
    pytest.importorskip("torch")
    from convtune import ConvProblem, MemoryPlanStore, Runtime
    from convtune.backend import get_backend
    from convtune.bench.peers import Peer
    from convtune.bench.runner import bench_pass
    from convtune.direct.reference import reference
    from convtune.timing import TimingStats

    class Timer:
        repeats = 5

        def __init__(self):
            self.interleaved_calls = []

        def __call__(self, fn, backend=None, label="", stop_above=None):
            fn()
            t = {"torch-fp32": 1e-3, "drop-in": drop_in_s}.get(label, 2e-3)
            return TimingStats(t, 0.0, t, 1)

        def interleaved(self, fns, backend, label="", repeats=None):
            self.interleaved_calls.append((label, len(fns), repeats))
            for fn in fns:
                fn()
            return [TimingStats.from_samples([1e-3, 1.2e-3, 0.9e-3], keep=True),
                    TimingStats.from_samples([1e-3, 1e-3, 1e-3], keep=True),
                    TimingStats.from_samples([1e-3, 1.1e-3, 0.9e-3], keep=True)]
    backend, timer = get_backend("numpy"), Timer()
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    peer = Peer("torch-fp32", lambda q, a, b: (lambda: reference(backend.xp, q, a, b)))
    rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": timer, "strategies": ["im2col"]})
    rec = bench_pass(p, backend, rt, timer, [peer])
    if paired:
        # the peer, the layer's pass and the peer again (its ratio to itself: how far apart two runs of one call come)
        assert timer.interleaved_calls == [("torch-fp32 / drop-in", 3, 5)]  # (CPU: the timer's repeats)
        assert rec["paired"] == {"peer": "torch-fp32", "contender": "drop-in", "peer_ms": 1.0, "median_ms": 1.0,
                                 "ratio": 1.0, "ratio_spread": pytest.approx(0.3), "repeats": 3,
                                 "null_ratio": 1.0, "null_spread": pytest.approx(1.2 / 1.1 - 1)}
    else:
        assert timer.interleaved_calls == [] and "skipped" in rec["paired"]


def test_a_layer_whose_every_pass_is_pytorchs_is_timed_as_its_training_runs_its_gradients(fake_timer):
    """A layer whose training calls run PyTorch's own convolution and autograd (every pass settled to it): the
    drop-in's gradient passes are PyTorch's computation of them, not the route's per-pass calls (a path its
    training never takes); its forward is the route's call. A layer with a plan of convtune's keeps the route."""
    pytest.importorskip("torch")
    from convtune import ConvProblem, Runtime
    from convtune.backend import get_backend
    from convtune.bench import runner
    from convtune.planner import random_operands
    from convtune.strategies.reference import reference
    backend = get_backend("numpy")
    layer = dict(batch=2, in_channels=3, out_channels=4, input_size=(8, 9), kernel_size=3, padding=1)
    for strategies, by_autograd in ((["torch"], True), (["im2col"], False)):
        rt = Runtime(planner_options={"strategies": strategies, "timer": fake_timer})
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = ConvProblem.make(**layer, pass_=pass_)
            a, b = random_operands(backend, p, 0)
            ref = reference(backend.xp, p, a.astype("float64"), b.astype("float64"))
            rec, call = runner.bench_drop_in(p, a, b, ref, backend, rt, fake_timer)
            assert rec["error"] < 1e-5 and call is not None, rec
            assert rec["route"].endswith("run by PyTorch's autograd (every pass of the layer is PyTorch's)") == \
                (by_autograd and pass_ != "fwd"), rec["route"]


def test_bench_model_ratios_pair_each_convtune_mode_with_each_pytorch_mode_and_pytorch_with_itself():
    """``convtune.bench.steps``: peer over convtune (medians, and round by round where rounds were kept); a
    PyTorch copy (``--null``) against its original only; failed modes left out."""
    from convtune.bench.steps import paired, speedups
    doc = {"modes": [{"mode": "torch-amp-bf16", "step_ms": 20.0, "round_ms": [20.0, 22.0, 18.0]},
                     {"mode": "torch-amp-bf16-again", "step_ms": 25.0, "round_ms": [25.0, 22.0, 18.0]},
                     {"mode": "torch-fp32", "failed": "RuntimeError: out of memory"},
                     {"mode": "convtune-amp-bf16", "step_ms": 10.0, "round_ms": [10.0, 11.0, 12.0]}]}
    assert speedups(doc) == {"torch-amp-bf16-again vs torch-amp-bf16": 0.8, "convtune-amp-bf16 vs torch-amp-bf16": 2.0}
    rounds = paired(doc)
    assert rounds["convtune-amp-bf16 vs torch-amp-bf16"] == (2.0, 1.5, 2.0)  # 2.0, 2.0, 1.5
    assert rounds["torch-amp-bf16-again vs torch-amp-bf16"] == (1.0, 0.8, 1.0)
    del doc["modes"][0]["round_ms"]  # one side without rounds (run one mode after another): no round ratio
    assert "convtune-amp-bf16 vs torch-amp-bf16" not in paired(doc)


def test_bench_model_says_which_pytorch_steps_were_host_bound():
    """A PyTorch mode whose host time is 90% of its step or more, eager on a GPU: named; its copy, convtune's
    modes, a failed mode, a graphed run and a CPU run are not."""
    from convtune.bench.steps import host_bound
    doc = {"device": "cuda:0", "graph": False,
           "modes": [{"mode": "torch-amp-bf16", "step_ms": 30.0, "host_ms": 29.5},
                     {"mode": "torch-amp-bf16-again", "step_ms": 30.0, "host_ms": 29.5},
                     {"mode": "torch-fp32", "step_ms": 30.0, "host_ms": 20.0},
                     {"mode": "torch-tf32", "failed": "RuntimeError: out of memory"},
                     {"mode": "convtune-amp-bf16", "step_ms": 30.0, "host_ms": 29.9}]}
    assert host_bound(doc) == ["torch-amp-bf16"]
    assert host_bound({**doc, "graph": True}) == [] and host_bound({**doc, "device": "cpu"}) == []
    doc["modes"][2]["host_ms"] = 27.0  # exactly 90%
    assert host_bound(doc) == ["torch-amp-bf16", "torch-fp32"]


def test_a_kept_spectra_trip_is_timed_side_by_side_with_the_torch_fft_peers():
    """bench_trip_paired: the runtime's trip and the torch-fft peer's, each whole, in turns (the CPU's timer), the
    peer's time over convtune's; a timer that cannot interleave, or a trip that cannot be built, says so."""
    pytest.importorskip("torch")
    from types import SimpleNamespace
    from convtune import ConvProblem
    from convtune.backend import get_backend
    from convtune.bench.runner import bench_trip_paired
    from convtune.roundtrip import TripConfig
    from convtune.timing import CpuTimer
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=3, groups=3, input_size=(40,), kernel_size=17,
                         padding=8)
    decided = SimpleNamespace(round_trip_for=lambda problem, backend: SimpleNamespace(
        config=TripConfig(sizes=(64,), product="pointwise")))
    backend, timer = get_backend("numpy"), CpuTimer(repeats=3, min_time_s=0.002)
    got = bench_trip_paired(p, backend, decided, timer, pair_ms=1.0)
    assert got["peer"] == "torch-fft" and got["contender"] == "convtune" and got["repeats"] == 3
    assert got["ratio"] > 0 and got["median_ms"] > 0 and got["peer_ms"] > 0 and got["null_ratio"] > 0
    assert bench_trip_paired(p, backend, decided, object(), 1.0) == {
        "absent": "the timer cannot time calls side by side"}
    wrong = SimpleNamespace(round_trip_for=lambda problem, backend: SimpleNamespace(
        config=TripConfig(sizes=(8,), product="pointwise")))
    assert "failed" in bench_trip_paired(p, backend, wrong, timer, 1.0)


def test_bench_model_counts_the_cuda_graphs_its_timed_steps_made_and_replayed(monkeypatch):
    from convtune.bench import model
    now = [(10, 100, 0.5)]
    monkeypatch.setattr(model.replay, "counts", lambda: now[0])
    record, quiet = {"mode": "convtune-amp-bf16"}, {"mode": "torch-amp-bf16"}
    for counts in ((13, 140, 0.75), (14, 190, 1.0)):
        before = now[0]
        now[0] = counts
        model._count_graphs(record, before, 5)
        model._count_graphs(quiet, now[0], 5)  # (nothing made or replayed during its steps)
    assert (record["graphs_made"], record["graph_replays"], record["graph_steps"]) == (4, 90, 10)
    assert record["graph_capture_s"] == pytest.approx(0.5)
    assert "graphs_made" not in quiet


def test_bench_model_counts_pythons_garbage_collections_during_the_timed_steps(monkeypatch):
    import gc
    from convtune.bench import model
    monkeypatch.setattr(model.replay, "counts", lambda: (0, 0, 0.0))
    record = {"mode": "torch-amp-bf16"}
    for _ in range(2):
        with model._watched(record, 3):
            gc.collect(0)
            gc.collect()  # (a full collection: the oldest generation)
    assert record["gc_collections"] == 4 and record["gc_full"] == 2 and record["gc_s"] > 0
    assert "graphs_made" not in record  # (no CUDA graphs made or replayed: none counted)
    with model._watched(record, 3):
        pass
    assert record["gc_collections"] == 4 and all(cb.__self__.__class__ is not model._GcWatch
                                                 for cb in gc.callbacks if hasattr(cb, "__self__"))
