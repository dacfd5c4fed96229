"""Round trips with kept spectra: results against float64, kept-state rules, and the tuning verdict."""

import numpy
import pytest

from cases import CASES, problem
from conftest import FakeTimer
from convtune.fft import sizes as fft_sizes
from convtune.planner import random_operands, relative_error
from convtune.roundtrip import (RoundTrip, TripConfig, TripDecision, held_bytes, load_trip, trip_candidates, tune_round_trip,
                                unsupported_reason)
from convtune.strategies import get_strategy
from convtune.text import human_bytes

SUPPORTED = [name for name in CASES if unsupported_reason(problem(name)) is None]


def _references(backend, p, x, w, dy):
    xp = backend.xp
    ref = get_strategy("reference")
    return [ref.build(p.for_pass(q), None, backend)(a.astype(xp.float64), b.astype(xp.float64))
            for q, (a, b) in (("fwd", (x, w)), ("dgrad", (dy, w)), ("wgrad", (x, dy)))]


def _operands(backend, p):
    x, w = random_operands(backend, p, 3)
    (dy, _w) = random_operands(backend, p.for_pass("dgrad"), 4)
    return x, w, dy


@pytest.mark.parametrize("order", ["dgrad-first", "wgrad-first"])
@pytest.mark.parametrize("name", SUPPORTED)
def test_round_trip_matches_float64(backend, name, order):
    p = problem(name)
    x, w, dy = _operands(backend, p)
    refs = _references(backend, p, x, w, dy)
    for config in trip_candidates(p, backend):
        trip = RoundTrip(p, config, backend)
        y = trip.forward(x, w)
        assert trip.holding
        if order == "dgrad-first":
            dx = trip.backward_data(dy)
            dw = trip.backward_filter(dy)
        else:
            dw = trip.backward_filter(dy)
            dx = trip.backward_data(dy)
        assert not trip.holding  # both backward passes ran: nothing kept
        for out, ref, q in zip((y, dx, dw), refs, ("fwd", "dgrad", "wgrad")):
            err = relative_error(backend.xp, out, ref)
            assert err <= p.tolerance, f"{config.label()} {q}: error {err:.2g}"


def test_second_round_trip_uses_new_operands(backend):
    """Kept spectra belong to one forward pass: the next forward and a new dy replace them."""
    p = problem("2d-large-kernel")
    trip = RoundTrip(p, trip_candidates(p, backend)[0], backend)
    first = _operands(backend, p)
    trip.forward(*first[:2])
    trip.backward_data(first[2])
    x, w, dy = (a * 2 + 1 for a in _operands(backend, p))
    refs = _references(backend, p, x, w, dy)
    outs = trip(x, w, dy)  # forward() drops the half-used first round trip
    for out, ref in zip(outs, refs):
        assert relative_error(backend.xp, out, ref) <= p.tolerance
    # a different dy in the second backward pass is transformed, not confused with the kept one
    trip.forward(x, w)
    trip.backward_data(dy)
    dy2 = dy * -3 + 0.5
    ref_dw = _references(backend, p, x, w, dy2)[2]
    assert relative_error(backend.xp, trip.backward_filter(dy2), ref_dw) <= p.tolerance


def test_backward_needs_forward_and_runs_once():
    p = problem("2d-odd")
    trip = RoundTrip(p, TripConfig(sizes=fft_sizes.minimal_sizes(p)), "numpy")
    x, w, dy = _operands(trip.backend, p)
    with pytest.raises(RuntimeError, match="needs a forward"):
        trip.backward_data(dy)
    trip.forward(x, w)
    trip.backward_filter(dy)
    with pytest.raises(RuntimeError, match="runs once per forward pass"):
        trip.backward_filter(dy)
    trip.release()
    assert not trip.holding
    with pytest.raises(RuntimeError, match="needs a forward"):
        trip.backward_data(dy)


def test_bad_inputs_say_what_is_wrong():
    p = problem("2d-odd")
    with pytest.raises(ValueError, match="below the minimum"):
        RoundTrip(p, TripConfig(sizes=(2, 2)), "numpy")
    with pytest.raises(ValueError, match="groups"):
        RoundTrip(problem("2d-depthwise", groups=40, in_channels=40, out_channels=40),
                  TripConfig(sizes=(16, 16)), "numpy")
    with pytest.raises(ValueError, match="math='tf32'"):
        RoundTrip(p, TripConfig(sizes=fft_sizes.minimal_sizes(p), tf32=True), "numpy")
    trip = RoundTrip(p, TripConfig(sizes=fft_sizes.minimal_sizes(p)), "numpy")
    x, w, _dy = _operands(trip.backend, p)
    with pytest.raises(ValueError, match="x has shape"):
        trip.forward(x[:1], w)
    with pytest.raises(ValueError, match="float32"):
        trip.forward(x.astype("float64"), w)


