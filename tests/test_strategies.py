"""Every candidate of every registered strategy, every pass, every shape, against float64."""

import math
from dataclasses import replace

import pytest

from convtune.planner import random_operands, relative_error
from convtune.problem import PASSES
from convtune.strategies import all_strategies, get_strategy, register, unregister
from convtune.strategies.base import Strategy
from cases import CASES, problem

SELECTABLE = [s.name for s in all_strategies(selectable_only=True)]


@pytest.mark.parametrize("strategy_name", SELECTABLE)
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_every_candidate_matches_float64(backend, strategy_name, pass_, case):
    p = problem(case, pass_)
    strategy = get_strategy(strategy_name)
    reason = strategy.supports(p, backend)
    if reason is not None:
        pytest.skip(f"{strategy_name} does not support {case}: {reason}")
    xp = backend.xp
    a, b = random_operands(backend, p, seed=hash((case, pass_)) % 1000)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    configs = strategy.candidates(p, backend)
    assert configs, f"{strategy_name} supports {case} but lists no candidate"
    # (cuDNN lists the plans its rules prune without building them, and bars some of them only when built)
    for config in [c for c in configs if strategy_name != "cudnn" or strategy.pruned(p, c, backend) is None]:
        out = xp.full(p.result_shape, xp.nan, dtype=xp.float32)
        result = strategy.build(p, config, backend)(a, b, out)
        assert result is out
        err = relative_error(xp, out, ref)
        assert err <= 1e-5, f"{strategy.describe(config)} error {err:.3g} on {p.describe()}"
        fresh = strategy.build(p, config, backend)(a, b)
        assert type(fresh) is type(a) and fresh.shape == p.result_shape and fresh.dtype == xp.float32
        assert relative_error(xp, fresh, ref) <= 1e-5


def test_registry_rejects_duplicates_and_names_valid_strategies():
    with pytest.raises(ValueError, match="already registered"):
        @register
        class Again(Strategy):
            name = "fft"
    with pytest.raises(ValueError, match="registered strategies: .*fft.*im2col"):
        get_strategy("winograd")


def test_unregister_removes_a_strategy():
    @register
    class Temporary(Strategy):
        name = "temporary-test-strategy"
    unregister("temporary-test-strategy")
    assert "temporary-test-strategy" not in [s.name for s in all_strategies()]


def test_reference_is_never_selectable():
    assert "reference" not in SELECTABLE
    assert {"fft", "im2col"} <= set(SELECTABLE)


def test_config_round_trips_through_dict(backend):
    p = problem("2d-odd")
    for name in SELECTABLE:
        strategy = get_strategy(name)
        if strategy.supports(p, backend) is not None:
            continue
        for config in strategy.candidates(p, backend):
            assert strategy.config_type.from_dict(config.as_dict()) == config


def test_fft_rejects_too_small_sizes(backend):
    p = problem("2d-odd")
    fft = get_strategy("fft")
    config = fft.candidates(p, backend)[0]
    small = type(config)(sizes=(2, 2), product="gemm", chunk=1)
    with pytest.raises(ValueError, match="below the minimum"):
        fft.build(p, small, backend)


