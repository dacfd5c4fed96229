"""Tune-ahead, the torch strategy, model specs in the CLI, and bench-model (CPU)."""

import copy
import json
import logging
import sys
import types

import pytest

torch = pytest.importorskip("torch")
from click.testing import CliRunner  # noqa: E402
from torch import nn  # noqa: E402

import convtune.torch as ct  # noqa: E402
from convtune.torch import _handback, _host  # noqa: E402
from convtune.torch import tuning as tuning_module  # noqa: E402
from convtune import MemoryPlanStore, Runtime  # noqa: E402
from convtune.cli import main  # noqa: E402
from convtune.errors import NetworkError  # noqa: E402
from convtune.network import is_model_spec, load_network  # noqa: E402
from convtune.planner import Planner  # noqa: E402
from convtune.problem import ConvProblem  # noqa: E402
from convtune.strategies import get_strategy, register, strategy_versions, unregister  # noqa: E402
from convtune.strategies.base import Config, Strategy  # noqa: E402
from conftest import FailingTimer, FakeTimer  # noqa: E402
from convtune.timing import TimingStats  # noqa: E402
from torch_models import MODELS  # noqa: E402


def make_runtime(strategies=("torch", "im2col"), timer=None):
    return Runtime(store=MemoryPlanStore(), planner_options={"timer": timer or FakeTimer(),
                                                             "strategies": list(strategies)})


# -- tune ahead ------------------------------------------------------------------------------------------
def test_collect_finds_each_call_with_the_passes_training_needs():
    model = MODELS["resnet_like"][0]()
    found = ct.collect(model, torch.randn(2, 3, 32, 32))
    assert len(found) == 9  # the stem and 2 x (3 convolutions + projection)
    assert found[0].name == "0" and found[0].passes == ("fwd", "wgrad")  # the input needs no gradient
    assert all(item.passes == ("fwd", "dgrad", "wgrad") for item in found[1:])
    frozen = MODELS["resnet_like"][0]()
    frozen[0].weight.requires_grad_(False)
    assert ct.collect(frozen, torch.randn(2, 3, 32, 32))[0].passes == ("fwd",)


@pytest.mark.parametrize("patched", [False, True])
def test_tune_ahead_then_training_is_all_cache_hits(patched):
    factory, shape = MODELS["slak_tiny"]
    model = factory()
    runtime = make_runtime()
    if patched:
        ct.patch(model, runtime=runtime)
    seen = []
    report = ct.tune(model, torch.randn(shape), runtime=runtime, progress=lambda done, total, label: seen.append(done))
    assert report.tuned == len(report.problems) and report.cached == 0 and not report.failed
    assert seen[0] == 0 and seen[-1] == len(report.problems)
    assert "problems:" in str(report)
    again = ct.tune(model, torch.randn(shape), runtime=runtime, progress=False)
    assert again.tuned == 0 and again.cached == len(report.problems)
    # a training step now times nothing: every plan comes from the store
    runtime.planner_options["timer"] = FailingTimer()
    ct.patch(model, runtime=runtime)
    model(torch.randn(shape)).sum().backward()
    assert runtime.tuned == report.tuned


def test_tune_ahead_says_where_its_time_went(monkeypatch):
    """Each part of a tune-ahead is timed (the parts in order, summing to its time) and the report says the ones that
    took 0.05 s or more."""
    from convtune.torch import tuning
    factory, shape = MODELS["resnet_like"]
    model = factory()
    runtime = make_runtime()
    ct.patch(model, runtime=runtime)
    slow = type(runtime).decision_for

    def slower(self, *args, **kwargs):  # (the plans' part made long enough to be said)
        import time
        time.sleep(0.01)
        return slow(self, *args, **kwargs)
    monkeypatch.setattr(type(runtime), "decision_for", slower)
    report = ct.tune(model, torch.randn(shape), runtime=runtime, progress=False)
    assert tuple(report.phases) == tuning.PHASES
    assert report.phases["plans"] >= 0.01 * len(report.problems) >= 0.05
    assert sum(report.phases.values()) == pytest.approx(report.seconds, abs=0.05)
    assert f"plans {report.phases['plans']:.1f} s" in str(report)


def test_tune_ahead_compiles_the_kernels_of_its_routes_stored_plans_at_once_before_building_them(monkeypatch):
    """(The CPU standing in for CUDA.) On plans already in the cache, the routes' kernels are compiled together
    (convtune.building.compile_ahead, on several threads) before the first route is resolved, with every pass's
    stored decision; a failure there costs nothing (each build compiles what it needs)."""
    from convtune.torch import _dispatch, tuning
    monkeypatch.setattr(tuning, "COMPILED_DEVICE_TYPES", {"cpu"})
    factory, shape = MODELS["resnet_like"]
    runtime = make_runtime()
    ct.tune(factory(), torch.randn(shape), runtime=runtime, progress=False)  # (the plans, stored)
    events = []
    monkeypatch.setattr(tuning, "compile_ahead", lambda decisions, backend: events.append(
        ("compile", sorted(d.problem.key() for d in decisions))) or 0)
    resolve = _dispatch.Route.resolve
    monkeypatch.setattr(_dispatch.Route, "resolve", lambda self, pass_: events.append(("resolve", pass_)) or
                        resolve(self, pass_))
    model = factory()
    ct.patch(model, runtime=runtime)
    report = ct.tune(model, torch.randn(shape), runtime=runtime, progress=False)
    assert report.cached == len(report.problems) and events[0][0] == "compile"
    assert events[0][1] == sorted(p.key() for p, _names in report.problems)  # every pass the routes need
    assert [e for e in events if e[0] == "compile"] == events[:1] and len(events) > 1
    monkeypatch.setattr(tuning, "compile_ahead", lambda decisions, backend: 1 / 0)
    model = factory()
    ct.patch(model, runtime=runtime)
    runtime.clear_memo()
    assert ct.tune(model, torch.randn(shape), runtime=runtime, progress=False).routes == report.routes


def test_the_default_progress_says_when_pytorchs_steps_are_timed(capsys):
    from convtune.torch import tuning
    tuning._announce(True, 3)
    tuning._announce(False, 3)
    assert capsys.readouterr().err == f"convtune: {tuning.STEPS_NOTE}\n"


def test_time_went_names_the_parts_of_a_twentieth_of_a_second_or_more():
    from convtune.text import time_went
    assert time_went({"a": 1.25, "b": 0.049, "c": 0.05}) == "a 1.2 s, c 0.1 s"
    assert time_went({}) == ""


