"""The PyTorch drop-in on CUDA tensors (GPU): every code path against PyTorch, channels_last, a
non-default stream, PyTorch's allocator serving convtune's memory, opcheck and torch.compile."""

import copy
import dataclasses
import logging

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import convtune  # noqa: E402
import convtune.torch as ct  # noqa: E402
from convtune import MemoryPlanStore, Runtime  # noqa: E402
from conftest import FakeTimer  # noqa: E402
from test_torch import FORMS, assert_same_training, assert_trains_within  # noqa: E402
from torch_models import MODELS  # noqa: E402

pytestmark = pytest.mark.gpu

#: PyTorch's own path and one of convtune's executors, on every form (quick to plan); the other GPU
#: strategies (each verifies many candidates per problem) on a few forms each
FAST_STRATEGIES = ["torch", "im2col"]
SLOW_STRATEGY_FORMS = {"fft": ["2d-same-odd", "1d-basic"], "cudnn": ["2d-stride-dilation", "1d-basic"],
                       "depthwise": ["2d-depthwise"]}


@pytest.fixture(autouse=True)
def _strict_fp32():
    """PyTorch's references in strict fp32, as convtune's fp32 plans are."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def make_runtime(strategies, timer=None):
    return Runtime(store=MemoryPlanStore(), planner_options={"timer": timer or FakeTimer(),
                                                             "strategies": list(strategies)})


def _cuda_input(cls, kind, channels):
    size = {nn.Conv1d: (29,), nn.Conv2d: (13, 11), nn.Conv3d: (7, 6, 5)}[cls]
    x = torch.randn(3, channels, *size, device="cuda")
    if kind == "channels_last":
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        return x.contiguous(memory_format=fmt) if fmt is not None else None
    if kind == "sliced":
        return torch.randn(6, channels, *size[:-1], size[-1] + 2, device="cuda")[::2, ..., 1:-1]
    if kind == "unbatched":
        return x[0]
    return x


CASES = [(s, f) for s in FAST_STRATEGIES for f in sorted(FORMS)] + \
    [(s, f) for s, forms in SLOW_STRATEGY_FORMS.items() for f in forms]


@pytest.mark.parametrize("kind", ["batched", "channels_last", "sliced", "unbatched"])
@pytest.mark.parametrize("strategy, form", CASES)
def test_conv_forms_on_cuda_match_pytorch(strategy, form, kind):
    cls, kwargs = FORMS[form]
    torch.manual_seed(0)
    plain = cls(**kwargs).cuda()
    x = _cuda_input(cls, kind, kwargs["in_channels"])
    if x is None:
        pytest.skip("channels_last is a 4-D and 5-D layout")
    if kind == "channels_last":
        plain = plain.to(memory_format=torch.channels_last_3d if cls is nn.Conv3d else torch.channels_last)
    rt = make_runtime([strategy])
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=False)  # the per-pass plans (round trips: the kept-spectra tests)
    assert_same_training(plain, patched, x)
    labels = [label for route in rt.layer_memo("torch").values() for label in route.labels().values()]
    assert labels and all(label.startswith(strategy) for label in labels), labels


@pytest.mark.parametrize("name", sorted(MODELS))
def test_models_train_like_pytorch_on_cuda(name):
    factory, shape = MODELS[name]
    torch.manual_seed(0)
    plain = factory().cuda()
    rt = make_runtime(["torch", "im2col", "depthwise"], FakeTimer(times={"torch": 2.0}, default=1.0))
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt)
    x = torch.randn(shape, device="cuda")
    assert_same_training(plain, patched, x, rtol=2e-4, atol=2e-5)
    if x.dim() == 4:  # the whole model channels_last, as AMP users run it (here in fp32)
        plain_cl, patched_cl = plain.to(memory_format=torch.channels_last), patched.to(memory_format=torch.channels_last)
        assert_same_training(plain_cl, patched_cl, x.contiguous(memory_format=torch.channels_last), rtol=2e-4,
                             atol=2e-5)


def _spy_streams(route, seen):
    """Wrap the forward plan of ``route`` so that it records CuPy's and PyTorch's current streams."""
    import cupy as cp
    plan = route.fwd_exec.plan
    inner = plan.run

    def spy(a, b, out=None):
        seen.append((cp.cuda.get_current_stream().ptr, torch.cuda.current_stream().cuda_stream))
        return inner(a, b, out)
    route.fwd_exec.plan = dataclasses.replace(plan, run=dataclasses.replace(inner, run=spy))


@pytest.mark.parametrize("strategy", ["im2col", "fft"])  # (cuDNN's plans run by address: LAUNCH_CASES)
def test_work_runs_on_pytorchs_current_stream(strategy):
    """On a side stream, convtune's kernels run on that stream: they see the input that stream's earlier
    (slow) work produced, and PyTorch's later work sees their output, with no synchronisation between."""
    rt = make_runtime([strategy])
    layer = ct.Conv2d(16, 16, 3, padding=1, runtime=rt).cuda()
    x0 = torch.randn(8, 16, 32, 32, device="cuda")
    layer(x0)  # plans made on the default stream
    (route,) = rt.layer_memo("torch").values()
    seen = []
    _spy_streams(route, seen)
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    expected = nn.functional.conv2d(x0 * 2, layer.weight, layer.bias, padding=1)
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):  # keep the side stream busy before the input is written
            big = big @ big / 64
        x = x0 * 2
        y = layer(x)
        out = y * 1  # PyTorch work after convtune's, on the same stream
    side.synchronize()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert seen == [(side.cuda_stream, side.cuda_stream)]
    import cupy as cp
    assert cp.cuda.get_current_stream().ptr == torch.cuda.current_stream().cuda_stream  # put back after the call


