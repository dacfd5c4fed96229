"""The PyTorch drop-in on CPU tensors: modules, patching, every nn.Conv argument form, fallbacks."""

import copy
import dataclasses
import math
import logging

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import convtune.torch as ct  # noqa: E402
from convtune import MemoryPlanStore, Runtime  # noqa: E402
from convtune.executor import Executor  # noqa: E402
from convtune.torch import _dispatch, _duel, _notes  # noqa: E402
from conftest import FailingTimer, FakeTimer  # noqa: E402
from torch_models import MODELS  # noqa: E402

#: which code path the plans take: PyTorch's own (native), or convtune's executors on array views
STRATEGY_SETS = {"torch": ["torch"], "im2col": ["im2col"], "fft": ["fft"]}


def make_runtime(strategies=None, timer=None, **kw):
    options = {"timer": timer or FakeTimer()}
    if strategies:
        options["strategies"] = strategies
    return Runtime(store=MemoryPlanStore(), planner_options=options, **kw)


@pytest.fixture(params=sorted(STRATEGY_SETS))
def runtime(request):
    return make_runtime(STRATEGY_SETS[request.param])


@pytest.fixture(autouse=True)
def _fresh_log_once(monkeypatch):
    """Every test sees each once-only message anew."""
    monkeypatch.setattr(_notes, "_said", set())


def patched_copy(module, runtime, **kw):
    twin = copy.deepcopy(module)
    ct.patch(twin, runtime=runtime, **kw)
    return twin


def assert_same_training(plain, patched, *inputs, rtol=1e-4, atol=1e-5):
    """Outputs, the inputs' gradients and every parameter's gradient agree (float32 tolerance)."""
    def run(model):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
        out = model(*xs)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.device)
        (out * probe).sum().backward()
        return out.detach(), [x.grad for x in xs], {n: p.grad for n, p in model.named_parameters()}
    out_a, gx_a, gp_a = run(plain)
    out_b, gx_b, gp_b = run(patched)
    torch.testing.assert_close(out_b, out_a, rtol=rtol, atol=atol)
    for a, b in zip(gx_a, gx_b):
        if a is not None:
            torch.testing.assert_close(b, a, rtol=rtol, atol=atol)
    assert gp_a.keys() == gp_b.keys()
    for name in gp_a:
        torch.testing.assert_close(gp_b[name], gp_a[name], rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def assert_trains_within(plain, patched, *inputs, bound=1e-5):
    """The patched model's output, input gradients and parameter gradients are each within ``bound``
    (norm-wise relative error, convtune's fp32 definition) of a float64 run of ``plain`` on the CPU. For
    layers whose gradients sum thousands of terms, where an elementwise float32 comparison against
    PyTorch's own (also rounded) result measures the reference's rounding as much as convtune's."""
    def run(model, xs, dtype, device):
        xs = [x.detach().to(device=device, dtype=dtype).requires_grad_() for x in xs]
        out = model(*xs)
        probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (out * probe.to(out)).sum().backward()
        return [out.detach()] + [x.grad for x in xs] + [p.grad for _, p in sorted(model.named_parameters())]
    ref = run(copy.deepcopy(plain).to(device="cpu", dtype=torch.float64), inputs, torch.float64, "cpu")
    got = run(patched, inputs, inputs[0].dtype, inputs[0].device)
    for i, (g, r) in enumerate(zip(got, ref)):
        err = float((g.double().cpu() - r).norm() / r.norm().clamp_min(1e-300))
        assert err <= bound, f"result {i} (output, input gradients, then parameters by name): {err:.2e} > {bound}"


# -- every argument form nn.Conv1d/Conv2d accepts --------------------------------------------------------
FORMS = {
    "2d-basic": (nn.Conv2d, dict(in_channels=3, out_channels=5, kernel_size=3)),
    "2d-pad-tuple": (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=(3, 5), padding=(1, 2))),
    "2d-same-odd": (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=5, padding="same")),
    "2d-same-even-dilated": (nn.Conv2d, dict(in_channels=2, out_channels=3, kernel_size=(4, 2), padding="same",
                                             dilation=(1, 3))),
    "2d-valid": (nn.Conv2d, dict(in_channels=3, out_channels=2, kernel_size=3, padding="valid")),
    "2d-stride-dilation": (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=(2, 1), padding=2,
                                           dilation=(2, 1))),
    "2d-groups-nobias": (nn.Conv2d, dict(in_channels=6, out_channels=4, kernel_size=3, padding=1, groups=2,
                                         bias=False)),
    "2d-depthwise": (nn.Conv2d, dict(in_channels=4, out_channels=4, kernel_size=5, padding=2, groups=4)),
    "2d-reflect": (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=3, padding=1, padding_mode="reflect")),
    "2d-replicate-same": (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=4, padding="same",
                                          padding_mode="replicate")),
    "2d-circular-stride": (nn.Conv2d, dict(in_channels=2, out_channels=3, kernel_size=3, stride=2, padding=(1, 2),
                                           padding_mode="circular")),
    "1d-basic": (nn.Conv1d, dict(in_channels=3, out_channels=4, kernel_size=5, padding=2)),
    "1d-same-even": (nn.Conv1d, dict(in_channels=2, out_channels=2, kernel_size=6, padding="same", groups=2)),
    "1d-stride-circular": (nn.Conv1d, dict(in_channels=3, out_channels=5, kernel_size=3, stride=3, padding=1,
                                           padding_mode="circular", bias=False)),
    "3d-basic": (nn.Conv3d, dict(in_channels=3, out_channels=4, kernel_size=3, padding=1)),
    "3d-stride-dilation-groups": (nn.Conv3d, dict(in_channels=4, out_channels=6, kernel_size=(3, 2, 3),
                                                  stride=(2, 1, 2), padding=(1, 0, 2), dilation=(1, 2, 1), groups=2)),
    "3d-depthwise-same": (nn.Conv3d, dict(in_channels=4, out_channels=4, kernel_size=3, padding="same", groups=4,
                                          bias=False)),
}

#: A form's input size per convolution class, and the drop-in module that replaces it.
SIZES = {nn.Conv1d: (23,), nn.Conv2d: (11, 9), nn.Conv3d: (7, 6, 5)}
DROP_IN = {nn.Conv1d: ct.Conv1d, nn.Conv2d: ct.Conv2d, nn.Conv3d: ct.Conv3d}


def _input(cls, kind, channels):
    size = SIZES[cls]
    gen = torch.Generator().manual_seed(0)
    if kind == "unbatched":
        return torch.randn(channels, *size, generator=gen)
    if kind == "empty-batch":
        return torch.randn(0, channels, *size, generator=gen)
    if kind == "sliced":  # a non-contiguous view: every other sample of a wider tensor, offset width
        wide = torch.randn(6, channels, *size[:-1], size[-1] + 3, generator=gen)
        return wide[::2, :, ..., 2:-1]
    x = torch.randn(3, channels, *size, generator=gen)
    if kind == "channels_last":
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        return x.contiguous(memory_format=fmt) if fmt is not None else None
    return x


