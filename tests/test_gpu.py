"""GPU-only checks (scripts/gpu-tests.sh runs them on a GPU machine).

A tuned forward/backward round trip through convtune's runtime, with the real
CUDA-event timer, must match PyTorch's conv and its autograd gradients in float64
on layers of the public benchmark suite (batch reduced to keep the run short).
"""

import gc
import math

import numpy as np
import pytest

import convtune
from convtune.backend import get_backend

pytestmark = pytest.mark.gpu

# name: (batch, in, out, input, kernel, stride, padding, groups) from ../shared/bench/layers.yaml
SUITE_LAYERS = {
    "alexnet-conv2": (4, 64, 192, (27, 27), (5, 5), 1, 2, 1),
    "resnet50-res3-3x3s2": (4, 128, 128, (56, 56), (3, 3), 2, 1, 1),
    "resnet50-res2-1x1": (4, 256, 64, (56, 56), (1, 1), 1, 0, 1),
    "convnext-t-dw7": (4, 96, 96, (56, 56), (7, 7), 1, 3, 96),
    "fbfft-L4": (4, 128, 128, (16, 16), (7, 7), 1, 0, 1),
    "temporal-k5": (4, 256, 256, (512,), (5,), 1, 2, 1),
    "wav2vec2-conv0": (2, 1, 512, (16000,), (10,), 5, 0, 1),
}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.mark.parametrize("name", sorted(SUITE_LAYERS))
def test_tuned_round_trip_matches_torch(torch, name):
    import cupy as cp
    n, cin, cout, size, kernel, stride, padding, groups = SUITE_LAYERS[name]
    rank = len(size)
    rt = convtune.Runtime(planner_options={"time_budget_s": 5.0})
    rng = cp.random.default_rng(7)
    x = rng.standard_normal((n, cin, *size), dtype=cp.float32)
    w = rng.standard_normal((cout, cin // groups, *kernel), dtype=cp.float32)
    y = convtune.conv(x, w, stride, padding, 1, groups, runtime=rt)
    dy = rng.standard_normal(y.shape, dtype=cp.float32)
    dx = convtune.conv_backward_data(dy, w, x.shape, stride, padding, 1, groups, runtime=rt)
    dw = convtune.conv_backward_filter(x, dy, w.shape, stride, padding, 1, groups, runtime=rt)
    assert rt.tuned == 3

    tx = torch.as_tensor(cp.asnumpy(x), dtype=torch.float64, device="cuda").requires_grad_()
    tw = torch.as_tensor(cp.asnumpy(w), dtype=torch.float64, device="cuda").requires_grad_()
    fn = torch.nn.functional.conv1d if rank == 1 else torch.nn.functional.conv2d
    ty = fn(tx, tw, stride=stride, padding=padding, groups=groups)
    ty.backward(torch.as_tensor(cp.asnumpy(dy), dtype=torch.float64, device="cuda"))

    def rel(ours, theirs):
        theirs = theirs.detach().cpu().numpy()
        return float(np.linalg.norm(cp.asnumpy(ours).astype(np.float64) - theirs) / np.linalg.norm(theirs))

    assert rel(y, ty) < 1e-5
    assert rel(dx, tx.grad) < 1e-5
    assert rel(dw, tw.grad) < 1e-5
    # warm calls hit the memo: no tuning, same numbers
    y2 = convtune.conv(x, w, stride, padding, 1, groups, runtime=rt)
    assert rt.tuned == 3 and bool(cp.allclose(y, y2))


def test_cuda_event_timer_measures_real_work():
    import cupy as cp
    backend = get_backend("cupy")
    a = cp.random.default_rng(0).standard_normal((2048, 2048), dtype=cp.float32)
    stats = convtune.CudaEventTimer(repeats=10)(lambda: a @ a, backend)
    flops = 2 * 2048 ** 3
    assert stats.repeats == 10
    assert 1e-6 < stats.median_s < 1.0
    assert flops / stats.median_s < 2e14  # below any fp32 peak: the timer did not skip the work


def test_device_fingerprint_is_complete():
    info = get_backend("cupy").device_info()
    for field in ("model", "compute_capability", "driver", "cuda_runtime", "cufft", "cublas", "cupy"):
        assert getattr(info, field), field
    assert info.sm_count > 0 and info.memory_bytes > 0
    assert info.key().startswith("gpu:")


def test_layer_object_trains_on_cupy():
    import cupy as cp
    rt = convtune.Runtime(planner_options={"time_budget_s": 2.0})
    layer = convtune.Conv2d(8, 16, 3, padding=1, backend="cupy", seed=0, runtime=rt)
    x = cp.random.default_rng(1).standard_normal((4, 8, 20, 20), dtype=cp.float32)
    y = layer(x)
    dx = layer.backward(cp.ones_like(y))
    assert isinstance(dx, cp.ndarray) and dx.shape == x.shape
    assert isinstance(layer.grad_weight, cp.ndarray) and math.isfinite(float(layer.grad_weight.sum()))


def _operands_and_reference(be, p, seed):
    from convtune.direct.reference import reference
    from convtune.planner import random_operands
    xp = be.xp
    a, b = random_operands(be, p, seed)
    return a, b, reference(xp, p, a.astype(xp.float64), b.astype(xp.float64))


@pytest.mark.parametrize("name", ["im2col", "fft"])
def test_tf32_gemm_engages_in_tf32_mode_only(name):
    """tf32 configs run their GEMMs on TF32 tensor cores (the error shows it); fp32 configs stay strict
    even when CuPy's global compute type asks for TF32, and that setting is restored."""
    import cupy as cp
    from cupy._core import _routines_linalg as linalg
    from convtune.planner import relative_error
    from convtune.strategies import get_strategy
    be = get_backend("cupy")
    shape = dict(batch=4, in_channels=128, out_channels=128, input_size=(16, 16), kernel_size=3, padding=1)
    p32, ptf = convtune.ConvProblem.make(**shape), convtune.ConvProblem.make(**shape, math="tf32")
    a, b, ref = _operands_and_reference(be, p32, 1)
    strategy = get_strategy(name)
    tf = next(c for c in strategy.candidates(ptf, be) if c.tf32)
    err_tf = relative_error(cp, strategy.build(ptf, tf, be)(a, b), ref)
    assert 1e-6 < err_tf <= 1e-3, err_tf
    previous = linalg.get_compute_type(np.float32)
    linalg.set_compute_type(np.float32, 7)  # COMPUTE_TYPE_TF32, as CUPY_TF32=1 would
    try:
        strict = next(c for c in strategy.candidates(p32, be) if getattr(c, "product", "gemm") == "gemm")
        err32 = relative_error(cp, strategy.build(p32, strict, be)(a, b), ref)
        assert linalg.get_compute_type(np.float32) == 7
    finally:
        linalg.set_compute_type(np.float32, previous)
    assert err32 <= 1e-5, err32


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_depthwise_tiled_kernels_on_a_convnext_shape(pass_):
    """The register-blocked tiled kernels (4 and 8 rows per thread) against float64 on a ConvNeXt
    depthwise 7x7 shape with partial tiles on both axes."""
    import cupy as cp
    from convtune.planner import relative_error
    from convtune.strategies import get_strategy
    be = get_backend("cupy")
    p = convtune.ConvProblem.make(batch=3, in_channels=20, out_channels=20, input_size=(56, 45), kernel_size=7,
                                  padding=3, groups=20, pass_=pass_)
    a, b, ref = _operands_and_reference(be, p, 4)
    strategy = get_strategy("depthwise")
    tiled = [c for c in strategy.candidates(p, be) if c.variant == "tiled"]
    assert sorted(c.rows for c in tiled) == [4, 8]
    for c in tiled:
        out = cp.full(p.result_shape, cp.nan, dtype=cp.float32)
        assert relative_error(cp, strategy.build(p, c, be)(a, b, out), ref) <= 1e-5, c.label()


# (input, kernel, padding, dilation, batch, channels): 3D UX-Net's 7x7x7 with partial tiles, a dilated uneven
# kernel whose backward-data padding goes negative in depth, 9x9x9 (81-tap slices), an even kernel one row tall
DW3_CASES = [((13, 37, 21), 7, 3, 1, 2, 5), ((5, 9, 40), (3, 5, 3), (5, 1, 0), (2, 1, 3), 2, 3),
             ((6, 20, 20), 9, 4, 1, 1, 4), ((4, 3, 70), (2, 1, 5), (0, 0, 2), 1, 3, 33)]


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", DW3_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-k" + str(c[1]))
def test_3d_depthwise_kernels_against_float64(pass_, case):
    """The 3-D tiled depthwise kernels (8 and 4 rows per thread) against float64 in every pass, on arrays
    and by address."""
    import cupy as cp
    from convtune.planner import relative_error
    from convtune.strategies import get_strategy
    size, kernel, padding, dilation, n, c = case
    be = get_backend("cupy")
    p = convtune.ConvProblem.make(batch=n, in_channels=c, out_channels=c, input_size=size, kernel_size=kernel,
                                  padding=padding, dilation=dilation, groups=c, pass_=pass_)
    a, b, ref = _operands_and_reference(be, p, 5)
    strategy = get_strategy("depthwise")
    assert strategy.supports(p, be) is None
    configs = strategy.candidates(p, be)
    assert sorted(cfg.rows for cfg in configs) == [4, 8]
    for cfg in configs:
        run = strategy.build(p, cfg, be)
        out = cp.full(p.result_shape, cp.nan, dtype=cp.float32)
        assert relative_error(cp, run(a, b, out), ref) <= 1e-5, cfg.label()
        out = cp.full(p.result_shape, cp.nan, dtype=cp.float32)
        run.launch(a.data.ptr, b.data.ptr, out.data.ptr, cp.cuda.get_current_stream())
        assert relative_error(cp, out, ref) <= 1e-5, cfg.label()


# (input, kernel, padding, batch, channels): RepLKNet's stage 3 and 4 (27x27 on 14x14, 13x13 on 7x7),
# a 31x31 kernel on a plane larger than it with uneven padding, a 1-D window, and odd sizes
WINDOW_CASES = [((14, 14), (27, 27), (13, 13), 3, 5), ((7, 7), (13, 13), (6, 6), 2, 6),
                ((40, 37), (31, 31), (15, 10), 2, 3), ((300,), (61,), (30,), 3, 4), ((19, 23), (11, 17), (0, 16), 2, 3)]


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", WINDOW_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-k" + "x".join(map(str, c[1])))
def test_depthwise_window_kernels_against_float64(pass_, case):
    """The window kernels (large kernels on small planes, both S) against float64 in every pass."""
    import cupy as cp
    from convtune.planner import relative_error
    from convtune.strategies import get_strategy
    size, kernel, padding, n, c = case
    be = get_backend("cupy")
    p = convtune.ConvProblem.make(batch=n, in_channels=c, out_channels=c, input_size=size, kernel_size=kernel,
                                  padding=padding, groups=c, pass_=pass_)
    a, b, ref = _operands_and_reference(be, p, 4)
    strategy = get_strategy("depthwise")
    assert strategy.supports(p, be) is None
    window = [cfg for cfg in strategy.candidates(p, be) if cfg.variant == "window"]
    assert sorted(cfg.rows for cfg in window) == [4, 8]
    for cfg in window:
        out = cp.full(p.result_shape, cp.nan, dtype=cp.float32)
        assert relative_error(cp, strategy.build(p, cfg, be)(a, b, out), ref) <= 1e-5, cfg.label()