@pytest.mark.parametrize("name", ["im2col", "fft"])
def test_tf32_configs_only_in_tf32_mode(backend, name):
    strategy = get_strategy(name)
    p32, ptf = problem("2d-groups"), problem("2d-groups", math="tf32")
    assert not any(c.tf32 for c in strategy.candidates(p32, backend))
    tf32_configs = [c for c in strategy.candidates(ptf, backend) if c.tf32]
    assert tf32_configs
    assert all(c.product in ("gemm", "fgemm") for c in tf32_configs) if name == "fft" else True
    with pytest.raises(ValueError, match="only for math mode 'tf32'"):
        strategy.build(p32, tf32_configs[0], backend)
    a, b = random_operands(backend, ptf, seed=5)
    xp = backend.xp
    ref = get_strategy("reference").build(ptf, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    assert relative_error(xp, strategy.build(ptf, tf32_configs[0], backend)(a, b), ref) <= 1e-3


def test_boolean_fields_label_as_their_name_when_true():
    from convtune.strategies.im2col import Im2colConfig
    assert Im2colConfig(chunk=4).label() == "chunk=4"
    assert Im2colConfig(chunk=4, tf32=True).label() == "chunk=4,tf32"
    assert Im2colConfig.from_dict({"chunk": 4}) == Im2colConfig(chunk=4)  # records from before the field


@pytest.mark.parametrize("product", ["gemm", "fgemm"])
@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("case", ["1d-stride-pad", "2d-odd", "2d-groups", "2d-stride-pad-dil"])
def test_fft_batch_chunks_match_float64(backend, product, pass_, case):
    """One sample per chunk: the forward and backward-data chunks write disjoint slices of the
    output (2d-odd's input gradient is the whole inverse transform, written in place), and the filter
    gradient accumulates over the chunks (the registry test's batches are too small to get the
    chunked candidates)."""
    from convtune.strategies.fft import FftConfig
    from convtune.fft.sizes import minimal_sizes
    p = problem(case, pass_)
    xp = backend.xp
    a, b = random_operands(backend, p, seed=11)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    config = FftConfig(sizes=minimal_sizes(p), product=product, chunk=1)
    out = xp.full(p.result_shape, xp.nan, dtype=xp.float32)
    get_strategy("fft").build(p, config, backend)(a, b, out)
    assert relative_error(xp, out, ref) <= 1e-5


def test_fft_rejects_unknown_products_naming_the_valid_ones(backend):
    from convtune.strategies.fft import FftConfig
    p = problem("2d-odd")
    with pytest.raises(ValueError, match="acceptable: gemm, fgemm, pointwise"):
        get_strategy("fft").build(p, FftConfig(sizes=(9, 10), product="winograd"), backend)


def test_packed_product_is_a_gpu_candidate_only(backend):
    """The packed product is a CUDA kernel: a GPU candidate (each tested against float64 above),
    never a CPU one, and a clear error when asked for on the CPU."""
    from convtune.strategies.fft import FftConfig
    p = problem("2d-odd")
    fft = get_strategy("fft")
    packed = [c for c in fft.candidates(p, backend) if c.packed]
    assert (len(packed) > 0) == (backend.name == "cupy")
    if backend.name == "numpy":
        with pytest.raises(ValueError, match="GPU only"):
            fft.build(p, FftConfig(sizes=(9, 10), product="fgemm", packed=True), backend)
    with pytest.raises(ValueError, match="fgemm product only"):
        fft.build(p, FftConfig(sizes=(9, 10), product="gemm", packed=True), backend)


def test_own_transforms_are_gpu_candidates_at_64x64_only(backend):
    """convtune's own transforms: GPU candidates (each tested against float64 above) where the
    sizes are 64x64, never on the CPU, and clear errors elsewhere."""
    from convtune.strategies.fft import FftConfig
    p = problem("2d-fft64")
    fft = get_strategy("fft")
    own = [c for c in fft.candidates(p, backend) if c.own]
    assert (len(own) > 0) == (backend.name == "cupy")
    assert all(c.sizes == (64, 64) and c.product == "fgemm" and not c.fused for c in own)
    if backend.name == "numpy":
        with pytest.raises(ValueError, match="GPU only"):
            fft.build(p, FftConfig(sizes=(64, 64), product="fgemm", own=True), backend)
    else:
        with pytest.raises(ValueError, match="64x64 only, not 60x64"):
            fft.build(p, FftConfig(sizes=(60, 64), product="fgemm", own=True), backend)
        with pytest.raises(ValueError, match="replace cuFFT's"):
            fft.build(p, FftConfig(sizes=(64, 64), product="fgemm", fused=True, own=True), backend)
    with pytest.raises(ValueError, match="fgemm product only"):
        fft.build(p, FftConfig(sizes=(64, 64), product="gemm", own=True), backend)


def test_own_transform_plans_are_built_for_the_problem_itself_others_for_its_float32_form(monkeypatch):
    """The executor of a half-precision or channels_last problem: convtune's own transforms (not tiled, not
    polyphase) are built for the problem itself, with no conversions and no conversion workspace; every other
    configuration for its float32 channels-first form, between conversions (the builds stubbed: own transforms
    are GPU kernels)."""
    from types import SimpleNamespace
    import numpy as np
    from convtune.strategies.fft import FftConfig
    fft = get_strategy("fft")
    built = []

    def build(problem, config, backend):
        built.append(problem)
        return lambda a, b, out=None: out
    monkeypatch.setattr(fft, "build", build)
    be = SimpleNamespace(name="numpy", xp=np)
    p = problem("2d-fft64").replace(dtype="bfloat16", layout="channels_last")
    own = FftConfig(sizes=(64, 64), product="fgemm", chunk=2, packed=True, own=True)
    for config, itself in ((own, True), (replace(own, tiled=True), False), (replace(own, polyphase=True), False),
                           (FftConfig(sizes=(64, 64), product="fgemm", chunk=2, packed=True), False)):
        run = fft.executor(p, config, be)
        assert built[-1] == (p if itself else p.in_float32()), config.label()
        assert (run.float32 is not None) != itself and fft.reads(p, config) == itself
        if not (config.tiled or config.polyphase):  # (their workspaces are for problems they apply to)
            extra = 0 if itself else p.in_float32().min_bytes()
            assert fft.workspace(p, config) == fft.workspace_bytes(p, config) + extra
    assert fft.reads(p.in_float32()) and not fft.reads(p)


def test_tf32_mode_offers_the_packed_products_tf32_form_with_own_transforms():
    """In tf32 mode convtune's own transforms come with the packed product in float32 and in its TF32 form, and with
    cuBLAS's TF32 product; in fp32 mode with the float32 packed product only. Narrow variants are float32 (the
    narrow kernel has no TF32 form), one per packed configuration."""
    from types import SimpleNamespace
    from convtune.strategies.fft import narrow_variants, own_transform_configs
    gpu = SimpleNamespace(name="cupy", device_info=lambda: SimpleNamespace(compute_capability="9.0"))
    p = problem("2d-fft64")
    labels = sorted(c.label() for c in own_transform_configs(p, gpu, [(64, 64), (60, 64)], ("fgemm",), True))
    assert labels == sorted(["sizes=64x64,product=fgemm,chunk=2,packed,own",
                             "sizes=64x64,product=fgemm,chunk=2,tf32,packed,own",
                             "sizes=64x64,product=fgemm,chunk=2,tf32,own"]), labels
    fp32 = own_transform_configs(p, gpu, [(64, 64)], ("fgemm",), False)
    assert [c.label() for c in fp32] == ["sizes=64x64,product=fgemm,chunk=2,packed,own"]
    thin = narrow_variants(p, own_transform_configs(p, gpu, [(64, 64)], ("fgemm",), True))
    assert [c.label() for c in thin] == ["sizes=64x64,product=fgemm,chunk=2,packed,own,narrow"]


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", PASSES)
def test_own_transforms_with_tf32_products(pass_):
    """In tf32 mode the own transforms are also offered with cuBLAS's TF32 product (spectra in the
    kernels' frequency order, transposed to frequency-major): within the mode's tolerance."""
    from convtune.backend import get_backend
    backend = get_backend("cupy")
    p = problem("2d-fft64", pass_, math="tf32")
    fft = get_strategy("fft")
    configs = [c for c in fft.candidates(p, backend) if c.own]
    assert any(c.tf32 and not c.packed for c in configs) and any(c.packed for c in configs)
    xp = backend.xp
    a, b = random_operands(backend, p, seed=7)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    for config in configs:
        assert relative_error(xp, fft.build(p, config, backend)(a, b), ref) <= 1e-3, config.label()


def _gather_by_geometry(np, full, geometry, counts):
    """What the fused store callback computes: output q of an axis takes element r of the inverse
    transform where (r + offset) mod L == q * step and q < count."""
    out = np.full(full.shape[:2] + tuple(counts), np.nan)
    for r in np.ndindex(*full.shape[2:]):
        q = []
        for ri, (offset, step, count), L in zip(r, geometry, full.shape[2:]):
            t = (ri + offset) % L
            if t % step or t // step >= count:
                break
            q.append(t // step)
        else:
            out[(slice(None), slice(None)) + tuple(q)] = full[(slice(None), slice(None)) + r]
    return out


@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_gather_geometry_matches_the_slice_gathers(case):
    """The (offset, step, count) geometry the GPU's store callbacks get selects the same elements as
    the slice copies the other paths use, for every case and pass."""
    import numpy as np
    from convtune.fft.freqmajor import FreqMajorConv
    from convtune.fft.sizes import minimal_sizes
    from convtune.fft.placement import gather
    for pass_ in PASSES:
        p = problem(case, pass_)
        ex = FreqMajorConv(np, p, minimal_sizes(p), p.batch)
        geometry, blocks, counts, channels = {
            "fwd": (ex._fwd_geometry, ex._fwd_index, p.output_size, p.out_channels),
            "dgrad": (ex._dgrad_geometry, ex._dgrad_index, p.input_size, p.in_channels),
            "wgrad": (ex._wgrad_geometry, ex._wgrad_index, p.kernel_size, p.in_per_group)}[pass_]
        rows = p.out_channels if pass_ == "wgrad" else p.batch
        full = np.random.default_rng(3).standard_normal((rows, channels) + ex.sizes)
        expected = np.empty((rows, channels) + tuple(counts))
        gather(expected, full, blocks)
        np.testing.assert_array_equal(_gather_by_geometry(np, full, geometry, counts), expected)


def test_depthwise_window_kernels_take_large_kernels_on_small_planes():
    """Which depthwise kernels are offered, and why not, decided on shapes alone (no GPU needed): the
    window kernels for large kernels where a plane fits shared memory; FFT's territory otherwise."""
    from types import SimpleNamespace
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    gpu = SimpleNamespace(name="cupy")
    dw = get_strategy("depthwise")

    def layer(size, k, pad, c=512, **kw):
        return ConvProblem.make(batch=16, in_channels=c, out_channels=c, input_size=size, kernel_size=k,
                                padding=pad, groups=c, **kw)
    for pass_ in ("fwd", "dgrad", "wgrad"):
        p = layer((14, 14), 27, 13, pass_=pass_)  # RepLKNet stage 3
        assert dw.supports(p, gpu) is None
        assert [(c.variant, c.rows) for c in dw.candidates(p, gpu)] == [("window", 4), ("window", 8)]
        assert all(c.threads % 32 == 0 and c.threads <= 1024 for c in dw.candidates(p, gpu))
    small = dw.candidates(layer((56, 56), 7, 3), gpu)  # 49 taps: the window kernels join the tiled ones
    assert {c.variant for c in small} == {"window", "tiled", "simple"}
    assert {c.variant for c in dw.candidates(layer((56, 56), 5, 2), gpu)} == {"tiled", "simple"}
    assert "stride 1" in dw.supports(layer((14, 14), 27, 13, stride=2), gpu)
    assert "64" in dw.supports(layer((1, 4096), (1, 4096), (0, 4095), c=8), gpu)  # a long 1-D kernel: FFT's
    assert "48 KiB" in dw.supports(layer((224, 224), 31, 15, c=8), gpu)
    assert "padding" in dw.supports(layer((20, 20), 13, 13), gpu)  # more padding than the kernel's size - 1
    assert dw.supports(layer((14, 14), 27, 13), SimpleNamespace(name="numpy")).startswith("the direct depthwise")


def test_the_depthwise_heuristic_keeps_the_tiled_kernels_where_they_hold_the_filter():
    from types import SimpleNamespace
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    gpu, dw = SimpleNamespace(name="cupy"), get_strategy("depthwise")
    p = ConvProblem.make(batch=8, in_channels=96, out_channels=96, input_size=(56, 56), kernel_size=7, padding=3,
                         groups=96)
    assert dw.heuristic_config(p, gpu).variant == "tiled"
    big = ConvProblem.make(batch=8, in_channels=96, out_channels=96, input_size=(14, 14), kernel_size=27,
                           padding=13, groups=96)
    assert dw.heuristic_config(big, gpu).variant == "window"


def test_staged_configurations_over_48_kib_only_where_the_device_gives_and_the_tile_needs_them(monkeypatch):
    """The staged configurations of 100 KiB a block: not on a device that gives a block 48 KiB (or cannot say), and
    on one that gives 227 KiB only where their tile needs more than 48 (ConvNeXt-T's 56x56 layers: all three, every
    pass; 28x28: the 16-row tile forward, the 8-pair filter gradient's; 14x14: none, its tiles fit 48 KiB). A device
    of less than 100 KiB a block is offered those whose tile it holds (56x56: tiles of 60 to 100 KiB)."""
    from types import SimpleNamespace
    from convtune.problem import ConvProblem
    from convtune.strategies import depthwise, get_strategy
    dw, shared_room = get_strategy("depthwise"), depthwise.shared_room

    def opted(side, c, pass_, room):
        monkeypatch.setattr(depthwise, "shared_room", lambda backend: room)
        p = ConvProblem.make(batch=32, in_channels=c, out_channels=c, input_size=(side, side), kernel_size=7,
                             padding=3, groups=c, dtype="bfloat16", layout="channels_last", pass_=pass_)
        configs = dw.candidates(p, SimpleNamespace(name="cupy"))
        return sorted(cfg.variant for cfg in configs if cfg.variant.endswith("m100"))
    for pass_ in ("fwd", "dgrad", "wgrad"):
        assert opted(56, 96, pass_, 227 * 1024) == ["nhwc-st16pm100", "nhwc-st8pm100", "nhwc-st8pm100"]
        assert opted(56, 96, pass_, 48 * 1024) == []
        assert opted(14, 384, pass_, 227 * 1024) == []
    assert opted(56, 96, "fwd", 99 * 1024) == ["nhwc-st16pm100", "nhwc-st8pm100", "nhwc-st8pm100"]
    assert opted(56, 96, "wgrad", 99 * 1024) == ["nhwc-st16pm100", "nhwc-st8pm100"]  # (16 rows: 100 KiB)
    assert opted(56, 96, "fwd", 64 * 1024) == ["nhwc-st8pm100"]  # (8 rows: 60 KiB)
    assert opted(28, 192, "fwd", 227 * 1024) == ["nhwc-st16pm100", "nhwc-st8pm100"]
    assert opted(28, 192, "wgrad", 227 * 1024) == ["nhwc-st16pm100", "nhwc-st8pm100"]
    assert shared_room(SimpleNamespace(name="cupy")) == shared_room(None) == 48 * 1024


def test_channels_last_depthwise_problems_get_the_nhwc_kernels_first():
    """A channels-last depthwise problem, in any dtype, is offered the nhwc kernels first (vectorized for the forward
    and backward-data passes at stride and dilation 1, tiled, then plain: they read its
    operands as they lie: no conversions, no conversion workspace), then the channels-first kernels between
    conversions; kernels wider than 81 are not theirs, and large kernels on planes too big for the window
    kernels are supported through them. A channels-first problem gets no nhwc kernel."""
    from types import SimpleNamespace
    from convtune.direct import depthwise_nhwc
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    from convtune.strategies.depthwise import NHWC_STAGED_CONFIGS
    gpu, dw = SimpleNamespace(name="cupy"), get_strategy("depthwise")

    def layer(size, k, pad, c=96, **kw):
        return ConvProblem.make(batch=8, in_channels=c, out_channels=c, input_size=size, kernel_size=k,
                                padding=pad, groups=c, **kw)
    for dtype in ("float32", "bfloat16", "float16"):
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = layer((56, 56), 7, 3, dtype=dtype, layout="channels_last", pass_=pass_)
            configs = dw.candidates(p, gpu)
            vec = [] if pass_ == "wgrad" else [("nhwc-vec4", 4, 256), ("nhwc-vec2", 4, 256), ("nhwc-vec2", 4, 128),
                                               ("nhwc-vec4", 4, 128)]
            staged = [(f"nhwc-st{pairs}" + ("p" if pipe else ""), rows,
                       depthwise_nhwc.staged_tile(p, pairs, rows, segw, pipe).threads)
                      for pairs, rows, segw, pipe, kib in NHWC_STAGED_CONFIGS
                      if kib == 48 and depthwise_nhwc.staged_reason(p, pairs, rows, segw, pipe) is None]
            assert staged or dtype == "float32"  # (16-bit: each of them; float32: those whose tile fits)
            nhwc = vec + staged + [("nhwc-tiled", 4, 256), ("nhwc-tiled", 8, 256), ("nhwc", 4, 256),
                                   ("nhwc", 8, 256), ("nhwc", 2, 256)]
            assert [(c.variant, c.rows, c.threads) for c in configs[:len(nhwc)]] == nhwc
            assert {c.variant for c in configs[len(nhwc):]} == {"tiled", "window", "simple"}
            assert dw.heuristic_config(p, gpu).variant.startswith("nhwc")
            half_wgrad = pass_ == "wgrad" and dtype != "float32"
            assert dw.workspace(p, configs[0]) == (4 * 96 * 49 if half_wgrad else 0)
            # the channels-first kernels between conversions: the conversions' float32 copies
            assert dw.workspace(p, configs[len(nhwc)]) == p.in_float32().min_bytes()
            assert depthwise_nhwc.tile_shape(p, 4) == ((4, 16) if pass_ == "wgrad" else (8, 16))  # (dy's tile too)
    assert not any(c.variant == "nhwc" for c in dw.candidates(layer((56, 56), 7, 3, dtype="bfloat16"), gpu))
    # the vectorized kernel: stride and dilation 1, channels a multiple of its vector, not the filter gradient
    cl = layer((56, 56), 7, 3, layout="channels_last")
    assert depthwise_nhwc.vec_reason(cl, 4) is None and depthwise_nhwc.vec_reason(cl.replace(pass_="dgrad"), 2) is None
    assert "multiple" in depthwise_nhwc.vec_reason(layer((56, 56), 7, 3, c=6, layout="channels_last"), 4)
    assert depthwise_nhwc.vec_reason(layer((56, 56), 7, 3, c=6, layout="channels_last"), 2) is None
    assert "stride and dilation" in depthwise_nhwc.vec_reason(layer((56, 56), 3, 1, stride=2, layout="channels_last"), 2)
    assert "forward and backward-data" in depthwise_nhwc.vec_reason(cl.replace(pass_="wgrad"), 2)
    assert "channels-last" in depthwise_nhwc.vec_reason(layer((56, 56), 7, 3), 2)
    big = layer((224, 224), 31, 15, c=8, layout="channels_last")  # too big a plane for the window kernels
    assert dw.supports(big, gpu) is None and {c.variant for c in dw.candidates(big, gpu)} == {"nhwc"}
    assert "81 taps" in depthwise_nhwc.tiled_reason(big, 4)
    assert "1-D" in depthwise_nhwc.tiled_reason(ConvProblem.make(batch=2, in_channels=8, out_channels=8,
                                                                  input_size=(300,), kernel_size=31, padding=15,
                                                                  groups=8, pass_="wgrad", layout="channels_last"), 4)
    assert "stride 1" in depthwise_nhwc.tiled_reason(layer((56, 56), 3, 1, stride=2, layout="channels_last"), 4)
    assert depthwise_nhwc.row_group(big) == 2  # 62 of the filter gradient's sums per thread, in registers
    wide = layer((1, 4096), (1, 101), (0, 50), c=8, layout="channels_last")
    assert "wider than 81" in depthwise_nhwc.reason(wide) and "64" in dw.supports(wide, gpu)
    cl3 = ConvProblem.make(batch=2, in_channels=4, out_channels=4, input_size=(6, 6, 6), kernel_size=3, groups=4,
                           layout="channels_last")  # the 3-D kernels, between conversions
    assert "1-D and 2-D" in depthwise_nhwc.reason(cl3) and dw.supports(cl3, gpu) is None
    assert [c.variant for c in dw.candidates(cl3, gpu)] == ["tiled", "tiled"]
    assert dw.workspace(cl3, dw.candidates(cl3, gpu)[0]) == cl3.in_float32().min_bytes()


def test_channels_first_half_depthwise_problems_run_their_kernels_without_conversions():
    """A 1-D, 2-D or 3-D channels-first depthwise problem in bfloat16 or float16 runs the channels-first kernels on its
    own memory (no conversion workspace; a filter gradient's float32 sums instead); a channels-last one on those
    kernels (a 3-D one on any) goes through conversions."""
    from types import SimpleNamespace
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    gpu, dw = SimpleNamespace(name="cupy"), get_strategy("depthwise")

    def layer(size, k, pad, c=16, **kw):
        return ConvProblem.make(batch=4, in_channels=c, out_channels=c, input_size=size, kernel_size=k,
                                padding=pad, groups=c, **kw)
    for dtype in ("bfloat16", "float16"):
        for size, k, pad in (((56, 56), 7, 3), ((14, 14), 27, 13), ((300,), 9, 4)):
            for pass_ in ("fwd", "dgrad", "wgrad"):
                p = layer(size, k, pad, dtype=dtype, pass_=pass_)
                for config in dw.candidates(p, gpu):
                    assert dw.reads(p, config), config.label()
                    sums = 4 * 16 * math.prod(p.kernel_size) if pass_ == "wgrad" else 0
                    assert dw.workspace(p, config) == sums, (config.label(), pass_)
        for pass_ in ("fwd", "dgrad", "wgrad"):
            cube = layer((6, 6, 6), 3, 1, dtype=dtype, pass_=pass_)
            assert all(dw.reads(cube, c) for c in dw.candidates(cube, gpu))
            sums = 4 * 16 * 27 if pass_ == "wgrad" else 0
            assert dw.workspace(cube, dw.candidates(cube, gpu)[0]) == sums
        cube_last = layer((6, 6, 6), 3, 1, dtype=dtype, layout="channels_last")
        assert not any(dw.reads(cube_last, c) for c in dw.candidates(cube_last, gpu))
        assert dw.workspace(cube_last, dw.candidates(cube_last, gpu)[0]) == cube_last.in_float32().min_bytes()
        last = layer((56, 56), 7, 3, dtype=dtype, layout="channels_last")
        assert [dw.reads(last, c) for c in dw.candidates(last, gpu)] == [c.variant.startswith("nhwc")
                                                                          for c in dw.candidates(last, gpu)]
    assert dw.version >= 8 and dw.changes[7](layer((56, 56), 7, 3, dtype="bfloat16"))
    assert not dw.changes[7](layer((56, 56), 7, 3)) and not dw.changes[7](layer((6, 6, 6), 3, 1, dtype="float16"))
    # version 8 (half precision in the 3-D kernels) re-tunes half-precision 3-D depthwise plans only
    assert dw.changes[8](layer((6, 6, 6), 3, 1, dtype="float16"))
    assert not dw.changes[8](layer((6, 6, 6), 3, 1)) and not dw.changes[8](layer((56, 56), 7, 3, dtype="bfloat16"))
    # version 9 (the launches replayed from CUDA graphs) re-tunes nothing: the kernels and their times are the same
    assert not any(dw.changes[9](layer(*shape, dtype=dtype, layout=layout)) for shape in (((56, 56), 7, 3),
                   ((6, 6, 6), 3, 1)) for dtype in ("float32", "bfloat16") for layout in ("channels_first",
                                                                                        "channels_last"))


def test_3d_depthwise_problems_get_the_3d_tiled_kernels():
    """A 3-D depthwise problem is offered the 3-D tiled kernels (8 and 4 rows per thread, warps to cover the
    output's height), each pass in its forward form (backward-data: dy in, padding dil*(k-1) - pad, which may
    be negative); what they cannot run says why; the version change re-tunes 3-D depthwise plans only."""
    from types import SimpleNamespace
    from convtune.direct import depthwise3d
    from convtune.problem import ConvProblem
    from convtune.strategies import get_strategy
    gpu, dw = SimpleNamespace(name="cupy"), get_strategy("depthwise")

    def layer(size, k, pad, c=48, **kw):
        return ConvProblem.make(batch=2, in_channels=c, out_channels=c, input_size=size, kernel_size=k,
                                padding=pad, groups=c, **kw)
    for pass_ in ("fwd", "dgrad", "wgrad"):
        p = layer((48, 48, 48), 7, 3, pass_=pass_)  # 3D UX-Net's first stage
        assert dw.supports(p, gpu) is None
        configs = dw.candidates(p, gpu)
        assert [(c.variant, c.rows, c.threads) for c in configs] == [("tiled", 8, 192), ("tiled", 4, 256)]
        assert depthwise3d.forward_form(p)[2] == (3, 3, 3)
        floats = (8 * 6 + 6) * (32 + 6) + (8 * 6 * 32 + 6 * 49 if pass_ == "wgrad" else 343)
        assert depthwise3d.smem_bytes(p, 8, 6) == 4 * floats
    odd = layer((5, 9, 40), (3, 5, 3), (4, 1, 0), dilation=(2, 1, 3), pass_="dgrad")
    assert depthwise3d.forward_form(odd) == ((9, 7, 34), (5, 9, 40), (0, 3, 6))
    assert depthwise3d.forward_form(layer((5, 9, 40), 3, 2, pass_="dgrad"))[2] == (0, 0, 0)
    assert depthwise3d.warps(odd, 8) == 2 and depthwise3d.warps(odd, 4) == 3
    assert "stride 1" in dw.supports(layer((16, 16, 16), 3, 1, stride=2), gpu)
    assert "11x11 taps is over 81" in dw.supports(layer((16, 16, 16), (3, 11, 11), 1), gpu)
    assert "48 KiB" in dw.supports(layer((16, 64, 64), (3, 9, 9), (1, 48, 48), dilation=(1, 12, 12)), gpu)
    dense = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(8, 8, 8), kernel_size=3)
    assert "not a depthwise" in dw.supports(dense, gpu)
    assert dw.changed_since(5, layer((8, 8, 8), 3, 1)) and not dw.changed_since(5, layer((8, 8), 3, 1))


def test_strategies_say_which_plans_a_cuda_graph_records():
    """Kernel launches and cuFFT work record in a CUDA graph; CuPy refuses cuBLAS calls while capturing, so
    plans that call it (im2col, the FFT's GEMM products) and plans not known to record (cuDNN's) say no."""
    from types import SimpleNamespace
    from convtune.backend import get_backend
    from convtune.problem import ConvProblem
    from convtune.roundtrip import RoundTrip, TripConfig
    from convtune.strategies.fft import FftConfig
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=4, input_size=(12, 12), kernel_size=5, padding=2,
                         groups=4)
    fft = get_strategy("fft")
    assert fft.recordable(p, FftConfig(sizes=(16, 16), product="pointwise"))
    assert not fft.recordable(p, FftConfig(sizes=(16, 16), product="gemm"))
    assert not fft.recordable(p, FftConfig(sizes=(16, 16), product="fgemm", packed=True))
    dw = get_strategy("depthwise")
    assert dw.recordable(p, dw.candidates(p, get_backend("numpy"))[0])
    # (a channels-first kernel between conversions does not say so: one failed inside a capture on the GPU)
    half, gpu = p.replace(dtype="bfloat16", layout="channels_last"), SimpleNamespace(name="cupy")
    assert {dw.recordable(half, c) for c in dw.candidates(half, gpu) if not c.variant.startswith("nhwc")} == {False}
    assert {dw.recordable(half, c) for c in dw.candidates(half, gpu) if c.variant.startswith("nhwc")} == {True}
    assert not get_strategy("im2col").recordable(p, get_strategy("im2col").candidates(p, get_backend("numpy"))[0])
    assert not get_strategy("cudnn").recordable(p, None)
    assert RoundTrip(p, TripConfig(sizes=(16, 16), product="pointwise"), "numpy").recordable
    assert not RoundTrip(p, TripConfig(sizes=(16, 16)), "numpy").recordable


