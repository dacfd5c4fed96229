"""The registered operators: opcheck, double backward, torch.compile of a patched model (CPU)."""

import copy
import logging

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import convtune  # noqa: E402
import convtune.torch as ct  # noqa: E402
from convtune import MemoryPlanStore, Runtime  # noqa: E402
from convtune.executor import Executor  # noqa: E402
from convtune.torch import _autograd  # noqa: E402
from conftest import FakeTimer  # noqa: E402
from torch_models import MODELS  # noqa: E402

OPS = torch.ops.convtune


@pytest.fixture(params=["torch", "im2col"])
def default_runtime(request):
    """The registered ops take no runtime argument: they use the default runtime (compiled models too)."""
    rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": FakeTimer(), "strategies": [request.param]})
    previous = convtune.set_default_runtime(rt)
    yield rt
    convtune.set_default_runtime(previous)


def _layouts(x):
    yield "contiguous", x
    yield "channels_last", x.contiguous(memory_format=torch.channels_last)
    wide = torch.randn(x.shape[0] * 2, *x.shape[1:-1], x.shape[-1] + 2)
    yield "sliced", wide[::2, ..., 1:-1]


GEOMETRY = ([2, 1], [1, 2], [1, 2], 2, "fp32")


@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "sliced"])
def test_opcheck_all_three_ops(default_runtime, layout):
    gen = torch.Generator().manual_seed(0)
    x = dict(_layouts(torch.randn(3, 4, 9, 8, generator=gen)))[layout]
    w = torch.randn(6, 2, 3, 3, generator=gen)
    b = torch.randn(6, generator=gen)
    y = OPS.conv_fwd(x, w, b, *GEOMETRY)
    ref = nn.functional.conv2d(x, w, b, GEOMETRY[0], GEOMETRY[1], GEOMETRY[2], GEOMETRY[3])
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)
    dy = dict(_layouts(torch.randn(y.shape, generator=gen)))[layout]
    cases = [(OPS.conv_fwd.default, (x, w, b, *GEOMETRY)), (OPS.conv_fwd.default, (x, w, None, *GEOMETRY)),
             (OPS.conv_dgrad.default, (dy, w, list(x.shape), *GEOMETRY)),
             (OPS.conv_wgrad.default, (x, dy, list(w.shape), *GEOMETRY))]
    for op, args in cases:
        grads = [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) else a for a in args]
        torch.library.opcheck(op, grads)
        torch.library.opcheck(op, args)


def test_empty_batch_and_other_dtypes_go_to_pytorch(default_runtime):
    x, w = torch.randn(0, 3, 8, 8), torch.randn(4, 3, 3, 3)
    assert OPS.conv_fwd(x, w, None, [1, 1], [0, 0], [1, 1], 1, "fp32").shape == (0, 4, 6, 6)
    dw = OPS.conv_wgrad(x, torch.randn(0, 4, 6, 6), [4, 3, 3, 3], [1, 1], [0, 0], [1, 1], 1, "fp32")
    assert dw.shape == (4, 3, 3, 3) and not dw.any()
    x64, w64 = torch.randn(2, 3, 8, 8, dtype=torch.float64), torch.randn(4, 3, 3, 3, dtype=torch.float64)
    torch.testing.assert_close(OPS.conv_fwd(x64, w64, None, [1, 1], [1, 1], [1, 1], 1, "fp32"),
                               nn.functional.conv2d(x64, w64, padding=1))


def _second_order(conv, x, w):
    """A loss built from a first-order gradient (a gradient penalty), differentiated again."""
    x, w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    y = conv(x, w)
    probe = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    gx, gw = torch.autograd.grad((y * probe).sum(), (x, w), create_graph=True)
    (gx.square().sum() + gw.square().sum()).backward()
    return x.grad, w.grad