def _depthwise_case(be, case, dtype, layout, pass_):
    """A depthwise problem from ``(input, kernel, stride, padding, dilation, batch, channels)`` and the depthwise
    strategy, which supports it."""
    from convtune.strategies import get_strategy
    size, kernel, stride, padding, dilation, n, c = case
    p = convtune.ConvProblem.make(batch=n, in_channels=c, out_channels=c, input_size=size, kernel_size=kernel,
                                  stride=stride, padding=padding, dilation=dilation, groups=c, pass_=pass_,
                                  dtype=dtype, layout=layout)
    strategy = get_strategy("depthwise")
    assert strategy.supports(p, be) is None
    return p, strategy


# (input, kernel, stride, padding, dilation, batch, channels): ConvNeXt's 7x7 with channels not a multiple of 32,
# a strided 3x3 (backward-data's gather), a dilated 5x5, a 31x31 kernel (taps outside registers, filter
# gradient in row groups), a long 1-D kernel, uneven strides and padding; 96 channels of a 23x41 plane, which every
# staged configuration takes (three segments a row, tiles past the last rows); ConvNeXt-T's stage-1 rows (56 wide),
# whose double-buffered tiles of more than 48 KiB a block opt in
NHWC_CASES = [((13, 17), (7, 7), 1, 3, 1, 3, 40), ((15, 16), (3, 3), 2, 1, 1, 2, 24),
              ((20, 19), (5, 5), 1, 4, 2, 2, 33), ((40, 37), (31, 31), 1, 15, 1, 2, 16),
              ((301,), (61,), 1, 30, 1, 3, 48), ((9, 11), (3, 5), (2, 1), (0, 2), 1, 2, 8),
              ((23, 41), (5, 3), 1, (2, 1), 1, 3, 96), ((30, 56), (7, 7), 1, 3, 1, 2, 96),
              ((56, 56), (3, 3), 2, 1, 1, 2, 64)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", NHWC_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-k" + "x".join(map(str, c[1])))