def test_tune_ahead_resolves_the_patched_layers_routes_and_runs_their_duels(monkeypatch):
    """(The CPU standing in for CUDA.) Tune-ahead makes every patched layer's route and resolves the passes
    it will run: plans built, the duels run then; the first training step runs none and trains right."""
    from convtune.torch import _dispatch
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    duels = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        duels.append(tuple(a.shape))
        return [100e-6, 200e-6]  # the plan wins: its route keeps it
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    # (the autograd detour as measured on a quiet host: measured here, a loaded CI machine made it outweigh the fake
    # duels' 100 us a pass, and every route went back to PyTorch)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6)
    # (a CPU's steps are host-bound: the whole-step check, timed there, would hand the layers back at random)
    monkeypatch.setattr(_handback, "patched_step_ratios", lambda *args: [0.5])
    factory, shape = MODELS["resnet_like"]
    model = factory()
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    report = ct.tune(model, torch.randn(shape), runtime=runtime, progress=False)
    routes = runtime.layer_memo("torch")
    assert report.routes == len(routes) > 0 and f"{report.routes} layer routes resolved" in str(report)
    needed = sum(len(item.passes) for item in {i.route_key: i for i in ct.collect(model, torch.randn(shape))}.values())
    assert len(duels) == needed  # every pass of every distinct layer: each one's plan is im2col's
    assert all(label.startswith("im2col") for route in routes.values() for label in route.labels().values())

    def no_duel(*args, **kwargs):
        raise AssertionError("the first step ran a duel that tune-ahead should have run")
    monkeypatch.setattr(_dispatch, "per_call_seconds", no_duel)
    runtime.planner_options["timer"] = FailingTimer()
    plain = factory()
    plain.load_state_dict(model.state_dict())
    x = torch.randn(shape)
    model(x).sum().backward()
    plain(x).sum().backward()
    assert len(runtime.layer_memo("torch")) == len(routes)  # the layers found the routes made ahead
    for (name, a), (_, b) in zip(model.named_parameters(), plain.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def _host_bound_tune(monkeypatch, ratios, steps=None):
    """(The CPU standing in for CUDA.) A model whose two layers' im2col plans win their duels, tuned as for host-bound
    steps (or, given ``steps``, for steps whose host and whole times those are), with the whole-step check finding
    ``ratios`` (or raising, where ``ratios`` is an exception)."""
    from convtune.torch import _dispatch

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        if hosts is not None:
            hosts[:] = [10e-6, 200e-6]  # the plan saves the host 190 us a call
        return [100e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6)
    monkeypatch.setattr(_handback, "cannot_gain", lambda problem, passes, device: False)
    asked = []

    def fake_ratios(model, example_inputs, device, patched):
        asked.append(sorted(type(m).__name__ for m in patched))
        if isinstance(ratios, Exception):
            raise ratios
        return ratios
    monkeypatch.setattr(_handback, "patched_step_ratios", fake_ratios)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    if steps is not None:
        monkeypatch.setattr(_handback, "step_times", lambda *args, **kw: steps)
    report = ct.tune(model, torch.randn(2, 3, 8, 8), runtime=runtime, progress=False,
                     host_bound=True if steps is None else None)
    return model, report, asked


def test_a_models_weighed_steps_are_stored_and_a_later_tune_ahead_reads_them(monkeypatch, tmp_path):
    """(The CPU standing in for CUDA.) Weighing the steps runs PyTorch's own (its algorithm search on their first): the
    figures are stored in the plan cache, and a later tune-ahead of the same model (a new process, say) reads them; a
    model whose steps differ, or another PyTorch, or another host, is timed again."""
    from convtune.cache import PlanCache
    from convtune.torch import _dispatch, tuning
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [100e-6, 200e-6])
    monkeypatch.setattr(tuning, "floor_spares_search", lambda p: p.in_channels == 4)  # (the second layer's search)
    timed = []
    monkeypatch.setattr(_handback, "step_times",
                        lambda model, inputs, device, spared=None: timed.append(1) or (0.003, 0.010))
    url = f"sqlite:///{tmp_path / 'plans.db'}"

    said = []

    def tune(width=4, batch=2, training=True):
        runtime = Runtime(store=PlanCache(url), planner_options={"timer": FakeTimer({"im2col": 0.1, "torch": 1.0}),
                                                                 "strategies": ["im2col", "torch"]})
        model = nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 4, 3, padding=1))
        model.train(training)
        ct.patch(model, runtime=runtime)
        return ct.tune(model, torch.randn(batch, 3, 8, 8), runtime=runtime,
                       progress=lambda done, total, label: said.append(label))
    first = tune()
    assert timed == [1] and not first.steps_stored and (first.step_host_s, first.step_s) == (0.003, 0.010)
    assert first.steps_spared == 1
    assert said[0] == tuning.STEPS_NOTE  # (said before the steps are timed: they can take a minute)
    said.clear()
    again = tune()
    assert timed == [1] and again.steps_stored and (again.step_host_s, again.step_s) == pytest.approx((0.003, 0.010))
    assert tuning.STEPS_NOTE not in said
    assert "host 3.0 ms of a 10.0 ms step, 1 layer shape on cuDNN's heuristic pick, as stored" in str(again)
    tune(width=5)  # other steps: timed
    tune(batch=3)
    tune(training=False)
    assert len(timed) == 4
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not torch.backends.cudnn.benchmark)
    tune()
    monkeypatch.setattr(_handback, "pytorch_versions", lambda: "torch-another-version")
    tune()
    monkeypatch.setattr(_handback, "host_fingerprint", lambda: "another host")
    tune()
    assert len(timed) == 7
    tune()
    assert len(timed) == 7


def test_in_host_bound_steps_the_layers_left_patched_go_back_unless_the_whole_step_gains(monkeypatch, caplog):
    """The layers' duels keep them patched; the whole step, timed with them and without, decides: a step no faster
    by 2% (the median of the rounds) hands them all back, said at INFO; a faster one keeps them."""
    with caplog.at_level(logging.INFO, logger="convtune"):
        model, report, asked = _host_bound_tune(monkeypatch, [1.01, 0.97, 1.20, 0.99, 1.00])
    assert asked == [["Conv2d", "Conv2d"]]  # both layers, still patched when checked
    assert report.step_ratio == 1.00 and report.step_handed_back == report.handed_back == ["0", "2"]
    assert type(model[0]) is nn.Conv2d and type(model[2]) is nn.Conv2d
    assert "the whole step 1.00x with the layers left patched" in str(report) and "2 handed back then" in str(report)
    assert "took 1.00x its time with them handed back (median of 5 rounds, faster in 2)" in caplog.text
    model, report, _ = _host_bound_tune(monkeypatch, [0.90, 0.97, 1.01, 0.95, 0.96])
    assert report.step_ratio == 0.96 and report.handed_back == [] and isinstance(model[2], ct.Conv2d)
    model, report, _ = _host_bound_tune(monkeypatch, [0.90, 1.05, 0.95, 1.10, 0.96])  # two rounds slower: noise
    assert report.step_ratio == 0.96 and report.step_handed_back == ["0", "2"] and type(model[2]) is nn.Conv2d
    model, report, _ = _host_bound_tune(monkeypatch, RuntimeError("no clock"))  # not checked: they stay
    assert report.step_ratio is None and report.handed_back == [] and isinstance(model[0], ct.Conv2d)


def test_the_whole_step_is_checked_where_the_hosts_work_is_half_the_step_or_more(monkeypatch):
    """Steps not host-bound whose host's time is still half the step are checked too (the duels weighed the device's
    work and the host's together); steps the device's work dominates are not."""
    model, report, asked = _host_bound_tune(monkeypatch, [1.05] * 5, steps=(0.6, 1.0))
    assert report.host_bound is False and asked and report.step_handed_back == ["0", "2"]
    model, report, asked = _host_bound_tune(monkeypatch, [1.05] * 5, steps=(0.3, 1.0))
    assert report.host_bound is False and not asked and report.step_ratio is None and report.handed_back == []