def test_held_bytes_counts_three_spectra():
    p = problem("2d-large-kernel")  # n=2, C=3, K=4, 16x16 input, 9x9 kernel
    F = 24 * 13
    assert held_bytes(p, (24, 24)) == 8 * F * (2 * 3 + 4 * 3 + 2 * 4)


def test_tuning_decides_whether_keeping_pays():
    p = problem("2d-large-kernel")
    # a fake timer: the round trip takes 1.0 s per run; per-pass plans of 0.5 s in all beat it, 5 s do not
    slow = tune_round_trip(p, "numpy", 0.5, ("a", "b", "c"), timer=FakeTimer(default=1.0))
    assert slow.winner is not None and slow.winner.status == "winner" and not slow.pays
    assert "per-pass plans are" in slow.reason
    fast = tune_round_trip(p, "numpy", 5.0, ("a", "b", "c"), timer=FakeTimer(default=1.0))
    assert fast.pays and fast.config == TripConfig.from_dict(fast.winner.config)
    assert all(o.error is not None and o.error <= p.tolerance for o in fast.outcomes if o.status in ("ok", "winner"))
    unknown = tune_round_trip(p, "numpy", None, timer=FakeTimer(default=1.0))
    assert not unknown.pays
    # the decision survives its dict form (how the cache stores it)
    again = TripDecision.from_dict(fast.as_dict())
    held = human_bytes(held_bytes(p, fast.config.sizes))
    assert again == fast and f"keeps spectra, {held} from forward to backward" in again.describe()


def test_tuning_records_every_candidate():
    p = problem("2d-large-kernel")
    tight = tune_round_trip(p, "numpy", 1.0, timer=FakeTimer(), keep_limit=100)
    assert tight.winner is None and not tight.pays
    assert {o.status for o in tight.outcomes} == {"over_budget"}
    assert all("over the limit 100 B" in o.reason for o in tight.outcomes)
    # a depthwise layer (more groups than the frequency-major GEMMs take): round trips with the pointwise product
    p_dw = problem("2d-depthwise", in_channels=40, out_channels=40, groups=40)
    depthwise = tune_round_trip(p_dw, "numpy", 1.0, timer=FakeTimer(default=0.5))
    assert depthwise.pays and depthwise.config.product == "pointwise"
    assert {o.label.endswith(",pointwise]") for o in depthwise.outcomes} == {True}
    assert TripDecision.from_dict(depthwise.as_dict()).config == depthwise.config
    # many groups of many channels: neither product takes them, and that is recorded
    wide = tune_round_trip(problem("2d-depthwise", in_channels=80, out_channels=160, groups=20), "numpy", 1.0,
                           timer=FakeTimer())
    assert wide.outcomes[0].status == "unsupported" and "20 groups of 4->8 channels" in wide.reason
    with pytest.raises(ValueError, match="unknown round-trip product"):
        RoundTrip(p, TripConfig(sizes=fft_sizes.size_candidates(p)[0], product="gemm"), "numpy")
    with pytest.raises(ValueError, match="the pointwise round trip takes it"):
        RoundTrip(p_dw, TripConfig(sizes=fft_sizes.size_candidates(p_dw)[0]), "numpy")


def test_block_trips_at_sizes_the_per_pass_plans_did_not_choose_are_skipped(monkeypatch):
    """Where the per-pass plans are the one-block transforms', a block trip is tried only at the transform sizes they
    chose; the others are recorded as skipped, with why. An exhaustive search, and a layer whose per-pass plans are
    not the one-block transforms', try every size."""
    from convtune.roundtrip import block_size_rule
    from convtune.roundtrip import tuning as trip_tuning
    p = problem("2d-depthwise", in_channels=8, out_channels=8, groups=8)
    chosen = TripConfig(sizes=(16, 16), product="block", radices="8")
    other = TripConfig(sizes=(32, 32), product="block", radices="16")
    plain = trip_candidates(p, trip_tuning.get_backend("numpy"))
    assert plain and not any(c.product == "block" for c in plain)
    monkeypatch.setattr(trip_tuning, "trip_candidates", lambda q, backend: plain + [chosen, other])
    planes = ("fft-plane[sizes=16x16,slices=1,threads=0,radices=8]", "fft-plane[sizes=16x16,slices=1,threads=0,"
              "radices=16]", "depthwise[threads=256,variant=window,rows=8]")

    def statuses(labels, **kw):
        d = tune_round_trip(p, "numpy", 1.0, labels, timer=FakeTimer(default=0.5), **kw)
        return {o.label: (o.status, o.reason) for o in d.outcomes}
    ruled = statuses(planes)
    assert ruled[other.label()][0] == "skipped"
    assert "did not choose (they chose 16x16)" in ruled[other.label()][1]
    assert ruled[chosen.label()][0] == "failed"  # tried (a block trip needs the GPU)
    assert all(ruled[c.label()][0] in ("ok", "winner") for c in plain)
    assert statuses(planes, exhaustive=True)[other.label()][0] == "failed"
    assert statuses(("im2col[chunk=32]",) * 3)[other.label()][0] == "failed"
    rows = block_size_rule(("fft-row[size=8192,radices=16]", "cudnn[eng0]"))
    assert rows(TripConfig(sizes=(8192,), product="block")) is None
    assert rows(TripConfig(sizes=(4096,), product="block")) is not None
    assert rows(TripConfig(sizes=(4096,), product="pointwise")) is None
    assert block_size_rule(("cudnn[eng0]", "torch[benchmark]")) is None