#: Plans with a by-address form (``launch``), one layer each: the depthwise kernels' variants, the 1x1 cuBLAS
#: calls and cuDNN's engines (the word its plans' labels must hold, the strategy, the layer, the input's shape)
LAUNCH_CASES = {
    "depthwise-simple": ("variant=simple", "depthwise", dict(in_channels=8, out_channels=8, kernel_size=3, stride=2,
                                                             padding=1, groups=8), (5, 8, 17, 15)),
    "depthwise-tiled": ("variant=tiled", "depthwise", dict(in_channels=16, out_channels=16, kernel_size=5, padding=2,
                                                           groups=16), (4, 16, 19, 21)),
    "depthwise-window": ("variant=window", "depthwise", dict(in_channels=16, out_channels=16, kernel_size=15,
                                                             padding=7, groups=16), (3, 16, 20, 18)),
    "depthwise-nhwc": ("variant=nhwc", "depthwise", dict(in_channels=40, out_channels=40, kernel_size=7, padding=3,
                                                         groups=40), (3, 40, 13, 17)),
    "im2col-1x1": ("im2col", "im2col", dict(in_channels=16, out_channels=24, kernel_size=1), (4, 16, 9, 11)),
    "cudnn": ("cudnn", "cudnn", dict(in_channels=16, out_channels=16, kernel_size=3, padding=1), (4, 16, 19, 21)),
}


class _Prefer:
    """A planner timer that times nothing and prefers candidates whose label holds ``word``."""

    def __init__(self, word):
        self.word = word

    def __call__(self, fn, backend=None, label=""):
        from convtune.timing import TimingStats
        fn()
        t = 0.5 if self.word in label else 1.0
        return TimingStats(median_s=t, spread_s=0.0, min_s=t, repeats=1)


@pytest.mark.parametrize("case", sorted(LAUNCH_CASES))
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_launch_path_trains_like_pytorch_on_a_side_stream(case, layout, monkeypatch):
    """Plans with a by-address form run on the tensors' addresses and PyTorch's current stream, never through
    the bridge's array views (channels_last: between PyTorch's layout conversions): on a busy side stream, a
    training step gives PyTorch's output and gradients."""
    from convtune.torch._bridge import bridge
    word, strategy, kwargs, shape = LAUNCH_CASES[case]
    if word == "variant=nhwc" and layout == "channels_first":
        pytest.skip("the nhwc kernels are for channels-last operands")
    torch.manual_seed(0)
    plain = nn.Conv2d(**kwargs).cuda()
    rt = make_runtime([strategy], _Prefer(word))
    x = torch.randn(shape, device="cuda")
    if layout == "channels_last":
        plain, x = plain.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt)
    ct.tune(patched, x.detach().requires_grad_(), runtime=rt, progress=False)
    (route,) = rt.layer_memo("torch").values()
    assert route.problem.layout == layout
    executors = [getattr(route, name) for name in ("fwd_exec", "dgrad_exec", "wgrad_exec")]
    assert all(e is not None and e.launch is not None for e in executors), route.labels()
    assert all(word in label for label in route.labels().values()), route.labels()
    br = bridge("cuda")
    through_bridge = []
    inner_call = br.call

    def spy(index, fn, *args):
        through_bridge.append(fn)
        return inner_call(index, fn, *args)
    monkeypatch.setattr(br, "call", spy)
    expected_y = plain(x)
    probe = torch.randn_like(expected_y)
    (expected_y * probe).sum().backward()
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(20):  # the side stream busy before its input is written
            big = big @ big / 64
        xs = (x * 1).requires_grad_()
        y = patched(xs)
        (y * probe).sum().backward()
        grads = (y * 1, xs.grad * 1, patched.weight.grad * 1, patched.bias.grad * 1)
    side.synchronize()
    assert through_bridge == []
    xr = x.clone().requires_grad_()
    ref = copy.deepcopy(plain)  # (plain's parameters hold the first step's gradients)
    (ref(xr) * probe).sum().backward()
    # within fp32 of PyTorch's as a whole (sums in another order: an element near zero may differ by more,
    # relative to itself, than fp32's bound; cuDNN's filter-gradient engines showed 5% on such elements)
    for got, want in zip(grads, (expected_y, xr.grad, plain.weight.grad, plain.bias.grad)):
        error = float((got.double() - want.double()).norm() / want.double().norm())
        assert error <= 1e-5, (got.shape, error)


REPLAYED = {"im2col-1x1": ("im2col", dict(in_channels=32, out_channels=48, kernel_size=1), ("fwd", "dgrad")),
            "cudnn": ("cudnn", dict(in_channels=32, out_channels=48, kernel_size=3, padding=1), ("fwd", "dgrad", "wgrad")),
            "depthwise": ("depthwise", dict(in_channels=32, out_channels=32, kernel_size=5, padding=2, groups=32),
                          ("fwd", "dgrad", "wgrad"))}