def test_the_whole_step_check_times_the_patched_model_against_it_handed_back():
    """Rounds of turns, the order alternating: each turn's untimed steps, then its timed ones (the fastest counts);
    the patched modules run as PyTorch's inside the handed-back turns and are patched again afterwards; the model is
    left as it was."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Conv2d(4, 4, 3, padding=1))
    ct.patch(model, runtime=make_runtime(["torch"]))
    runtime_of = model[2].convtune_runtime
    before = {k: v.clone() for k, v in model.state_dict().items()}
    seen = []

    def timed(step, device):
        patched = isinstance(model[2], ct.Conv2d)
        step()
        seen.append(patched)
        return 1e-3, (3e-3 if patched else 4e-3) + 1e-6 * len(seen)  # (later steps slower: the fastest counts)
    ratios = _host.patched_step_ratios(model, torch.randn(2, 3, 8, 8), torch.device("cpu"), [model[2]], rounds=3,
                                       timed=timed)
    n = _host.CHECK_UNTIMED + _host.CHECK_TIMED
    assert seen == [True] * n + [False] * n + [False] * n + [True] * n + [True] * n + [False] * n
    assert len(ratios) == 3 and all(0.7 < r < 0.8 for r in ratios)  # (not clear: every round runs)
    assert isinstance(model[0], ct.Conv2d) and isinstance(model[2], ct.Conv2d)  # patched again, as they were
    assert model[2].convtune_runtime is runtime_of
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    def clear(step, device):  # the patched step 1.6x faster in every round: two rounds decide it
        return 0.0, 1e-3 if isinstance(model[2], ct.Conv2d) else 1.6e-3
    assert len(_host.patched_step_ratios(model, torch.randn(2, 3, 8, 8), torch.device("cpu"), [model[2]],
                                         timed=clear)) == 2
    with pytest.raises(RuntimeError, match="mid-step"):  # (a failure inside leaves the modules patched again)
        with ct.modules.restored_for_a_while([model[2]]):
            assert type(model[2]) is nn.Conv2d and not hasattr(model[2], "convtune_runtime")
            raise RuntimeError("mid-step")
    assert isinstance(model[2], ct.Conv2d) and model[2].convtune_runtime is runtime_of
    real = _host.patched_step_ratios(model, torch.randn(2, 3, 8, 8), torch.device("cpu"), [model[0], model[2]],
                                     rounds=2)
    assert len(real) == 2 and all(r > 0 for r in real)


def _two_layer_model():
    """A model whose first layer tunes to PyTorch's convolution (a runtime of the torch strategy alone) and
    whose second to im2col (a runtime of im2col alone), and the plain model it started as."""
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 5, 5, padding=2))
    model = copy.deepcopy(plain)
    ct.patch(model, runtime=make_runtime(["torch"]), filter=lambda m, name: name == "0")
    ct.patch(model, runtime=make_runtime(["im2col"]), filter=lambda m, name: name == "2")
    return plain, model


def test_tune_hands_back_the_layers_whose_every_pass_runs_pytorchs_convolution(caplog):
    plain, model = _two_layer_model()
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        report = ct.tune(model, x, runtime=make_runtime(), progress=False)
    assert report.handed_back == ["0"] and "1 layers handed back to PyTorch" in str(report)
    assert "handed back to PyTorch" in caplog.text
    assert type(model[0]) is nn.Conv2d and isinstance(model[2], ct.Conv2d)  # the plain class back; the other kept
    assert not hasattr(model[0], "convtune_math") and model[0].weight is model[0]._parameters["weight"]
    from test_torch import assert_same_training
    assert_same_training(plain, model, x)


def test_tune_keeps_layers_patched_where_told_or_where_a_pass_it_needs_was_not_tuned():
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    _, model = _two_layer_model()
    report = ct.tune(model, x, runtime=make_runtime(), progress=False, hand_back=False)
    assert report.handed_back == [] and isinstance(model[0], ct.Conv2d) and "handed back" not in str(report)
    _, model = _two_layer_model()
    report = ct.tune(model, x, passes=("fwd",), runtime=make_runtime(), progress=False)
    assert report.handed_back == [] and isinstance(model[0], ct.Conv2d)  # (its gradients' plans are not known yet)
    _, model = _two_layer_model()
    report = ct.tune(model, x.detach(), passes=("fwd", "wgrad"), runtime=make_runtime(), progress=False)
    assert report.handed_back == ["0"]  # the first layer's input needs no gradient: its backward-data is not run


def test_tune_keeps_a_layer_patched_whose_calls_without_gradients_keep_a_plan(monkeypatch):
    """(The CPU standing in for CUDA.) A layer whose plans won their duels, but by less than the autograd
    detour: its training calls run PyTorch's convolution, its calls without gradients the forward's plan
    (Route.settle). It stays patched, or inference would lose that plan (where training steps are not host-bound:
    test_in_host_bound_steps_a_forward_plan_for_calls_without_gradients_keeps_no_layer_patched)."""
    from convtune.torch import _dispatch
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [100e-6, 200e-6])
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 1.0)  # more than any gain
    monkeypatch.setattr(_handback, "dispatch_seconds", lambda device: 5e-6)  # less than its forward plan's gain
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    report = ct.tune(model, x, runtime=runtime, progress=False, host_bound=False)
    (route,) = runtime.layer_memo("torch").values()
    assert route.native_for_grads(True, True) and route.fwd_infer is not None  # settled: training is PyTorch's
    assert route.fwd_exec.label.startswith("torch")
    assert report.handed_back == [] and isinstance(model[0], ct.Conv2d)
    model(x).sum().backward()  # a training step, then tuning again: the settled route is asked once more
    again = ct.tune(model, x, runtime=runtime, progress=False, host_bound=False)
    assert again.handed_back == [] and isinstance(model[0], ct.Conv2d)


@pytest.mark.parametrize("dispatch_us, handed_back", [(5.0, False), (20.0, True)])
def test_tune_hands_back_a_layer_whose_plan_without_gradients_gains_less_than_a_patched_call_costs(
        monkeypatch, caplog, dispatch_us, handed_back):
    """(The CPU standing in for CUDA.) The forward's plan won its duel by 10 us per call, training calls settled on
    PyTorch's convolution: the layer stays patched for its calls without gradients only where 10 us is more than
    what every call of a patched layer costs the host."""
    from convtune.torch import _dispatch
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [190e-6, 200e-6])
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 1.0)
    monkeypatch.setattr(_handback, "dispatch_seconds", lambda device: dispatch_us * 1e-6)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))
    model = copy.deepcopy(plain)
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="convtune"):  # (steps weighed as not host-bound: see below for those)
        report = ct.tune(model, x, runtime=runtime, progress=False, host_bound=False)
    (route,) = runtime.layer_memo("torch").values()
    assert route.fwd_infer is not None and route.fwd_infer.duel[1] - route.fwd_infer.duel[0] == pytest.approx(10e-6)
    assert report.handed_back == (["0"] if handed_back else [])
    assert (type(model[0]) is nn.Conv2d) == handed_back
    from test_torch import assert_same_training
    assert_same_training(plain, model, x)


def _duels_on_the_cpu(monkeypatch, host_us, detour_s):
    """(The CPU standing in for CUDA.) Every duel: the plan 100 us per call in the layer against PyTorch's 200, and
    ``host_us`` the two's host time per call; the autograd detour ``detour_s``, a patched call's cost 5 us."""
    from convtune.torch import _dispatch

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        if hosts is not None:
            hosts[:] = [t * 1e-6 for t in host_us]
        return [100e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: detour_s)
    monkeypatch.setattr(_handback, "dispatch_seconds", lambda device: 5e-6)


@pytest.mark.parametrize("host_bound", [False, True, None])
def test_in_host_bound_steps_tune_weighs_the_plans_host_time_alone(monkeypatch, host_bound):
    """(The CPU standing in for CUDA.) Every pass's plan won its duel by 100 us per call in the layer, but saves 2 us
    of host time. Weighed as the layer's time, the plans keep the layer; in host-bound steps (said, or timed: on a
    CPU the host's time is the step's) they gain less than the autograd detour and a patched call's cost, and the
    layer goes back to PyTorch. Either way it trains as PyTorch's."""
    _duels_on_the_cpu(monkeypatch, (30, 32), 50e-6)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model = copy.deepcopy(plain)
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    report = ct.tune(model, x, runtime=runtime, progress=False, host_bound=host_bound)
    weighed_on_host = host_bound is not False
    assert report.host_bound is weighed_on_host
    assert (report.step_s is not None) is (host_bound is None)  # timed only where not said
    if host_bound is None:
        assert 0 < report.step_host_s <= report.step_s and "steps host-bound (host" in str(report)
    assert report.handed_back == (["0"] if weighed_on_host else [])
    assert (type(model[0]) is nn.Conv2d) is weighed_on_host
    from test_torch import assert_same_training
    assert_same_training(plain, model, x)


@pytest.mark.parametrize("graphed", [False, True])
def test_for_steps_in_cuda_graphs_tune_decides_the_duels_on_the_devices_time_alone(monkeypatch, caplog, graphed):
    """(The CPU standing in for CUDA.) Every pass's plan takes 200 us per call in the layer against PyTorch's 150 (its
    host work), but 50 us on the device against PyTorch's 100, and the autograd detour costs more than any gain. In
    steps replayed from CUDA graphs the host is out of the step: the plans win on the device's time, no detour is
    weighed, and the layer stays patched; elsewhere PyTorch's convolution wins each duel and the layer goes back. The
    verdicts are stored with both measures: a later route decides again from the record, without a duel."""
    from convtune.torch import _dispatch
    duels = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        duels.append(tuple(a.shape))
        if devices is not None:
            devices[:] = [50e-6, 100e-6]
        return [200e-6, 150e-6]
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 1.0)
    monkeypatch.setattr(_handback, "dispatch_seconds", lambda device: 1.0)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    model = copy.deepcopy(plain)
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        report = ct.tune(model, x, runtime=runtime, progress=False, graphed=graphed, host_bound=False)
    assert report.graphed is graphed and report.host_bound is False and report.step_s is None  # (not timed)
    assert ("steps in CUDA graphs" in str(report)) is graphed
    (route,) = runtime.layer_memo("torch").values()
    labels = route.labels()
    assert len(duels) == 3 and len(labels) == 3
    if graphed:
        assert all(label.startswith("im2col") for label in labels.values()), labels
        assert route.fwd_exec.duel.gain(graphed=True) == pytest.approx(50e-6)
        assert report.handed_back == [] and isinstance(model[0], ct.Conv2d)
    else:
        assert all(label.startswith("torch (in the layer 150 us per call") for label in labels.values()), labels
        said = [r.getMessage() for r in caplog.records if "150 us per call in the layer against 200 us" in
                r.getMessage()]
        assert said and "host work included" in said[0]
        assert report.handed_back == ["0"] and type(model[0]) is nn.Conv2d
    # the other weighing on a fresh route of the same layer: decided from the stored records, no duel run
    runtime.clear_memo()
    fresh = _dispatch.route_for((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32", torch.device("cpu"),
                                runtime)
    assert fresh is not route and fresh.problem == route.problem
    fresh.weigh_host(False, graphed=not graphed)
    for p in ("fwd", "dgrad", "wgrad"):
        fresh.resolve(p)
    assert len(duels) == 3
    expect = "torch" if graphed else "im2col"
    assert all(label.startswith(expect) for label in fresh.labels().values()), fresh.labels()
    from test_torch import assert_same_training
    assert_same_training(plain, model, x)


@pytest.mark.parametrize("host_bound", [False, True])
def test_in_host_bound_steps_a_forward_plan_for_calls_without_gradients_keeps_no_layer_patched(monkeypatch, host_bound):
    """(The CPU standing in for CUDA.) Training calls settled on PyTorch's convolution (the detour outweighs every
    gain); the forward's plan saves 100 us per call without gradients (20 us of host time), more than a patched call
    costs. That keeps the layer patched, except where training steps are host-bound: every call of a patched layer
    costs the host there, training calls included."""
    _duels_on_the_cpu(monkeypatch, (10, 30), 1.0)
    monkeypatch.setattr(_handback, "pytorch_host_seconds", lambda problem, device: 1.0)  # (searched: see below)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1))
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    report = ct.tune(model, torch.randn(2, 3, 8, 8), runtime=runtime, progress=False, host_bound=host_bound)
    (route,) = runtime.layer_memo("torch").values()
    assert route.fwd_infer is not None and route.fwd_infer.duel.gain(True) == pytest.approx(20e-6)
    assert report.handed_back == (["0"] if host_bound else [])


@pytest.mark.parametrize("pytorch_host_us, searched", [(10.0, False), (20.0, True)])
def test_in_host_bound_steps_a_layer_no_plan_could_keep_is_not_searched(monkeypatch, pytorch_host_us, searched):
    """(The CPU standing in for CUDA.) In host-bound steps a plan is worth at most PyTorch's own host time per call:
    a layer whose three passes cost PyTorch's convolution 30 us of host time against a 50 us detour (and its forward
    less than the 25 us detour of a forward plan alone) is handed back unsearched; at 60 us it is searched and
    weighed as before. A layer with kept spectra, or whose calls need no gradient, is searched either way."""
    from convtune.torch import _dispatch
    _duels_on_the_cpu(monkeypatch, (30, 32), 1.0)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6 if split else 25e-6)
    monkeypatch.setattr(_handback, "pytorch_host_seconds", lambda problem, device: pytorch_host_us * 1e-6)
    plain = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                          nn.Conv2d(4, 4, 5, padding=2))
    model = copy.deepcopy(plain)
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    model[3].convtune_keep_spectra = True
    model[0].weight.requires_grad_(False)  # (its calls need no gradient: the input needs none either)
    x = torch.randn(2, 3, 8, 8)
    report = ct.tune(model, x, runtime=runtime, progress=False, host_bound=True)
    assert report.not_searched == ([] if searched else ["2"])
    searched_layers = {name for _p, names in report.problems for name in names}
    assert searched_layers == ({"0", "2", "3"} if searched else {"0", "3"})
    assert "2" in report.handed_back and isinstance(model[2], nn.Conv2d) and type(model[2]) is nn.Conv2d
    assert ("not searched" in str(report)) is not searched
    from test_torch import assert_same_training
    model[0].weight.requires_grad_(True)
    assert_same_training(plain, model, x)