def test_real_timer_round_trip(backend):
    """With the backend's real timer (CUDA events per pass on the GPU) the decision is timed."""
    p = problem("2d-groups")
    decision = tune_round_trip(p, backend, 1e9)
    assert decision.winner is not None and decision.winner.timing.median_s > 0 and decision.pays


@pytest.mark.parametrize("keep", [True, "auto"])
def test_layer_keeps_spectra(backend, keep):
    """A layer with kept spectra gives the gradients of one with per-pass plans; ``'auto'`` follows
    the stored verdict (here a fake timer makes the FFT win the passes and the round trip pay)."""
    from convtune import Conv2d, MemoryPlanStore, Runtime
    timer = FakeTimer(times={"fft-trip": 1e-3, "fft[": 0.5})
    runtime = Runtime(store=MemoryPlanStore(), planner_options={"timer": timer})
    kw = dict(padding=4, seed=1, backend=backend.name, runtime=runtime)
    plain, kept = Conv2d(3, 4, 9, **kw), Conv2d(3, 4, 9, keep_spectra=keep, **kw)
    x = backend.xp.random.default_rng(0).standard_normal((2, 3, 16, 16), dtype=backend.xp.float32)
    y0, y1 = plain(x), kept(x)
    assert kept._trip[1] is not None and kept._trip[1].holding
    dy = backend.xp.ones_like(y0) * 0.5
    dx0, dx1 = plain.backward(dy), kept.backward(dy)
    assert not kept._trip[1].holding
    for a, b in ((y0, y1), (dx0, dx1), (plain.grad_weight, kept.grad_weight), (plain.grad_bias, kept.grad_bias)):
        assert float(abs(a - b).max()) <= 1e-4 * float(abs(a).max())
    stored = load_trip(runtime.store, kept._trip[1].problem, backend.device_info().key())
    assert stored is not None and stored.pays


def test_layer_auto_keeps_per_pass_plans_when_the_trip_does_not_pay():
    from convtune import Conv2d, MemoryPlanStore, Runtime
    timer = FakeTimer(times={"fft-trip": 100.0, "fft[": 0.5})  # (the FFT wins the passes: a trip is measured)
    runtime = Runtime(store=MemoryPlanStore(), planner_options={"timer": timer})
    layer = Conv2d(3, 4, 9, padding=4, seed=1, runtime=runtime, keep_spectra="auto")
    x = numpy.random.default_rng(0).standard_normal((2, 3, 16, 16), dtype=numpy.float32)
    layer.backward(numpy.ones_like(layer(x)))
    assert layer._trip[1] is None
    from convtune import ConvProblem
    from convtune.backend import get_backend
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(16, 16), kernel_size=9, padding=4)
    stored = load_trip(runtime.store, p, get_backend("numpy").device_info().key())
    assert stored is not None and not stored.pays and stored.winner is not None
    with pytest.raises(ValueError, match="keep_spectra"):
        Conv2d(3, 4, 5, keep_spectra="always")
    with pytest.raises(ValueError, match="keep_spectra=True: 20 groups of 4->8 channels"):
        Conv2d(80, 160, 3, groups=20, keep_spectra=True)(numpy.zeros((1, 80, 8, 8), numpy.float32))


