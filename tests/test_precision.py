"""Half precision and channels_last: problem keys and bounds, storage and rounding, the planner through
conversions, the cache, the array API, the command line, and the PyTorch layer under autocast."""

from __future__ import annotations

import itertools
import shutil
import sqlite3
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import convtune
from convtune import ConvProblem, Planner, precision
from convtune.cache import PlanCache
from convtune.cli import main
from convtune.planner import random_operands, relative_error
from convtune.strategies import get_strategy, register, unregister
from convtune.strategies.reference import reference
from test_planner import make_strategy

KINDS = list(itertools.product(precision.DTYPES, precision.LAYOUTS))
#: The plan table shipped before schema 2 (resnet50 on an H100 at commit c649302): what upgrades are tested on.
SCHEMA1_DB = Path(__file__).resolve().parent / "data" / "plans-schema1-c649302.db"


def layer(**kw):
    return ConvProblem.make(**{**dict(batch=2, in_channels=4, out_channels=6, input_size=(9, 10), kernel_size=3,
                                      padding=1), **kw})


# -- the problem ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, layout", KINDS)
def test_keys_say_dtype_and_layout_and_read_back(dtype, layout):
    p = layer(dtype=dtype, layout=layout, pass_="wgrad")
    assert ConvProblem.from_key(p.key()) == p
    assert f":{dtype}:" in p.key() and p.key().endswith(":channels_last") == (layout == "channels_last")
    assert (dtype in p.describe()) == (dtype != "float32") and (layout in p.describe()) == (layout == "channels_last")
    assert p.min_bytes() == precision.ITEMSIZE[dtype] * layer().min_bytes() // 4


def test_a_float32_channels_first_key_is_as_it_always_was():
    assert layer().key() == "ck1:conv2d:fwd:float32:fp32:n2:c4:k6:in9x10:ker3x3:s1x1:p1x1:d1x1:g1"


def test_bounds_are_four_rounding_units_or_the_math_modes():
    assert layer(dtype="bfloat16").tolerance == 2 ** -6 and layer(dtype="float16").tolerance == 2 ** -9
    assert layer().tolerance == 1e-5 and layer(math="tf32").tolerance == 1e-3
    assert layer(dtype="float16", math="tf32").tolerance == 2 ** -9  # the looser of the two


@pytest.mark.parametrize("kw, message", [
    (dict(dtype="float64"), "unknown dtype 'float64'; acceptable dtypes: float32, bfloat16, float16"),
    (dict(layout="nhwc"), "unknown layout 'nhwc'; acceptable layouts: channels_first, channels_last"),
])
def test_bad_dtype_or_layout_is_a_clear_error(kw, message):
    with pytest.raises(ValueError, match=message):
        layer(**kw)


# -- storage and rounding ----------------------------------------------------------------------------------------
def test_bfloat16_rounding_is_to_nearest_even_as_pytorchs():
    torch = pytest.importorskip("torch")
    values = np.concatenate([np.random.default_rng(0).standard_normal(10000).astype(np.float32) * 100,
                             np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 3.4e38, np.inf, -np.inf, 0.0,
                                       1e-40], dtype=np.float32)])
    ours = precision.round_to(np, values, "bfloat16")
    theirs = torch.from_numpy(values).to(torch.bfloat16).float().numpy()
    assert ours.dtype == np.float32 and np.array_equal(ours, theirs)
    assert np.isnan(precision.round_to(np, np.array([np.nan], np.float32), "bfloat16")).all()
    assert precision.round_to(np, values, "float16").dtype == np.float16