class _TwoSizes(nn.Module):
    """One convolution called at two input sizes: one call's layer shape could gain host time, the other's not."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x):
        return self.conv(x).sum() + self.conv(torch.nn.functional.avg_pool2d(x, 2)).sum()


def test_a_layer_with_a_call_worth_searching_has_all_its_calls_searched(monkeypatch):
    """(The CPU standing in for CUDA.) A layer goes back to PyTorch only where all its calls do: where one of its layer
    shapes could keep a plan, the other is searched too (its route would otherwise tune at the first training call)."""
    from convtune.torch import _dispatch
    _duels_on_the_cpu(monkeypatch, (30, 32), 1.0)
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6 if split else 25e-6)
    monkeypatch.setattr(_handback, "pytorch_host_seconds",  # (the full-size call's passes cost the host more)
                        lambda problem, device: (40e-6 if problem.input_size == (8, 8) else 5e-6))
    model = _TwoSizes()
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    report = ct.tune(model, torch.randn(2, 3, 8, 8, requires_grad=True), runtime=runtime, progress=False,
                     host_bound=True)
    assert report.not_searched == [] and report.tuned == len(report.problems) == 6  # both shapes' three passes


def test_a_runtime_without_pytorchs_convolution_searches_every_layer_in_host_bound_steps(monkeypatch):
    """Where the runtime's strategies leave PyTorch's convolution out, no plan duels it and every plan runs: no layer
    is left unsearched, whatever PyTorch's host time."""
    _duels_on_the_cpu(monkeypatch, (30, 32), 1.0)
    monkeypatch.setattr(_handback, "pytorch_host_seconds", lambda problem, device: 1e-6)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1))
    runtime = make_runtime(["im2col"])
    ct.patch(model, runtime=runtime)
    report = ct.tune(model, torch.randn(2, 3, 8, 8, requires_grad=True), runtime=runtime, progress=False,
                     host_bound=True)
    assert report.not_searched == [] and report.tuned == len(report.problems) == 6 and report.handed_back == []


def test_pytorchs_host_time_per_call_is_measured_on_random_operands():
    from convtune.torch._dispatch import layer_problem
    problem = layer_problem((2, 3, 8, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    assert all(0 < _host.pytorch_host_seconds(problem.for_pass(p), torch.device("cpu")) < 0.1
               for p in ("fwd", "dgrad", "wgrad"))


def test_the_weighing_runs_the_layers_whose_search_costs_much_and_buys_little_on_cudnns_heuristic_pick(monkeypatch):
    """(The CPU standing in for CUDA.) Weighing PyTorch's steps, a tune-ahead spares PyTorch's algorithm search the
    patched layers where it costs much and is expected to buy little (floor_spares_search): their calls run PyTorch's
    convolution with cudnn.benchmark off, forward and gradients (both in one call where both are needed, as PyTorch's
    own autograd), with the same results; the other layers run PyTorch's own call as before."""
    from convtune.strategies import pytorch
    from convtune.torch import _dispatch, functional
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [100e-6, 200e-6])
    monkeypatch.setattr(tuning_module, "floor_spares_search", lambda p: p.in_channels == 4)  # (the second layer)
    weighed = []
    monkeypatch.setattr(_handback, "step_times",
                        lambda model, inputs, device, spared=None: weighed.append(spared) or (0.003, 0.010))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 5, padding=2))
    runtime = make_runtime(timer=FakeTimer({"im2col": 0.1, "torch": 1.0}))
    ct.patch(model, runtime=runtime)
    x = torch.randn(2, 3, 8, 8)
    report = ct.tune(model, x, runtime=runtime, progress=False)
    [spared] = weighed
    assert report.steps_spared == 1 and "10.0 ms step, 1 layer shape on cuDNN's heuristic pick)" in str(report)
    [(key, problem)] = spared.items()
    assert problem.in_channels == 4 and problem.kernel_size == (5, 5) and problem.pass_ == "fwd"
    assert key[:2] == ((2, 4, 8, 8), (4, 4, 5, 5))

    made = []

    def spy(name, make):
        def made_with(*args, benchmark=None, tf32=None):
            made.append((args[0] if name == "native_pass" else args[0].pass_, benchmark))
            fn = make(*args, benchmark=benchmark, tf32=tf32)

            def call(*a):
                made.append(("call", args[0] if name == "native_pass" else args[0].pass_))
                return fn(*a)
            return call
        monkeypatch.setattr(_dispatch, name, made_with)
    spy("native_for", pytorch.native_for)
    spy("native_pass", pytorch.native_pass)
    host, step = _host.step_times(model, x, torch.device("cpu"), spared=spared)
    assert 0 < host <= step and functional._collect.spare is None and functional._collect.records is None
    built = [m for m in made if m[0] != "call"]
    assert built == [("fwd", False), ("dgrad", False), ("wgrad", False), ("both", False)]  # (once per layer call)
    calls = [m[1] for m in made if m[0] == "call"]
    assert calls == ["fwd", "both"] * (1 + _host.HOST_STEPS)  # (its input needs a gradient too: both in one call)
    assert all(p.grad is None for p in model.parameters())

    # the same results as PyTorch's own call, each gradient only where needed
    layer = model[2]
    spare = _host._heuristic_calls(spared)
    geom = functional.geometry(2, layer.kernel_size, layer.stride, layer.padding, layer.dilation, layer.padding_mode)
    assert spare(None, x, layer.weight, None, geom, 1, problem.math) is None  # (a functional call: not a layer's)
    for needs_x in (True, False):
        a = torch.randn(2, 4, 8, 8, requires_grad=needs_x)
        y = spare(layer, a, layer.weight, layer.bias, geom, 1, problem.math)
        want = nn.functional.conv2d(a, layer.weight, layer.bias, padding=2)
        assert torch.allclose(y, want, atol=1e-5)
        inputs = [a, layer.weight, layer.bias] if needs_x else [layer.weight, layer.bias]
        got = torch.autograd.grad((y * y).sum(), inputs)
        expected = torch.autograd.grad((want * want).sum(), inputs)
        assert all(torch.allclose(g, e, atol=1e-4) for g, e in zip(got, expected))
    other = torch.randn(2, 4, 6, 6)  # (another shape: not a spared call)
    assert spare(layer, other, layer.weight, None, geom, 1, problem.math) is None


def test_finding_a_models_problems_spares_pytorchs_search_where_it_buys_little(monkeypatch):
    """collect runs the model's forward once, PyTorch's convolution in every layer: a patched layer whose search costs
    much and buys little (floor_spares_search) runs on cuDNN's heuristic pick (cudnn.benchmark off), with the same
    result; the others and a plain module as before; the problems found are the same."""
    from convtune.strategies import pytorch
    from convtune.torch import functional
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 5, padding=2),
                          nn.Conv2d(4, 2, 5, padding=2))
    ct.patch(model, runtime=make_runtime(["torch"]))
    model[3] = nn.Conv2d(4, 2, 5, padding=2)  # (a plain module: PyTorch's call, recorded by its hook)
    x = torch.randn(2, 3, 8, 8)
    before = tuning_module.collect(model, x)
    monkeypatch.setattr(tuning_module, "floor_spares_search", lambda p: p.in_channels == 4)
    made, outputs = [], []

    def native_for(problem, benchmark=None, tf32=None):
        made.append((problem.in_channels, problem.out_channels, problem.pass_, benchmark))
        fn = pytorch.native_for(problem, benchmark=benchmark, tf32=tf32)
        return lambda *a: outputs.append(fn(*a)) or outputs[-1]
    monkeypatch.setattr(tuning_module, "native_for", native_for)
    found = tuning_module.collect(model, x)
    assert made == [(4, 4, "fwd", False)] and functional._collect.spare is None
    assert [(f.problem, f.passes, f.name) for f in found] == [(f.problem, f.passes, f.name) for f in before]
    with torch.no_grad():
        want = model[2](torch.relu(model[0](x)))
    assert torch.allclose(outputs[0], want, atol=1e-5)