@pytest.mark.parametrize("case", sorted(REPLAYED))
def test_plans_replayed_from_cuda_graphs_train_like_pytorch_on_a_side_stream(case):
    """The 1x1 plans' forward and backward-data GEMMs (cuBLASLt), the cuDNN plans' executions and the depthwise
    kernels' launches are replayed from CUDA graphs once the same addresses come again. Called three times on the same tensors (the result dropped
    between calls, so its block comes back), each pass is direct, then captured, then replayed, right each time.
    Then six training steps on a busy side stream, each dropping its tensors before the next as a training loop
    does: output and gradients within fp32 of PyTorch's at every step, the steady steps replayed, and replay never
    switched off."""
    strategy, kwargs, passes = REPLAYED[case]
    torch.manual_seed(2)
    plain = nn.Conv2d(**kwargs).cuda()
    rt = make_runtime([strategy], _Prefer(strategy))
    x = torch.randn(4, 32, 15, 13, device="cuda")
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt)
    ct.tune(patched, x.detach().requires_grad_(), runtime=rt, progress=False)
    (route,) = rt.layer_memo("torch").values()
    launches = {p: getattr(route, f"{p}_exec").launch for p in passes}
    assert all(type(r).__name__ == "AddressReplay" for r in launches.values()), launches
    fwd, dgrad = launches["fwd"], launches["dgrad"]
    w = plain.weight.detach()
    out_channels = kwargs["out_channels"]
    dy = torch.randn(4, out_channels, 15, 13, device="cuda")
    pad, groups = kwargs.get("padding", 0), kwargs.get("groups", 1)
    want = {"fwd": torch.nn.functional.conv2d(x, w, padding=pad, groups=groups),
            "dgrad": torch.nn.grad.conv2d_input(x.shape, w, dy, padding=pad, groups=groups),
            "wgrad": torch.nn.grad.conv2d_weight(x, w.shape, dy, padding=pad, groups=groups)}
    operands = {"fwd": (x, w), "dgrad": (dy, w), "wgrad": (x, dy)}
    for pass_, replay in launches.items():
        a, b = operands[pass_]
        before = (replay.made, replay.replayed)
        for call in range(3):
            got = route.run(pass_, a, b)
            error = float((got.double() - want[pass_].double()).norm() / want[pass_].double().norm())
            assert error <= 1e-5, (pass_, call, error)
            del got
        # (one graph at most for these addresses, and replays: the example run of ct.tune may have called them first)
        assert replay.made - before[0] <= 1 and replay.replayed - before[1] >= 1, (pass_, replay.made, replay.replayed)
    probe = torch.randn(4, out_channels, 15, 13, device="cuda")
    side = torch.cuda.Stream()
    big = torch.randn(4096, 4096, device="cuda")
    xs = x.clone().requires_grad_()
    replayed = (fwd.replayed, dgrad.replayed)
    for step in range(6):
        xr = x.clone().requires_grad_()
        ref = copy.deepcopy(plain)
        y_ref = ref(xr)
        (y_ref * probe).sum().backward()
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            for _ in range(10):  # the side stream busy before its input is written
                big = big @ big / 64
            xs.grad = None
            patched.zero_grad(set_to_none=True)
            y = patched(xs)
            (y * probe).sum().backward()
            grads = (y.detach().clone(), xs.grad.clone(), patched.weight.grad.clone())
            del y
        side.synchronize()
        for got, expected in zip(grads, (y_ref, xr.grad, ref.weight.grad)):
            error = float((got.double() - expected.double()).norm() / expected.double().norm())
            assert error <= 1e-5, (step, got.shape, error)
        del grads
    assert all(r.off is None for r in launches.values()), {p: r.off for p, r in launches.items()}
    assert fwd.replayed > replayed[0] and dgrad.replayed > replayed[1], (fwd.made, fwd.replayed, dgrad.made,
                                                                         dgrad.replayed)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_amp_channels_last_depthwise_plans_run_on_the_tensors_own_memory(dtype, monkeypatch):
    """Under autocast, a channels-last depthwise layer's plans (the nhwc kernels) run by address on the
    half-precision tensors themselves: no conversion to float32, nothing through the bridge's array views, the
    filter gradient's float32 sums in a block of PyTorch's allocator. Output and gradients are within one
    unit roundoff of float64 on the same rounded operands."""
    from convtune.torch._bridge import bridge
    half = getattr(torch, dtype)
    torch.manual_seed(1)
    plain = nn.Conv2d(40, 40, 7, padding=3, groups=40, bias=False).cuda().to(memory_format=torch.channels_last)
    patched = copy.deepcopy(plain)
    rt = make_runtime(["depthwise"], _Prefer("variant=nhwc"))
    ct.patch(patched, runtime=rt)
    x = torch.randn(3, 40, 13, 17, device="cuda").contiguous(memory_format=torch.channels_last)
    probe = torch.randn(3, 40, 13, 17, device="cuda")
    br = bridge("cuda")
    through_bridge = []
    inner_call = br.call
    for step in range(2):  # the first tunes; the second runs the resolved plans
        if step == 1:
            monkeypatch.setattr(br, "call", lambda index, fn, *args: through_bridge.append(fn) or
                                inner_call(index, fn, *args))
        xs = x.clone().requires_grad_()
        patched.weight.grad = None
        with torch.autocast("cuda", dtype=half):
            y = patched(xs)
        (y.float() * probe).sum().backward()
    assert through_bridge == []
    (route,) = rt.layer_memo("torch").values()
    assert (route.problem.dtype, route.problem.layout) == (dtype, "channels_last")
    assert all("variant=nhwc" in label for label in route.labels().values()), route.labels()
    assert {e.launch_dtype for e in (route.fwd_exec, route.dgrad_exec, route.wgrad_exec)} == {half}
    # (the filter gradient's float32 sums: a block of the plan's own, so the launch replays from a CUDA graph)
    assert route.wgrad_exec.launch_workspace == 0 and route.wgrad_exec.launch.holds.nbytes == 4 * 40 * 49
    assert all(type(e.launch).__name__ == "AddressReplay" for e in (route.fwd_exec, route.dgrad_exec,
                                                                     route.wgrad_exec))
    assert y.dtype == half and y.is_contiguous(memory_format=torch.channels_last)
    x64 = x.to(half).double().requires_grad_()
    w64 = plain.weight.to(half).double().requires_grad_()
    y64 = torch.nn.functional.conv2d(x64, w64, padding=3, groups=40)
    dy64 = probe.to(half).double()  # the gradient autograd hands the convolution: the probe in its dtype
    dx64, dw64 = torch.autograd.grad(y64, (x64, w64), dy64)
    u = 2.0 ** -8 if dtype == "bfloat16" else 2.0 ** -11
    for got, want in ((y, y64), (xs.grad, dx64), (patched.weight.grad, dw64)):
        got, want = got.detach().double(), want.detach()
        err = float((got - want).norm() / want.norm())
        assert err <= u, err


def test_convtune_memory_comes_from_pytorchs_allocator():
    """The output, the FFT plan's buffers and the contiguous copies come from PyTorch's caching allocator:
    CuPy's own pool does not grow, and PyTorch's peak counts them."""
    import cupy as cp
    rt = make_runtime(["fft"])
    layer = ct.Conv2d(32, 32, 9, padding=4, runtime=rt).cuda()
    x = torch.randn(8, 32, 64, 64, device="cuda")
    x_last = x.contiguous(memory_format=torch.channels_last)  # a problem of its own (its layout is in the key)
    layer(x), layer(x_last)  # tune and build both plans
    pool = cp.get_default_memory_pool()
    pool.free_all_blocks()
    pool_bytes = pool.total_bytes()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():  # (with gradients on, autograd would keep the input: PyTorch's doing, not ours)
        y = layer(x_last)  # the FFT plan's float32 channels-first executor: + a contiguous copy of the input
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    assert pool.total_bytes() == pool_bytes
    # at least the output, the input's copy and the spectra of the FFT plan's workspace
    assert peak > y.numel() * 4 + x.numel() * 4
    assert torch.cuda.memory_allocated() - before == y.numel() * 4  # only the output is still held