def test_layout_is_read_from_the_strides():
    x = np.zeros((2, 3, 4, 5), np.float32)
    cl = precision.laid_out(np, x, "channels_last")
    assert precision.layout_of(x) == "channels_first" and precision.layout_of(cl) == "channels_last"
    assert cl.shape == x.shape and cl.transpose(0, 2, 3, 1).flags.c_contiguous
    assert precision.layout_of(np.zeros((2, 1, 4, 5), np.float32)) == "channels_first"  # one channel: both
    nlc = np.zeros((2, 5, 3), np.float32).transpose(0, 2, 1)
    assert precision.layout_of(nlc) == "channels_last"
    out = precision.empty_result(np, layer(dtype="float16", layout="channels_last"))
    assert out.dtype == np.float16 and precision.layout_of(out) == "channels_last"


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (2, 3, 7)])
def test_launch_memory_is_the_layouts_dense_memory_and_the_array_itself_where_it_is_that(shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    assert precision.launch_memory(np, x, "float32", "channels_first") is x  # (no view made on a cached call)
    strided = x[:, ::-1]  # (not C-contiguous: the dense memory is a copy)
    got = precision.launch_memory(np, strided, "float32", "channels_first")
    assert got.flags.c_contiguous and np.array_equal(got, strided)
    cl = precision.laid_out(np, x, "channels_last")
    got = precision.launch_memory(np, cl, "float32", "channels_last")
    assert got.flags.c_contiguous and np.array_equal(got, np.moveaxis(x, 1, -1))
    # a channels-first array handed in as channels_last is read in channels_last's memory order (a copy)
    assert np.array_equal(precision.launch_memory(np, x, "float32", "channels_last"), np.moveaxis(x, 1, -1))
    bits = precision.launch_memory(np, x, "bfloat16", "channels_first")
    assert bits.dtype == np.uint16 and np.array_equal(bits, (x.view(np.uint32) >> 16).astype(np.uint16))
    for layout in ("channels_first", "channels_last"):
        e = precision.empty_in(np, shape, "float32", layout)
        assert e.shape == shape and e.dtype == np.float32 and precision.layout_of(e) == layout
        assert precision.launch_memory(np, e, "float32", layout).flags.c_contiguous


@pytest.mark.parametrize("dtype, layout", KINDS)
def test_operands_are_stored_rounded_and_laid_out(dtype, layout):
    p = layer(dtype=dtype, layout=layout)
    a, b = random_operands(convtune.backend.get_backend("numpy"), p, 0)
    assert a.dtype == np.dtype(precision.STORAGE[dtype]) and precision.layout_of(a) == layout
    assert np.array_equal(precision.round_to(np, a.astype(np.float32), dtype).astype(np.float32),
                          a.astype(np.float32))


# -- the planner through conversions -------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, layout", KINDS)
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("strategy", ["im2col", "fft"])
def test_numpy_strategies_run_half_and_channels_last_within_the_bound(dtype, layout, pass_, strategy, fake_timer):
    p = layer(dtype=dtype, layout=layout, pass_=pass_, kernel_size=5, padding=2)
    decision = Planner("numpy", fake_timer, strategies=[strategy]).tune(p)
    assert decision.winner.error <= p.tolerance
    if dtype != "float32":  # the result's own rounding: near half a unit, far from nothing
        assert precision.UNIT_ROUNDOFF[dtype] / 8 < decision.winner.error
    plan = convtune.planner.build_plan(decision, "numpy")
    a, b = random_operands(convtune.backend.get_backend("numpy"), p, 7)
    out = plan(a, b)
    assert out.dtype == np.dtype(precision.STORAGE[dtype]) and precision.layout_of(out) == layout or \
        out.shape[1] == 1
    ref = reference(np, p, a.astype(np.float64), b.astype(np.float64))
    assert relative_error(np, out, ref) <= p.tolerance
    exact32 = get_strategy(strategy).build(p.in_float32(), plan.config, convtune.backend.get_backend("numpy"))(
        np.ascontiguousarray(a, dtype=np.float32), np.ascontiguousarray(b, dtype=np.float32))
    assert np.array_equal(out.astype(np.float32), precision.round_to(np, exact32, dtype).astype(np.float32))


def test_a_result_that_misses_its_dtypes_bound_is_rejected(fake_timer):
    """A candidate off by 6 rounding units (what accumulating in half precision does on long reductions)
    is rejected with its error recorded; one off by half a unit passes."""
    def noisy(units):
        def behaviour(a, b, out, problem, _reference):
            exact = reference(np, problem, np.asarray(a, np.float64), np.asarray(b, np.float64))
            noise = np.random.default_rng(0).choice([-1.0, 1.0], size=exact.shape)
            off = (exact * (1 + units * precision.UNIT_ROUNDOFF[problem.dtype] * noise)).astype(np.float32)
            out[...] = precision.round_to(np, off, problem.dtype)
            return out
        return behaviour
    names = []
    try:
        for name, units in (("t-half-accum", 6.0), ("t-fp32-accum", 0.5)):
            strategy = make_strategy(name, noisy(units))
            strategy.native_dtypes = precision.DTYPES  # it reads and writes half precision itself
            register(strategy)
            names.append(name)
        for dtype in ("bfloat16", "float16"):
            d = Planner("numpy", fake_timer, strategies=names).tune(layer(dtype=dtype))
            outcomes = {o.strategy: o for o in d.outcomes}
            assert outcomes["t-half-accum"].status == "rejected" and outcomes["t-half-accum"].error > 4 * \
                precision.UNIT_ROUNDOFF[dtype]
            assert d.winner.strategy == "t-fp32-accum"
    finally:
        for name in names:
            unregister(name)


def test_the_torch_candidate_runs_half_precision_natively(fake_timer):
    pytest.importorskip("torch")
    torch_strategy = get_strategy("torch")
    for dtype, layout in KINDS:
        p = layer(dtype=dtype, layout=layout)
        assert torch_strategy.reads(p) and torch_strategy.workspace(p, None) == 0
        assert get_strategy("im2col").workspace(p, get_strategy("im2col").candidates(p, None)[0]) >= \
            (0 if (dtype, layout) == ("float32", "channels_first") else p.in_float32().min_bytes())
        d = Planner("numpy", fake_timer, strategies=["torch"]).tune(p)
        assert d.winner.strategy == "torch" and d.winner.error <= p.tolerance


# -- the cache ----------------------------------------------------------------------------------------------------
def test_plans_of_every_dtype_and_layout_are_stored_apart(cache_url, fake_timer):
    cache = PlanCache(cache_url)
    planner = Planner("numpy", fake_timer, strategies=["im2col"])
    device = planner.backend.device_info().key()
    for dtype, layout in KINDS:
        cache.put(planner.tune(layer(dtype=dtype, layout=layout)))
    fresh = PlanCache(cache_url)
    for dtype, layout in KINDS:
        got = fresh.get(layer(dtype=dtype, layout=layout), device)
        assert got is not None and got.problem.dtype == dtype and got.problem.layout == layout
    assert len(fresh.plan_rows()) == len(KINDS)
    # the nearest tuned problem of a channels_last bfloat16 problem is of its kind, never another layout's
    near = fresh.nearest(layer(dtype="bfloat16", layout="channels_last", batch=3), device)
    assert near.problem == layer(dtype="bfloat16", layout="channels_last")


def test_upgrading_to_schema_4_reads_old_problems_as_channels_first(tmp_path):
    copy = tmp_path / "plans.db"
    shutil.copy(SCHEMA1_DB, copy)
    cache = PlanCache(str(copy))
    layouts = {r[0] for r in sqlite3.connect(copy).execute("SELECT layout FROM problems")}
    assert layouts == {"channels_first"}
    key = cache.plan_rows()[0]["problem_key"]
    assert ConvProblem.from_key(key).layout == "channels_first"
    read_only = PlanCache(str(SCHEMA1_DB), create=False, read_only=True)  # schema 1, no layout column
    p = ConvProblem.from_key(key)
    assert read_only.measured_batches(p) == [] or all(isinstance(b, int) for b in read_only.measured_batches(p))
    assert read_only.nearest(p.replace(layout="channels_last"), read_only.plan_rows()[0]["fingerprint"]) is None


# -- the array API ----------------------------------------------------------------------------------------------
def test_conv_takes_float16_and_channels_last_arrays(fake_default_timer):
    rt = convtune.Runtime()
    rng = np.random.default_rng(0)
    x32, w32 = rng.standard_normal((2, 3, 9, 9)).astype(np.float32), rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    ref = reference(np, layer(in_channels=3, out_channels=4, input_size=(9, 9)), x32.astype(np.float64),
                    w32.astype(np.float64))
    y16 = convtune.conv(x32.astype(np.float16), w32.astype(np.float16), padding=1, runtime=rt)
    assert y16.dtype == np.float16
    ref16 = reference(np, layer(in_channels=3, out_channels=4, input_size=(9, 9)),
                      x32.astype(np.float16).astype(np.float64), w32.astype(np.float16).astype(np.float64))
    assert relative_error(np, y16, ref16) <= 2 ** -10
    xl, wl = precision.laid_out(np, x32, "channels_last"), precision.laid_out(np, w32, "channels_last")
    yl = convtune.conv(xl, wl, padding=1, runtime=rt)
    assert precision.layout_of(yl) == "channels_last" and relative_error(np, yl, ref) <= 1e-5
    problems = {p.problem.key() for p in rt._memo.values()}
    assert any(k.endswith(":channels_last") for k in problems) and any(":float16:" in k for k in problems)
    with pytest.raises(ValueError, match="dtypes float16 and float32"):
        convtune.conv(x32.astype(np.float16), w32, runtime=rt)
    with pytest.raises(ValueError, match="convtune runs float32 and float16 arrays; got float64"):
        convtune.conv(x32.astype(np.float64), w32.astype(np.float64), runtime=rt)


# -- the command line ------------------------------------------------------------------------------------------
def test_tune_show_and_explain_take_dtype_and_layout(tmp_path, fake_default_timer):
    net = tmp_path / "net.yaml"
    net.write_text("layers:\n  - {name: a, batch: 2, in_channels: 3, out_channels: 4, input: [8, 8], kernel: 5}\n")
    db = str(tmp_path / "plans.db")
    run = CliRunner().invoke
    done = run(main, ["tune", str(net), "--db", db, "--dtype", "bfloat16", "--layout", "channels_last",
                      "--passes", "fwd", "--backend", "numpy"])
    assert done.exit_code == 0, done.output
    shown = run(main, ["show", "--db", db, "--dtype", "bfloat16", "--layout", "channels_last"])
    assert "bfloat16" in shown.output and "channels_last" in shown.output and "1 plan(s)" in shown.output
    assert "no plans match" in run(main, ["show", "--db", db, "--dtype", "float16"]).output
    explained = run(main, ["explain", "a", "--net", str(net), "--db", db, "--dtype", "bfloat16", "--layout",
                           "channels_last", "--pass", "fwd"])
    assert explained.exit_code == 0 and "bfloat16 channels_last" in explained.output and "winner" in explained.output
    bad = run(main, ["tune", str(net), "--db", db, "--dtype", "float64"])
    assert bad.exit_code != 0 and "Invalid value for '--dtype'" in bad.output


# -- PyTorch ----------------------------------------------------------------------------------------------------
def test_pytorch_layers_run_the_plan_of_their_dtype_and_layout(fake_default_timer):
    torch = pytest.importorskip("torch")
    import convtune.torch as ct
    rt = convtune.Runtime(planner_options={"strategies": ["im2col", "fft"]})
    torch.manual_seed(0)
    layer_ = ct.Conv2d(3, 8, 5, padding=2, runtime=rt)
    plain = torch.nn.Conv2d(3, 8, 5, padding=2)
    plain.load_state_dict(layer_.state_dict())
    x = torch.randn(2, 3, 12, 12)
    for dtype, fmt in itertools.product((torch.float16, torch.bfloat16), (torch.contiguous_format,
                                                                          torch.channels_last)):
        lay, pl = layer_.to(dtype=dtype, memory_format=fmt), plain.to(dtype=dtype, memory_format=fmt)
        xx = x.to(dtype=dtype, memory_format=fmt).requires_grad_()
        xp = xx.detach().clone().requires_grad_()
        y, expected = lay(xx), pl(xp)
        assert y.dtype == dtype and y.is_contiguous(memory_format=fmt)
        bound = 4 * precision.UNIT_ROUNDOFF[str(dtype).split(".")[1]]  # both rounded: two roundings apart at most
        assert float((y - expected).detach().float().norm() / expected.detach().float().norm()) <= bound, (dtype, fmt)
        y.float().square().sum().backward()
        expected.float().square().sum().backward()
        assert float((xx.grad.float() - xp.grad.float()).norm() / xp.grad.float().norm()) <= 4 * bound
    kinds = {(r.problem.dtype, r.problem.layout) for r in rt.layer_memo("torch").values()}
    assert kinds == {("float16", "channels_first"), ("float16", "channels_last"), ("bfloat16", "channels_first"),
                     ("bfloat16", "channels_last")}
    labels = {label for r in rt.layer_memo("torch").values() for label in r.labels().values()}
    assert labels and all(label.startswith(("im2col", "fft")) for label in labels)  # convtune's own, converted
    # by PyTorch: the float32 channels-first executor on float32 copies, not the array form's conversions
    executors = [e for r in rt.layer_memo("torch").values() for e in (r.fwd_exec, r.dgrad_exec, r.wgrad_exec)]
    assert executors and all(e.float32_run is not None for e in executors)


def test_tune_ahead_under_autocast_tunes_the_autocast_dtype(fake_default_timer):
    torch = pytest.importorskip("torch")
    import convtune.torch as ct
    rt = convtune.Runtime()
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3, padding=1))
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        report = ct.tune(model, x, runtime=rt, progress=False)
    assert report.tuned == len(report.problems) == 5 and not report.failed
    assert {(p.dtype, p.layout) for p, _names in report.problems} == {("bfloat16", "channels_last")}
    ct.patch(model, runtime=rt)
    tuned = rt.tuned
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x).float().sum().backward()
    assert rt.tuned == tuned  # training finds every plan tuned ahead