def _imports_in_a_fresh_process(code: str) -> list[str]:
    """What ``code`` prints, run by this Python in a process of its own (it must succeed), split into words."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_measuring_the_autograd_detour_imports_no_symbolic_shapes():
    """The detour's measurement (once per device, in a tune-ahead's hand-back) takes the backward of a sum: a backward
    given a gradient tensor has PyTorch import its symbolic shapes and SymPy on the first call (2.5 s of a tune-ahead
    on an H200 host). In a fresh process, as a tune-ahead's is."""
    code = ("import sys, torch; from convtune.torch import _dispatch; "
            "assert _dispatch._measure_detour(torch.device('cpu'), calls=5, rounds=3) >= 0; "
            "print('sympy' in sys.modules, 'torch.fx.experimental.symbolic_shapes' in sys.modules)")
    assert _imports_in_a_fresh_process(code) == ["False", "False"]


def test_the_round_trip_duels_gradients_import_no_symbolic_shapes():
    """keep_spectra='auto' duels a layer's round trip against its per-pass plans on whole training calls; their
    gradients come from a random gradient of the result through the backward of a scalar, not a backward given that
    gradient (which imports PyTorch's symbolic shapes and SymPy on the first call): the same gradients, in a fresh
    process nothing imported."""
    code = ("import sys, torch; from convtune.torch import functional; "
            "a = torch.randn(2, 3, 8, 8, requires_grad=True); b = torch.randn(4, 3, 3, 3, requires_grad=True); "
            "grads = {}; got = functional._duel_gradients(torch.nn.functional.conv2d(a, b), a, b, grads); "
            "imported = ('sympy' in sys.modules, 'torch.fx.experimental.symbolic_shapes' in sys.modules); "
            "want = torch.autograd.grad(torch.nn.functional.conv2d(a, b), (a, b), grads['dy']); "
            "assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want)); print(*imported)")
    assert _imports_in_a_fresh_process(code) == ["False", "False"]


def test_timing_training_steps_leaves_the_model_as_it_was():
    """step_times runs the forward and the parameters' gradients a few times: no gradient is left behind, the running
    statistics are as they were; a model whose outputs need no gradient cannot be timed so."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.Dropout(0.5))
    ct.patch(model, runtime=make_runtime(["torch"]))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 8, 8)
    rng = torch.random.get_rng_state()
    host, step = _host.step_times(model, x, torch.device("cpu"))
    assert 0 < host <= step
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(torch.random.get_rng_state(), rng)
    wrapped = nn.DataParallel(model)  # (timed without its wrapper, as DistributedDataParallel is)
    assert 0 < _host.step_times(wrapped, x, torch.device("cpu"))[0]
    assert all(p.grad is None for p in model.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="need no gradient"):
        _host.step_times(model, torch.randn(2, 3, 8, 8), torch.device("cpu"))


def test_outputs_of_every_form_are_summed_for_the_timed_steps():
    a, b = torch.ones(2, requires_grad=True), torch.full((3,), 2.0, requires_grad=True)
    total = _host._summed({"logits": a, "aux": (b, torch.ones(4), "text"), "none": None})
    assert total.item() == 8.0 and _host._summed((torch.ones(2), [3])) is None


def test_what_a_patched_call_costs_is_measured_once_per_device(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(_host, "_dispatches", {})
    first = _host.dispatch_seconds(cpu)
    assert 0.0 <= first < 1e-3 and _host.dispatch_seconds(cpu) == first  # (a few microseconds on a CPU)

    def fails(device):
        raise RuntimeError("no clock")
    monkeypatch.setattr(_host, "_dispatches", {})
    monkeypatch.setattr(_host, "_measure_dispatch", fails)
    assert _host.dispatch_seconds(cpu) == 0.0  # nothing counted: no layer handed back for it


def test_tune_hands_back_a_layer_only_where_all_its_calls_run_pytorchs_convolution():
    """One module called on two shapes: handed back only where the routes of both run PyTorch's convolution."""
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 3, 3, padding=1)

        def forward(self, x):
            return self.conv(x) + nn.functional.interpolate(self.conv(x[..., ::2, ::2]), scale_factor=2)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    for timer, expected in ((FakeTimer({"im2col": 0.1, "torch": 1.0}), []), (FakeTimer({"torch": 0.1}), ["conv"])):
        model = Twice()
        runtime = make_runtime(("torch", "im2col"), timer)
        ct.patch(model, runtime=runtime)
        assert ct.tune(model, x, runtime=runtime, progress=False).handed_back == expected


def test_tune_ahead_builds_the_round_trips_of_layers_with_kept_spectra():
    model = nn.Sequential(nn.Conv2d(4, 4, 7, padding=3, groups=4), nn.Conv2d(4, 4, 1))
    runtime = make_runtime(("fft", "torch"), FakeTimer({"fft-trip": 1e-3, "torch": 1.0}))
    ct.patch(model, runtime=runtime, keep_spectra=True)
    report = ct.tune(model, torch.randn(2, 4, 12, 12, requires_grad=True), runtime=runtime, progress=False)
    assert report.routes == 2 and len(report.trips) == 2
    trips = {route.problem.kernel_size: route.trips for route in runtime.layer_memo("torch").values()}
    assert trips[(7, 7)][True] is not None  # built ahead: the first step finds it
    assert set(trips[(1, 1)]) == {True}  # decided ahead too (a 1x1 layer has no round trip: None)


def test_tune_ahead_makes_each_route_in_the_runtime_its_layer_was_patched_with():
    model = MODELS["resnet_like"][0]()
    theirs, tunes = make_runtime(), make_runtime()
    ct.patch(model, runtime=theirs)
    report = ct.tune(model, torch.randn(MODELS["resnet_like"][1]), runtime=tunes, progress=False)
    assert report.routes == len(theirs.layer_memo("torch")) > 0 and not tunes.layer_memo("torch")


def test_tune_ahead_makes_no_routes_for_plain_modules():
    model = MODELS["resnet_like"][0]()
    runtime = make_runtime()
    report = ct.tune(model, torch.randn(MODELS["resnet_like"][1]), runtime=runtime, progress=False)
    assert report.routes == 0 and not runtime.layer_memo("torch")


def test_tune_reports_what_it_cannot_plan():
    runtime = Runtime(store=MemoryPlanStore(), miss_policy="error")
    report = ct.tune(nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8), runtime=runtime, progress=False)
    assert report.tuned == 0 and len(report.failed) == 2 and "miss policy" in report.failed[0][1]
    with pytest.raises(ValueError, match="unknown pass"):
        ct.tune(nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8), passes=("fwd", "bwd"), runtime=runtime)


def test_tune_progress_bar_on_stderr(capsys):
    ct.tune(nn.Conv2d(3, 4, 3), torch.randn(1, 3, 8, 8), runtime=make_runtime(["torch"]))
    err = capsys.readouterr().err
    assert "convtune: tuning 0/2" in err and "2/2 done" in err


# -- the torch strategy ------------------------------------------------------------------------------------
def test_torch_strategy_version_carries_pytorchs_version():
    assert f"torch2@{torch.__version__}" in strategy_versions()
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    assert get_strategy("torch").supports(p, Planner("numpy").backend) is None


def test_planner_times_a_strategy_that_makes_its_result_without_out():
    targets = []

    @register
    class OwnResult(Strategy):
        name = "test-own-result"
        allocates_result = True
        config_type = Config

        def supports(self, problem, backend):
            return None

        def candidates(self, problem, backend):
            return [Config()]

        def workspace_bytes(self, problem, config):
            return 0

        def build(self, problem, config, backend):
            ref = get_strategy("reference").build(problem, None, backend)

            def run(a, b, out=None):
                targets.append(out is None)
                result = ref(a.astype("float64"), b.astype("float64")).astype("float32")
                if out is None:
                    return result
                out[...] = result
                return out
            return run
    try:
        p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
        Planner("numpy", FakeTimer(), strategies=["test-own-result", "im2col"]).tune(p)
    finally:
        unregister("test-own-result")
    # verification writes into a poisoned out; timing lets the executor make its own result
    assert targets[0] is False and targets[-1] is True


def test_the_torch_candidate_is_timed_on_bfloat16_tensors_made_once(monkeypatch):
    """A bfloat16 problem's operands are float32 arrays of bfloat16 values; the torch candidate's verification
    converts them, its timing runs PyTorch's convolution on bfloat16 tensors made once (its ``timed`` form),
    the same tensors on every timed run, as the PyTorch layer calls it."""
    from convtune.strategies import pytorch as pytorch_strategy
    real, seen = pytorch_strategy.native_for, []

    def recording(problem, **kwargs):
        fn = real(problem, **kwargs)

        def call(a, b):
            seen.append((a.dtype, b.dtype, a.data_ptr(), b.data_ptr()))
            return fn(a, b)
        return call
    monkeypatch.setattr(pytorch_strategy, "native_for", recording)
    runs = []

    def timer(fn, backend=None, label=""):
        start = len(seen)
        fn()
        fn()
        runs.append((label, seen[start:]))
        return TimingStats(median_s=1e-3, spread_s=0.0, min_s=1e-3, repeats=2)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3, dtype="bfloat16")
    decision = Planner("numpy", timer, strategies=["torch", "im2col"]).tune(p)
    assert decision.winner is not None
    (label, calls), = [r for r in runs if r[0].startswith("torch")]
    assert len(calls) == 2 and all(c[:2] == (torch.bfloat16, torch.bfloat16) for c in calls)
    assert calls[0][2:] == calls[1][2:]  # the same tensors: converted once, before the timed runs


