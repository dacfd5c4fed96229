"""Runtime dispatch: lookup order, miss policies, the hit path, public functions and layers."""

import numpy as np
import pytest

import convtune
from convtune import ConvtuneError, Conv1d, Conv2d, MemoryPlanStore, Runtime
from convtune.direct.reference import reference
from convtune.planner import Planner, build_plan
from convtune.problem import ConvProblem
from conftest import FakeTimer, FailingTimer

rng = np.random.default_rng(0)


def randn(*shape):
    return rng.standard_normal(shape, dtype=np.float32)


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture
def runtime():
    return Runtime(planner_options={"timer": FakeTimer()})


def test_conv_tunes_once_then_hits(runtime):
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    y = convtune.conv(x, w, padding=1, runtime=runtime)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3, padding=1)
    assert rel(y, reference(np, p, x, w)) < 1e-5
    assert runtime.tuned == 1
    runtime.planner_options["timer"] = FailingTimer()
    convtune.conv(x, w, padding=1, runtime=runtime)
    assert runtime.tuned == 1


class _OnDevice(np.ndarray):
    """A NumPy array that says it lives on a CUDA device, as a CuPy array does (``.device.id``)."""

    @property
    def device(self):
        return type("Device", (), {"id": getattr(self, "_device_id", None)})()


def _on(a, device_id):
    out = a.view(_OnDevice)
    out._device_id = device_id
    return out


def test_memo_keeps_one_plan_per_device(runtime):
    """Built plans belong to one GPU: the same call on arrays of another device gets its own memo
    entry (both from the one stored decision), and a repeat on the first device reuses its plan."""
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    convtune.conv(_on(x, 0), _on(w, 0), padding=1, runtime=runtime)
    convtune.conv(_on(x, 1), _on(w, 1), padding=1, runtime=runtime)
    convtune.conv(_on(x, 0), _on(w, 0), padding=1, runtime=runtime)
    assert len(runtime._memo) == 2 and runtime.tuned == 1


def test_store_hit_does_no_timing_in_a_new_runtime(runtime):
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    convtune.conv(x, w, padding=1, runtime=runtime)
    fresh = Runtime(store=runtime.store, planner_options={"timer": FailingTimer()})
    y = convtune.conv(x, w, padding=1, runtime=fresh)
    assert fresh.tuned == 0 and runtime.store.hits == 1
    assert y.shape == (2, 4, 9, 9)
    plan = fresh._memo[next(iter(fresh._memo))]
    assert plan.source == "cache"


def test_explicit_plan_comes_first(runtime, failing_timer):
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    decision = Planner("numpy", FakeTimer(), strategies=["fft"]).tune(p)
    plan = build_plan(decision, "numpy")
    rt = Runtime(miss_policy="error")
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    y = convtune.conv(x, w, plan=plan, runtime=rt)
    assert plan.strategy == "fft" and rel(y, reference(np, p, x, w)) < 1e-5


def test_miss_policy_error_says_what_to_do():
    rt = Runtime(miss_policy="error")
    with pytest.raises(ConvtuneError, match="convtune tune"):
        convtune.conv(randn(1, 2, 5, 5), randn(2, 2, 3, 3), runtime=rt)


def test_miss_policy_heuristic_times_nothing_and_stores_nothing():
    rt = Runtime(miss_policy="heuristic", planner_options={"timer": FailingTimer()})
    x, w = randn(2, 2, 12, 12), randn(3, 2, 5, 5)
    y = convtune.conv(x, w, runtime=rt)
    p = ConvProblem.make(batch=2, in_channels=2, out_channels=3, input_size=(12, 12), kernel_size=5)
    assert rel(y, reference(np, p, x, w)) < 1e-5
    assert len(rt.store) == 0
    assert next(iter(rt._memo.values())).source == "heuristic"


def test_unknown_miss_policy_names_the_valid_ones():
    with pytest.raises(ValueError, match="acceptable: tune, nearest, heuristic, error"):
        Runtime(miss_policy="guess")


def test_unknown_strategy_in_the_planner_options_fails_at_once_naming_the_registered_ones():
    with pytest.raises(ValueError, match="unknown strategy 'fftrow'; registered strategies: .*fft-row"):
        Runtime(planner_options={"strategies": ["fft", "fftrow"]})
    assert Runtime(planner_options={"strategies": ["fft", "fft-row"]}).planner_options["strategies"] == ["fft",
                                                                                                       "fft-row"]