# -- the GPU (scripts/gpu-tests.sh runs these on a GPU machine) -----------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout", KINDS)
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_every_gpu_strategy_runs_half_and_channels_last_within_the_bound(dtype, layout, pass_):
    """The candidates of every strategy on CuPy arrays, each within the bound and in the problem's
    layout: every candidate for AMP's case (bfloat16 channels_last), each strategy's first for the other
    kinds (the conversions around a strategy's float32 executor are one code path for all its
    candidates; PyTorch's candidate runs natively)."""
    import cupy as cp
    from convtune.backend import get_backend
    from convtune.strategies import all_strategies
    backend = get_backend("cupy")
    every = (dtype, layout) == ("bfloat16", "channels_last")
    checked = set()
    for kw in (dict(kernel_size=3, padding=1), dict(kernel_size=9, padding=4),
               dict(kernel_size=7, padding=3, in_channels=6, out_channels=6, groups=6)):
        p = layer(dtype=dtype, layout=layout, pass_=pass_, input_size=(20, 24), **kw)
        a, b = random_operands(backend, p, 3)
        assert precision.layout_of(a) == layout  # (an activation: x, or dy for dgrad; a weight of one channel
        # per group reads as either layout)
        ref = reference(cp, p, a.astype(cp.float64), b.astype(cp.float64))
        for strategy in all_strategies(selectable_only=True):
            if strategy.supports(p, backend) is not None:
                continue
            # (cuDNN lists the plans its rules prune without building them, and bars some of them only when built)
            configs = [c for c in strategy.candidates(p, backend)
                       if strategy.name != "cudnn" or strategy.pruned(p, c, backend) is None]
            for config in configs if every else configs[:1]:
                out = precision.empty_result(cp, p, fill=cp.nan)
                strategy.executor(p, config, backend)(a, b, out)
                err = relative_error(cp, out, ref)
                assert err <= p.tolerance, f"{strategy.describe(config)}: error {err:.3g} on {p.describe()}"
                checked.add(strategy.name)
    assert {"torch", "im2col", "fft", "cudnn"} <= checked, checked


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout", [k for k in KINDS if k != ("float32", "channels_first")])
def test_the_gpus_conversions_are_one_kernel_each_and_round_as_the_cpu(dtype, layout):
    """bounded's GPU forms: the result rounded and laid out in one kernel (the array form) and the timed form's
    widening and narrowing of the dtype's own memory give what round_to and laid_out give, ties and odd
    sizes included."""
    import cupy as cp
    p = layer(dtype=dtype, layout=layout, in_channels=3, out_channels=5, input_size=(7, 9))
    rng = np.random.default_rng(1)
    exact = rng.standard_normal(p.y_shape).astype(np.float32)
    exact.flat[:4] = [1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -11]  # ties of bfloat16 and float16
    expected = precision.laid_out(np, precision.round_to(np, exact, dtype), layout)

    def fake_run(a, b, out=None):  # the float32 executor: hands back the exact result
        result = cp.asarray(exact)
        if out is None:
            return result
        out[...] = result
        return out
    call = precision.bounded(fake_run, p, cp)
    a, b = (cp.asarray(precision.stored(np, rng.standard_normal(s).astype(np.float32), p)) for s in p.operand_shapes)
    got = call(a, b)
    assert precision.layout_of(got) == layout
    assert str(got.dtype) == precision.STORAGE[dtype] and np.array_equal(cp.asnumpy(got), expected)
    out = precision.empty_result(cp, p, fill=cp.nan)
    assert call(a, b, out) is out and np.array_equal(cp.asnumpy(out), expected)
    memory = call.timed(a, b, None)()  # the dtype's own memory (bfloat16: 16 bits) as a logical view
    widened = cp.empty(p.y_shape, cp.float32)
    precision._widening_kernel(cp, dtype)(memory, widened)
    assert np.array_equal(cp.asnumpy(widened), expected.astype(np.float32))


@pytest.mark.gpu
def test_pytorch_layers_on_cuda_run_bfloat16_channels_last_plans():
    torch = pytest.importorskip("torch")
    import convtune.torch as ct
    rt = convtune.Runtime()
    layer_ = ct.Conv2d(8, 8, 7, padding=3, runtime=rt).cuda().to(memory_format=torch.channels_last)
    plain = torch.nn.Conv2d(8, 8, 7, padding=3).cuda().to(memory_format=torch.channels_last)
    plain.load_state_dict(layer_.state_dict())
    x = torch.randn(4, 8, 32, 32, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y, expected = layer_(x), plain(x)
    assert y.dtype == torch.bfloat16 and y.is_contiguous(memory_format=torch.channels_last)
    assert float((y - expected).float().norm() / expected.float().norm()) <= 4 * 2 ** -8
    (route,) = rt.layer_memo("torch").values()
    assert (route.problem.dtype, route.problem.layout) == ("bfloat16", "channels_last")