def test_channels_last_depthwise_kernels_against_float64(dtype, pass_, case):
    """The channels-last kernels (every rows setting, the tiled ones where they apply) read and write the problem's dtype in its layout, and sum
    in float32: within one unit roundoff of the float64 result of the same rounded operands (the rounding of
    the result alone), float32 within 1e-5. Their timed form runs on the same memory layout."""
    import cupy as cp
    from convtune import precision
    from convtune.direct import depthwise_nhwc
    from convtune.planner import relative_error
    from convtune.strategies.depthwise import NHWC_STAGED_CONFIGS
    be = get_backend("cupy")
    p, strategy = _depthwise_case(be, case, dtype, "channels_last", pass_)
    kernel = p.kernel_size
    a, b, ref = _operands_and_reference(be, p, 5)
    nhwc = [cfg for cfg in strategy.candidates(p, be) if cfg.variant.startswith("nhwc")]
    tiled = depthwise_nhwc.tiled_reason(p, 4) is None
    assert tiled or p.stride != (1,) * p.rank or math.prod(kernel) > 81 or (p.rank == 1 and pass_ == "wgrad")
    vec = sorted({cfg.variant for cfg in nhwc if cfg.variant.startswith("nhwc-vec")})
    assert vec == [f"nhwc-vec{v}" for v in (2, 4) if depthwise_nhwc.vec_reason(p, v) is None]
    staged = sorted((cfg.variant, cfg.rows) for cfg in nhwc if cfg.variant.startswith("nhwc-st"))
    room = cp.cuda.runtime.deviceGetAttribute(97, cp.cuda.Device().id)  # (a block's shared memory, opted in)
    assert staged == sorted(
        (f"nhwc-st{pairs}" + ("p" if pipe else "") + (f"m{kib}" if kib > 48 else ""), rows)
        for pairs, rows, segw, pipe, kib in NHWC_STAGED_CONFIGS
        if depthwise_nhwc.staged_reason(p, pairs, rows, segw, pipe, kib * 1024) is None
        and (kib == 48 or 48 * 1024 < depthwise_nhwc.staged_tile(p, pairs, rows, segw, pipe, kib * 1024).shared
             <= room))
    assert staged or p.rank == 1 or p.stride != (1,) * p.rank or p.dilation != (1,) * p.rank \
        or math.prod(kernel) > 81 or p.in_channels % 8
    assert sorted((cfg.variant, cfg.rows) for cfg in nhwc if cfg.variant in ("nhwc", "nhwc-tiled")) == \
        [("nhwc", 2), ("nhwc", 4), ("nhwc", 8)] + ([("nhwc-tiled", 4), ("nhwc-tiled", 8)] if tiled else [])
    bound = 1e-5 if dtype == "float32" else precision.UNIT_ROUNDOFF[dtype]
    for cfg in nhwc:
        out = precision.empty_result(cp, p, fill=cp.nan)
        run = strategy.executor(p, cfg, be)
        assert run(a, b, out) is out
        if pass_ != "wgrad":  # (a filter of one channel per group reads as either layout)
            assert precision.layout_of(out) == "channels_last"
        err = relative_error(cp, out, ref)
        assert err <= bound, f"{cfg.label()}: {err:.3g} on {p.describe()}"
        run.timed(a, b, out)()