@pytest.mark.parametrize("kind", ["batched", "unbatched", "empty-batch", "sliced", "channels_last"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_every_conv_form_matches_pytorch(form, kind, runtime):
    cls, kwargs = FORMS[form]
    torch.manual_seed(0)
    plain = cls(**kwargs)
    x = _input(cls, kind, kwargs["in_channels"])
    if x is None:
        pytest.skip("channels_last is a 4-D and 5-D layout")
    fmt = torch.channels_last_3d if cls is nn.Conv3d else torch.channels_last
    if kind == "channels_last":
        plain = plain.to(memory_format=fmt)
    patched = patched_copy(plain, runtime)
    assert isinstance(patched, DROP_IN[cls])
    # (a 3-D weight gradient sums hundreds of products per element: float32 rounding differs by more)
    assert_same_training(plain, patched, x, atol=1e-4 if cls is nn.Conv3d else 1e-5)
    if kind == "channels_last":
        assert patched(x).is_contiguous(memory_format=fmt)


def test_convtune_executors_ran(runtime):
    """The routes took the path their plans say: PyTorch's operator or convtune's executor (per-pass plans: no
    round trip with kept spectra)."""
    layer = ct.Conv2d(3, 4, 3, padding=1, runtime=runtime, keep_spectra=False)
    layer(torch.randn(2, 3, 8, 8, requires_grad=True)).sum().backward()
    (route,) = runtime.layer_memo("torch").values()
    strategy = runtime.planner_options["strategies"][0]
    assert set(route.labels()) == {"fwd", "dgrad", "wgrad"}
    assert all(label.startswith(strategy + "[") for label in route.labels().values())
    kind = _dispatch.Native if strategy == "torch" else _dispatch.ArrayPlan
    assert all(type(getattr(route, f"{p}_exec")) is kind for p in ("fwd", "dgrad", "wgrad"))


def test_native_route_uses_pytorchs_own_autograd_and_others_ours():
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    native = ct.Conv2d(3, 4, 3, runtime=make_runtime(["torch"]))
    assert type(native(x).grad_fn).__name__ == "ConvolutionBackward0"
    ours = ct.Conv2d(3, 4, 3, runtime=make_runtime(["im2col"]))
    assert type(ours(x).grad_fn).__name__ == "_ForwardBackward"
    with torch.no_grad():  # inference: no autograd function at all
        assert ours(x).grad_fn is None


def test_a_kept_spectra_layer_without_a_round_trip_takes_pytorchs_autograd_after_its_first_call(monkeypatch):
    """``keep_spectra='auto'`` on a layer whose passes are PyTorch's (no round trip to run): its first training call
    finds that out, and later ones go straight to PyTorch's convolution with its own autograd (no operands handled
    on the way, no round trip looked up)."""
    from convtune.torch import functional
    layer = ct.Conv2d(3, 4, 3, runtime=make_runtime(["torch"]), keep_spectra="auto")
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    layer(x).sum().backward()
    detours = []
    monkeypatch.setattr(functional, "_cast", lambda *args: detours.append(args))
    assert type(layer(x).grad_fn).__name__ == "ConvolutionBackward0" and detours == []


@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_models_train_like_pytorch(name):
    """Each kind of model, patched, gives the unpatched model's loss and gradients; convtune's own
    executors run (the fake timer makes PyTorch's convolution the slowest candidate)."""
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    plain = factory()
    runtime = make_runtime(["torch", "im2col", "fft"], FakeTimer(times={"torch": 2.0}, default=1.0))
    patched = patched_copy(plain, runtime)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    assert_same_training(plain, patched, x, rtol=2e-4, atol=2e-5)
    labels = [label for route in runtime.layer_memo("torch").values() for label in route.labels().values()]
    assert labels and not any(label.startswith("torch") for label in labels)


def test_state_dict_round_trips_both_ways():
    torch.manual_seed(0)
    plain = MODELS["resnet_like"][0]()
    patched = patched_copy(plain, make_runtime(["torch"]))
    assert plain.state_dict().keys() == patched.state_dict().keys()
    fresh_plain, fresh_patched = MODELS["resnet_like"][0](), MODELS["resnet_like"][0]()
    ct.patch(fresh_patched, runtime=make_runtime(["torch"]))
    fresh_plain.load_state_dict(patched.state_dict())
    fresh_patched.load_state_dict(plain.state_dict())
    for (name, a), (_n, b) in zip(fresh_plain.state_dict().items(), fresh_patched.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
        torch.testing.assert_close(a, plain.state_dict()[name], msg=name)


def test_convtune_modules_take_nn_arguments_and_load_nn_weights():
    rt = make_runtime(["im2col"])
    plain = nn.Conv1d(4, 6, 3, stride=2, padding=1, groups=2)
    ours = ct.Conv1d(4, 6, 3, stride=2, padding=1, groups=2, runtime=rt, math="fp32")
    ours.load_state_dict(plain.state_dict())
    x = torch.randn(3, 4, 17)
    torch.testing.assert_close(ours(x), plain(x), rtol=1e-5, atol=1e-6)
    assert "math='fp32'" in repr(ours)
    with pytest.raises(ValueError, match="acceptable: auto, fp32, tf32"):
        ct.Conv2d(3, 4, 3, math="fp16")


# -- patch / unpatch ---------------------------------------------------------------------------------------
class OwnForward(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


class PlainSubclass(nn.Conv2d):
    pass


def test_patch_is_in_place_keeps_hooks_and_parameters_and_unpatch_undoes_it(caplog):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Sequential(PlainSubclass(4, 4, 3), OwnForward(4, 4, 1)),
                          nn.Conv1d(2, 2, 3), nn.Conv3d(1, 1, 1), nn.LazyConv2d(4, 3))
    first, sub = model[0], model[1][0]
    weight = first.weight
    calls = []
    first.register_forward_hook(lambda m, i, o: calls.append(o.shape))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with caplog.at_level(logging.INFO, logger="convtune"):
        swapped = ct.patch(model, runtime=make_runtime(["im2col"]))
    assert swapped == ["0", "1.0", "2", "3"]  # children first; the own-forward and lazy modules are left
    assert "has a forward of its own" in caplog.text and "lazy" in caplog.text
    assert model[0] is first and first.weight is weight and isinstance(first, nn.Conv2d)
    assert isinstance(sub, PlainSubclass) and type(sub).__name__ == "ConvtunePlainSubclass"
    x = torch.randn(2, 3, 9, 9)
    model[1](model[0](x)).sum().backward()
    optimizer.step()
    assert calls == [torch.Size([2, 4, 7, 7])]
    assert ct.patch(model) == []  # nothing left to patch
    assert ct.unpatch(model) == ["0", "1.0", "2", "3"]
    assert type(first) is nn.Conv2d and type(sub) is PlainSubclass and "convtune_math" not in first.__dict__


def test_patch_filter_and_a_bare_conv_module():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Conv2d(4, 4, 3))
    assert ct.patch(model, filter=lambda module, name: name == "1") == ["1"]
    conv = nn.Conv2d(3, 4, 3)
    assert ct.patch(conv, math="fp32") == [""] and conv.convtune_math == "fp32"
    with pytest.raises(ValueError, match="acceptable"):
        ct.patch(conv, math="bf16")


# -- what falls back, and says so once ------------------------------------------------------------------------
def test_float64_falls_back_with_one_message(caplog):
    layer = ct.Conv2d(3, 4, 3, runtime=make_runtime(timer=FailingTimer()), dtype=torch.float64)
    plain = nn.Conv2d(3, 4, 3, dtype=torch.float64)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="convtune"):
        for _ in range(3):
            torch.testing.assert_close(layer(x), plain(x))
    assert caplog.text.count("float64") == 1 and "PyTorch's convolution runs" in caplog.text


def test_autocast_runs_the_plan_tuned_for_its_dtype(caplog):
    rt = make_runtime(["im2col"])
    layer = ct.Conv2d(3, 4, 3, runtime=rt)
    plain = nn.Conv2d(3, 4, 3)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with caplog.at_level(logging.WARNING, logger="convtune"), torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = layer(x), plain(x)
    assert y.dtype == expected.dtype == torch.bfloat16 and "PyTorch's convolution runs" not in caplog.text
    (route,) = rt.layer_memo("torch").values()
    assert route.problem.dtype == "bfloat16" and route.labels()["fwd"].startswith("im2col[")
    torch.testing.assert_close(y.float(), expected.float(), rtol=2 ** -7, atol=2 ** -7 * float(expected.abs().max()))


def test_autocast_hands_pytorchs_convolution_the_operands_as_they_came(monkeypatch):
    """Under autocast, a layer whose passes are PyTorch's convolution routes by autocast's dtype but does not
    cast the operands itself: PyTorch's convolution, under the same autocast, casts them (in C++, with its
    cache of the weights' casts), so the drop-in adds no casts of its own; its results are the plain layer's.
    A layer that runs convtune's plan gets the operands cast."""
    from convtune.torch import functional
    casts = []
    real_cast = functional._cast
    monkeypatch.setattr(functional, "_cast", lambda x, w, b, dtype: casts.append(dtype) or real_cast(x, w, b, dtype))
    torch.manual_seed(0)
    for strategy, casts_per_call in (("torch", 0), ("im2col", 1)):
        rt = make_runtime([strategy])
        layer = ct.Conv2d(3, 4, 3, runtime=rt)
        plain = nn.Conv2d(3, 4, 3)
        plain.load_state_dict(layer.state_dict())
        x = torch.randn(2, 3, 8, 8, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            layer(x), layer(x.detach())  # resolves the route's passes for training and inference calls
            casts.clear()
            y, expected = layer(x), plain(x)
            y_infer = layer(x.detach())
        assert casts == [torch.bfloat16] * (2 * casts_per_call), (strategy, casts)
        (route,) = rt.layer_memo("torch").values()
        assert route.problem.dtype == "bfloat16" and route.labels()["fwd"].startswith(strategy)
        assert y.dtype == y_infer.dtype == torch.bfloat16
        if strategy == "torch":
            torch.testing.assert_close(y, expected, rtol=0, atol=0)
            torch.testing.assert_close(y_infer, expected.detach(), rtol=0, atol=0)


def test_float64_under_autocast_runs_in_float64_as_pytorchs_does(caplog):
    """autocast leaves float64 operands alone, so a patched layer does too: PyTorch's convolution in float64
    (convtune does not run float64), not a bfloat16 plan."""
    rt = make_runtime(["im2col"])
    layer = ct.Conv2d(3, 4, 3, runtime=rt).double()
    plain = nn.Conv2d(3, 4, 3).double()
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    with caplog.at_level(logging.WARNING, logger="convtune"), torch.autocast("cpu", dtype=torch.bfloat16):
        y, expected = layer(x), plain(x)
    assert y.dtype == expected.dtype == torch.float64 and "float64" in caplog.text
    torch.testing.assert_close(y, expected, rtol=0, atol=0)
    assert rt.layer_memo("torch") == {}  # no route: nothing looked up or tuned for it


def test_conv3d_under_autocast_and_tune_ahead():
    """A video-style model: Conv3d layers channels_last_3d under bfloat16 autocast, tuned ahead, then trained
    on the plans tuned for them."""
    rt = make_runtime(["im2col"])
    model = nn.Sequential(nn.Conv3d(3, 4, (3, 5, 5), padding=(1, 2, 2)), nn.ReLU(),
                          nn.Conv3d(4, 4, 3, padding=1, groups=4)).to(memory_format=torch.channels_last_3d)
    plain = copy.deepcopy(model)
    x = torch.randn(2, 3, 4, 9, 8).contiguous(memory_format=torch.channels_last_3d)
    problems = ct.collect(model, x)
    assert [p.problem.rank for p in problems] == [3, 3] and {p.problem.layout for p in problems} == {"channels_last"}
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = ct.tune(model, x, runtime=rt, progress=False)
        assert report.tuned == len(report.problems) and not report.failed
        ct.patch(model, runtime=rt)
        tuned = rt.tuned
        y, expected = model(x), plain(x)
    assert rt.tuned == tuned  # every plan was tuned ahead
    assert y.dtype == expected.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last_3d)
    torch.testing.assert_close(y.float(), expected.float(), rtol=2 ** -6, atol=2 ** -6 * float(expected.abs().max()))
    route = next(iter(rt.layer_memo("torch").values()))
    assert (route.problem.rank, route.problem.dtype) == (3, "bfloat16")


def _fallen_back(rt, caplog, said):
    """A layer on ``rt`` trained beside a plain one (same results), the warning ``said``; its route."""
    layer, plain = ct.Conv2d(3, 4, 3, padding=1, runtime=rt), nn.Conv2d(3, 4, 3, padding=1)
    plain.load_state_dict(layer.state_dict())
    with caplog.at_level(logging.WARNING, logger="convtune"):
        assert_same_training(plain, layer, torch.randn(2, 3, 8, 8))
    assert said in caplog.text
    (route,) = rt.layer_memo("torch").values()
    assert set(route.labels().values()) == {"pytorch (fallback)"}
    return route


def test_a_runtime_that_cannot_plan_falls_back(caplog):
    """A plan that is only missing (miss policy ``error``): PyTorch runs the layer, and the plan is looked
    up again later (another process may tune it)."""
    route = _fallen_back(Runtime(store=MemoryPlanStore(), miss_policy="error"), caplog, "no tuned plan")
    assert route.fwd_exec.retry_at is not None and not route.native(["fwd"])


def test_a_failed_tuning_falls_back_for_good(caplog):
    """A tuning that ends with no candidate must not run again in the middle of a training step (it would
    stall it for the same answer): PyTorch runs the layer for good, through its own autograd."""
    failing = Runtime(store=MemoryPlanStore(), planner_options={"strategies": ["cudnn"]})  # none runs on the CPU
    route = _fallen_back(failing, caplog, "TuningError")
    assert all(e.retry_at is None for e in (route.fwd_exec, route.dgrad_exec, route.wgrad_exec))
    assert route.native(["fwd", "dgrad", "wgrad"])


def test_a_plan_that_fails_when_it_runs_falls_back(caplog, monkeypatch):
    rt = make_runtime(["im2col"])
    layer, plain = ct.Conv2d(3, 4, 3, runtime=rt), nn.Conv2d(3, 4, 3)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8)
    layer(x)
    (route,) = rt.layer_memo("torch").values()

    def broken(*args):
        raise MemoryError("out of memory in the test")
    monkeypatch.setattr(route.fwd_exec, "plan", dataclasses.replace(route.fwd_exec.plan, run=Executor(broken)))
    with caplog.at_level(logging.WARNING, logger="convtune"):
        torch.testing.assert_close(layer(x), plain(x), rtol=1e-5, atol=1e-6)
    assert "out of memory in the test" in caplog.text and route.fwd_exec.label == "pytorch (fallback)"