def test_backward_functions_match_reference(runtime):
    x, w = randn(2, 4, 11, 10), randn(6, 2, 3, 3)
    kw = dict(stride=(2, 1), padding=1, dilation=(1, 2), groups=2)
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=6, input_size=(11, 10), kernel_size=3, **kw)
    dy = randn(*p.y_shape)
    dx = convtune.conv_backward_data(dy, w, x.shape, **kw, runtime=runtime)
    dw = convtune.conv_backward_filter(x, dy, w.shape, **kw, runtime=runtime)
    assert rel(dx, reference(np, p.for_pass("dgrad"), dy, w)) < 1e-5
    assert rel(dw, reference(np, p.for_pass("wgrad"), x, dy)) < 1e-5


@pytest.mark.parametrize("call, message", [
    (lambda rt: convtune.conv(randn(2, 3, 8, 8).astype(np.float64), randn(4, 3, 3, 3), runtime=rt), "float32"),
    (lambda rt: convtune.conv(randn(2, 3, 8, 8), randn(4, 2, 3, 3), runtime=rt), "expects 2 input channels"),
    (lambda rt: convtune.conv(randn(3, 8), randn(4, 3, 3, 3), runtime=rt), "same rank"),
    # a 3-D input to a 2-D convolution is an unbatched one, as in PyTorch: here with the wrong channels
    (lambda rt: convtune.conv(randn(2, 3, 8), randn(4, 3, 3, 3), runtime=rt), "expects 3 input channels"),
    (lambda rt: convtune.conv(randn(2, 3, 2, 2), randn(4, 3, 3, 3), runtime=rt), "dilated kernel spans"),
    (lambda rt: convtune.conv(randn(2, 3, 8, 8), randn(4, 3, 3, 3), stride=(1, 1, 1), runtime=rt), "stride has 3"),
    (lambda rt: convtune.conv_backward_data(randn(2, 4, 5, 5), randn(4, 3, 3, 3), (2, 3, 8, 8), runtime=rt),
     "dy has shape"),
    (lambda rt: convtune.conv_backward_filter(randn(2, 3, 8, 8), randn(2, 4, 5, 5), (4, 3, 3, 3), runtime=rt),
     "dy has shape"),
    (lambda rt: convtune.conv(randn(2, 3, 8, 8), randn(4, 3, 3, 3), math="fp16", runtime=rt), "acceptable modes"),
])
def test_bad_input_gets_a_clear_error(runtime, call, message):
    with pytest.raises(ValueError, match=message):
        call(runtime)


def test_plan_refuses_operands_of_other_shapes(runtime):
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    plan = build_plan(Planner("numpy", FakeTimer()).tune(p), "numpy")
    with pytest.raises(ValueError, match="this plan is for operands"):
        plan(randn(3, 3, 9, 9), randn(4, 3, 3, 3))


def test_mixed_array_kinds_are_refused():
    from convtune.backend import backend_for

    class FakeCupy:
        __module__ = "cupy._core.core"
    with pytest.raises(ValueError, match="all NumPy or all CuPy"):
        backend_for(np.zeros(1), FakeCupy())


def test_conv2d_layer_trains_a_step(runtime):
    layer = Conv2d(3, 5, 3, stride=2, padding=1, seed=1, runtime=runtime)
    x = randn(2, 3, 9, 8)
    y = layer(x)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=5, input_size=(9, 8), kernel_size=3, stride=2,
                         padding=1)
    assert rel(y, reference(np, p, x, layer.weight) + layer.bias.reshape(1, -1, 1, 1)) < 1e-5
    dy = randn(*y.shape)
    dx = layer.backward(dy)
    assert rel(dx, reference(np, p.for_pass("dgrad"), dy, layer.weight)) < 1e-5
    assert rel(layer.grad_weight, reference(np, p.for_pass("wgrad"), x, dy)) < 1e-5
    np.testing.assert_allclose(layer.grad_bias, dy.sum(axis=(0, 2, 3)), rtol=1e-5)
    before = layer.weight.copy()
    for param, grad in layer.parameters():
        param -= 0.1 * grad
    assert not np.allclose(before, layer.weight)