def test_pytorchs_backward_data_keeps_a_channels_last_gradient_channels_last():
    """PyTorch's backward-data as a plan reads only the input's shape and memory format: for a channels-last
    gradient it says channels-last (a depthwise filter's own format is ambiguous), so PyTorch runs the pass as
    its autograd would, without channels-first copies, and the result is channels-last; a channels-first
    gradient keeps the broadcast stand-in."""
    from convtune.strategies.pytorch import native_pass
    cl = torch.channels_last
    torch.manual_seed(0)
    w = torch.randn(6, 1, 3, 3).contiguous(memory_format=cl)
    x = torch.randn(2, 6, 9, 9, requires_grad=True)
    dgrad = native_pass("dgrad", (2, 6, 9, 9), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 6)
    for dy in (torch.randn(2, 6, 9, 9).contiguous(memory_format=cl), torch.randn(2, 6, 9, 9)):
        dx = dgrad(dy, w)
        expected, = torch.autograd.grad(torch.nn.functional.conv2d(x, w, None, 1, 1, 1, 6), x, dy)
        torch.testing.assert_close(dx, expected)
        assert dx.is_contiguous(memory_format=cl) == (not dy.is_contiguous())


# -- model specs -------------------------------------------------------------------------------------------
def test_model_specs_are_told_from_files_and_builtin_networks(tmp_path):
    assert is_model_spec("torchvision:resnet50") and is_model_spec("torch_models:resnet_like")
    assert is_model_spec("models/net.py:build")
    assert not is_model_spec("resnet50") and not is_model_spec("net.yaml") and not is_model_spec("dir/a:b.json")


def test_model_layers_on_the_meta_device():
    layers = load_network("torch_models:resnet_like", input_shape=(4, 3, 64, 64))
    assert [layer.name for layer in layers][:3] == ["0", "4.body.0", "4.body.3"]
    assert layers[0].problem.batch == 4 and layers[0].problem.input_size == (64, 64)
    assert layers[0].passes == ("fwd", "wgrad")
    assert load_network("torch_models:resnet_like", batch=2, input_shape=(4, 3, 64, 64))[0].problem.batch == 2


@pytest.mark.parametrize("spec, kwargs, message", [
    ("torch_models:nothing", dict(input_shape=(1, 3, 8, 8)), "has no callable"),
    ("no_such_module_xyz:make", dict(input_shape=(1, 3, 8, 8)), "cannot import"),
    ("convtune:nope", dict(batch=1), "no built-in model"),
    ("torch_models:resnet_like", dict(batch=2), "give --input-shape"),
    ("convtune:longconv-1d", dict(), "give --batch"),
    ("torch_models:resnet_like", dict(input_shape=(2, 5, 32, 32)), "forward pass"),
    ("missing.py:build", dict(input_shape=(1, 3, 8, 8)), "no file"),
])
def test_model_spec_errors_say_what_to_do(spec, kwargs, message):
    with pytest.raises(NetworkError, match=message):
        load_network(spec, **kwargs)


def test_input_shape_is_only_for_models():
    with pytest.raises(NetworkError, match="input-shape is for PyTorch and ONNX models"):
        load_network("alexnet", input_shape=(1, 3, 224, 224))


def test_torchvision_and_timm_models_are_built_without_weights(monkeypatch):
    calls = []
    vision = types.ModuleType("torchvision.models")
    vision.list_models = lambda: ["tiny"]
    vision.get_model = lambda name, weights: calls.append(("torchvision", name, weights)) or nn.Conv2d(3, 4, 3)
    timm = types.ModuleType("timm")
    timm.is_model = lambda name: name == "tinynet"

    def create_model(name, pretrained):
        calls.append(("timm", name, pretrained))
        model = nn.Conv2d(3, 2, 5)
        model.pretrained_cfg = {"input_size": (3, 16, 16)}
        return model
    timm.create_model = create_model
    monkeypatch.setitem(sys.modules, "torchvision", types.ModuleType("torchvision"))
    monkeypatch.setitem(sys.modules, "torchvision.models", vision)
    monkeypatch.setitem(sys.modules, "timm", timm)
    assert load_network("torchvision:tiny", batch=2)[0].problem.input_size == (224, 224)
    assert load_network("timm:tinynet", batch=3)[0].problem.input_size == (16, 16)
    assert calls == [("torchvision", "tiny", None), ("timm", "tinynet", False)]
    with pytest.raises(NetworkError, match="no model 'huge'"):
        load_network("torchvision:huge", batch=1)


# -- the command line --------------------------------------------------------------------------------------
def run(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    return result


@pytest.mark.usefixtures("fake_default_timer")
def test_cli_tunes_a_pytorch_model(tmp_path):
    db = tmp_path / "plans.db"
    first = run("tune", "torch_models:convnext_like", "--input-shape", "2,3,32,32", "--db", db, "--backend", "numpy")
    assert first.exit_code == 0, first.output
    assert "4 layers, 11 distinct problems" in first.output and "1.dw" in first.output
    second = run("tune", "torch_models:convnext_like", "--input-shape", "2x3x32x32", "--db", db, "--backend",
                 "numpy")
    assert "nothing was timed" in second.output
    bad = run("tune", "torch_models:convnext_like", "--input-shape", "2,3,a", "--db", db)
    assert bad.exit_code == 1 and "cannot read the shape" in bad.output


def test_cli_bench_model_on_the_cpu(tmp_path, fake_default_timer):
    out = tmp_path / "bench.json"
    result = run("bench-model", "torch_models:longconv_tiny", "--input-shape", "2,6,48", "--modes",
                 "torch-fp32,convtune-fp32", "--steps", "3", "--warmup", "0", "--db", tmp_path / "plans.db",
                 "-o", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    # by default three interleaved rounds, with PyTorch against itself
    assert doc["complete"] and doc["rounds"] == 3 and doc["null"]
    assert [m["mode"] for m in doc["modes"]] == ["torch-fp32", "torch-fp32-again", "convtune-fp32"]
    assert "PyTorch against itself" in result.output and "interleaved over 3 rounds" in result.output
    torch_mode, _again, ours = doc["modes"]
    assert ours["tuning"]["tuned"] == ours["tuning"]["problems"] > 0 and ours["patched_layers"] == 6
    assert 0 < ours["tuning"]["routes"] <= 6  # the patched layers' routes, resolved ahead
    # (no duels on a CPU: nothing weighed as host-bound, no step timed, every layer searched)
    assert ours["tuning"]["host_bound"] is None and ours["tuning"]["step_ms"] is None
    assert ours["tuning"]["not_searched"] == 0
    from convtune.torch.tuning import PHASES
    assert tuple(ours["tuning"]["phases"]) == PHASES  # where the tune-ahead's time went, said where it shows
    assert ("[problems " in result.output) == (ours["tuning"]["phases"]["problems"] >= 0.05)
    assert ours["step_ms"] > 0 and ours["routes"]
    # Python's collections counted for every mode (maybe none), shown where there were some
    assert all(m["gc_collections"] >= m["gc_full"] >= 0 and m["gc_s"] >= 0 for m in doc["modes"])
    assert ("garbage collector" in result.output) == any(m["gc_collections"] for m in doc["modes"])
    # the same weights, the same batch: the same first loss
    assert ours["first_loss"] == pytest.approx(torch_mode["first_loss"], rel=1e-4)
    assert "convtune-fp32 vs torch-fp32" in result.output
    bad = run("bench-model", "torch_models:longconv_tiny", "--input-shape", "2,6,48", "--modes", "fp64", "-o", out)
    assert bad.exit_code == 1 and "unknown mode" in bad.output
    no_graph = run("bench-model", "torch_models:longconv_tiny", "--input-shape", "2,6,48", "--graph", "-o", out)
    assert no_graph.exit_code == 1 and "CUDA graph" in no_graph.output and "Traceback" not in no_graph.output
    once = run("bench-model", "torch_models:longconv_tiny", "--input-shape", "2,6,48", "--modes",
               "torch-fp32,convtune-fp32", "--steps", "3", "--warmup", "0", "--rounds", "1", "--db",
               tmp_path / "plans.db", "-o", out)  # one after the other, no copies
    assert once.exit_code == 0, once.output
    doc = json.loads(out.read_text())
    assert not doc["null"] and [m["mode"] for m in doc["modes"]] == ["torch-fp32", "convtune-fp32"]


def test_cli_bench_model_against_another_caches_plans(tmp_path, fake_default_timer):
    """--against: each convtune mode also runs on another cache's plans, interleaved with it, and the two are set
    against each other (the whole step's regret of one search against the other)."""
    shape = ("--input-shape", "2,6,48")
    a, b, out = tmp_path / "a.db", tmp_path / "b.db", tmp_path / "bench.json"
    for db, strategies in ((a, "im2col"), (b, "fft")):
        tuned = run("tune", "torch_models:longconv_tiny", *shape, "--db", db, "--backend", "numpy", "--strategies",
                    strategies)
        assert tuned.exit_code == 0, tuned.output
    result = run("bench-model", "torch_models:longconv_tiny", *shape, "--modes", "torch-fp32,convtune-fp32",
                 "--steps", "4", "--warmup", "0", "--rounds", "2", "--null", "--db", a, "--against", b, "-o", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    modes = {m["mode"]: m for m in doc["modes"]}
    assert list(modes) == ["torch-fp32", "torch-fp32-again", "convtune-fp32", "convtune-fp32-against"]
    ours, theirs = modes["convtune-fp32"], modes["convtune-fp32-against"]
    assert ours["tuning"]["tuned"] == theirs["tuning"]["tuned"] == 0  # (both from their caches)
    labels = {name: {label.split("[")[0] for r in m["routes"] for k, label in r.items() if k != "layer"}
              for name, m in (("ours", ours), ("theirs", theirs))}
    assert "im2col" in labels["ours"] and "fft" not in labels["ours"] and "fft" in labels["theirs"], labels
    assert ours["first_loss"] == pytest.approx(theirs["first_loss"], rel=1e-4)
    assert "convtune-fp32 vs convtune-fp32-against" in result.output and str(b) in result.output
    once = run("bench-model", "torch_models:longconv_tiny", *shape, "--modes", "convtune-fp32", "--db", a,
               "--against", b, "--rounds", "1", "-o", out)
    assert once.exit_code == 1 and "--rounds 2" in once.output
    missing = run("bench-model", "torch_models:longconv_tiny", *shape, "--rounds", "2", "--db", a,
                  "--against", tmp_path / "none.db", "-o", out)
    assert missing.exit_code == 1 and "no plan cache" in missing.output


def test_heuristic_runtime_serves_pytorchs_convolution(caplog):
    rt = Runtime(store=MemoryPlanStore(), miss_policy="heuristic", planner_options={"timer": FailingTimer()})
    layer = ct.Conv2d(3, 4, 3, runtime=rt)
    with caplog.at_level(logging.WARNING, logger="convtune"):
        layer(torch.randn(1, 3, 8, 8, requires_grad=True)).sum().backward()
    (route,) = rt.layer_memo("torch").values()
    assert set(route.labels().values()) == {"torch[]"} and "fallback" not in caplog.text


def test_pytorchs_candidate_is_timed_even_when_its_verification_run_is_slow(monkeypatch):
    """The reference point of a tuned plan is never ruled out unmeasured: not by a slow run on the
    verification batch, not by a spent time budget (any other candidate would be)."""
    import convtune.planner as planner_module
    from convtune.strategies.pytorch import TorchStrategy
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)

    def synchronized_run(self, run, a, b, out, again_past=None):
        run(a, b, out)
        return 1000.0 if run.run.__qualname__.startswith("TorchStrategy") else 0.001  # PyTorch looks very slow
    monkeypatch.setattr(Planner, "_synchronized_run", synchronized_run)

    def tuned():
        timer = FakeTimer()
        d = Planner("numpy", timer, strategies=["im2col", "torch"], time_budget_s=0.0).tune(p)
        return next(o for o in d.outcomes if o.strategy == "torch"), timer.labels
    outcome, labels = tuned()
    assert outcome.status in ("ok", "winner") and any(label.startswith("torch") for label in labels)
    monkeypatch.setattr(TorchStrategy, "always_timed", False)  # as any other candidate: skipped
    outcome, labels = tuned()
    assert outcome.status == "skipped" and not any(label.startswith("torch") for label in labels)
    assert planner_module.SLOW_FACTOR < 1000


def _bench_model_modes(tmp_path, modes):
    """``convtune bench-model`` of a small model on the CPU in ``modes``; the modes' records."""
    out = tmp_path / "bench.json"
    result = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--modes", modes,
                 "--steps", "3", "--warmup", "0", "--no-null", "--db", tmp_path / "plans.db", "-o", out)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())["modes"]