def _counting(original, calls):
    """``original`` (a plan) answering as itself, each call of it recorded in ``calls``."""
    class Counting:
        def __getattr__(self, name):
            return getattr(original, name)

        def __call__(self, *args):
            calls.append(1)
            return original(*args)
    return Counting()


def test_calls_inside_a_cuda_graph_capture_record_plans_resolved_before(caplog, monkeypatch):
    """While a stream records a CUDA graph (faked here: CI has no GPU), no plan is looked up, tuned or
    duelled: a layer no eager call has resolved records PyTorch's convolution, said once; once eager calls
    have resolved it, a capture records its plans where their strategy says they record (not im2col's,
    which call cuBLAS), PyTorch's convolution for the others; a plan that fails inside a capture anyway
    gives that pass to PyTorch's convolution in captures only, said once, and keeps its plan."""
    from convtune.torch import functional
    monkeypatch.setattr(_notes, "_said", set())  # what this process has said once already
    rt = make_runtime(["im2col"])
    layer, plain = ct.Conv2d(3, 4, 3, padding=1, runtime=rt), nn.Conv2d(3, 4, 3, padding=1)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    monkeypatch.setattr(functional, "capturing", lambda t: True)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: True)
    with caplog.at_level(logging.WARNING, logger="convtune"):
        y = layer(x)
        layer(x)
    torch.testing.assert_close(y, plain(x), rtol=1e-5, atol=1e-6)
    assert rt.tuned == 0 and caplog.text.count("CUDA graph") == 1
    assert all(not route.labels() for route in rt.layer_memo("torch").values())  # nothing resolved
    monkeypatch.setattr(functional, "capturing", lambda t: False)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: False)
    for _ in range(2):  # warm-up outside a capture: the plans, resolved
        layer(x).sum().backward()
    (route,) = rt.layer_memo("torch").values()
    assert route.fwd_exec.label.startswith("im2col")
    calls = []
    original = route.fwd_exec.plan
    monkeypatch.setattr(route.fwd_exec, "plan", _counting(original, calls))
    monkeypatch.setattr(functional, "capturing", lambda t: True)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: True)
    # im2col's plans call cuBLAS on the GPU, which CuPy refuses while capturing: not tried, PyTorch's recorded
    assert not route.fwd_exec.recordable and not route.dgrad_exec.recordable
    x.grad = None
    layer(x).sum().backward()
    assert not calls and set(route.capture.native) == {"fwd", "dgrad", "wgrad"} and not route.capture.failed
    torch.testing.assert_close(x.grad, torch.autograd.grad(plain(x).sum(), x)[0], rtol=1e-5, atol=1e-6)
    route.capture.native.clear()
    for executor in (route.fwd_exec, route.dgrad_exec, route.wgrad_exec):  # as a plan that records would be
        monkeypatch.setattr(executor, "recordable", True)
    x.grad = None
    layer(x).sum().backward()  # recorded: the plans
    assert calls and not route.capture.native and not route.capture.failed
    with torch.no_grad():  # (an inference call: its forward's plan, resolved by the training calls)
        expected = plain(x)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)

    def refused(*args):
        raise NotImplementedError("calling cuBLAS API during stream capture is currently unsupported")
    monkeypatch.setattr(route.fwd_exec, "plan", dataclasses.replace(original, run=refused))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="convtune"), torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert caplog.text.count("cannot be recorded in a CUDA graph") == 1 and route.capture.failed == {"fwd"}
    assert route.capture.native["fwd"].label == "pytorch (fallback)" and route.fwd_exec.label.startswith("im2col")
    monkeypatch.setattr(route.fwd_exec, "plan", original)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: False)
    monkeypatch.setattr(functional, "capturing", lambda t: False)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)  # outside: the plan again
    assert route.fwd_exec.label.startswith("im2col")