def test_gemm_precision_sets_only_what_differs_and_puts_it_back(monkeypatch):
    """The TF32 switches of CuPy's matmul and cuBLAS's handle for a block: set where they differ from what the plan
    wants and put back on exit (an exception too); left alone where they already are what it wants (no cuBLAS calls
    on a cached plan's every pass)."""
    from types import SimpleNamespace
    from convtune import backend
    calls, state = [], {"type": 1, "mode": 0}

    def set_type(_, value):
        calls.append(("type", value))
        state["type"] = value

    def set_mode(_, value):
        calls.append(("mode", value))
        state["mode"] = value
    linalg = SimpleNamespace(get_compute_type=lambda _: state["type"], set_compute_type=set_type)
    cublas = SimpleNamespace(getMathMode=lambda _: state["mode"], setMathMode=set_mode)
    monkeypatch.setattr(backend, "_gemm_state_modules", lambda: (linalg, cublas, "float32"))
    cupy = SimpleNamespace(__name__="cupy", cuda=SimpleNamespace(device=SimpleNamespace(get_cublas_handle=lambda: 7)))
    with backend.gemm_precision(cupy, tf32=False):
        assert state == {"type": 1, "mode": 0}
    assert calls == []  # (strict fp32 is the state already)
    with backend.gemm_precision(cupy, tf32=True):
        assert state == {"type": 7, "mode": 3}
        with backend.gemm_precision(cupy, tf32=False):
            assert state == {"type": 1, "mode": 0}
        assert state == {"type": 7, "mode": 3}
    assert state == {"type": 1, "mode": 0}
    with pytest.raises(RuntimeError):
        with backend.gemm_precision(cupy, tf32=True):
            raise RuntimeError("a failing product")
    assert state == {"type": 1, "mode": 0}
    state.update(type=7, mode=0)  # (CUPY_TF32=1 set CuPy's type, not the handle's mode)
    calls.clear()
    with backend.gemm_precision(cupy, tf32=False):
        assert state == {"type": 1, "mode": 0}
    assert calls == [("type", 1), ("type", 7)] and state == {"type": 7, "mode": 0}