def test_cli_bench_model_amp_modes_on_the_cpu(tmp_path, fake_default_timer):
    torch_mode, ours = _bench_model_modes(tmp_path, "torch-amp-bf16,convtune-amp-bf16")
    assert ours["tuning"]["tuned"] == ours["tuning"]["problems"] > 0 and not ours["tuning"]["failed"]
    assert all(":bfloat16:" in key and key.endswith(":channels_last") for key in _tuned_keys(tmp_path / "plans.db"))
    assert ours["first_loss"] == pytest.approx(torch_mode["first_loss"], rel=5e-2)  # both in bfloat16


def _tuned_keys(db):
    from convtune.cache import PlanCache
    return [r["problem_key"] for r in PlanCache(str(db), create=False, read_only=True).plan_rows()]


@pytest.mark.parametrize("mode", ["convtune-fp32-kept", "convtune-fp32-perpass"])
def test_cli_bench_model_kept_spectra_and_per_pass_modes_on_the_cpu(tmp_path, fake_default_timer, mode):
    torch_mode, kept = _bench_model_modes(tmp_path, f"torch-fp32,{mode}")
    assert kept["mode"] == mode and kept["patched_layers"] > 0 and not kept["tuning"]["failed"]
    assert kept["first_loss"] == pytest.approx(torch_mode["first_loss"], rel=1e-4)
    # keep_spectra='auto' (-kept): no round trip measured where no pass runs an FFT plan (none does here: the CPU's
    # FFT rules prune its 3x3 and 7x7 layers, and 1x1 ones); False (-perpass): none measured at all
    from convtune.cache import PlanCache
    cache = PlanCache(str(tmp_path / "plans.db"), create=False, read_only=True)
    rows = cache.plan_rows()
    assert rows and not any(row["strategy"].startswith("fft") for row in rows)
    assert not cache.records("trip")


def test_cli_bench_model_native_mode_is_pytorchs_convolution_through_the_drop_in(tmp_path, fake_default_timer):
    """The diagnosis mode: every route runs PyTorch's own convolution, and nothing goes to the user's cache."""
    torch_mode, native = _bench_model_modes(tmp_path, "torch-fp32,convtune-fp32-native")
    assert native["patched_layers"] > 0 and native["tuning"]["tuned"] == native["tuning"]["problems"] > 0
    labels = [label for route in native["routes"] for key, label in route.items() if key != "layer"]
    assert labels and all(label.startswith("torch") for label in labels)
    assert native["tuning"]["handed_back"] == 0  # (its layers stay patched: the drop-in's own cost is measured)
    assert native["first_loss"] == pytest.approx(torch_mode["first_loss"], rel=1e-4)
    assert not _tuned_keys(tmp_path / "plans.db")


def test_cli_bench_model_profiles_steps_on_request(tmp_path, fake_default_timer):
    out = tmp_path / "bench.json"
    result = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--modes",
                 "torch-fp32,convtune-fp32", "--steps", "3", "--warmup", "0", "--profile-steps", "2",
                 "--db", tmp_path / "plans.db", "-o", out)
    assert result.exit_code == 0, result.output
    for mode in json.loads(out.read_text())["modes"]:
        prof = mode["profile"]
        assert prof["steps"] == 2 and prof["wall_ms_per_step"] > 0 and prof["device_busy_ms_per_step"] is None
        names = [e["name"] for e in prof["host_top"]]
        assert names and all(e["ms_per_step"] > 0 for e in prof["host_top"])
        if mode["mode"] == "torch-fp32":  # PyTorch's convolutions are among its step's host time
            assert any("convolution" in n for n in names)
        # the drop-in's autograd functions run where a route has a plan of convtune's (not PyTorch's)
        ours = prof["drop_in_functions"]
        planned = any(not label.startswith(("torch", "pytorch")) for route in mode.get("routes", [])
                      for key, label in route.items() if key != "layer")
        assert (ours["calls_per_step"] > 0) == (ours["host_ms_per_step"] > 0) == planned
        assert f"{mode['mode']} profiled:" in result.output
    assert ("the drop-in's autograd functions:" in result.output) == planned


def _interleaved_run(tmp_path, monkeypatch, modes, steps, before_timing):
    """``bench-model --rounds 2`` of a small model with ``before_timing(step, n)`` called ahead of every
    timed batch of steps; the CLI's result and the JSON it wrote."""
    from convtune.bench import model as bench_mod
    timed = bench_mod.timed_steps

    def spy(step, device, n):
        before_timing(step, n)
        return timed(step, device, n)
    monkeypatch.setattr(bench_mod, "timed_steps", spy)
    out = tmp_path / "bench.json"
    result = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--modes", modes,
                 "--steps", str(steps), "--warmup", "0", "--rounds", "2", "--no-null", "--db", tmp_path / "plans.db",
                 "-o", out)
    return result, json.loads(out.read_text())