def test_an_inference_call_inside_a_capture_records_the_forward_plan_that_eager_inference_runs(monkeypatch):
    """Where settle gave a training call's forward to PyTorch and kept the duel's winner for calls without
    gradients (Route.fwd_infer), a captured inference call records that plan too, as eager inference runs it,
    where its strategy says it records; PyTorch's convolution where it does not (faked capture: CI has no GPU)."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import functional
    rt = make_runtime(["im2col"])
    layer, plain = ct.Conv2d(3, 4, 3, padding=1, runtime=rt), nn.Conv2d(3, 4, 3, padding=1)
    plain.load_state_dict(layer.state_dict())
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        expected = plain(x)
        layer(x)
    (route,) = rt.layer_memo("torch").values()
    plan = route.fwd_exec
    calls = []
    monkeypatch.setattr(plan, "plan", _counting(plan.plan, calls))
    # as Route.settle leaves a layer whose forward plan gained less than the training calls' detour
    route.fwd_exec, route.fwd_infer = _dispatch.Native(native_for(route.problem), "torch"), plan
    monkeypatch.setattr(functional, "capturing", lambda t: True)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: True)
    monkeypatch.setattr(plan, "recordable", True)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert calls == [1] and not route.capture.native  # recorded: the inference plan
    monkeypatch.setattr(plan, "recordable", False)  # (im2col's cuBLAS calls: CuPy refuses them while capturing)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert calls == [1] and set(route.capture.native) == {"fwd"}  # PyTorch's convolution recorded instead


def test_pytorchs_convolution_for_captures_is_warmed_once_per_thread():
    """What a capture records instead of a plan that does not record runs once outside it in each thread
    that runs the pass (cuDNN's handles are per thread: autograd's backward thread needs its own)."""
    import threading
    rt = make_runtime(["im2col"])
    route = _dispatch.route_for(torch.Size((2, 3, 8, 8)), torch.Size((4, 3, 3, 3)), (1, 1), (1, 1), (1, 1), 1,
                                "fp32", torch.device("cpu"), rt)
    seen = []
    route.capture.native["fwd"] = _dispatch.Native(lambda a, b, bias: seen.append(threading.get_ident()), "counting")
    a, b = torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3)
    route.capture.warm("fwd", a, b)
    route.capture.warm("fwd", a, b)
    other = threading.Thread(target=lambda: [route.capture.warm("fwd", a, b) for _ in range(2)])
    other.start()
    other.join()
    assert len(seen) == 2 and seen[0] == threading.get_ident() and seen[1] != seen[0]


def test_meta_tensors_and_bad_geometry_behave_as_in_pytorch():
    layer = ct.Conv2d(3, 4, 5, runtime=make_runtime(timer=FailingTimer()))
    assert layer(torch.empty(2, 3, 9, 9, device="meta")).shape == (2, 4, 5, 5)
    with pytest.raises(RuntimeError, match="[Kk]ernel size"):
        layer(torch.randn(1, 3, 3, 3))  # PyTorch's own error: the kernel is larger than the input
    with pytest.raises(RuntimeError):
        layer(torch.randn(2, 5, 9, 9))  # wrong channel count, as PyTorch says it


def test_math_auto_is_fp32_on_cpu_and_strict_modes_are_kept():
    rt = make_runtime(["im2col"])
    ct.Conv2d(3, 4, 3, runtime=rt)(torch.randn(1, 3, 6, 6))
    ct.Conv2d(3, 4, 3, runtime=rt, math="tf32")(torch.randn(1, 3, 6, 6))
    maths = sorted(route.problem.math for route in rt.layer_memo("torch").values())
    assert maths == ["fp32", "tf32"]


def test_functional_forms():
    rt = make_runtime(["fft"])
    x, w, b = torch.randn(2, 3, 10, 10), torch.randn(4, 3, 3, 3), torch.randn(4)
    torch.testing.assert_close(ct.conv2d(x, w, b, padding="same", runtime=rt),
                               nn.functional.conv2d(x, w, b, padding="same"), rtol=1e-4, atol=1e-5)
    x1, w1 = torch.randn(2, 3, 30), torch.randn(6, 1, 7)
    torch.testing.assert_close(ct.conv1d(x1, w1, None, 2, 3, 1, 3, runtime=rt),
                               nn.functional.conv1d(x1, w1, None, 2, 3, 1, 3), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="strided"):
        ct.conv2d(x, w, padding="same", stride=2, runtime=rt)
    with pytest.raises(ValueError, match="padding_mode"):
        ct.conv2d(x, w, padding_mode="mirror", runtime=rt)
    with pytest.raises(ValueError, match="4-D weight"):
        ct.conv2d(x, w1, runtime=rt)


def test_clear_memo_drops_the_routes():
    rt = make_runtime(["torch"])
    ct.Conv2d(3, 4, 3, runtime=rt)(torch.randn(1, 3, 6, 6))
    assert len(rt.layer_memo("torch")) == 1
    rt.clear_memo()
    assert len(rt.layer_memo("torch")) == 0


# -- the duel: a plan must beat PyTorch's convolution in the layer itself ----------------------------------
@pytest.mark.parametrize("native_faster", [True, False])
def test_a_plan_duels_pytorchs_convolution_before_the_route_takes_it(monkeypatch, caplog, native_faster):
    """(On the GPU; here the CPU stands in.) The faster per call in the layer wins; either way training
    matches PyTorch, and PyTorch's winning is said once, with both times."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    seen = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        seen.append((type(contenders[0]).__name__, tuple(a.shape), tuple(b.shape)))
        return [200e-6, 150e-6] if native_faster else [150e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    plain = nn.Conv2d(3, 5, 3, padding=1)
    x = torch.randn(2, 3, 9, 9)
    with caplog.at_level(logging.INFO, logger="convtune"):
        assert_same_training(plain, patched_copy(plain, rt), x)
    labels = [label for route in rt.layer_memo("torch").values() for label in route.labels().values()]
    assert len(seen) == 3 and seen[0] == ("ArrayPlan", (2, 3, 9, 9), (5, 3, 3, 3))  # every pass, its operands
    if native_faster:
        assert labels and all(label.startswith("torch (in the layer 150 us per call, im2col") for label in labels)
        said = [r.getMessage() for r in caplog.records if "per call in the layer" in r.getMessage()]
        assert len(said) == 3 and "150 us per call in the layer against 200 us" in said[0]
    else:
        assert labels and all(label.startswith("im2col") for label in labels)


@pytest.mark.parametrize("plan_us, plan_wins", [(150.0, True), (190.0, True), (192.0, False), (199.0, False)])
def test_a_plan_must_win_its_duel_by_the_margin(monkeypatch, plan_us, plan_wins):
    """PyTorch takes 200 us per call; a plan within DUEL_MARGIN of that is a tie, and a tie goes to PyTorch."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    assert _dispatch.DUEL_MARGIN == 0.05
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [plan_us * 1e-6, 200e-6])
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    patched_copy(nn.Conv2d(3, 5, 3, padding=1), rt)(torch.randn(2, 3, 9, 9))
    (route,) = rt.layer_memo("torch").values()
    assert route.labels()["fwd"].startswith("im2col" if plan_wins else "torch (in the layer 200 us")


def test_no_duel_where_the_strategies_leave_pytorch_out_or_on_the_cpu(monkeypatch):
    def no_duel(*args, **kwargs):
        raise AssertionError("no duel expected")
    monkeypatch.setattr(_dispatch, "per_call_seconds", no_duel)
    x = torch.randn(2, 3, 9, 9)
    plain = nn.Conv2d(3, 5, 3, padding=1)
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    assert_same_training(plain, patched_copy(plain, rt), x)  # the CPU: the planner's timing counts the host
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    plain = nn.Conv2d(3, 5, 3, padding=1)
    rt = make_runtime(["im2col"])
    assert_same_training(plain, patched_copy(plain, rt), x)


def test_a_real_duel_times_both_and_keeps_the_numbers(monkeypatch):
    """The duel's own timing on real operands (CPU here): it returns and the route it picks trains right."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    plain = nn.Conv2d(4, 6, 3, padding=1, stride=2)
    assert_same_training(plain, patched_copy(plain, rt), torch.randn(2, 4, 11, 11))
    routes = list(rt.layer_memo("torch").values())
    assert routes and len(routes[0].labels()) == 3


def _duel_process(tmp_path):
    """``process()``: as a new process would, a runtime on a plan cache in ``tmp_path`` whose planner gives im2col's
    plan the win trains a patched 3-to-5-channel 3x3 layer against PyTorch's (on the same batch each time); returns the
    runtime."""
    from convtune.cache import PlanCache
    options = {"timer": FakeTimer({"im2col": 0.1, "torch": 1.0}), "strategies": ["im2col", "torch"]}
    x = torch.randn(2, 3, 9, 9)

    def process():
        runtime = Runtime(store=PlanCache(f"sqlite:///{tmp_path / 'plans.db'}"), planner_options=options)
        plain = nn.Conv2d(3, 5, 3, padding=1)
        assert_same_training(plain, patched_copy(plain, runtime), x)
        return runtime
    return process


def _stored_duels(tmp_path) -> list[str]:
    """The duels' records stored in ``tmp_path``'s plan cache, as stored (JSON)."""
    import sqlite3
    return [v for (v,) in sqlite3.connect(tmp_path / "plans.db").execute(
        "SELECT value FROM convtune_meta WHERE key LIKE 'duel:%'")]


def test_a_duels_verdict_is_stored_and_a_later_process_runs_no_duel(monkeypatch, tmp_path):
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    duels = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        duels.append(1)
        return [200e-6, 150e-6]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    process = _duel_process(tmp_path)
    process()
    assert len(duels) == 3
    stored = _stored_duels(tmp_path)
    assert len(stored) == 3 and all('"plan_us": 200.0' in v and '"native_us": 150.0' in v for v in stored)

    def no_duel(*args, **kwargs):
        raise AssertionError("the stored verdict should have been used")
    monkeypatch.setattr(_dispatch, "per_call_seconds", no_duel)
    later = process()
    labels = [label for route in later.layer_memo("torch").values() for label in route.labels().values()]
    assert len(labels) == 3 and all(label.startswith("torch (in the layer 150 us per call, im2col") for label in labels)
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    # what the host cost depended on changes: each change duels again (and stores the new verdict)
    from convtune.strategies import get_strategy
    im2col = type(get_strategy("im2col"))
    changes = [lambda: monkeypatch.setattr(_duel, "pytorch_versions", lambda: "torch-another-version"),
               lambda: monkeypatch.setenv("CONVTUNE_REPLAY", "0"),
               lambda: monkeypatch.setattr(im2col, "version_tag", lambda self: "im2col-another-version"),
               lambda: monkeypatch.setattr(_duel, "DUEL_METHOD", _duel.DUEL_METHOD + 1)]
    for i, change in enumerate(changes):
        change()
        process()
        assert len(duels) == 3 * (i + 2), i
    process()  # (and nothing changed since: no duel)
    assert len(duels) == 3 * (len(changes) + 1)


def test_a_duels_host_times_are_stored_with_its_verdict(monkeypatch, tmp_path):
    """Each contender's host time per call is kept beside its time in the layer, and a later process finds both."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        hosts[:] = [30e-6, 20e-6]
        return [100e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    process = _duel_process(tmp_path)
    process()
    stored = _stored_duels(tmp_path)
    assert stored and all('"plan_host_us": 30.0' in v and '"native_host_us": 20.0' in v for v in stored)

    def no_duel(*args, **kwargs):
        raise AssertionError("the stored verdict should have been used")
    monkeypatch.setattr(_dispatch, "per_call_seconds", no_duel)
    (route,) = process().layer_memo("torch").values()
    duel = route.fwd_exec.duel
    assert (duel.plan_s, duel.native_s, duel.plan_host_s, duel.native_host_s) == pytest.approx(
        (100e-6, 200e-6, 30e-6, 20e-6))


def test_the_search_is_spared_on_large_layers_of_a_class_where_it_buys_little():
    """floor_spares_search: a layer of DUEL_FLOOR_FLOPS or more whose class bounds the search's gain tightly (large
    depthwise kernels in half precision: SLaK-T's 51x51 at batch 16), in any pass; not the same layer in float32 or
    at a batch too small, nor a dense or small kernel."""
    from convtune.problem import PASSES, ConvProblem
    from convtune.torch._duel import DUEL_FLOOR_FLOPS, floor_spares_search

    def make(**kw):
        shape = dict(batch=16, in_channels=96, out_channels=96, input_size=(56, 56), kernel_size=51, padding=25,
                     groups=96, dtype="bfloat16", layout="channels_last")
        return ConvProblem.make(**{**shape, **kw})
    slak = make()
    assert slak.flops() >= DUEL_FLOOR_FLOPS and all(floor_spares_search(slak.for_pass(p)) for p in PASSES)
    assert floor_spares_search(make(dtype="float16"))
    small = make(batch=1, input_size=(14, 14))
    assert small.flops() < DUEL_FLOOR_FLOPS and not floor_spares_search(small)
    for other in (make(dtype="float32", layout="channels_first"), make(kernel_size=5, padding=2), make(groups=1)):
        assert not floor_spares_search(other), other.describe()


@pytest.mark.parametrize("floor_us, searched", [(1000.0, False), (104.0, True), (150.0, False)])
def test_a_large_layers_duel_runs_pytorchs_search_only_where_its_floor_does_not_lose(monkeypatch, tmp_path, floor_us,
                                                                                     searched):
    """(On the GPU; here the CPU stands in.) The plan takes 100 us per call. A floor under PyTorch's time (its heuristic
    pick over the search's largest gain) above that by the margin decides the duel without running PyTorch's call; a
    floor within the margin leaves it to the duel. The verdict is stored, its bound said."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    monkeypatch.setattr(_dispatch, "DUEL_FLOOR_FLOPS", 0)
    floors, runs = [], []
    monkeypatch.setattr(_dispatch, "search_floor", lambda problem, a, b, device: floors.append(problem.pass_) or
                        (floor_us * 1e-6, 25e-6))

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        runs.append([type(c).__name__ for c in contenders])
        hosts[:] = [30e-6, 20e-6][:len(contenders)]
        return [100e-6, 120e-6][:len(contenders)]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    process = _duel_process(tmp_path)
    rt = process()
    assert sorted(floors) == ["dgrad", "fwd", "wgrad"]
    assert [r for r in runs if "Native" in r] == ([["ArrayPlan", "Native"]] * 3 if searched else [])
    (route,) = rt.layer_memo("torch").values()
    duel = route.fwd_exec.duel
    assert (duel.plan_s, duel.native_s) == pytest.approx((100e-6, 120e-6 if searched else floor_us * 1e-6))
    assert duel.bound is not searched
    stored = _stored_duels(tmp_path)
    assert len(stored) == 3 and all(('"bound": "native_us"' in v) is not searched for v in stored)
    # (the host's time of PyTorch's call: measured in the duel, or its heuristic pick's where the floor decided)
    assert all('"plan_host_us": 30.0' in v and f'"native_host_us": {20.0 if searched else 25.0}' in v for v in stored)

    def no_duel(*args, **kwargs):
        raise AssertionError("the stored verdict should have been used")
    monkeypatch.setattr(_dispatch, "per_call_seconds", no_duel)
    monkeypatch.setattr(_dispatch, "search_floor", no_duel)
    (route,) = process().layer_memo("torch").values()
    duel = route.fwd_exec.duel
    assert (duel.plan_s, duel.native_s, duel.plan_host_s, duel.native_host_s) == pytest.approx(
        (100e-6, 120e-6 if searched else floor_us * 1e-6, 30e-6, 20e-6 if searched else 25e-6))
    assert duel.bound is not searched  # (read back from the store too: the gain by a floor is only a floor)


def test_a_small_layers_duel_puts_no_floor_under_pytorchs_search(monkeypatch):
    """Below DUEL_FLOOR_FLOPS the search costs little: the duel runs both."""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    assert nn.Conv2d(3, 5, 3).weight.numel() * 2 * 2 * 81 < _duel.DUEL_FLOOR_FLOPS

    def no_floor(*args, **kwargs):
        raise AssertionError("no floor expected")
    monkeypatch.setattr(_dispatch, "search_floor", no_floor)
    monkeypatch.setattr(_dispatch, "per_call_seconds", lambda *args, **kwargs: [100e-6, 200e-6])
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    patched_copy(nn.Conv2d(3, 5, 3, padding=1), rt)(torch.randn(2, 3, 9, 9))
    (route,) = rt.layer_memo("torch").values()
    assert route.fwd_exec.duel.native_s == pytest.approx(200e-6)


def test_a_gradients_duel_is_timed_inside_a_backward_where_training_runs_that_pass(monkeypatch):
    """PyTorch keeps its cuDNN plans per thread, and a training step runs the gradients on the autograd engine's thread
    (on CUDA its worker's): a duel of a gradient pass is timed inside a backward, the forward pass's where it is
    called. (Here the CPU stands in: its backward runs on the caller's thread, inside an autograd node all the same.)"""
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    inside = {}

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        inside[contenders[0].plan.problem.pass_] = torch._C._current_autograd_node() is not None
        return [100e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    rt = make_runtime(["im2col", "torch"], FakeTimer({"im2col": 0.1, "torch": 1.0}))
    plain = nn.Conv2d(3, 5, 3, padding=1)
    patched = patched_copy(plain, rt)
    x = torch.randn(2, 3, 9, 9, requires_grad=True)  # (all three passes)
    # (its duels run here, outside a backward; the steps said not host-bound: in host-bound steps a layer whose calls
    # cost PyTorch's convolution less host time than the autograd detour is left unsearched, with no duel, and on a
    # loaded CPU those two timings can come out either way)
    ct.tune(patched, x, runtime=rt, progress=False, host_bound=False)
    assert inside == {"fwd": False, "dgrad": True, "wgrad": True}
    assert_same_training(plain, patched, torch.randn(2, 3, 9, 9))


def test_work_run_where_a_pass_runs_returns_its_result_or_raises_its_exception():
    cpu = torch.device("cpu")
    assert _duel.where_pass_runs("fwd", torch._C._current_autograd_node, cpu) is None
    assert _duel.where_pass_runs("wgrad", torch._C._current_autograd_node, cpu) is not None
    assert _duel.where_pass_runs("dgrad", lambda: 7, cpu) == 7

    def fails():
        raise KeyError("no")
    with pytest.raises(KeyError):
        _duel.where_pass_runs("dgrad", fails, cpu)


def test_a_duel_measures_each_contenders_host_time_too():
    from convtune.torch._duel import per_call_seconds
    x, w = torch.randn(2, 3, 9, 9), torch.randn(5, 3, 3, 3)
    hosts = []
    walls = per_call_seconds([torch.nn.functional.conv2d, lambda a, b: torch.nn.functional.conv2d(a, b, padding=1)],
                             x, w, torch.device("cpu"), hosts=hosts)
    assert len(hosts) == 2 and all(0 < h <= t for h, t in zip(hosts, walls))  # (issued before synchronised)


# -- kept spectra: a training step's three passes as one FFT round trip ----------------------------------
KEPT_FORMS = {
    "dense-5x5": (nn.Conv2d, dict(in_channels=3, out_channels=4, kernel_size=5, padding=2), (2, 3, 12, 11)),
    "depthwise-7x7": (nn.Conv2d, dict(in_channels=6, out_channels=6, kernel_size=7, padding=3, groups=6,
                                      bias=False), (2, 6, 13, 12)),
    "1d-long": (nn.Conv1d, dict(in_channels=4, out_channels=4, kernel_size=15, padding=7, groups=4), (2, 4, 40)),
    "3d": (nn.Conv3d, dict(in_channels=2, out_channels=3, kernel_size=3, padding=1), (1, 2, 6, 7, 5)),
}


@pytest.mark.parametrize("form", sorted(KEPT_FORMS))
def test_kept_spectra_train_like_pytorch(form, monkeypatch):
    from convtune.roundtrip import RoundTrip
    calls = []
    for name in ("kept_forward", "kept_backward"):
        original = getattr(RoundTrip, name)
        monkeypatch.setattr(RoundTrip, name, lambda self, *a, _o=original, _n=name, **k: calls.append(_n) or
                            _o(self, *a, **k))
    cls, kwargs, shape = KEPT_FORMS[form]
    torch.manual_seed(0)
    plain = cls(**kwargs)
    rt = make_runtime(["fft", "im2col"])
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)
    x = torch.randn(shape)
    assert_same_training(plain, patched, x, atol=1e-4 if cls is nn.Conv3d else 1e-5)
    assert calls == ["kept_forward", "kept_backward"]  # one forward, one backward for both gradients
    (route,) = rt.layer_memo("torch").values()
    assert route.trips[True] is not None and route.trips[True].config.label().startswith("fft-trip[")


@pytest.mark.parametrize("groups", [1, 4])
def test_a_capture_records_a_round_trip_only_with_the_pointwise_product(groups, caplog, monkeypatch):
    """Under a (faked) CUDA graph capture, a layer with kept spectra records its round trip where its products
    are convtune's kernels (the pointwise product, depthwise here); where they are GEMMs (cuBLAS, which CuPy
    refuses while capturing) PyTorch's convolution and autograd are recorded for the layer, said once."""
    from convtune.roundtrip import RoundTrip
    from convtune.torch import functional
    monkeypatch.setattr(_notes, "_said", set())
    class PreferPointwise(FakeTimer):  # the depthwise layer's round trip takes the pointwise product, the
        def __call__(self, fn, backend=None, label=""):  # dense one GEMMs (the first candidate)
            stats = super().__call__(fn, backend, label)
            faster = groups > 1 and "pointwise" in label
            return dataclasses.replace(stats, median_s=stats.median_s / 10) if faster else stats
    rt = make_runtime(["fft", "im2col"], PreferPointwise())
    plain = nn.Conv2d(4, 4, 5, padding=2, groups=groups)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    for _ in range(2):  # eager steps: the round trip decided and built
        patched(x).sum().backward()
    (route,) = rt.layer_memo("torch").values()
    trip = route.trips[True]
    assert trip is not None and trip.recordable == (groups == 4), trip.config
    calls = []
    original = RoundTrip.kept_forward
    monkeypatch.setattr(RoundTrip, "kept_forward", lambda self, *a: calls.append(1) or original(self, *a))
    monkeypatch.setattr(functional, "capturing", lambda t: True)
    monkeypatch.setattr(_dispatch, "capturing", lambda t: True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        for _ in range(2):
            x.grad = None
            patched(x).sum().backward()
            expected = torch.autograd.grad(plain(x).sum(), x)[0]
            torch.testing.assert_close(x.grad, expected, rtol=1e-4, atol=1e-5)
    assert bool(calls) == trip.recordable and route.capture.trip_failed == (not trip.recordable)
    assert caplog.text.count("is not recorded in CUDA graphs") == (0 if trip.recordable else 1)


def test_kept_spectra_fall_back_to_the_per_pass_plans_where_they_cannot_serve(caplog):
    rt = make_runtime(["fft", "im2col"])
    plain = nn.Conv2d(3, 4, 5, padding=2)
    x = torch.randn(2, 3, 10, 10, requires_grad=True)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)
    # a second backward of the same graph, and a double backward: the per-pass plans, differentiable
    for model in (plain, patched):
        model.zero_grad()
    y_a, y_b = plain(x), patched(x)
    g = torch.randn(y_a.shape)
    ga = torch.autograd.grad(y_a, (x, plain.weight), g, create_graph=True)
    gb = torch.autograd.grad(y_b, (x, patched.weight), g, create_graph=True)
    for a, b in zip(ga, gb):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    second_a = torch.autograd.grad(ga[0].square().sum(), plain.weight)[0]
    second_b = torch.autograd.grad(gb[0].square().sum(), patched.weight)[0]
    torch.testing.assert_close(second_b, second_a, rtol=1e-4, atol=1e-4)
    y_b = patched(x)
    first = torch.autograd.grad(y_b, x, g, retain_graph=True)[0]
    again = torch.autograd.grad(y_b, x, g)[0]  # the spectra went with the first backward
    torch.testing.assert_close(again, first, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="keep_spectra must be one of"):
        ct.Conv2d(3, 4, 3, keep_spectra="always")
    with pytest.raises(ValueError, match="keep_spectra must be one of"):
        ct.patch(nn.Conv2d(3, 4, 3), keep_spectra=1)


@pytest.mark.parametrize("dtype, fmt", [(torch.bfloat16, torch.channels_last), (torch.float16, torch.contiguous_format),
                                         (torch.float32, torch.channels_last)])
def test_kept_spectra_of_half_precision_and_channels_last_layers_run_between_conversions(dtype, fmt, monkeypatch):
    """A half-precision or channels_last layer with kept spectra: its training step is one round trip of the float32
    channels-first trip, PyTorch converting around it; gradients in the layer's dtype and layout, within the
    dtype's bound of PyTorch's own."""
    from convtune import precision
    from convtune.roundtrip import RoundTrip
    calls = []
    original = RoundTrip.kept_backward
    monkeypatch.setattr(RoundTrip, "kept_backward", lambda self, *a, **k: calls.append(self.converted) or
                        original(self, *a, **k))
    torch.manual_seed(0)
    plain = nn.Conv2d(4, 4, 7, padding=3, groups=4).to(dtype=dtype, memory_format=fmt)
    patched = copy.deepcopy(plain)
    rt = make_runtime(["fft", "im2col"])
    ct.patch(patched, runtime=rt, keep_spectra=True)
    x = torch.randn(2, 4, 12, 11).to(dtype=dtype, memory_format=fmt)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    ya, yb = plain(xa), patched(xb)
    assert yb.dtype == dtype and yb.is_contiguous(memory_format=fmt)
    g = torch.randn(ya.shape).to(dtype=dtype, memory_format=fmt)
    ya.backward(g)
    yb.backward(g)
    assert calls == [False]  # one backward through the float32 trip (the layer converts with PyTorch)
    (route,) = rt.layer_memo("torch").values()
    assert route.trips[True] is not None and route.problem.dtype == str(dtype).split(".")[1]
    bound = max(8 * precision.UNIT_ROUNDOFF[str(dtype).split(".")[1]], 1e-5)  # (both sides rounded; float32: its bound)
    for a, b in ((ya.detach(), yb.detach()), (xa.grad, xb.grad), (plain.weight.grad, patched.weight.grad),
                 (plain.bias.grad, patched.bias.grad)):
        assert b.dtype == dtype
        assert float((b.float() - a.float()).norm() / a.float().norm()) <= bound, (a.shape, dtype)
    assert xb.grad.is_contiguous(memory_format=fmt)


def test_kept_spectra_auto_follows_the_measured_verdict():
    from conftest import FakeTimer as Timer
    # (the FFT wins every pass, so that 'auto' measures a round trip)
    pays = make_runtime(["fft", "im2col"], Timer(times={"fft-trip": 1e-3, "fft[": 0.5}))
    costs = make_runtime(["fft", "im2col"], Timer(times={"fft-trip": 100.0, "fft[": 0.5}))
    for rt, expected in ((pays, True), (costs, False)):
        plain = nn.Conv2d(3, 4, 9, padding=4)
        patched = copy.deepcopy(plain)
        ct.patch(patched, runtime=rt, keep_spectra="auto")
        assert_same_training(plain, patched, torch.randn(2, 3, 12, 12))
        (route,) = rt.layer_memo("torch").values()
        assert (route.trips["auto"] is not None) == expected


def test_kept_spectra_auto_measures_only_calls_that_need_both_gradients(monkeypatch):
    """Per-pass plans are the default of the modules and of ``patch``; with ``'auto'``, inference calls and calls that
    need only one gradient never measure a round trip (nothing keeps spectra there), a training step does."""
    import convtune.roundtrip
    from conftest import FakeTimer as Timer
    assert ct.Conv2d(3, 4, 3).convtune_keep_spectra is False
    model = nn.Sequential(nn.Conv2d(3, 4, 9, padding=4))
    ct.patch(model)
    assert model[0].convtune_keep_spectra is False
    rt = make_runtime(["fft", "im2col"], Timer(times={"fft-trip": 1e-3, "fft[": 0.5}))
    layer = ct.Conv2d(3, 4, 9, padding=4, runtime=rt, keep_spectra="auto")
    measured = []
    original = convtune.roundtrip.tune_round_trip
    monkeypatch.setattr(convtune.roundtrip, "tune_round_trip", lambda *a, **k: measured.append(1) or original(*a, **k))
    x = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        layer(x)
    layer.weight.requires_grad_(False)  # frozen weights: one gradient
    layer(x.requires_grad_()).sum().backward()
    assert measured == []
    layer.weight.requires_grad_(True)  # a training step: both gradients
    layer(x).sum().backward()
    assert measured == [1]
    (route,) = rt.layer_memo("torch").values()
    assert route.trips["auto"] is not None


@pytest.mark.parametrize("trip_faster", [True, False])
def test_a_paying_round_trip_duels_the_per_pass_plans_in_the_layer(monkeypatch, caplog, trip_faster):
    """(On the GPU; here the CPU stands in.) keep_spectra='auto': a round trip whose verdict says it pays on the device
    alone still meets the per-pass plans per training call in the layer, host work included; the faster by the margin
    runs the layer's later training steps, which train as PyTorch's do either way, and the per-pass plans' winning is
    said once."""
    from conftest import FakeTimer as Timer
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    seen = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        names = [getattr(fn, "__name__", "") for fn in contenders]
        if names == ["kept", "per_pass"]:
            for fn in contenders:  # both contenders run a training call of the layer
                fn(a, b)
            seen.append((tuple(a.shape), tuple(b.shape), a.requires_grad and b.requires_grad))
            return [100e-6, 200e-6] if trip_faster else [200e-6, 100e-6]
        return [100e-6, 200e-6]  # (a pass's duel: its plan)
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    rt = make_runtime(["fft", "im2col", "torch"], Timer(times={"fft-trip": 1e-3, "fft[": 0.5}))
    plain = nn.Conv2d(3, 4, 9, padding=4)
    with caplog.at_level(logging.INFO, logger="convtune"):
        assert_same_training(plain, patched_copy(plain, rt, keep_spectra="auto"), torch.randn(2, 3, 12, 12))
    assert seen == [((2, 3, 12, 12), (4, 3, 9, 9), True)]  # one duel, on the layer's operands' shapes
    (route,) = rt.layer_memo("torch").values()
    assert route.trips.duelled and (route.trips["auto"] is not None) == trip_faster
    said = [r.getMessage() for r in caplog.records if "runs its per-pass plans, not the round trip" in r.getMessage()]
    assert len(said) == (0 if trip_faster else 1)
    if said:
        assert "100 us per training call in the layer against 200 us" in said[0]


def test_a_round_trips_duel_is_stored_and_a_later_process_runs_none(monkeypatch, tmp_path):
    from convtune.cache import PlanCache
    from conftest import FakeTimer as Timer
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    duels = []

    def fake_times(contenders, a, b, device, hosts=None, devices=None):
        duels.append([getattr(fn, "__name__", "") for fn in contenders])
        return [100e-6, 200e-6]
    monkeypatch.setattr(_dispatch, "per_call_seconds", fake_times)
    url = f"sqlite:///{tmp_path / 'plans.db'}"
    x = torch.randn(2, 3, 12, 12)
    for _process in range(2):
        rt = Runtime(store=PlanCache(url), planner_options={"timer": Timer(times={"fft-trip": 1e-3, "fft[": 0.5}),
                                                           "strategies": ["fft", "im2col"]})
        plain = nn.Conv2d(3, 4, 9, padding=4)
        assert_same_training(plain, patched_copy(plain, rt, keep_spectra="auto"), x)
        (route,) = rt.layer_memo("torch").values()
        assert route.trips["auto"] is not None
    assert duels == [["kept", "per_pass"]]  # the second process read the verdict
    stored = [v for v in _stored_duels(tmp_path) if "kept-spectra" in v]
    assert len(stored) == 1 and '"trip_us": 100.0' in stored[0] and '"per_pass_us": 200.0' in stored[0]
    assert "|trip" in stored[0]  # (the round trips' version among its conditions)


def test_a_real_round_trip_duel_times_both_and_trains_right(monkeypatch):
    """The round trip's duel with the per-pass plans timed for real (the CPU here): either verdict trains right."""
    from conftest import FakeTimer as Timer
    monkeypatch.setattr(_dispatch, "DUEL_DEVICE_TYPES", {"cpu"})
    rt = make_runtime(["fft", "im2col"], Timer(times={"fft-trip": 1e-3, "fft[": 0.5}))
    plain = nn.Conv2d(3, 4, 9, padding=4)
    patched = patched_copy(plain, rt, keep_spectra="auto")
    for _ in range(2):  # the call that duels, and one after
        patched.zero_grad(set_to_none=True)
        assert_same_training(copy.deepcopy(plain), patched, torch.randn(2, 3, 12, 12))
    (route,) = rt.layer_memo("torch").values()
    assert route.trips.duelled


def test_tune_ahead_decides_the_round_trips_of_kept_spectra_layers(monkeypatch):
    import convtune.roundtrip
    rt = make_runtime(["fft", "im2col"], FakeTimer(times={"fft-trip": 1e-3, "fft[": 0.5}))
    model = nn.Sequential(nn.Conv2d(3, 4, 9, padding=4), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1))
    plain = copy.deepcopy(model)
    ct.patch(model, runtime=rt, keep_spectra="auto", filter=lambda m, name: name == "0")
    x = torch.randn(2, 3, 12, 12, requires_grad=True)
    report = ct.tune(model, x, runtime=rt, progress=False)
    assert len(report.trips) == 1 and "keeps spectra" in report.trips[0][1] and "round-trip verdicts" in str(report)

    def no_tuning(*args, **kwargs):
        raise AssertionError("the verdict was tuned ahead")
    monkeypatch.setattr(convtune.roundtrip, "tune_round_trip", no_tuning)
    assert_same_training(plain, model, x)
    routes = [r for r in rt.layer_memo("torch").values() if r.trips]
    assert len(routes) == 1 and routes[0].trips["auto"] is not None