def test_opcheck_on_cuda():
    rt = make_runtime(["im2col"])
    previous = convtune.set_default_runtime(rt)
    try:
        x = torch.randn(2, 4, 9, 8, device="cuda")
        w = torch.randn(6, 2, 3, 3, device="cuda")
        geometry = ([2, 1], [1, 2], [1, 2], 2, "fp32")
        for layout in (x, x.contiguous(memory_format=torch.channels_last)):
            args = (layout.clone().requires_grad_(), w.clone().requires_grad_(), None, *geometry)
            torch.library.opcheck(torch.ops.convtune.conv_fwd.default, args)
    finally:
        convtune.set_default_runtime(previous)


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("tf32", [False, True])
def test_compiled_patched_model_on_cuda(backend, tf32):
    rt = make_runtime(["torch", "im2col"], FakeTimer(times={"torch": 2.0}, default=1.0))
    previous = convtune.set_default_runtime(rt)
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        torch.manual_seed(0)
        plain = MODELS["resnet_like"][0]().cuda()
        patched = copy.deepcopy(plain)
        ct.patch(patched)  # math='auto': follows allow_tf32
        compiled = torch.compile(patched, fullgraph=True, backend=backend)
        x = torch.randn(2, 3, 32, 32, device="cuda")
        torch.testing.assert_close(compiled(x), plain(x), rtol=1e-2 if tf32 else 1e-4, atol=1e-2 if tf32 else 1e-5)
        compiled(x).square().sum().backward()
        maths = {route.problem.math for route in rt.layer_memo("torch").values()}
        assert maths == {"tf32" if tf32 else "fp32"}
    finally:
        convtune.set_default_runtime(previous)
        torch._dynamo.reset()


def test_tune_ahead_on_cuda_then_cache_hits():
    from conftest import FailingTimer
    rt = make_runtime(["torch", "im2col", "depthwise"])
    model = MODELS["convnext_like"][0]().cuda()
    ct.patch(model, runtime=rt)
    x = torch.randn(2, 3, 32, 32, device="cuda")
    # (weighed as steps that are not host-bound, which a model this small is: there its layers would go back unsearched)
    report = ct.tune(model, x, runtime=rt, progress=False, host_bound=False)
    assert report.tuned == len(report.problems) > 0 and not report.failed
    rt.planner_options["timer"] = FailingTimer()
    model(x).sum().backward()
    assert rt.tuned == report.tuned


def test_a_duel_times_each_contender_on_the_device_alone_too():
    """A contender whose calls cost the host 200 us each but the device a few (an addition of 4 MB) takes its host's
    time per call in the layer and a few microseconds on the device alone; one whose calls are the device's work (a
    matrix product of 2 x 2048^3 operations, fp32) takes about as long either way."""
    import time

    from convtune.torch._duel import per_call_seconds

    def host_heavy(a, b):
        start = time.perf_counter()
        while time.perf_counter() - start < 200e-6:
            pass
        return a.add(b)

    def device_heavy(a, b):
        return a @ b
    device = torch.device("cuda")
    a, b = (torch.randn(2048, 2048, device=device) for _ in range(2))
    hosts, devices = [], []
    tf32, torch.backends.cuda.matmul.allow_tf32 = torch.backends.cuda.matmul.allow_tf32, False
    try:
        wall = per_call_seconds([host_heavy, device_heavy], a, b, device, hosts=hosts, devices=devices)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    assert wall[0] >= 200e-6 and hosts[0] >= 200e-6 and devices[0] < 40e-6, (wall, hosts, devices)
    assert 0.7 * wall[1] <= devices[1] <= 1.1 * wall[1] and devices[1] > 5 * devices[0], (wall, hosts, devices)


def test_a_duel_whose_device_times_fail_stands_on_its_times_in_the_layer(monkeypatch):
    """Where timing the contenders on the device alone fails, the duel keeps its times in the layer (and no device
    times: steps in CUDA graphs weigh the layer's); it is not lost."""
    from convtune.torch import _duel

    def broken(*args, **kwargs):
        raise RuntimeError("no spin kernel")
    monkeypatch.setattr(_duel, "device_seconds", broken)
    device = torch.device("cuda")
    a, b = (torch.randn(256, 256, device=device) for _ in range(2))
    devices = [1.0]
    wall = _duel.per_call_seconds([torch.add, torch.mul], a, b, device, hosts=[], devices=devices)
    assert len(wall) == 2 and all(t > 0 for t in wall) and devices == []


def test_tune_ahead_on_cuda_leaves_the_model_and_both_generators_as_they_were():
    """ct.tune on a CUDA model in train mode (BatchNorm, dropout drawing from the CUDA generator) leaves every
    buffer, the CPU generator and the CUDA generator exactly as they were: a seeded training run does not notice."""
    rt = make_runtime(["torch", "im2col"])
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.Dropout(0.5),
                          nn.Conv2d(8, 4, 3)).cuda().train()
    ct.patch(model, runtime=rt)
    x = torch.randn(2, 3, 12, 12, device="cuda")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_rng, cuda_rng = torch.random.get_rng_state(), torch.cuda.get_rng_state_all()
    report = ct.tune(model, x, runtime=rt, progress=False, hand_back=False)
    assert report.problems and not report.failed
    after = model.state_dict()
    assert all(torch.equal(value, after[key]) for key, value in before.items())
    assert torch.equal(torch.random.get_rng_state(), cpu_rng)
    assert all(torch.equal(a, b) for a, b in zip(torch.cuda.get_rng_state_all(), cuda_rng))
    torch.cuda.manual_seed(5)
    first = torch.rand(4, device="cuda")
    torch.cuda.manual_seed(5)
    ct.tune(model, x, runtime=rt, progress=False, hand_back=False)  # (cached now: the forward pass still draws)
    assert torch.equal(torch.rand(4, device="cuda"), first)