def test_cublas_scalars_are_made_once_and_stay_at_their_address():
    """cuBLAS reads alpha and beta from host memory: each value's complex64 is made once per executor and its
    address handed out on every call (no ctypes object made on the hot path), the memory holding the value."""
    import ctypes
    from types import SimpleNamespace
    from convtune.fft.arrayops import CupyOps
    ops = SimpleNamespace(_scalars={})
    one, zero = CupyOps._scalar(ops, 1.0), CupyOps._scalar(ops, 0.0)
    assert CupyOps._scalar(ops, 1.0) == one and one != zero and len(ops._scalars) == 2
    assert tuple((ctypes.c_float * 2).from_address(one)) == (1.0, 0.0)
    assert tuple((ctypes.c_float * 2).from_address(zero)) == (0.0, 0.0)


def test_an_fft_configuration_is_four_choices_and_an_invalid_combination_cannot_be_made():
    from convtune.strategies.fft import FftConfig, Placement, Product, SpectrumLayout, Transform
    own = FftConfig(sizes=(64, 64), product="fgemm", packed=True, own=True, narrow=True, polyphase=True)
    assert (own.product_kind, own.transform, own.layout, own.placement) == \
        (Product.NARROW, Transform.OWN, SpectrumLayout.LIBRARY, Placement.POLYPHASE)
    strided = FftConfig(sizes=(35, 35), product="fgemm", strided=True, tiled=True)
    assert (strided.product_kind, strided.transform, strided.layout, strided.placement) == \
        (Product.CUBLAS_GEMM, Transform.LIBRARY, SpectrumLayout.STRIDED, Placement.TILED)
    assert FftConfig(sizes=(9,), product="pointwise").product_kind is Product.POINTWISE
    assert FftConfig.from_label(own.label()) == own  # the stored form is unchanged
    for bad, message in ((dict(product="fft"), "acceptable: gemm, fgemm, pointwise"),
                         (dict(product="pointwise", tf32=True), "TF32 applies"),
                         (dict(product="gemm", packed=True), "fgemm product only"),
                         (dict(product="fgemm", narrow=True), "packed layout"),
                         (dict(product="fgemm", strided=True, packed=True), "not the strided one"),
                         (dict(product="fgemm", strided=True, fused=True), "not the strided one"),
                         (dict(product="fgemm", own=True, fused=True), "replace cuFFT's")):
        with pytest.raises(ValueError, match=message):
            FftConfig(sizes=(64, 64), **bad)