def test_auto_measures_a_round_trip_only_where_a_pass_transforms():
    """``keep_spectra='auto'`` measures no round trip for a layer none of whose per-pass winners is an FFT plan (no
    spectra to keep): it says why, stores nothing, and ``keep_spectra=True`` on the same runtime still measures it."""
    from convtune import Conv2d, MemoryPlanStore, Runtime
    timer = FakeTimer(times={"fft-trip": 1e-3, "im2col": 0.5})
    runtime = Runtime(store=MemoryPlanStore(), planner_options={"timer": timer})
    layer = Conv2d(3, 4, 9, padding=4, seed=1, runtime=runtime, keep_spectra="auto")
    x = numpy.random.default_rng(0).standard_normal((2, 3, 16, 16), dtype=numpy.float32)
    layer.backward(numpy.ones_like(layer(x)))
    assert layer._trip[1] is None and not any(label.startswith("fft-trip") for label in timer.labels)
    from convtune import ConvProblem
    from convtune.backend import get_backend
    backend = get_backend("numpy")
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(16, 16), kernel_size=9, padding=4)
    assert load_trip(runtime.store, p, backend.device_info().key()) is None
    said = runtime.round_trip_for(p, backend, where_spectral=True)
    assert said.winner is None and not said.pays and "no per-pass plan of it transforms" in said.reason
    kept = Conv2d(3, 4, 9, padding=4, seed=1, runtime=runtime, keep_spectra=True)
    kept.backward(numpy.ones_like(kept(x)))
    assert kept._trip[1] is not None and any(label.startswith("fft-trip") for label in timer.labels)
    assert load_trip(runtime.store, p, backend.device_info().key()).pays


def test_own_transforms_in_round_trips(backend):
    """convtune's own 64x64 transforms are round-trip candidates on the GPU (each checked against
    float64 above, case 2d-fft64); their flag survives the stored form, and older forms read as cuFFT."""
    p = problem("2d-fft64")
    own = [c for c in trip_candidates(p, backend) if c.own]
    assert (len(own) > 0) == (backend.name == "cupy")
    assert all(c.sizes == (64, 64) and not c.fused for c in own)
    c = TripConfig(sizes=(64, 64), packed=True, own=True)
    assert TripConfig.from_dict(c.as_dict()) == c and c.label() == "fft-trip[sizes=64x64,packed,own]"
    assert not TripConfig.from_dict({"sizes": [64, 64], "packed": True}).own


def test_a_stored_trip_decision_of_an_older_version_stands_where_no_later_version_changed_its_shape():
    """Version 7 added the GPU's fused and packed trips for 3-D problems only, versions 8 and 9 changed
    half-precision and channels_last layers, version 10 tf32 ones: a 2-D float32 decision of version 6 stands, a
    3-D one is measured again, a half-precision one of version 8 too, a tf32 one of version 9 too; an older version
    (6 changed every shape) or a newer one never stands. Version 11 (the block trips) changed float32 depthwise 1-D
    and 2-D layers only, version 12 (larger blocks for long rows) float32 depthwise rows of over 16384 samples, version
    13 (fused backward passes) float32 depthwise rows, version 14 (the same for images) 2-D ones, version 15 (radix-32
    passes) float32 depthwise rows whose transforms they shorten by a pass (long-16k's, not hyena's 4096 points),
    version 16 (the rows' first and last passes reading and writing memory) every float32 depthwise row, version 17
    (bfloat16 trips timed on 16-bit memory) every bfloat16 layer, version 18 (the narrow product at a small batch)
    layers of 16 images or fewer with more than 16 channels per group on both sides, and those whose narrow products
    take other blocks now (few channels on one side), versions 19 and 20 (block trips of dense layers offered, then
    withdrawn) float32 dense 2-D layers of one group, stride and dilation 1."""
    from convtune import roundtrip
    # (channels and a batch the narrow product does not take, nor the frequency-major product's groups: version 18;
    # two groups: not the dense layers' block trips of versions 19 and 20)
    wide = dict(in_channels=64, out_channels=64, groups=2, batch=17)
    two, three = problem("2d-large-kernel", **wide), problem("3d-basic", **wide)
    half = two.replace(dtype="bfloat16", layout="channels_last")
    half16 = half.replace(dtype="float16")  # (version 17 changed every bfloat16 layer)
    tf32 = two.replace(math="tf32")
    depthwise = problem("2d-depthwise-7x7", in_channels=32, out_channels=32, groups=32)
    assert depthwise.groups == depthwise.in_channels == depthwise.out_channels and depthwise.dtype == "float32"
    assert roundtrip.VERSION == 20
    from convtune import ConvProblem
    long_row = ConvProblem.make(batch=2, in_channels=32, out_channels=32, groups=32, input_size=(16384,),
                                kernel_size=16384, padding=16383)
    hyena = long_row.replace(input_size=(4096,), kernel_size=(4096,), padding=(4095,))
    assert roundtrip.stale(11, long_row) and roundtrip.stale(12, hyena) and roundtrip.stale(13, depthwise)
    assert roundtrip.stale(13, hyena) and not any(roundtrip.stale(13, p) for p in (two, three, half16, tf32))
    assert roundtrip.stale(10, depthwise) and not roundtrip.stale(10, depthwise.replace(dtype="float16"))
    assert not any(roundtrip.stale(10, p) for p in (two, three, half16, tf32))
    assert not roundtrip.stale(9, two) and not roundtrip.stale(9, half16) and roundtrip.stale(9, tf32)
    assert not roundtrip.stale(8, two) and not roundtrip.stale(8, three) and roundtrip.stale(8, half)
    assert not roundtrip.stale(7, two) and not roundtrip.stale(7, three) and roundtrip.stale(7, half)
    assert not roundtrip.stale(6, two) and roundtrip.stale(6, three)
    assert roundtrip.CHANGES[15](long_row) and not roundtrip.CHANGES[15](hyena)
    assert roundtrip.stale(15, long_row) and roundtrip.stale(15, hyena)
    assert not any(roundtrip.stale(15, p) for p in (two, three, half16, tf32, depthwise))
    assert not roundtrip.stale(16, hyena) and not roundtrip.stale(16, long_row)
    bf16 = two.replace(dtype="bfloat16")
    assert roundtrip.stale(16, half) and roundtrip.stale(16, bf16) and not roundtrip.stale(16, half16)
    assert not any(roundtrip.stale(16, p) for p in (two, three, tf32, depthwise))
    dense, few = two.replace(batch=8), problem("2d-large-kernel")  # (the narrow product's new candidates, blocks)
    assert roundtrip.CHANGES[18](dense) and roundtrip.CHANGES[18](few)
    assert not any(roundtrip.CHANGES[18](p) for p in (two, three, tf32, depthwise, long_row))
    # (versions 19 and 20: dense float32 2-D layers of one group, stride and dilation 1: a decision of 19 may name a
    # block trip of one, which 20 no longer builds)
    one_group = two.replace(groups=1)
    for version in (18, 19):
        assert roundtrip.stale(version, one_group) and roundtrip.stale(version, one_group.replace(math="tf32"))
        assert not any(roundtrip.stale(version, p) for p in (two, three, half, depthwise, long_row,
                                                              one_group.replace(stride=(2, 2))))
    assert not roundtrip.stale(20, one_group)
    assert roundtrip.stale(5, two) and roundtrip.stale(21, two)