def test_cli_bench_model_interleaves_the_timed_steps_in_rounds(tmp_path, fake_default_timer, monkeypatch):
    """``--rounds``: every mode is set up first (PyTorch's before convtune's, whatever the order given),
    then the timed steps alternate between the modes, each mode getting all its steps."""
    order = []
    result, doc = _interleaved_run(tmp_path, monkeypatch, "convtune-fp32,torch-fp32", 5,
                                   lambda step, n: order.append((step, n)))
    assert result.exit_code == 0, result.output
    assert doc["rounds"] == 2 and [m["mode"] for m in doc["modes"]] == ["torch-fp32", "convtune-fp32"]
    steps = [s for s, _ in order]
    assert [n for _, n in order] == [3, 3, 2, 2]  # 5 steps in two rounds: 3 then 2, per mode
    assert steps[0] is steps[3] and steps[1] is steps[2] and steps[0] is not steps[1]  # alternating, rotated
    for m in doc["modes"]:
        assert m["steps"] == 5 and m["rounds"] == 2 and 0 < m["host_ms"] and m["step_ms"] > 0
        assert len(m["round_ms"]) == 2 and all(t > 0 for t in m["round_ms"])
    assert "(round by round: median" in result.output
    assert doc["modes"][0]["first_loss"] == pytest.approx(doc["modes"][1]["first_loss"], rel=1e-4)
    assert "interleaved over 2 rounds" in result.output
    bad = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--steps", "3", "--rounds", "4",
              "--db", tmp_path / "plans.db", "-o", tmp_path / "bad.json")
    assert bad.exit_code == 1 and "--rounds 4 is more than --steps 3" in bad.output


def test_cli_bench_model_null_times_each_pytorch_mode_twice(tmp_path, fake_default_timer, monkeypatch):
    """``--null``: a second copy of each PyTorch mode, set up before convtune's, timed in the same rounds;
    its ratio to the first is printed as PyTorch against itself, and round by round."""
    order = []
    out = tmp_path / "bench.json"
    from convtune.bench import model as bench_mod
    timed = bench_mod.timed_steps

    def spy(step, device, n):
        order.append(step)
        return timed(step, device, n)
    monkeypatch.setattr(bench_mod, "timed_steps", spy)
    result = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--modes",
                 "convtune-fp32,torch-fp32", "--steps", "6", "--warmup", "0", "--rounds", "3", "--null",
                 "--db", tmp_path / "plans.db", "-o", out)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["null"] and [m["mode"] for m in doc["modes"]] == ["torch-fp32", "torch-fp32-again", "convtune-fp32"]
    assert len(set(order)) == 3 and order[3:6] == order[1:3] + order[:1]  # rounds in rotated order
    torch_mode, again, ours = doc["modes"]
    assert again["first_loss"] == pytest.approx(torch_mode["first_loss"], rel=1e-6) and "tuning" not in again
    assert "torch-fp32-again vs torch-fp32:" in result.output and "PyTorch against itself" in result.output
    assert "convtune-fp32 vs torch-fp32:" in result.output and "convtune-fp32 vs torch-fp32-again" not in result.output
    from convtune.bench.steps import paired
    mid, low, high = paired(doc)["convtune-fp32 vs torch-fp32"]
    rounds = [p / o for o, p in zip(ours["round_ms"], torch_mode["round_ms"])]
    assert low == min(rounds) <= mid <= high == max(rounds)
    bad = run("bench-model", "torch_models:resnet_like", "--input-shape", "2,3,32,32", "--null", "--rounds", "1",
              "-o", out)
    assert bad.exit_code == 1 and "--rounds 2 or more" in bad.output


def test_an_interrupted_interleaved_bench_model_keeps_the_rounds_it_measured(tmp_path, fake_default_timer,
                                                                             monkeypatch):
    calls = []

    def interrupt(step, n):
        calls.append(n)
        if len(calls) == 3:  # the second round's first turn
            raise KeyboardInterrupt
    result, doc = _interleaved_run(tmp_path, monkeypatch, "torch-fp32,convtune-fp32", 4, interrupt)
    assert result.exit_code == 1 and "interrupted" in result.output
    assert not doc["complete"] and [m["mode"] for m in doc["modes"]] == ["torch-fp32", "convtune-fp32"]
    for m in doc["modes"]:  # the first round of each: 2 steps
        assert m["rounds"] == 1 and m["steps"] == 2 and m["step_ms"] > 0


def test_an_interleaved_mode_that_fails_after_a_round_is_shown_failed(tmp_path, fake_default_timer, monkeypatch):
    calls = []

    def fail_second_mode_later(step, n):
        calls.append(n)
        if len(calls) == 3:  # the second mode's second round (which the rotated order takes first)
            raise RuntimeError("out of memory in the test")
    result, doc = _interleaved_run(tmp_path, monkeypatch, "torch-fp32,convtune-fp32", 4, fail_second_mode_later)
    assert result.exit_code == 0, result.output
    torch_mode, ours = doc["modes"]
    assert "failed" not in torch_mode and torch_mode["steps"] == 4
    assert "out of memory in the test" in ours["failed"] and ours["rounds"] == 1  # what it measured is kept
    line = next(l for l in result.output.splitlines() if l.startswith("convtune-fp32"))
    assert "out of memory in the test" in line and "vs torch-fp32" not in result.output


def test_tune_ahead_leaves_the_model_as_it_found_it():
    """ct.tune runs the model once on the example: BatchNorm's running statistics, its count of batches, every
    parameter and the random number generator are exactly as they were, in train mode (dropout drawing)."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.Dropout(0.5),
                                torch.nn.Conv2d(8, 4, 3)).train()
    ct.patch(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(2, 3, 12, 12)
    rng = torch.random.get_rng_state()
    ct.tune(model, x, runtime=make_runtime(), progress=False, hand_back=False)
    after = model.state_dict()
    assert before.keys() == after.keys() and model.training
    for key, value in before.items():
        assert torch.equal(value, after[key]), key
    assert int(after["1.num_batches_tracked"]) == 0
    assert torch.equal(torch.random.get_rng_state(), rng)
    model(x)  # (the next step does change them, as training should)
    assert int(model.state_dict()["1.num_batches_tracked"]) == 1


def test_a_missing_model_library_names_the_extra_that_installs_it(monkeypatch):
    from convtune.errors import NetworkError
    from convtune.torch import models
    real = models.importlib.import_module

    def without(name, *args):
        if name.split(".")[0] in ("torchvision", "timm"):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args)
    monkeypatch.setattr(models.importlib, "import_module", without)
    for spec in ("torchvision:resnet18", "timm:resnet18"):
        with pytest.raises(NetworkError, match=r"pip install 'convtune\[models\]'"):
            load_network(spec, batch=2)


def test_tune_ahead_compiles_the_next_problems_of_its_cuda_device_on_a_thread_of_its_own(monkeypatch):
    """ct.tune's compile-ahead on CUDA (the bridge a stand-in here): the runtime's planner prepares the problems of
    the first item's device on a background thread; those of another device are left to their searches; a runtime
    that does not tune on a miss, or a CPU model, gets a compile-ahead that does nothing."""
    import threading
    import time

    prepared = []

    from test_planner import correct, make_strategy

    class Compiling(make_strategy("t-compiles-in-tune", correct)):
        def prepare(self, p, configs, backend):
            prepared.append((p.pass_, threading.current_thread().name))
    Compiling.name = "t-compiles-in-tune"
    register(Compiling)
    try:
        monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
        from convtune.backend import get_backend
        bridge = types.SimpleNamespace(backend=get_backend("numpy"), call=lambda index, fn, *args: fn(*args))
        monkeypatch.setattr(tuning_module, "bridge", lambda device_type: bridge)
        p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(8, 8), kernel_size=3)
        gpu0, gpu1 = torch.device("cuda", 0), torch.device("cuda", 1)
        items = [(p.for_pass(s), d, ["conv"]) for s, d in (("fwd", gpu0), ("dgrad", gpu1), ("wgrad", gpu0))]
        rt = make_runtime(strategies=("t-compiles-in-tune",))
        with tuning_module._compile_ahead(rt, items) as ahead:
            ahead.reached(0)
            deadline = time.monotonic() + 10
            while ("wgrad", "convtune-compile-ahead") not in prepared and time.monotonic() < deadline:
                time.sleep(0.005)
        # (dgrad is cuda:1's; fwd, the item the caller is at, may have been begun before it said so)
        assert ("wgrad", "convtune-compile-ahead") in prepared and {s for s, _t in prepared} <= {"fwd", "wgrad"}
        assert {t for _s, t in prepared} == {"convtune-compile-ahead"}
        stored = make_runtime(strategies=("t-compiles-in-tune",))
        for q, _d, _n in items:  # (every plan in the cache: nothing to compile)
            stored.store.put(Planner(bridge.backend, strategies=["t-compiles-in-tune"]).tune(q))
        prepared.clear()
        for runtime, on in ((Runtime(store=MemoryPlanStore(), miss_policy="error"), items), (stored, items),
                            (rt, [(q, torch.device("cpu"), n) for q, _d, n in items])):
            with tuning_module._compile_ahead(runtime, on):
                time.sleep(0.05)
        assert prepared == []
        monkeypatch.setattr(tuning_module, "bridge", lambda device_type: 1 / 0)  # (no CuPy, say): no compiling ahead
        with tuning_module._compile_ahead(rt, items):
            pass
        assert prepared == []
    finally:
        unregister("t-compiles-in-tune")