def test_a_small_layer_duel_goes_to_pytorch_on_cuda():
    """A plan the planner preferred (a fake timer) loses the duel in the layer on a tiny problem, where the
    bridge's host work dwarfs the GPU's: PyTorch's convolution runs it, and training matches."""
    rt = make_runtime(["im2col", "torch"], FakeTimer(times={"torch": 2.0}, default=1.0))
    plain = nn.Conv2d(3, 5, 3, padding=1).cuda()
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt)
    assert_same_training(plain, patched, torch.randn(2, 3, 9, 9, device="cuda"))
    labels = [label for route in rt.layer_memo("torch").values() for label in route.labels().values()]
    assert len(labels) == 3 and all(label.startswith("torch (in the layer") for label in labels), labels


@pytest.mark.parametrize("keep", [True, "auto"])
def test_kept_spectra_on_cuda_train_like_pytorch(keep, monkeypatch):
    """A large depthwise layer with kept spectra (the FFT round trip) on CUDA tensors: the same training
    step as PyTorch's; with True the round trip runs whatever its verdict; with 'auto' the trip also wins its duel
    with the per-pass plans in the layer (made to here: test_a_round_trip_duels_the_per_pass_plans_on_cuda duels)."""
    from convtune.torch import _dispatch
    real = _dispatch.per_call_seconds

    def trip_wins(contenders, a, b, device, hosts=None, devices=None):
        if [getattr(fn, "__name__", "") for fn in contenders] == ["kept", "per_pass"]:
            return [1e-6, 1.0]
        return real(contenders, a, b, device, hosts=hosts)
    monkeypatch.setattr(_dispatch, "per_call_seconds", trip_wins)
    rt = make_runtime(["fft", "torch"], FakeTimer(times={"fft-trip": 1e-3, "torch": 2.0}, default=1.0))
    plain = nn.Conv2d(32, 32, 31, padding=15, groups=32).cuda()
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=keep)
    assert_trains_within(plain, patched, torch.randn(4, 32, 40, 40, device="cuda"))
    (route,) = rt.layer_memo("torch").values()
    assert route.trips[keep] is not None


def test_a_round_trip_duels_the_per_pass_plans_on_cuda():
    """keep_spectra='auto' on CUDA: a round trip whose verdict pays on the device meets the layer's per-pass plans per
    training call, host work included, for real; whichever wins, training gives PyTorch's gradients, before the duel
    and after it."""
    rt = make_runtime(["fft", "torch"], FakeTimer(times={"fft-trip": 1e-3, "torch": 2.0}, default=1.0))
    plain = nn.Conv2d(32, 32, 31, padding=15, groups=32).cuda()
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra="auto")
    for _ in range(2):
        patched.zero_grad(set_to_none=True)
        assert_trains_within(copy.deepcopy(plain), patched, torch.randn(4, 32, 40, 40, device="cuda"))
    (route,) = rt.layer_memo("torch").values()
    assert route.trips.duelled


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_block_round_trips_train_like_pytorch_on_cuda(memory_format):
    """A large float32 depthwise layer whose round trip is made to be the one-block transforms' (fft-row's and
    fft-plane's kept spectra): the training step PyTorch gives, its tensors read in their own layout (no
    conversions); and a long 1-D depthwise layer the same way."""
    for conv, x in ((nn.Conv2d(16, 16, 31, padding=15, groups=16), torch.randn(4, 16, 40, 40)),
                    (nn.Conv1d(8, 8, 255, padding=127, groups=8), torch.randn(3, 8, 300))):
        rt = make_runtime(["fft", "fft-plane", "fft-row", "torch"], _Prefer("block"))
        fmt = memory_format if conv.weight.dim() == 4 else torch.contiguous_format
        plain = conv.cuda().to(memory_format=fmt)
        patched = copy.deepcopy(plain)
        ct.patch(patched, runtime=rt, keep_spectra=True)
        assert_trains_within(plain, patched, x.cuda().to(memory_format=fmt))
        (route,) = rt.layer_memo("torch").values()
        trip = route.trips[True]
        assert trip is not None and trip.config.product == "block" and not trip.converted
        assert trip.problem.layout == ("channels_last" if fmt is torch.channels_last else "channels_first")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kept_spectra_of_half_precision_channels_last_layers_on_cuda(dtype):
    """A large depthwise layer in half precision, channels_last, with kept spectra: its training step is the float32
    round trip between PyTorch's conversions, within the dtype's bound of float64."""
    rt = make_runtime(["fft", "torch"], FakeTimer(times={"fft-trip": 1e-3, "torch": 2.0}, default=1.0))
    plain = nn.Conv2d(32, 32, 31, padding=15, groups=32).cuda().to(dtype=dtype, memory_format=torch.channels_last)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=True)
    x = torch.randn(4, 32, 40, 40, device="cuda").to(dtype=dtype, memory_format=torch.channels_last)
    assert_trains_within(plain, patched, x, bound=4 * 2.0 ** (-8 if dtype is torch.bfloat16 else -11))
    (route,) = rt.layer_memo("torch").values()
    assert route.trips[True] is not None and (route.problem.dtype, route.problem.layout) == (
        str(dtype).split(".")[1], "channels_last")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("keep", [False, True])
def test_own_transform_plans_of_half_precision_channels_last_layers_train_on_cuda(dtype, keep):
    """A dense 9x9 layer at 56x56 (64x64 transforms) in half precision, channels_last, whose plans are convtune's own
    transforms: per pass, and as a round trip with kept spectra that reads and writes the layer's tensors itself
    (bfloat16 as its 16 bits, no float32 copies); its training step within the dtype's bound of float64."""
    rt = make_runtime(["fft", "torch"], _Prefer("own"))
    plain = nn.Conv2d(8, 12, 9).cuda().to(dtype=dtype, memory_format=torch.channels_last)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt, keep_spectra=keep)
    x = torch.randn(4, 8, 56, 56, device="cuda").to(dtype=dtype, memory_format=torch.channels_last)
    assert_trains_within(plain, patched, x, bound=4 * 2.0 ** (-8 if dtype is torch.bfloat16 else -11))
    (route,) = rt.layer_memo("torch").values()
    if keep:
        trip = route.trips[True]
        assert trip is not None and trip.config.own and not trip.converted
        assert (trip.problem.dtype, trip.problem.layout) == (str(dtype).split(".")[1], "channels_last")
    else:
        labels = route.labels()
        assert len(labels) == 3 and all("own" in label for label in labels.values()), labels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("k", [7, 27])