HALF_KINDS = [("bfloat16", "channels_last"), ("bfloat16", "channels_first"), ("float16", "channels_last"),
              ("float32", "channels_last")]


@pytest.mark.parametrize("dtype, layout", HALF_KINDS)
@pytest.mark.parametrize("name", ["2d-large-kernel", "2d-depthwise-7x7", "1d-depthwise-long"])
def test_half_precision_and_channels_last_layers_round_trip_between_conversions(backend, name, dtype, layout):
    """A half-precision or channels_last layer's round trip: the float32 channels-first trip between conversions,
    its results rounded to the dtype and laid out, within the dtype's bound; the stateless form writes into the
    caller's arrays; tuning measures it against the per-pass plans."""
    from convtune import precision
    p = problem(name).replace(dtype=dtype, layout=layout)
    assert unsupported_reason(p) is None
    xp = backend.xp
    x, w, dy = _operands(backend, p)
    refs = _references(backend, p, x, w, dy)
    for config in trip_candidates(p, backend):
        trip = RoundTrip(p, config, backend)
        # (the block trips, float32 layers' on the GPU, read channels_last themselves)
        assert trip.converted == (not config.own and config.product != "block") and trip.float32 == p.in_float32()
        assert trip.reads_bits == (dtype == "bfloat16" and not trip.converted)  # (what timed_steps times it on)
        got = trip(x, w, dy)
        for out, ref, q in zip(got, refs, ("fwd", "dgrad", "wgrad")):
            assert str(out.dtype) == precision.STORAGE[dtype], (config.label(), q)
            if q != "wgrad" or p.rank > 1:
                assert precision.layout_of(out) == layout or out.shape[1] == 1, (config.label(), q)
            assert numpy.array_equal(precision.round_to(numpy, _host(out).astype(numpy.float32), dtype),
                                     _host(out).astype(numpy.float32))  # (values of the dtype)
            err = relative_error(xp, out, ref)
            assert err <= p.tolerance, f"{config.label()} {q}: error {err:.2g}"
        outs = [precision.empty_result(xp, p.for_pass(q), fill=numpy.nan) for q in ("fwd", "dgrad", "wgrad")]
        y, spectra = trip.kept_forward(x, w, outs[0])
        dx, dw = trip.kept_backward(spectra, dy, outs[1], outs[2])
        assert y is outs[0] and dx is outs[1] and dw is outs[2]
        for out, first in zip(outs, got):
            assert numpy.array_equal(_host(out), _host(first))
    decision = tune_round_trip(p, backend, 10.0, ("a", "b", "c"), timer=FakeTimer(default=1.0))
    assert decision.winner is not None and decision.pays and decision.problem == p.for_pass("fwd")