@pytest.mark.parametrize("path", ["eager", "ops"])
def test_double_backward_matches_pytorch(default_runtime, path):
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(2, 4, 10, 9, generator=gen), torch.randn(6, 2, 3, 3, generator=gen)
    kw = dict(stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    if path == "eager":
        ours = ct.Conv2d(4, 6, 3, bias=False, runtime=default_runtime, **kw)
        convtune_conv = lambda a, b: ours._conv_forward(a, b, None)  # noqa: E731
    else:
        convtune_conv = lambda a, b: OPS.conv_fwd(a, b, None, [2, 1], [1, 2], [1, 2], 2, "fp32")  # noqa: E731
    expected = _second_order(lambda a, b: nn.functional.conv2d(a, b, **kw), x, w)
    got = _second_order(convtune_conv, x, w)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)


def test_gradients_formula_is_the_adjoint_identity():
    """The one backward formula against PyTorch's own convolution gradients, pass by pass."""
    gen = torch.Generator().manual_seed(2)
    x, w = torch.randn(2, 3, 7, 6, generator=gen), torch.randn(4, 3, 3, 2, generator=gen)
    fwd = lambda a, b: nn.functional.conv2d(a, b, padding=1)  # noqa: E731
    dgrad = lambda dy, b: torch.nn.grad.conv2d_input(x.shape, b, dy, padding=1)  # noqa: E731
    wgrad = lambda a, dy: torch.nn.grad.conv2d_weight(a, w.shape, dy, padding=1)  # noqa: E731
    y = fwd(x, w)
    g = torch.randn(y.shape, generator=gen)
    dx, dw = _autograd.gradients("fwd", (True, True), x, w, g, fwd, dgrad, wgrad)
    xr, wr = x.clone().requires_grad_(), w.clone().requires_grad_()
    fwd(xr, wr).backward(g)
    torch.testing.assert_close(dx, xr.grad)
    torch.testing.assert_close(dw, wr.grad)


@pytest.mark.parametrize("name", ["resnet_like", "longconv_tiny"])
def test_compiled_patched_model_fullgraph(default_runtime, name):
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    plain = factory()
    patched = copy.deepcopy(plain)
    ct.patch(patched)
    compiled = torch.compile(patched, fullgraph=True, backend="aot_eager")
    x = torch.randn(shape)
    for model in (plain, compiled):
        model.zero_grad()
        model(x).square().sum().backward()
    torch.testing.assert_close(compiled(x), plain(x), rtol=1e-4, atol=1e-5)
    for (n, a), (_n, b) in zip(plain.named_parameters(), patched.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=n)
    assert len(default_runtime.layer_memo("torch")) > 0  # the ops ran convtune's routes


def test_inductor_compiles_a_patched_model(default_runtime):
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3))
    plain = copy.deepcopy(model)
    ct.patch(model)
    x = torch.randn(2, 3, 10, 10)
    torch.testing.assert_close(torch.compile(model, fullgraph=True)(x), plain(x), rtol=1e-4, atol=1e-5)


# -- plans called by address (the CUDA hot path), exercised on CPU memory ---------------------------
class _AddressBridge:
    """A stand-in for the CUDA bridge: ``launch_stream`` answers (or, ``stream=None``, says the tensor is on
    another device); ``call`` records what went the array way."""

    device_type = "cuda"

    def __init__(self, stream="stream"):
        self.stream, self.called = stream, []

    def launch_stream(self, index):
        return self.stream

    def call(self, index, fn, *args):
        self.called.append(fn)
        return fn(*args)

    @staticmethod
    def array(t):
        return t.detach().numpy()


def _at(ptr, shape):
    """The float32 memory at ``ptr`` as a (C-contiguous) tensor of ``shape``, without a copy."""
    import ctypes
    import math
    import numpy as np
    n = math.prod(shape)
    return torch.from_numpy(np.ctypeslib.as_array((ctypes.c_float * n).from_address(ptr)).reshape(shape))