def test_channels_first_half_precision_depthwise_layers_run_their_kernels_on_cuda(dtype, k):
    """A channels-first depthwise layer in half precision whose plans are the channels-first depthwise kernels
    (tiled 7x7, window 27x27 on a 14x14 plane): they run by address on the tensors' own memory (bfloat16 as its 16
    bits, the filter gradient's sums in a workspace from PyTorch's allocator); the training step within the
    dtype's bound of float64."""
    rt = make_runtime(["depthwise", "torch"], _Prefer("depthwise"))
    plain = nn.Conv2d(16, 16, k, padding=k // 2, groups=16).cuda().to(dtype=dtype)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=rt)
    x = torch.randn(4, 16, 14, 14, device="cuda").to(dtype=dtype)
    assert_trains_within(plain, patched, x, bound=4 * 2.0 ** (-8 if dtype is torch.bfloat16 else -11))
    (route,) = rt.layer_memo("torch").values()
    labels = route.labels()
    assert len(labels) == 3 and all("depthwise" in label for label in labels.values()), labels


#: Models captured in a CUDA graph: (strategies, the large layer's kernel and groups (0: depthwise),
#: keep_spectra, AMP bf16 channels_last, the plans the planner is made to prefer: labels holding this word)
CAPTURE_CASES = {"depthwise": (["im2col", "depthwise"], 7, 0, False, False, ""),
                 "depthwise-amp": (["im2col", "depthwise"], 7, 0, False, True, ""),
                 "fft": (["im2col", "fft"], 31, 0, False, False, "pointwise"),
                 "fft-kept": (["im2col", "fft"], 31, 0, True, False, "pointwise"),
                 "fft-kept-dense": (["im2col", "fft"], 15, 1, True, False, ""),  # (its trip's products: GEMMs)
                 "fft-amp": (["im2col", "fft"], 31, 0, False, True, "pointwise")}



@pytest.mark.parametrize("case", sorted(CAPTURE_CASES))
def test_a_patched_model_captured_in_a_cuda_graph_trains_like_pytorch(case, caplog, monkeypatch):
    """Forward and backward of a patched model captured with torch.cuda.graph (warm-up on a side stream, as
    PyTorch's recipe has it) and replayed twice on new data: the gradients PyTorch's own eager step gives.
    The depthwise layer's plans (kernels launched by address that read the layer's dtype and layout; cuFFT work and
    kernels through the bridge, the round trip with the pointwise product) are recorded in the graph; the 1x1 layer's im2col plans and a
    round trip with GEMM products call cuBLAS, which CuPy refuses on a capturing stream: PyTorch's
    convolution is recorded for those (warmed outside the capture)."""
    import logging
    from convtune.torch import _notes
    strategies, k, groups, keep, amp, prefer = CAPTURE_CASES[case]
    monkeypatch.setattr(_notes, "_said", set())  # what this process has said once already
    torch.manual_seed(0)
    c, size = 8, 24 if k > 7 else 12
    groups = groups or c
    base = nn.Sequential(nn.Conv2d(c, c, k, padding=k // 2, groups=groups), nn.ReLU(), nn.Conv2d(c, 16, 1)).cuda()
    rt = make_runtime(strategies, _Prefer(prefer))
    patched = copy.deepcopy(base)
    ct.patch(patched, runtime=rt, keep_spectra=keep)
    fmt = torch.channels_last if amp else torch.contiguous_format
    patched = patched.to(memory_format=fmt)
    # (the input needs its gradient too: a layer keeps spectra where both gradients are needed)
    static_x = torch.randn(4, c, size, size, device="cuda").contiguous(memory_format=fmt).requires_grad_()

    def loss_of(model, x):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp, cache_enabled=False):
            out = model(x)
        return out.float().square().mean()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=amp):
        ct.tune(patched, static_x, runtime=rt, progress=False)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            patched.zero_grad(set_to_none=True)
            static_x.grad = None
            loss_of(patched, static_x).backward()
    torch.cuda.current_stream().wait_stream(side)
    patched.zero_grad(set_to_none=True)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with caplog.at_level(logging.INFO, logger="convtune"), torch.cuda.graph(graph):
        loss = loss_of(patched, static_x)
        loss.backward()
    assert "no eager call has looked up" not in caplog.text  # every layer was resolved before the capture
    dw = [r for r in rt.layer_memo("torch").values() if r.problem.groups == groups and r.problem.kernel_size == (k, k)]
    if keep:  # the layer's round trip: recorded with the pointwise product, not with GEMM products (cuBLAS)
        (route,) = dw
        assert route.trips.get(keep) is not None
        assert route.capture.trip_failed == (not route.trips[keep].recordable), (route.trips[keep].config, caplog.text)
        assert route.trips[keep].recordable == (groups == c)  # (depthwise: the pointwise product; dense: GEMMs)
        said = f"the round trip of {route.problem.describe()} is not recorded" in caplog.text
        assert route.capture.trip_failed == said
    else:
        planned = [(r, p) for r in dw for p, label in r.labels().items() if label.startswith(("fft", "depthwise"))]
        assert planned, [r.labels() for r in dw]  # the large layer's kernel and FFT plans (or some im2col's)
        assert not any(p in r.capture.failed for r, p in planned), caplog.text  # none failed in the capture
        # those that say they record were recorded; PyTorch's convolution for the others (a channels-first kernel
        # between conversions: DepthwiseStrategy.recordable)
        assert all((p in r.capture.native) == (not getattr(r, f"{p}_exec").recordable) for r, p in planned), \
            ([r.labels() for r in dw], caplog.text)
    for _ in range(2):
        fresh = torch.randn_like(static_x)
        with torch.no_grad():
            static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        ref = copy.deepcopy(base).to(memory_format=fmt)
        ref_loss = loss_of(ref, fresh)
        ref_loss.backward()
        if not amp:
            torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6)
            for a, b in zip(patched.parameters(), ref.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)
            continue
        # bf16: the plans compute in fp32 between bf16 roundings, PyTorch's engines otherwise: within a few
        # bf16 steps (2**-8) of each other as a whole
        assert abs(float(loss) - float(ref_loss)) <= 2e-2 * abs(float(ref_loss))
        for a, b in zip(patched.parameters(), ref.parameters()):
            error = float((a.grad.float() - b.grad.float()).norm() / b.grad.float().norm())
            assert error <= 3e-2, (a.shape, error)