def _host(a):
    return a.get() if hasattr(a, "get") else numpy.asarray(a)


# -- the one-block transforms' kept spectra (the block product) ---------------------------------------------------------
def test_block_trip_config_label_and_dict():
    c = TripConfig(sizes=(72, 72), product="block", radices="16x9", threads=512)
    assert c.label() == "fft-trip[sizes=72x72,block,radices=16x9,threads=512]"
    assert TripConfig.from_dict(c.as_dict()) == c
    old = TripConfig.from_dict({"sizes": [8]})  # (stored before the fields)
    assert (old.radices, old.threads) == ("8", 0)


def test_block_trips_are_candidates_of_float32_depthwise_layers_on_the_gpu():
    from types import SimpleNamespace
    from convtune.problem import ConvProblem
    from convtune.roundtrip import block_trip_configs
    gpu, cpu = SimpleNamespace(name="cupy"), SimpleNamespace(name="numpy")
    hyena = ConvProblem.make(batch=4, in_channels=8, out_channels=8, groups=8, input_size=(4096,), kernel_size=4096,
                             padding=4095)
    assert [c.label() for c in block_trip_configs(hyena, gpu)] == [
        "fft-trip[sizes=8192,block]", "fft-trip[sizes=8192,block,radices=16]",
        "fft-trip[sizes=8192,fused,block]", "fft-trip[sizes=8192,fused,block,radices=16]"]
    replk = ConvProblem.make(batch=2, in_channels=4, out_channels=4, groups=4, input_size=(56, 56), kernel_size=31,
                             padding=15)
    plain = [((128, 128), "8", 0), ((128, 128), "16", 0), ((128, 128), "8", 256), ((128, 128), "16", 256),
             ((72, 72), "8", 0), ((72, 72), "16x9", 0), ((72, 72), "8", 512), ((72, 72), "16x9", 512)]
    got = [(c.sizes, c.radices, c.threads) for c in block_trip_configs(replk, gpu)]
    assert got == plain[:4] + plain[:4] + plain[4:] + plain[4:]  # (each also fused, after the plain ones of its size)
    assert [c.fused for c in block_trip_configs(replk, gpu)] == ([False] * 4 + [True] * 4) * 2
    assert block_trip_configs(replk, gpu)[7].label() == "fft-trip[sizes=128x128,fused,block,radices=16,threads=256]"
    assert block_trip_configs(replk, cpu) == [] and block_trip_configs(replk.replace(dtype="bfloat16"), gpu) == []
    # (a dense layer, or one of a few groups: none)
    assert block_trip_configs(replk.replace(groups=1, out_channels=8), gpu) == []
    assert block_trip_configs(replk.replace(groups=2, out_channels=8), gpu) == []
    long_row = hyena.replace(input_size=(16384,), kernel_size=(16384,), padding=(16383,))
    assert [(c.radices, c.threads, c.fused) for c in block_trip_configs(long_row, gpu)] == [
        ("8", 0, False), ("16", 0, False), ("32", 0, False), ("8", 1024, False),
        ("16", 1024, False)]  # (no room for fused sums; radix 32 at 512 threads only)


@pytest.mark.gpu
@pytest.mark.parametrize("n, k, pad", [((4096,), 4096, 4095), ((16384,), 16384, 16383), ((3001,), 1500, 700),
                                       ((56, 56), 31, 15)])
def test_block_trip_candidates_match_float64_on_the_gpu(n, k, pad):
    """Every block round trip of a long depthwise row or a RepLKNet-sized image (radices, block sizes and the fused
    backward passes where listed), all three passes against float64 on the GPU, through the round trip and its
    stateless form (an odd batch: the images' fused slices end with one sample)."""
    from convtune.problem import ConvProblem
    from convtune.roundtrip import block_trip_configs, round_trip_operands, round_trip_references
    from convtune.backend import get_backend
    backend = get_backend("cupy")
    p = ConvProblem.make(batch=2 if len(n) == 1 else 3, in_channels=3, out_channels=3, groups=3, input_size=n,
                         kernel_size=k, padding=pad)
    x, w, dy = round_trip_operands(backend, p, seed=n[0])
    refs = round_trip_references(backend, p, x, w, dy)
    configs = block_trip_configs(p, backend)
    assert configs
    assert any(c.fused for c in configs) == (n[0] <= 4096)  # (rows up to 8192 points, and images, have a fused form)
    for config in configs:
        trip = RoundTrip(p, config, backend)
        got = trip(x, w, dy)
        errors = [relative_error(backend.xp, a, ref) for a, ref in zip(got, refs)]
        assert max(errors) <= 1e-5, f"{config.label()}: {errors}"
        y, spectra = trip.kept_forward(x, w)  # (the drop-in's stateless form: both gradients from one call)
        got = (y, *trip.kept_backward(spectra, dy))
        errors = [relative_error(backend.xp, a, ref) for a, ref in zip(got, refs)]
        assert max(errors) <= 1e-5, f"{config.label()}, kept_backward: {errors}"