# (input, kernel, stride, padding, dilation, batch, channels): the simple kernels (strided, dilated, 1-D), the tiled
# ones (7x7), the window ones (a 27x27 kernel on a 14x14 plane, a 31x31 on 20x21)
CF_HALF_CASES = [((13, 17), (7, 7), 1, 3, 1, 3, 40), ((15, 16), (3, 3), 2, 1, 1, 2, 24),
                 ((20, 19), (5, 5), 1, 4, 2, 2, 33), ((14, 14), (27, 27), 1, 13, 1, 3, 16),
                 ((20, 21), (31, 31), 1, 15, 1, 2, 8), ((301,), (9,), 1, 4, 1, 3, 12)]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", CF_HALF_CASES, ids=lambda c: "x".join(map(str, c[0])) + "-k" + "x".join(map(str, c[1])))
def test_channels_first_depthwise_kernels_read_half_precision_against_float64(dtype, pass_, case):
    """The channels-first depthwise kernels (simple, tiled, window: every candidate) read and write half-precision
    operands themselves, summing in float32 (the filter gradient in a float32 workspace, rounded once): no float32
    executor between conversions, within one unit roundoff of the float64 result of the same rounded operands (the
    array form runs the by-address launch on 16-bit memory, as the PyTorch layer does; so does the timed form)."""
    import cupy as cp
    from convtune import precision
    from convtune.planner import relative_error
    be = get_backend("cupy")
    p, strategy = _depthwise_case(be, case, dtype, "channels_first", pass_)
    a, b, ref = _operands_and_reference(be, p, 6)
    configs = strategy.candidates(p, be)
    variants = {cfg.variant for cfg in configs}
    assert variants <= {"simple", "tiled", "window"} and variants, variants
    for cfg in configs:
        run = strategy.executor(p, cfg, be)
        assert run.float32 is None and run.launch is not None, cfg.label()
        out = precision.empty_result(cp, p, fill=cp.nan)
        assert run(a, b, out) is out
        err = relative_error(cp, out, ref)
        assert err <= precision.UNIT_ROUNDOFF[dtype], f"{cfg.label()}: {err:.3g} on {p.describe()}"
        run.timed(a, b, out)()
        # the filter gradient's float32 sums are the plan's own block: its launch allocates nothing, takes none
        assert run.launch_workspace == 0 and type(run.launch).__name__ == "AddressReplay"
        holds = run.launch.holds
        assert (holds.nbytes if holds is not None else 0) == (4 * math.prod(p.w_shape) if pass_ == "wgrad" else 0)