@pytest.mark.parametrize("strategy", ["depthwise", "cudnn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_one_d_layer_on_nlc_memory_runs_its_plan_by_address_right(strategy, dtype):
    """A Conv1d on (N, L, C) memory (x.transpose(1, 2), as sequence models call it) is a channels_last problem
    whose plans (the channels-last depthwise kernels, cuDNN's engines) read (N, L, C) memory by address: the
    forward and both gradients match PyTorch's."""
    rt = make_runtime([strategy], _Prefer("variant=nhwc") if strategy == "depthwise" else None)
    torch.manual_seed(0)
    groups = 32 if strategy == "depthwise" else 1
    layer_ = ct.Conv1d(32, 32, 7, padding=3, groups=groups, runtime=rt).cuda().to(dtype)
    plain = nn.Conv1d(32, 32, 7, padding=3, groups=groups).cuda().to(dtype)
    plain.load_state_dict(layer_.state_dict())
    x = torch.randn(4, 100, 32, device="cuda", dtype=dtype).transpose(1, 2).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    y, want = layer_(x), plain(x2)
    dy = torch.randn_like(want)
    y.backward(dy)
    want.backward(dy)
    bound = 1e-5 if dtype == torch.float32 else 4 * 2 ** -8
    for got, ref in ((y, want), (x.grad, x2.grad), (layer_.weight.grad, plain.weight.grad)):
        assert float((got.float() - ref.float()).norm() / ref.float().norm()) <= bound
    (route,) = rt.layer_memo("torch").values()
    assert route.problem.layout == "channels_last"
    assert all(label.startswith(strategy) for label in route.labels().values()), route.labels()
    if strategy == "depthwise":
        assert all("variant=nhwc" in label for label in route.labels().values()), route.labels()
    executors = (route.fwd_exec, route.dgrad_exec, route.wgrad_exec)
    assert all(e.launch is not None and e.launch_format == "NLC" for e in executors)  # by address, (N, L, C)


def test_graphed_modes_interleave_with_their_graphs_alive_at_once():
    """bench-model --graph --rounds --null: every mode's step captured in a CUDA graph, all graphs alive at once, their
    replays interleaved. A graph reads and writes memory made before its capture (parameters, momentum buffers, the
    batch); the step holds it, so that another mode's set-up cannot take those blocks (it did: an illegal memory
    access at the first replay)."""
    import gc
    import weakref
    from convtune.bench import model as bench
    spec = "torch_models:resnet_like"
    base = bench.model_specs.build_model(spec, "cpu")
    device = torch.device("cuda")
    x = torch.randn(8, 3, 32, 32, device=device)
    target = torch.randint(0, 5, (8,), device=device)
    record, step, _ = bench.prepare_mode("torch-fp32", base, x, target, device, warmup=1, graph=True)
    held = [weakref.ref(t) for t in step.held[1].state_dict()["state"][0].values() if torch.is_tensor(t)]
    assert held
    gc.collect()
    torch.cuda.empty_cache()
    assert all(r() is not None for r in held)  # the momentum buffers the graph updates are still there
    del step
    gc.collect()
    rt = Runtime(store=MemoryPlanStore())
    doc = bench.bench_model(spec, input_shape=(8, 3, 32, 32), modes=("torch-fp32", "torch-amp-bf16", "convtune-fp32"),
                            steps=6, warmup=1, device="cuda", runtime=rt, rounds=3, graph=True, null=True)
    modes = {m["mode"]: m for m in doc["modes"]}
    assert set(modes) == {"torch-fp32", "torch-fp32-again", "torch-amp-bf16", "torch-amp-bf16-again", "convtune-fp32"}
    assert all("failed" not in m and m["rounds"] == 3 and m["step_ms"] > 0 for m in modes.values()), doc["modes"]
    assert modes["convtune-fp32"]["first_loss"] == pytest.approx(modes["torch-fp32"]["first_loss"], rel=1e-4)


def test_what_a_patched_call_costs_on_cuda_is_measured_quietly(caplog):
    """``dispatch_seconds`` on the GPU: a few microseconds of host time (under a millisecond), measured on a
    throwaway runtime: nothing said, nothing left in the default runtime's routes."""
    from convtune.torch import _host
    device = torch.device("cuda")
    _host._dispatches.pop(device, None)
    before = len(convtune.default_runtime().layer_memo("torch"))
    with caplog.at_level(logging.INFO, logger="convtune"):
        cost = _host.dispatch_seconds(device)
    assert 0.0 <= cost < 1e-3, cost  # (0 where the two calls measured alike)
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and r.name.startswith("convtune")]
    assert len(convtune.default_runtime().layer_memo("torch")) == before


def test_the_duels_floor_under_pytorchs_search_leaves_the_search_to_the_layers_thread():
    """A duel's floor under PyTorch's searched call (:func:`convtune.torch._duel.search_floor`) times cuDNN's heuristic
    pick on a thread of its own, as the planner's floor does: the layer thread's searched call that follows must still
    search (counted as in the planner's test below, against a control this thread picked by the heuristics first)."""
    from convtune.problem import ConvProblem
    from convtune.strategies.pytorch import native_for
    from convtune.torch._duel import duel_operands, search_floor

    device = torch.device("cuda", torch.cuda.current_device())

    def depthwise(batch):  # (bfloat16 channels-last: the heuristic pick and the search's differ)
        return ConvProblem.make(batch=batch, in_channels=96, out_channels=96, input_size=(28, 28), kernel_size=5,
                                padding=2, groups=96, dtype="bfloat16", layout="channels_last")

    def kernels(p, benchmark):
        a, b = duel_operands(p, device)
        fn = native_for(p, benchmark=benchmark)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(a, b)
            torch.cuda.synchronize()
        return len([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])

    p = depthwise(6)
    floor, host = search_floor(p, *duel_operands(p, device), device)
    assert 0 < floor < 1e-3 and 0 < host < 0.1, (floor, host)
    searched = kernels(p, benchmark=True)
    control = depthwise(5)
    kernels(control, benchmark=False)
    assert kernels(control, benchmark=True) <= 4 < searched


def test_the_weighing_spares_pytorchs_search_on_a_large_depthwise_layer_in_bfloat16():
    """A tune-ahead's weighing runs a layer whose search costs much and buys little (floor_spares_search: a large
    depthwise kernel in bfloat16 channels-last) on cuDNN's heuristic pick: its steps run far fewer kernels than the same
    steps searching (a shape of its own each, so that neither finds the other's plans), and its results and gradients
    are PyTorch's."""
    from convtune.torch import _host, tuning
    from convtune.torch._duel import floor_spares_search

    def case(size):
        torch.manual_seed(0)
        layer = nn.Conv2d(96, 96, 31, padding=15, groups=96, bias=True)
        model = nn.Sequential(layer).cuda().to(memory_format=torch.channels_last)
        ct.patch(model, runtime=make_runtime(["torch"]))
        x = torch.randn(12, 96, size, size, device="cuda").to(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            [item] = tuning.collect(model, x)
        assert floor_spares_search(item.problem), item.problem.describe()
        return model, x, {item.route_key: item.problem}, item.problem

    def kernels(model, x, spared):
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                _host.step_times(model, x, x.device, steps=1, spared=spared)
            torch.cuda.synchronize()
        assert all(p.grad is None for p in model.parameters())
        return len([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])

    with torch.backends.cudnn.flags(enabled=True, benchmark=True):
        model, x, spared, problem = case(40)
        searching = case(36)
        assert 2 * kernels(model, x, spared) < kernels(searching[0], searching[1], {})
        layer, spare = model[0], _host._heuristic_calls(spared)
        xr = x.detach().to(torch.bfloat16).requires_grad_()
        w = layer.weight.detach().to(torch.bfloat16).requires_grad_()
        geom = ct.functional.geometry(2, layer.kernel_size, layer.stride, layer.padding, layer.dilation, "zeros")
        y = spare(layer, xr, w, None, geom, 96, problem.math)
        got = torch.autograd.grad(y.float().square().sum(), (xr, w))
        want_y = nn.functional.conv2d(xr, w, None, padding=15, groups=96)
        want = torch.autograd.grad(want_y.float().square().sum(), (xr, w))
    assert torch.allclose(y.float(), want_y.float(), rtol=2e-2, atol=2e-2)
    assert all(torch.allclose(g.float(), e.float(), rtol=5e-2, atol=5e-1) for g, e in zip(got, want))


def test_a_gradients_duel_finds_what_pytorchs_training_step_searched():
    """A training step searches its gradients' cuDNN plans on the autograd engine's worker thread, and PyTorch keeps them
    per thread: the duel of a gradient pass, timed where that pass runs (:func:`convtune.torch._duel.where_pass_runs`),
    finds the step's pick and runs no search of its own, where a call on this thread searches again."""
    from convtune.problem import ConvProblem
    from convtune.strategies.pytorch import native_for
    from convtune.torch._duel import duel_operands, where_pass_runs

    device = torch.device("cuda", torch.cuda.current_device())
    layer = nn.Conv2d(96, 96, 5, padding=2, groups=96, bias=False).to(device, torch.bfloat16,
                                                                        memory_format=torch.channels_last)
    x = torch.randn(4, 96, 26, 26, device=device, dtype=torch.bfloat16).to(memory_format=torch.channels_last)
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        layer(x.requires_grad_()).float().sum().backward()  # PyTorch's own step: its search
        torch.cuda.synchronize()
    finally:
        torch.backends.cudnn.benchmark = saved
    p = ConvProblem.make(batch=4, in_channels=96, out_channels=96, input_size=(26, 26), kernel_size=5, padding=2,
                         groups=96, dtype="bfloat16", layout="channels_last").for_pass("dgrad")
    a, b = duel_operands(p, device)
    fn = native_for(p, benchmark=True)

    def kernels():
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            fn(a, b)
            torch.cuda.synchronize()
        return len([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])
    assert where_pass_runs("dgrad", kernels, device) <= 4 < kernels()


def test_the_floor_under_pytorchs_search_leaves_the_search_to_the_planners_thread():
    """The torch strategy's floor (Strategy.lower_bound) measures cuDNN's heuristic pick on a thread of its own, because
    PyTorch keeps the plan a shape first got in a cache per thread, the benchmark on or off: the planner thread's
    searched call that follows must still search. A search runs several engines, many kernels; a call whose shape this
    thread planned by the heuristics first runs a few (the control, so that the count tells the two apart)."""
    from convtune.backend import get_backend
    from convtune.planner import random_operands
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    from convtune.strategies.pytorch import TorchConfig

    backend, strategy = get_backend("cupy"), get_strategy("torch")

    def kernels(p, benchmark):
        a, b = random_operands(backend, p, 0)
        go = strategy.executor(p, TorchConfig(benchmark=benchmark), backend).timed(a, b)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            go()
            torch.cuda.synchronize()
        return len([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA])

    def depthwise(batch):  # (bfloat16 channels-last: the heuristic pick and the search's differ)
        return ConvProblem.make(batch=batch, in_channels=96, out_channels=96, input_size=(28, 28), kernel_size=5,
                                padding=2, groups=96, dtype="bfloat16", layout="channels_last")
    p = depthwise(8)
    a, b = random_operands(backend, p, 1)
    floor, why = strategy.lower_bound(p, TorchConfig(benchmark=True), backend, (a, b), 1e-9, None)
    assert floor > 0 and "heuristic pick" in why
    searched = kernels(p, benchmark=True)
    control = depthwise(7)
    kernels(control, benchmark=False)  # this thread's heuristic pick first: the searched call finds it cached
    assert kernels(control, benchmark=True) <= 4 < searched