def _address_plan(problem, form):
    """A plan whose executor's by-address form (``form``: ``'native'``, the problem's dtype and layout;
    ``'float32'``, float32 channels-first through :func:`convtune.precision.bounded`) computes the forward
    pass with PyTorch on the memory it is given, recording the streams it ran on."""
    from convtune.plan import Plan
    from convtune.strategies.base import Config
    x_shape, w_shape = problem.operand_shapes
    streams = []

    def launch(a, b, out, stream):
        streams.append(stream)
        y = torch.nn.functional.conv2d(_at(a, x_shape), _at(b, w_shape), None, problem.stride, problem.padding,
                                       problem.dilation, problem.groups)
        _at(out, problem.result_shape).copy_(y)

    def run(a, b, out=None):
        raise AssertionError("the array path ran")
    if form == "native":
        executor = Executor(run, launch=launch)
    else:
        executor = Executor(run, float32=Executor(run, launch=launch))
    return Plan(problem, "fake", Config(), "cupy", run=executor), streams


@pytest.mark.parametrize("dtype, layout, form", [("float32", "channels_first", "native"),
                                                 ("float32", "channels_last", "float32"),
                                                 ("bfloat16", "channels_last", "float32"),
                                                 ("bfloat16", "channels_first", "float32")])
def test_an_address_plan_gets_dense_operands_and_gives_pytorchs_result(dtype, layout, form):
    from convtune.torch._dispatch import ArrayPlan, layer_problem
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    torch.manual_seed(0)
    x = torch.randn(6, 4, 11, 10)[::2, :, 1:, :].to(tdtype)  # not dense
    w = torch.randn(6, 4, 3, 3).to(tdtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    problem = layer_problem(x.shape, w.shape, (1, 1), (1, 0), (1, 1), 1, "fp32", tdtype, layout)
    plan, streams = _address_plan(problem, form)
    br = _AddressBridge()
    executor = ArrayPlan(plan, br, problem)
    y = executor(x, w, torch.ones(6, dtype=tdtype))
    want = torch.nn.functional.conv2d(x.float(), w.float(), None, 1, (1, 0)).to(tdtype) + 1  # (bias after rounding)
    assert y.dtype == tdtype and streams == ["stream"] and br.called == []
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_an_address_plan_of_a_tensor_on_another_device_goes_the_array_way():
    from convtune.torch._dispatch import ArrayPlan, layer_problem
    x, w = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    problem = layer_problem(x.shape, w.shape, (1, 1), (0, 0), (1, 1), 1, "fp32")
    plan, streams = _address_plan(problem, "native")
    br = _AddressBridge(stream=None)
    with pytest.raises(AssertionError, match="the array path ran"):
        ArrayPlan(plan, br, problem)(x, w)
    assert streams == [] and br.called == [plan]


def test_bfloat16_plans_are_not_called_by_their_native_address_form():
    """bfloat16 lives in float32 arrays: a native by-address form (operands of the problem's dtype) cannot
    take PyTorch's bfloat16 tensors, so the plan keeps the array way."""
    from convtune.torch._dispatch import ArrayPlan, layer_problem
    problem = layer_problem((2, 3, 8, 8), (5, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1, "fp32", torch.bfloat16)
    plan, _ = _address_plan(problem, "native")
    assert ArrayPlan(plan, _AddressBridge(), problem).launch is None


def test_a_by_address_form_that_reads_bfloat16_gets_the_tensors_own_memory_and_a_workspace():
    """Where a plan's by-address form says it reads bfloat16 itself (the channels-last depthwise kernels), the
    bridge hands it the bfloat16 tensors' memory, dense in the problem's layout, and a workspace block of the
    size it asks for as a fifth argument; the result is bfloat16 in that layout, nothing goes the array way."""
    import ctypes
    import math
    import numpy as np
    from convtune.plan import Plan
    from convtune.strategies.base import Config
    from convtune.torch._dispatch import ArrayPlan, layer_problem

    def at16(ptr, shape):  # the bfloat16 memory at ptr, without a copy
        n = math.prod(shape)
        raw = np.ctypeslib.as_array((ctypes.c_uint16 * n).from_address(ptr)).reshape(shape)
        return torch.from_numpy(raw).view(torch.bfloat16)
    problem = layer_problem((2, 4, 9, 8), (4, 1, 3, 3), (1, 1), (1, 1), (1, 1), 4, "fp32", torch.bfloat16,
                            "channels_last")
    workspaces = []

    def launch(a, b, out, stream, workspace=None):
        workspaces.append(workspace)
        x = at16(a, (2, 9, 8, 4)).permute(0, 3, 1, 2)  # channels-last memory: N, H, W, C
        y = torch.nn.functional.conv2d(x.float(), at16(b, (4, 1, 3, 3)).float(), None, 1, 1, 1, 4)
        at16(out, (2, 9, 8, 4)).copy_(y.to(torch.bfloat16).permute(0, 2, 3, 1))

    def run(a, b, out=None):
        raise AssertionError("the array path ran")
    run = Executor(run, launch=launch, launch_reads_bfloat16=True, launch_workspace=96)
    br = _AddressBridge()
    executor = ArrayPlan(Plan(problem, "fake", Config(), "cupy", run=run), br, problem)
    assert executor.launch_dtype == torch.bfloat16 and executor.launch_workspace == 96
    torch.manual_seed(0)
    x = torch.randn(2, 4, 9, 8).to(torch.bfloat16)  # channels-first: made dense channels-last for the launch
    w = torch.randn(4, 1, 3, 3).to(torch.bfloat16)
    y = executor(x, w)
    want = torch.nn.functional.conv2d(x.float(), w.float(), None, 1, 1, 1, 4).to(torch.bfloat16)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last) and br.called == []
    assert len(workspaces) == 1 and isinstance(workspaces[0], int) and workspaces[0] != 0
    torch.testing.assert_close(y, want, rtol=0, atol=0)


def test_a_one_d_channels_last_launch_gets_and_gives_memory_in_nlc_order():
    """A 1-D call on (N, L, C) memory is a channels_last problem; PyTorch has no memory format for it, and the
    launch of such a problem (the channels-last depthwise kernels, cuDNN's) reads and writes (N, L, C) memory:
    the bridge hands it that, for channels-first operands too, and the result is right either way."""
    from convtune.plan import Plan
    from convtune.strategies.base import Config
    from convtune.torch._dispatch import ArrayPlan, layer_problem
    n, c, length, k = 2, 6, 11, 3
    problem = layer_problem((n, c, length), (c, 1, k), (1,), (1,), (1,), c, "fp32", torch.float32, "channels_last")

    def launch(a, b, out, stream):
        x = _at(a, (n, length, c)).permute(0, 2, 1)  # NLC memory
        w = _at(b, (c, k, 1)).permute(0, 2, 1)  # (C, 1, k) in the same order: its memory as contiguous
        _at(out, (n, length, c)).copy_(torch.nn.functional.conv1d(x, w, None, 1, 1, 1, c).permute(0, 2, 1))

    def run(a, b, out=None):
        raise AssertionError("the array path ran")
    run = Executor(run, launch=launch)
    br = _AddressBridge()
    executor = ArrayPlan(Plan(problem, "fake", Config(), "cupy", run=run), br, problem)
    torch.manual_seed(0)
    w = torch.randn(c, 1, k)
    for x in (torch.randn(n, length, c).transpose(1, 2), torch.randn(n, c, length)):  # NLC, and channels-first
        y = executor(x, w)
        assert y.transpose(1, 2).is_contiguous() and br.called == []
        torch.testing.assert_close(y, torch.nn.functional.conv1d(x, w, None, 1, 1, 1, c))


# -- weighing won duels against the autograd detour (Route.settle) -----------------------------------
def _dueled(problem, pass_, t_plan, t_native, *hosts):
    from convtune.strategies.pytorch import native_for
    from convtune.torch._dispatch import ArrayPlan, Native
    from convtune.torch._duel import Duel
    q = problem.for_pass(pass_)
    plan, _ = _address_plan(q, "native")
    executor = ArrayPlan(plan, _AddressBridge(), q)
    executor.duel = Duel(t_plan, t_native, Native(native_for(q), "torch"), *hosts) if t_plan is not None else None
    return executor


@pytest.mark.parametrize("times, settles", [
    ({"fwd": (10e-6, 30e-6), "dgrad": (10e-6, 25e-6)}, True),    # 35 us gained < 50 us detour: PyTorch's
    ({"fwd": (10e-6, 40e-6), "dgrad": (10e-6, 40e-6)}, False),   # 60 us gained: the plans stay
    ({"fwd": (10e-6, 30e-6), "dgrad": (None, None)}, False),     # a plan without a duel's verdict: left alone
])
def test_plans_that_gain_less_than_the_autograd_detour_give_their_passes_to_pytorch(times, settles, monkeypatch):
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _dispatch
    from convtune.torch._dispatch import Native, Route, layer_problem
    problem = layer_problem((2, 3, 8, 8), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    route = Route(problem, None, torch.device("cpu"))
    route.fwd_exec = _dueled(problem, "fwd", *times["fwd"])
    route.dgrad_exec = _dueled(problem, "dgrad", *times["dgrad"])
    route.wgrad_exec = Native(native_for(problem.for_pass("wgrad")), "torch")
    asked = []
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: asked.append(split) or 50e-6)
    assert route.native_for_grads(True, True) is settles
    labels = route.labels()
    assert all(label.startswith("torch (in the layer") for p, label in labels.items() if p != "wgrad") is settles
    route.native_for_grads(True, True)  # weighed once: not asked again
    assert asked == ([] if times["dgrad"][0] is None else [True])  # (a backward pass's plan: the split detour)


@pytest.mark.parametrize("host_bound", [False, True])
def test_a_gain_known_only_by_a_floor_under_pytorchs_time_keeps_the_plans(monkeypatch, host_bound):
    """Plans that gain 35 us per training call by measured duels go back to PyTorch against a 50 us detour (above);
    where one of those duels was decided by a floor under PyTorch's time (its search not run), the gain may be far
    larger and the plans stay. In a host-bound step the host's times decide, both measured: the floor does not count."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _dispatch, _handback
    from convtune.torch._dispatch import Native, Route, layer_problem
    problem = layer_problem((2, 3, 7, 7), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")  # (said once: its own)
    route = Route(problem, None, torch.device("cpu"))
    route.fwd_exec = fwd = _dueled(problem, "fwd", 10e-6, 30e-6, 20e-6, 22e-6)
    route.dgrad_exec = _dueled(problem, "dgrad", 10e-6, 25e-6, 20e-6, 22e-6)
    route.dgrad_exec.duel = route.dgrad_exec.duel._replace(bound=True)
    route.wgrad_exec = Native(native_for(problem.for_pass("wgrad")), "torch")
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6)
    route.weigh_host(host_bound)
    assert route.native_for_grads(True, True) is host_bound
    # the same for a forward plan kept for calls without gradients (however much a patched call costs)
    monkeypatch.setattr(_handback, "dispatch_seconds", lambda device: 1.0)
    infer = Route(problem, None, torch.device("cpu"))
    infer.fwd_exec = fwd
    infer.weigh_host(host_bound)
    assert _handback.pytorch_throughout(infer, ("fwd",), False) is True
    fwd.duel = fwd.duel._replace(bound=True)
    assert _handback.pytorch_throughout(infer, ("fwd",), False) is host_bound


def test_in_host_bound_steps_settle_weighs_the_host_time_the_plans_save(monkeypatch, caplog):
    """Plans that save 60 us per training call in the layer (the device's time and the host's together) keep a layer's
    training calls against a 50 us detour; where its steps are host-bound, the device's time is hidden behind the
    host's and the same plans save 6 us of host time: PyTorch's convolution runs them, said with the host times."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _dispatch
    from convtune.torch._dispatch import Native, Route, layer_problem
    problem = layer_problem((2, 3, 8, 8), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    route = Route(problem, None, torch.device("cpu"))
    route.fwd_exec = _dueled(problem, "fwd", 10e-6, 40e-6, 20e-6, 24e-6)
    route.dgrad_exec = _dueled(problem, "dgrad", 10e-6, 40e-6, 20e-6, 22e-6)
    route.wgrad_exec = Native(native_for(problem.for_pass("wgrad")), "torch")
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6)
    assert route.native_for_grads(True, True) is False and route.verdicts == {(True, True): False}
    route.weigh_host(True)  # (said before the first training call; a change forgets what was weighed)
    assert route.verdicts == {}
    with caplog.at_level(logging.INFO, logger="convtune"):
        assert route.native_for_grads(True, True) is True
    assert route.labels()["fwd"].startswith("torch (in a host-bound step 24 us of host time per call against 20 us")
    assert any("gain 6 us host time per training call" in r.getMessage() for r in caplog.records)
    assert route.fwd_infer is not None  # (calls without gradients keep the forward's plan, as before)


@pytest.mark.parametrize("hosts, host_bound, gain_us", [
    ((20e-6, 24e-6), False, 30.0),  # the layer's time per call: 40 - 10
    ((20e-6, 24e-6), True, 4.0),    # a host-bound step: the host's time, 24 - 20
    ((), True, 30.0),               # no host times measured (a verdict stored before they were): the layer's
])
def test_a_duels_gain_is_the_host_time_in_host_bound_steps(hosts, host_bound, gain_us):
    from convtune.torch._duel import Duel
    assert Duel(10e-6, 40e-6, None, *hosts).gain(host_bound) * 1e6 == pytest.approx(gain_us)


def test_calls_without_gradients_keep_the_forward_plan_that_settle_took_from_training(monkeypatch):
    """Settle gives a training call's passes to PyTorch where the plans gain less than the autograd detour; a
    call without gradients takes no detour, so it keeps the forward's plan that won its duel (and falls back
    to PyTorch's, said once, where that plan fails); a new forward executor forgets it."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _dispatch
    from convtune.torch._dispatch import ArrayPlan, Native, Route, layer_problem
    from convtune.torch._duel import Duel
    problem = layer_problem((2, 3, 8, 8), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    route = Route(problem, None, torch.device("cpu"))
    plan, streams = _address_plan(problem, "native")
    fwd = route.fwd_exec = ArrayPlan(plan, _AddressBridge(), problem)
    fwd.duel = Duel(10e-6, 30e-6, Native(native_for(problem), "torch"))
    route.dgrad_exec = Native(native_for(problem.for_pass("dgrad")), "torch")
    route.wgrad_exec = Native(native_for(problem.for_pass("wgrad")), "torch")
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6)
    assert route.native_for_grads(True, True) is True and isinstance(route.fwd_exec, Native)
    assert route.fwd_infer is fwd
    x, w = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    want = torch.nn.functional.conv2d(x, w, None, 1, 1)
    torch.testing.assert_close(route.infer(x, w), want)
    assert streams == ["stream"]  # the plan's launch ran
    torch.testing.assert_close(route.run("fwd", x, w), want)
    assert streams == ["stream"]  # a training call's forward: PyTorch's
    fwd.launch = lambda *args: (_ for _ in ()).throw(RuntimeError("boom"))
    torch.testing.assert_close(route.infer(x, w), want)  # the plan failed: PyTorch's, from now on
    assert route.fwd_infer is None
    route.fwd_infer = fwd
    route._keep("fwd", Native(native_for(problem), "torch"))
    assert route.fwd_infer is None

def test_the_autograd_detour_is_measured_once_per_device():
    from convtune.torch import _dispatch
    cpu = torch.device("cpu")
    for split in (True, False):
        _dispatch._detours.pop((cpu, split), None)
        first = _dispatch.detour_seconds(cpu, split)
        assert 0 <= first < 0.01 and _dispatch.detour_seconds(cpu, split) == first


def test_a_forward_plan_alone_is_weighed_against_the_detour_of_one_backward_call(monkeypatch):
    """Where only the forward is convtune's plan, both gradients come from one call of PyTorch's
    (Route.native_backward), so the plan is weighed against that detour, not the split one."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _dispatch
    from convtune.torch._dispatch import Native, Route, layer_problem
    problem = layer_problem((2, 3, 8, 8), (5, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    route = Route(problem, None, torch.device("cpu"))
    route.fwd_exec = _dueled(problem, "fwd", 10e-6, 30e-6)  # 20 us gained
    route.dgrad_exec = Native(native_for(problem.for_pass("dgrad")), "torch")
    route.wgrad_exec = Native(native_for(problem.for_pass("wgrad")), "torch")
    monkeypatch.setattr(_dispatch, "detour_seconds", lambda device, split=True: 50e-6 if split else 15e-6)
    assert route.native_for_grads(True, True) is False  # 20 us > 15 us: the plan stays
    assert route.labels()["fwd"] == route.fwd_exec.label and not route.labels()["fwd"].startswith("torch")


@pytest.mark.parametrize("combine", [True, False])
def test_both_gradients_of_pytorchs_passes_come_from_one_call(combine, monkeypatch):
    """A layer whose forward is convtune's and whose backward passes are PyTorch's convolution: its backward
    gives autograd's gradients (input, weight, bias) from one convolution_backward call, not the per-pass
    executors; with combining off (the split detour's measurement), from the per-pass executors."""
    from convtune.strategies.pytorch import native_for
    from convtune.torch import _autograd
    from convtune.torch._dispatch import Native, Route, layer_problem
    problem = layer_problem((2, 3, 9, 8), (5, 3, 3, 3), (1, 1), (1, 0), (1, 1), 1, "fp32")
    route = Route(problem, None, torch.device("cpu"))
    called = []
    for p, name in (("fwd", "fwd_exec"), ("dgrad", "dgrad_exec"), ("wgrad", "wgrad_exec")):
        fn = native_for(problem.for_pass(p))
        setattr(route, name, Native(lambda a, b, bias=None, fn=fn, p=p: called.append(p) or fn(a, b, bias), "torch"))
    if not combine:
        route.both = None
    from convtune.torch import _dispatch
    real_pass, calls = _dispatch.native_pass, []

    def spied(pass_, *args, **kwargs):
        fn = real_pass(pass_, *args, **kwargs)
        return lambda *a: calls.append((pass_, a[-1])) or fn(*a)
    monkeypatch.setattr(_dispatch, "native_pass", spied)
    torch.manual_seed(0)
    x = torch.randn(2, 3, 9, 8, requires_grad=True)
    w = torch.randn(5, 3, 3, 3, requires_grad=True)
    bias = torch.randn(5, requires_grad=True)
    g = torch.randn(2, 5, 9, 6)
    _autograd.eager_forward(x, w, bias, route).backward(g)
    got = (x.grad, w.grad, bias.grad)
    x2, w2, b2 = (t.detach().clone().requires_grad_() for t in (x, w, bias))
    torch.nn.functional.conv2d(x2, w2, b2, 1, (1, 0)).backward(g)
    for a, b in zip(got, (x2.grad, w2.grad, b2.grad)):
        torch.testing.assert_close(a, b)
    if combine:
        assert called == ["fwd"] and calls == [("both", True)]  # (the bias's gradient asked of the same call)
    else:
        assert sorted(called) == ["dgrad", "fwd", "wgrad"] and calls == []