def test_conv1d_layer_depthwise(runtime):
    layer = Conv1d(4, 4, 7, padding=3, groups=4, bias=False, seed=2, runtime=runtime)
    x = randn(3, 4, 20)
    y = layer(x)
    p = ConvProblem.make(batch=3, in_channels=4, out_channels=4, input_size=(20,), kernel_size=7, padding=3, groups=4)
    assert rel(y, reference(np, p, x, layer.weight)) < 1e-5
    assert layer.backward(randn(*y.shape)).shape == x.shape
    assert layer.grad_bias is None


def test_layer_errors():
    with pytest.raises(ValueError, match="divisible by groups"):
        Conv2d(3, 4, 3, groups=2)
    with pytest.raises(ValueError, match="kernel_size must be"):
        Conv2d(3, 4, (3, 3, 3))
    layer = Conv2d(3, 4, 3)
    with pytest.raises(ValueError, match="expects input of rank 4 .* or 3"):
        layer(randn(3, 8))
    with pytest.raises(RuntimeError, match="before forward"):
        layer.backward(randn(1, 4, 1, 1))


def test_public_tune_stores_the_decision():
    rt = Runtime(planner_options={"timer": FakeTimer()})
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    decision = convtune.tune(p, runtime=rt)
    assert rt.store.get(p, decision.device_key) is decision


def test_memory_store_repr_counts():
    store = MemoryPlanStore()
    assert "0 decisions" in repr(store)


def test_backward_passes_with_operands_of_mismatched_ranks_are_refused_with_the_shapes():
    """A dy of the unbatched rank with a batched x_shape (or the reverse) was a RecursionError."""
    w = np.ones((8, 3, 3, 3), np.float32)
    with pytest.raises(ValueError, match=r"both \(N, C, \*spatial\) or both unbatched.*\(3, 3\) and \(3, 8, 1\)"):
        convtune.conv_backward_data(np.ones((3, 8, 1), np.float32), w, (3, 3))
    with pytest.raises(ValueError, match="both unbatched"):
        convtune.conv_backward_data(np.ones((3, 8, 1), np.float32), w, (2, 3, 3, 3))
    with pytest.raises(ValueError, match="both unbatched"):
        convtune.conv_backward_filter(np.ones((3, 9, 9), np.float32), np.ones((2, 8, 7, 7), np.float32), w.shape)