def test_kept_spectra_are_bounded_by_the_devices_budget_and_given_back(caplog):
    """Two layers that keep spectra, a budget that holds one layer's: the first keeps them, the second runs its
    per-pass plans (said once), the gradients are PyTorch's, and the backward gives the bytes back; a forward whose
    output is never differentiated gives them back when its graph is freed."""
    import gc
    from conftest import FakeTimer as Timer
    from convtune.text import human_bytes
    timer = Timer(times={"fft-trip": 1e-3, "fft[": 0.5})  # (the FFT wins every pass; the round trips pay)
    probe_rt = make_runtime(["fft", "im2col"], timer)
    one = copy.deepcopy(nn.Conv2d(3, 3, 9, padding=4))
    ct.patch(one, runtime=probe_rt, keep_spectra=True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        one(torch.randn(2, 3, 12, 12, requires_grad=True)).sum().backward()
    (route,) = probe_rt.layer_memo("torch").values()
    layer_bytes = route.trips.kept_bytes
    assert layer_bytes > 0 and probe_rt.kept_ledger("cpu").held == 0
    assert probe_rt.kept_ledger("cpu").peak == layer_bytes
    assert f"keeps {human_bytes(layer_bytes)} of spectra from its forward pass to its backward" in caplog.text

    rt = make_runtime(["fft", "im2col"], timer, kept_budget=layer_bytes)
    plain = nn.Sequential(nn.Conv2d(3, 3, 9, padding=4), nn.Conv2d(3, 3, 9, padding=4))
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        assert_same_training(plain, patched, torch.randn(2, 3, 12, 12))
        assert_same_training(plain, patched, torch.randn(2, 3, 12, 12))
    kept = rt.kept_ledger("cpu")
    assert kept.budget == layer_bytes and kept.peak == layer_bytes and kept.held == 0 and kept.refused >= 2
    assert caplog.text.count("do not fit beside the other layers'") == 1
    y = patched(torch.randn(2, 3, 12, 12, requires_grad=True))
    assert kept.held == layer_bytes
    del y
    gc.collect()
    assert kept.held == 0 and "kept spectra: 0 B held" in kept.describe()


def test_a_runtimes_kept_spectra_budget_is_a_share_a_byte_count_or_none():
    assert make_runtime(kept_budget=None).kept_ledger("cpu").budget is None
    assert make_runtime(kept_budget=1 << 20).kept_ledger("cpu").budget == 1 << 20
    assert make_runtime(kept_budget=0.5).kept_ledger("cpu", lambda: 1000).budget == 500
    assert make_runtime().kept_ledger("cpu", lambda: None).budget is None  # (free memory unknown: no limit)
    for wrong in (1.5, -1, "8G", True):
        with pytest.raises(ValueError, match="kept_budget is a share"):
            make_runtime(kept_budget=wrong)


def test_a_round_trip_that_fails_gives_way_to_the_per_pass_plans(monkeypatch, caplog):
    from convtune.roundtrip import RoundTrip
    rt = make_runtime(["fft", "im2col"])
    plain = nn.Conv2d(3, 4, 5, padding=2)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)

    def broken(self, *args, **kwargs):
        raise RuntimeError("a test's broken round trip")
    monkeypatch.setattr(RoundTrip, "kept_backward", broken)  # fails in the backward: gradients still come
    with caplog.at_level(logging.WARNING, logger="convtune"):
        assert_same_training(plain, patched, torch.randn(2, 3, 10, 10))
    assert "broken round trip" in caplog.text and "per-pass plans" in caplog.text
    (route,) = rt.layer_memo("torch").values()
    assert route.trips[True] is None  # and the forward passes no longer try it
    monkeypatch.setattr(RoundTrip, "kept_forward", broken)
    rt2 = make_runtime(["fft", "im2col"])
    plain = nn.Conv2d(3, 4, 5, padding=2)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt2, keep_spectra=True)
    assert_same_training(plain, patched, torch.randn(2, 3, 10, 10))  # fails in the forward: the per-pass plans