def test_cudnn_best_peer_names_its_engine_and_is_exact():
    import cupy as cp
    pytest.importorskip("cudnn")
    from convtune.bench.peers import available_peers
    from convtune.planner import relative_error
    be = get_backend("cupy")
    peer = {p.name: p for p in available_peers(be)}["cudnn-best"]
    assert peer.make is not None, peer.absent_reason
    p = convtune.ConvProblem.make(batch=4, in_channels=32, out_channels=32, input_size=(20, 20), kernel_size=3,
                                  padding=1, pass_="wgrad")
    a, b, ref = _operands_and_reference(be, p, 2)
    fn = peer.make(p, a, b)
    assert fn.label.startswith("cudnn[eng")
    assert relative_error(cp, fn(), ref) <= 1e-5


def test_fft_calibration_measures_on_the_gpu(tmp_path, calibrations):
    from convtune.cache import PlanCache
    from convtune.fft import cost
    from convtune.fft.calibrate import calibrate
    from convtune.timing import default_timer
    be = get_backend("cupy")
    result = calibrate(be, default_timer(be), elements=1 << 20)
    assert result["source"].startswith("measured by convtune calibrate on gpu:")
    assert all(result[k] > 0 for k in ("pow2", "smooth", "other")) and len(result["measurements"]) == 15
    cost.store_calibration(PlanCache(str(tmp_path / "p.db")), be.device_info().key(), result)
    assert cost.calibration_for(be.device_info().key())["other"] == result["other"]