def _emulated_block_kernels(monkeypatch):
    """The block trips' kernels as the CPU runs them (tests/cuda_cpu.py) in place of the GPU's."""
    import cuda_cpu
    from convtune.fft import blockkept, planeconv, rowconv
    monkeypatch.setattr(blockkept, "row_kernels", lambda dtype, m, radix, block, fused, device: cuda_cpu.launchables(
        rowconv.source(dtype, m, radix, block), rowconv.KEPT_NAMES + ((rowconv.BOTH_NAME,) if fused else ())))
    monkeypatch.setattr(blockkept, "plane_kernels", lambda dtype, sizes, shape, radix, fused, device:
                        cuda_cpu.launchables(planeconv.source(dtype, sizes, shape, radix),
                                             planeconv.KEPT_NAMES + (planeconv.FUSED_NAMES if fused else ())))


ROW, IMAGE = dict(input_size=(37,), kernel_size=11, padding=5), dict(input_size=(9, 11), kernel_size=(3, 5),
                                                                      padding=(1, 2))


@pytest.mark.parametrize("shape, fused", [(ROW, False), (ROW, True), (IMAGE, False), (IMAGE, True)])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
@pytest.mark.parametrize("dgrad_first", [False, True])
def test_block_round_trip_through_roundtrip(monkeypatch, shape, fused, layout, dgrad_first):
    """RoundTrip with the block product: forward (the pass and x's spectra in one kernel), then both backward passes
    in either order (backward-data first: dx and dy's spectra in one kernel; else dy's spectra alone, then dx from
    them; ``fused``: whichever comes first makes both in one kernel, the second hands over its result), and the
    stateless kept_forward / kept_backward, against float64 (the kernels emulated on the CPU)."""
    from convtune.backend import get_backend
    from convtune.fft import planeconv, rowconv
    from convtune.problem import ConvProblem
    _emulated_block_kernels(monkeypatch)
    backend = get_backend("numpy")
    p = ConvProblem.make(batch=3, in_channels=2, out_channels=2, groups=2, layout=layout, **shape)
    sizes = (rowconv.transform_size(p),) if p.rank == 1 else planeconv.transform_sizes(p)
    x, w, dy = _operands(backend, p)
    refs = _references(backend, p, x, w, dy)
    trip = RoundTrip(p, TripConfig(sizes=sizes, product="block", threads=512 if p.rank == 2 else 0, fused=fused),
                     backend)
    assert trip.recordable and not trip.converted and trip._ex.fused == fused
    launches = []
    for i, kernel in enumerate(trip._ex.kernels):
        def counted(*args, _i=i, _k=kernel):
            launches.append(_i)
            return _k(*args)
        trip._ex.kernels = trip._ex.kernels[:i] + (counted,) + trip._ex.kernels[i + 1:]
    y = trip.forward(x, w)
    if dgrad_first:
        dx = trip.backward_data(dy)
        dw = trip.backward_filter(dy)
    else:
        dw = trip.backward_filter(dy)
        dx = trip.backward_data(dy, out=numpy.empty(p.x_shape, numpy.float32))
    assert not trip.holding
    for out, ref in zip((y, dx, dw), refs):
        assert relative_error(numpy, out, ref) <= 1e-6
    # (w's and x's spectra with y, then one kernel for both (images: and the sums' kernel); else dx with dy's spectra,
    # then dw, or dy's spectra, dw, then dx)
    both = 1 if p.rank == 1 else 2
    assert launches.count(6) == fused and len(launches) == (2 + both if fused else 4 if dgrad_first else 5)
    y, spectra = trip.kept_forward(x, w)
    dx, dw = trip.kept_backward(spectra, dy)
    for out, ref in zip((y, dx, dw), refs):
        assert relative_error(numpy, out, ref) <= 1e-6
    if fused:  # (a backward pass with another dy than the first's is computed, not handed over)
        trip.forward(x, w)
        trip.backward_data(dy)
        dw2 = trip.backward_filter(2 * dy)
        assert relative_error(numpy, dw2, 2 * refs[2]) <= 1e-6