def test_a_stored_plan_that_does_not_build_falls_back_and_says_so_once(caplog):
    """A tampered stored plan (its configuration edited) serves the call through the heuristic's plan, with one
    warning, instead of raising an exception that is not convtune's."""
    import logging
    from convtune.plan import CandidateOutcome, Decision
    store = MemoryPlanStore()
    rt = Runtime(store=store, miss_policy="heuristic")
    x, w = np.ones((2, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    device = convtune.backend.get_backend("numpy").device_info()
    broken = CandidateOutcome("im2col", {"chunk": 2, "no_such_field": 1}, "im2col[tampered]", "winner")
    store.put(Decision(p, device, broken, (), "measured"))
    with caplog.at_level(logging.WARNING, logger="convtune"):
        y = convtune.conv(x, w, runtime=rt)
        rt.clear_memo()
        convtune.conv(x, w, runtime=rt)
    assert rel(y, reference(np, p, x, w)) < 1e-5
    said = [r for r in caplog.records if "does not build" in r.getMessage()]
    assert len(said) == 1 and "im2col[tampered]" in said[0].getMessage()


def test_the_error_policy_says_when_the_cache_did_not_answer():
    """A store that fails (a frozen PostgreSQL server, say) is not a miss: under the `error` miss policy the message
    says that the cache did not answer, not that there is no plan."""
    from convtune.errors import CacheError

    class Frozen(MemoryPlanStore):
        def get(self, problem, device_key, fresh=False):
            raise CacheError("postgresql://cache/plans: no answer within 10 s")
    rt = Runtime(store=Frozen(), miss_policy="error")
    x, w = np.ones((2, 3, 9, 9), np.float32), np.ones((4, 3, 3, 3), np.float32)
    with pytest.raises(ConvtuneError, match="the plan cache did not answer .*no answer within 10 s"):
        convtune.conv(x, w, runtime=rt)
    with pytest.raises(ConvtuneError, match="no tuned plan"):
        convtune.conv(x, w, runtime=Runtime(store=MemoryPlanStore(), miss_policy="error"))


def test_same_padding_with_a_weight_of_another_rank_names_the_ranks():
    """A 4-D input with a 3-D weight and padding='same': the rank message, not NumPy's broadcasting error."""
    with pytest.raises(ValueError, match=r"of the same rank; got shapes \(1, 3, 8, 8\) and \(4, 3, 3\)"):
        convtune.conv(np.ones((1, 3, 8, 8), np.float32), np.ones((4, 3, 3), np.float32), padding="same")


def test_looking_up_a_pytorch_plan_leaves_the_import_of_pytorch_to_its_first_call(tmp_path):
    """A process that looks up a stored plan of PyTorch's own convolution (``torch[]``) on NumPy arrays does not
    import PyTorch in the lookup (a second or more, several under load); the plan's first call does, and computes
    the right numbers."""
    import subprocess
    import sys
    pytest.importorskip("torch")
    from convtune.cache import PlanCache
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    tuner = Runtime(store=PlanCache(url), planner_options={"timer": FakeTimer(), "strategies": ["torch"]})
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    convtune.conv(x, w, padding=1, runtime=tuner)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "w.npy", w)
    script = f"""
import sys
import numpy as np
import convtune
from convtune import Runtime
from convtune.cache import PlanCache
from convtune.backend import get_backend
from convtune.direct.reference import reference
from convtune.problem import ConvProblem
rt = Runtime(store=PlanCache({url!r}), miss_policy="error")
x, w = np.load({str(tmp_path / 'x.npy')!r}), np.load({str(tmp_path / 'w.npy')!r})
problem = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=(3, 3), padding=1)
plan = rt.plan_for(problem, get_backend("numpy"))
assert plan.strategy == "torch" and plan.source == "cache", plan
assert "torch" not in sys.modules, "the lookup imported PyTorch"
y = convtune.conv(x, w, padding=1, runtime=rt)
assert "torch" in sys.modules
ref = reference(np, problem, x.astype(np.float64), w.astype(np.float64))
print(float(np.abs(y - ref).max() / np.abs(ref).max()))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout.split()[-1]) < 1e-5


def test_a_cache_that_does_not_answer_is_not_a_miss_under_the_tune_policy():
    """A shared cache that stops answering (restarting, frozen) under the `tune` policy: the call is served by the
    heuristic's plan, nothing is tuned (the plan may well be stored: tuning it again would stall the call and store it
    twice once the cache is back), and the plan is looked up again after miss_ttl_s; tuning ahead says the cache did
    not answer."""
    from convtune.errors import CacheError

    class Flaky(MemoryPlanStore):
        down = False

        def get(self, problem, device_key, fresh=False):
            if self.down:
                raise CacheError("postgresql://cache/plans: no answer within 10 s")
            return super().get(problem, device_key, fresh)
    store = Flaky()
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=(3, 3))
    tuner = Runtime(store=store, planner_options={"timer": FakeTimer(), "strategies": ["im2col", "fft"]})
    convtune.conv(x, w, runtime=tuner)  # (tuned and stored while the cache answers)
    store.down = True
    rt = Runtime(store=store, planner_options={"timer": FailingTimer()}, miss_ttl_s=0.0)
    y = convtune.conv(x, w, runtime=rt)
    assert rel(y, reference(np, p, x, w)) < 1e-5 and rt.tuned == 0
    from convtune.backend import get_backend
    with pytest.raises(CacheError, match="did not answer"):
        rt.decision_for(p, get_backend("numpy"), ahead=True)
    store.down = False
    convtune.conv(x, w, runtime=rt)  # looked up again: the stored plan now
    assert rt.plan_for(p, get_backend("numpy")).source == "cache" and rt.tuned == 0


def test_a_lease_that_cannot_be_taken_tunes_nothing(tmp_path, monkeypatch):
    """A miss whose lease cannot be taken (the shared cache stopped answering between the lookup and the lease):
    not tuned without its lease (another process may be tuning it); the heuristic's plan serves the call."""
    from convtune import worklist
    from convtune.cache import PlanCache
    from convtune.errors import CacheError

    def refused(self, problem, device):
        raise CacheError("postgresql://cache/plans: connection refused")
    monkeypatch.setattr(worklist.Leases, "take", refused)
    rt = Runtime(store=PlanCache(f"sqlite:///{tmp_path / 'plans.db'}"), planner_options={"timer": FailingTimer()})
    x, w = randn(2, 3, 9, 9), randn(4, 3, 3, 3)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=(3, 3))
    assert rel(convtune.conv(x, w, runtime=rt), reference(np, p, x, w)) < 1e-5 and rt.tuned == 0