@pytest.mark.parametrize("shape, sizes", [((3, 4, 9, 5), (9, 8)), ((2, 6, 13), (24,)), ((2, 2, 5, 6, 4), (5, 6, 6))])
def test_the_consuming_inverse_transform_is_numpys(shape, sizes):
    """The spectral executors' inverse transform on CuPy skips cupy.fft's copy of its input (it may
    overwrite it): the same result as NumPy's, 1-D to 3-D, both normalisations."""
    import cupy as cp
    from convtune.fft.spectral import consuming_irfftn
    rng = np.random.default_rng(0)
    spec = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(np.complex64)
    axes = tuple(range(len(shape) - len(sizes), len(shape)))
    for norm in ("forward", "backward"):
        expected = np.fft.irfftn(spec.astype(np.complex128), s=sizes, axes=axes, norm=norm)
        got = consuming_irfftn(cp)(cp.asarray(spec), s=sizes, axes=axes, norm=norm)
        assert got.dtype == cp.float32
        np.testing.assert_allclose(cp.asnumpy(got), expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_fused_callback_plan_after_pytorch_loaded_its_own_cufft(torch):
    """A process that has run PyTorch's CUDA FFT maps PyTorch's copy of cuFFT beside CuPy's; the JIT
    callback must be set through CuPy's copy (found failing in benchmarks/compare_plans.py on the public
    suite's temporal-k5 wgrad plan, cufftXtSetJITCallback -> cufftResult 1, 2026-11-23)."""
    from convtune import ConvProblem, precision
    from convtune.fft.callbacks import callbacks_available
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    from convtune.strategies.fft import FftConfig
    if not callbacks_available():
        pytest.skip("cuFFT JIT callbacks are not available here")
    torch.fft.rfft(torch.randn(4, 64, device="cuda"))  # PyTorch's cuFFT, loaded and used
    be = get_backend("cupy")
    p = ConvProblem.make(batch=32, in_channels=256, out_channels=256, input_size=(512,), kernel_size=5, padding=2,
                         pass_="wgrad")
    a, b = random_operands(be, p, 1)
    ref = get_strategy("reference").build(p, None, be)(a.astype(be.xp.float64), b.astype(be.xp.float64))
    for _ in range(2):  # two executors of the same plan in one process
        out = precision.empty_result(be.xp, p)
        run = get_strategy("fft").executor(p, FftConfig(sizes=(64,), product="fgemm", chunk=288, fused=True,
                                                        tiled=True), be)
        run(a, b, out)
        assert relative_error(be.xp, out, ref) <= 1e-5


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_torch_plan_returns_a_view_that_keeps_pytorchs_result_alive(torch, pass_):
    """The torch strategy's array path hands PyTorch's result back as a CuPy view without DLPack: right
    against float64 (channels_last operands too), and the tensor's memory stays the view's while PyTorch
    allocates and frees around it."""
    from convtune import ConvProblem, precision
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    from convtune.strategies.pytorch import TorchConfig
    be = get_backend("cupy")
    for layout in ("channels_first", "channels_last"):
        p = ConvProblem.make(batch=3, in_channels=8, out_channels=6, input_size=(13, 11), kernel_size=3, padding=1,
                             stride=2, pass_=pass_, layout=layout)
        a, b = random_operands(be, p, 1)
        ref = get_strategy("reference").build(p, None, be)(a.astype(be.xp.float64), b.astype(be.xp.float64))
        run = get_strategy("torch").build(p, TorchConfig(benchmark=True), be)
        got = run(a, b)
        assert isinstance(got, be.xp.ndarray) and got.shape == p.result_shape
        # blocks of the result's size: PyTorch would hand the result's block out again if it were free
        churn = [torch.full(p.result_shape, 7.0, device="cuda") for _ in range(16)]
        del churn
        torch.cuda.synchronize()
        assert relative_error(be.xp, got, ref) <= 1e-5
        out = precision.empty_result(be.xp, p)
        assert run(a, b, out) is out and relative_error(be.xp, out, ref) <= 1e-5


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_pointwise_layers_run_as_bare_cublas_calls(pass_, monkeypatch):
    """im2col's 1x1 layers on the GPU: right against float64 through cuBLAS alone (the general path made to
    fail), the handle's math and pointer modes as they were, strided operands on the general path."""
    from cupy_backends.cuda.libs import cublas
    from convtune import ConvProblem
    from convtune.direct import im2col as im2col_module
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    from convtune.strategies.im2col import Im2colConfig
    be = get_backend("cupy")
    handle = be.xp.cuda.device.get_cublas_handle()
    for batch, cin, cout, size, math_mode in [(3, 37, 19, (7, 5), "fp32"), (2, 64, 128, (6, 6, 6), "fp32"),
                                              (4, 96, 48, (33,), "tf32")]:
        p = ConvProblem.make(batch=batch, in_channels=cin, out_channels=cout, input_size=size, kernel_size=1,
                             pass_=pass_, math=math_mode)
        a, b = random_operands(be, p, 1)
        ref = get_strategy("reference").build(p, None, be)(a.astype(be.xp.float64), b.astype(be.xp.float64))
        assert len(get_strategy("im2col").candidates(p, be)) == 1  # one plan: no chunks to choose between
        run = get_strategy("im2col").build(p, Im2colConfig(chunk=batch, tf32=math_mode == "tf32"), be)
        modes = cublas.getMathMode(handle), cublas.getPointerMode(handle)
        with monkeypatch.context() as m:
            m.setitem(im2col_module.PASS_FUNCTIONS, pass_, None)  # the general path would fail
            for _ in range(3):  # not only the first call after the build (alpha and beta stay alive)
                gc.collect()
                got = run(a, b)
                assert relative_error(be.xp, got, ref) <= (1e-5 if math_mode == "fp32" else 1e-3)
        assert (cublas.getMathMode(handle), cublas.getPointerMode(handle)) == modes
        strided = be.xp.empty((a.shape[0], a.shape[1] * 2) + a.shape[2:], dtype=a.dtype)[:, ::2]
        strided[...] = a
        assert relative_error(be.xp, run(strided, b), ref) <= (1e-5 if math_mode == "fp32" else 1e-3)


@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("name, size, kernel", [("fft-row", (3000,), 1001), ("fft-plane", (56, 56), 31)])
def test_block_fft_launches_replay_from_cuda_graphs_with_the_plans_own_workspace(name, size, kernel, pass_, layout):
    """The row and plane FFTs' launches (the filter's spectra and the rows or planes, several kernels) are replayed
    from CUDA graphs per operand addresses: called on the same memory, the first call is direct, the second captured,
    later ones replayed, each result within fp32 of float64; the spectra's workspace is the plan's own block, of the
    size the strategy reports."""
    import cupy as cp
    from convtune import precision
    from convtune.planner import relative_error
    from convtune.strategies import get_strategy
    be = get_backend("cupy")
    p = convtune.ConvProblem.make(batch=2, in_channels=6, out_channels=6, input_size=size, kernel_size=kernel,
                                  padding=kernel // 2, groups=6, pass_=pass_, layout=layout)
    strategy = get_strategy(name)
    config = strategy.candidates(p, be)[0]
    run = strategy.executor(p, config, be)
    launch = run.launch
    assert type(launch).__name__ == "AddressReplay" and run.launch_workspace == 0
    workspace = strategy.workspace_bytes(p, config)
    a, b, ref = _operands_and_reference(be, p, 3)
    ma, mb = (precision.launch_memory(cp, v, "float32", layout) for v in (a, b))
    res = precision.launch_result(cp, p.result_shape, "float32", layout)
    stream = cp.cuda.get_current_stream()
    for call in range(4):
        res.fill(cp.nan)
        launch(ma.data.ptr, mb.data.ptr, res.data.ptr, stream)
        stream.synchronize()
        got = precision.from_launch(cp, res, "float32", layout)
        assert relative_error(cp, got, ref) <= 1e-5, (call, p.describe())
    assert launch.off is None and (launch.made, launch.replayed) == (1, 2), (launch.made, launch.replayed)
    assert (launch.holds.nbytes if launch.holds is not None else 0) == workspace