@pytest.mark.parametrize("product", ["pointwise", "block"])
def test_elementwise_products_refuse_the_gemm_variants(product):
    from convtune.problem import ConvProblem
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=4, groups=4, input_size=(20, 20), kernel_size=5,
                         padding=2)
    what = "fused, packed" if product == "pointwise" else "packed"
    with pytest.raises(ValueError, match=f"the {product} round trip has no {what}, own, narrow or TF32"):
        RoundTrip(p, TripConfig(sizes=(32, 32), product=product, packed=True), "numpy")


def test_block_trips_compile_together_before_they_are_timed(monkeypatch):
    """tune_round_trip hands every block candidate's build to build_concurrently first (their kernels compile on
    several threads), on the GPU only."""
    from types import SimpleNamespace
    from convtune import compiling, roundtrip
    from convtune.problem import ConvProblem
    built, handed = [], []
    monkeypatch.setattr(roundtrip.trip, "_block_kept", lambda xp, p, c: built.append(c.label()))
    monkeypatch.setattr(compiling, "build_concurrently", lambda builds, backend: handed.append(list(builds)))
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=4, groups=4, input_size=(56, 56), kernel_size=31,
                         padding=15)
    configs = roundtrip.block_trip_configs(p, SimpleNamespace(name="cupy"))
    roundtrip.compile_block_trips(p, configs, SimpleNamespace(name="cupy", xp=None))
    assert len(handed) == 1 and len(handed[0]) == len(configs) == 16
    for build in handed[0]:
        build()
    assert built == [c.label() for c in configs]
    roundtrip.compile_block_trips(p, configs, SimpleNamespace(name="numpy", xp=None))
    roundtrip.compile_block_trips(p, [], SimpleNamespace(name="cupy", xp=None))
    assert len(handed) == 1


class _RecordingTrip:
    """A stand-in round trip that records what each pass is called with (``reads_bits`` as given)."""

    def __init__(self, p, reads_bits):
        self.xp, self.problem, self.reads_bits, self.calls = numpy, p, reads_bits, []

    def forward(self, x, w, out=None):
        self.calls.append(("fwd", x, w, out))

    def backward_data(self, dy, out=None):
        self.calls.append(("dgrad", dy, out))

    def backward_filter(self, dy, out=None):
        self.calls.append(("wgrad", dy, out))


@pytest.mark.parametrize("reads_bits", [True, False])
def test_a_trip_that_reads_bfloat16_bits_is_timed_on_16_bit_memory(reads_bits):
    """A bfloat16 round trip is timed on what the PyTorch layer hands it: where the trip reads bfloat16's 16 bits itself,
    16-bit copies of the operands, made once (their bits the float32 storage's upper halves, in the layer's memory
    order), and 16-bit results of the passes' shapes; any other trip on the operands as given, its results its own."""
    from convtune.roundtrip import time_round_trip
    from convtune.backend import get_backend
    p = problem("2d-odd").replace(dtype="bfloat16", layout="channels_last")
    backend = get_backend("numpy")
    x, w = random_operands(backend, p, 0)
    dy = random_operands(backend, p.for_pass("dgrad"), 1)[0]
    trip = _RecordingTrip(p, reads_bits)
    timer = FakeTimer()
    time_round_trip(lambda fn, *args: [fn(), timer(fn, *args)][1], backend, trip, x, w, dy, "t")  # (two runs)
    assert [c[0] for c in trip.calls] == ["fwd", "dgrad", "wgrad"] * 2
    (_, tx, tw, y), (_, tdy, dx), (_, tdy2, dw) = trip.calls[:3]
    if not reads_bits:
        assert tx is x and tw is w and tdy is dy and tdy2 is dy and (y, dx, dw) == (None, None, None)
        return
    for got, given in ((tx, x), (tw, w), (tdy, dy)):
        assert got.dtype == numpy.uint16 and got.shape == given.shape
        widened = (got.astype(numpy.uint32) << 16).view(numpy.float32)
        assert numpy.array_equal(widened, given)  # (bfloat16 values: their upper halves, exactly)
        assert got.transpose(0, 2, 3, 1).flags.c_contiguous  # (channels_last memory, as the layer's tensors)
    assert tdy2 is tdy
    for out, shape in ((y, p.y_shape), (dx, p.x_shape), (dw, p.w_shape)):
        assert out.dtype == numpy.uint16 and out.shape == shape and out.transpose(0, 2, 3, 1).flags.c_contiguous
    assert all(a is b for a, b in zip(trip.calls[0][1:], trip.calls[3][1:]))  # (copies made once, not a run)