@pytest.mark.parametrize("plan_us, rounds", [(350.0, 2), (110.0, _duel.DUEL_ROUNDS)])
def test_a_clear_duel_ends_after_two_rounds(monkeypatch, plan_us, rounds):
    """On a clock the contenders advance (PyTorch 100 us per call, the plan ``plan_us``): a gap of
    DUEL_CLEAR or more is settled by two rounds; a close one takes every round."""
    now = [0.0]
    monkeypatch.setattr(_dispatch.time, "perf_counter", lambda: now[0])
    calls = {"plan": 0, "torch": 0}

    def contender(name, us):
        def run(a, b):
            calls[name] += 1
            now[0] += us * 1e-6
        return run
    t_plan, t_torch = _dispatch.per_call_seconds([contender("plan", plan_us), contender("torch", 100.0)], None, None,
                                                 torch.device("cpu"))
    assert (t_plan, t_torch) == pytest.approx((plan_us * 1e-6, 100e-6))
    # each: two warm-up calls, one to size the rounds (to last DUEL_ROUND_S), then the rounds
    per_round = max(_duel.DUEL_CALLS, math.ceil(_duel.DUEL_ROUND_S * 2 / ((plan_us + 100.0) * 1e-6)))
    assert calls == {"plan": 3 + rounds * per_round, "torch": 3 + rounds * per_round}
    assert _duel.DUEL_CLEAR == 1.5


def test_a_routes_native_verdict_is_remembered_until_an_executor_changes():
    """A training call asks whether its passes all run PyTorch's convolution; the answer is remembered per
    combination of gradients (a no once the plans were weighed), and forgotten when a pass gets another executor."""
    rt = make_runtime(["torch"])
    layer = ct.Conv2d(3, 4, 3, padding=1, runtime=rt)
    x = torch.randn(2, 3, 8, 8)
    layer(x).sum().backward()  # the weight needs a gradient, the input not: fwd and wgrad
    (route,) = rt.layer_memo("torch").values()
    assert route.verdicts == {(False, True): True}
    assert route.native_for_grads(True, True)  # resolving dgrad on the way (an executor change) forgot the first
    assert route.native_for_grads(False, True) and route.verdicts == {(False, True): True, (True, True): True}
    route.resolve("dgrad")  # (the same plan, looked up again: any executor change forgets the verdicts)
    assert route.verdicts == {}
    other = make_runtime(["im2col"])
    layer = ct.Conv2d(3, 4, 3, padding=1, runtime=other)
    layer(x.requires_grad_()).sum().backward()
    (route,) = other.layer_memo("torch").values()
    assert not route.native_for_grads(True, True) and route.verdicts == {(True, True): False}
