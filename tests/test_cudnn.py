"""The cuDNN strategy: absent cleanly on the CPU; on the GPU, engine id + knobs, math modes, replay."""

import time

import pytest

from convtune.backend import get_backend
from convtune.planner import Planner, random_operands, relative_error
from convtune.strategies import get_strategy
from convtune.strategies.cudnn import CudnnConfig
from cases import problem


def assert_every_engine_within(p, be, bound):
    """cuDNN offers engines for ``p``, and each one's result is within ``bound`` of float64."""
    xp, cudnn = be.xp, get_strategy("cudnn")
    a, b = random_operands(be, p, 3)
    ref = get_strategy("reference").build(p, None, be)(a.astype(xp.float64), b.astype(xp.float64))
    configs = cudnn.candidates(p, be)
    assert configs
    for c in configs:
        assert relative_error(xp, cudnn.build(p, c, be)(a, b), ref) <= bound, c.label()


def test_cpu_backend_is_declined_with_a_reason():
    reason = get_strategy("cudnn").supports(problem("2d-odd"), get_backend("numpy"))
    assert reason == "cuDNN needs the CuPy (GPU) backend"


def test_tensors_are_described_in_the_problems_layout_and_half_problems_keep_tensor_cores():
    """Channels-last strides for every operand (a 1-D problem's lifted height is spatial: (N, L, C) memory),
    packed ones for channels-first; half-precision engines may use tensor cores in any math mode, no engine may
    reduce in reduced precision."""
    from convtune.direct.cudnn_frontend import excluded_notes, strides as _strides
    assert _strides([2, 3, 4, 5]) == [60, 20, 5, 1]
    assert _strides([2, 3, 4, 5], "channels_last") == [60, 1, 15, 3]
    assert _strides([2, 3, 1, 7], "channels_last") == [21, 1, 21, 3]  # N, L, C
    assert _strides([2, 3, 4, 5, 6], "channels_last") == [360, 1, 90, 18, 3]
    assert "TENSOR_CORE" in excluded_notes("fp32", "float32")
    assert excluded_notes("fp32", "float16") == excluded_notes("tf32", "bfloat16") == ("REDUCED_PRECISION_REDUCTION",)
    strategy, p = get_strategy("cudnn"), problem("2d-odd")
    assert all(strategy.reads(p.replace(dtype=d, layout=l)) for d in ("float32", "bfloat16", "float16")
               for l in ("channels_first", "channels_last"))


def test_config_is_engine_and_knobs():
    c = CudnnConfig(engine=7, knobs=(("SPLIT_K", 2), ("TILE_SIZE", 1)))
    assert CudnnConfig.from_dict(c.as_dict()) == c
    assert c.label() == "eng7,split_k=2,tile_size=1"
    assert c.as_dict() == {"engine": 7, "knobs": [("SPLIT_K", 2), ("TILE_SIZE", 1)]}


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_math_modes(pass_):
    """fp32 offers no TF32 engine (every plan within 1e-5); tf32 offers tensor-core engines, and the
    planner keeps only those within 1e-3 and records the rest as rejected."""
    be = get_backend("cupy")
    shape = dict(batch=8, in_channels=64, out_channels=64, input_size=(28, 28), groups=1)
    assert_every_engine_within(problem("2d-groups", pass_, **shape), be, 1e-5)
    ptf = problem("2d-groups", pass_, **shape, math="tf32")
    decision = Planner(be, strategies=["cudnn"], time_budget_s=3.0).tune(ptf)
    kept = [o for o in decision.outcomes if o.status in ("winner", "ok")]
    assert kept and all(o.error <= 1e-3 for o in kept)
    assert all(o.error > 1e-3 for o in decision.outcomes if o.status == "rejected")
    assert max(o.error for o in decision.outcomes if o.error is not None) > 1e-5  # TF32 engines were offered


@pytest.mark.gpu
def test_winner_is_rebuilt_from_engine_and_knobs_without_enumeration(monkeypatch):
    from convtune.strategies import cudnn as mod
    be = get_backend("cupy")
    p = problem("2d-stride-pad-dil", "dgrad", batch=4)
    decision = Planner(be, strategies=["cudnn"], time_budget_s=2.0).tune(p)
    config = CudnnConfig.from_dict(decision.winner.config)
    # a fresh process has no graphs: forget them, and forbid enumerating
    monkeypatch.setattr(mod, "_CTX", mod._Context())
    monkeypatch.setattr(mod._Graph, "enumerate", lambda *a, **k: pytest.fail("enumerated engines on a rebuild"))
    xp = be.xp
    a, b = random_operands(be, p, 5)
    ref = get_strategy("reference").build(p, None, be)(a.astype(xp.float64), b.astype(xp.float64))
    out = get_strategy("cudnn").build(p, config, be)(a, b)
    assert relative_error(xp, out, ref) <= 1e-5


@pytest.mark.parametrize("case, dims", [("1d-basic", 4), ("2d-odd", 4), ("3d-stride-dil-groups", 5)])
def test_problems_reach_cudnn_as_4d_or_5d_tensors(case, dims):
    """Rank 1 gets a height-1 axis; ranks 2 and 3 go as they are (NCHW, NCDHW), geometry per axis."""
    from convtune.direct.cudnn_frontend import geometry as _geometry
    p = problem(case)
    x, w, y, pad, stride, dil = _geometry(p)
    assert (len(x), len(w), len(y)) == (dims,) * 3 and len(pad) == len(stride) == len(dil) == dims - 2
    assert x[:2] == [p.batch, p.in_channels] and w[:2] == [p.out_channels, p.in_per_group]
    assert tuple(x[2:])[-p.rank:] == p.input_size and tuple(y[2:])[-p.rank:] == p.output_size
    assert tuple(pad)[-p.rank:] == p.padding and tuple(stride)[-p.rank:] == p.stride


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", ["3d-basic", "3d-stride-dil-groups", "3d-1x1-stride"])
def test_3d_problems_have_engines_within_fp32(case, pass_):
    """Rank 3 on 5-D tensors: cuDNN offers engines for each pass, and every one it offers in fp32 mode
    is within 1e-5 of float64."""
    be = get_backend("cupy")
    p = problem(case, pass_)
    assert get_strategy("cudnn").supports(p, be) is None
    assert_every_engine_within(p, be, 1e-5)


def test_operands_bind_by_position_where_the_frontend_takes_tensor_uids():
    """A frontend whose execute_plan_at_index takes ``tensor_uids`` gets the operands by position (a cheaper
    per-call path), the uids read from the graph's tensors; an older one gets the mapping form."""
    from types import SimpleNamespace
    from convtune.direct.cudnn_frontend import ordered_uids as _ordered_uids

    def newer(tensor_dict, workspace=None, index=0, handle=None, *args, tensor_uids=None, **kwargs):
        pass

    def older(tensor_dict, workspace=None, index=0, handle=None):
        pass
    tensors = (SimpleNamespace(uid=3), SimpleNamespace(get_uid=lambda: 1), SimpleNamespace(uid=2))
    assert _ordered_uids(newer, tensors) == (3, 1, 2)
    assert _ordered_uids(older, tensors) is None
    assert _ordered_uids(newer, (SimpleNamespace(),)) is None  # tensors without uids: the mapping form

@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_plans_run_by_address_on_the_operands_memory(pass_):
    """Each engine's by-address form (the PyTorch bridge's path) gives the float64 reference's result within
    fp32 on a stream of its own."""
    import cupy as cp
    be, cudnn = get_backend("cupy"), get_strategy("cudnn")
    p = problem("2d-stride-pad-dil", pass_, batch=3)
    a, b = random_operands(be, p, 5)
    ref = get_strategy("reference").build(p, None, be)(a.astype(cp.float64), b.astype(cp.float64))
    configs = cudnn.candidates(p, be)
    assert configs
    stream = cp.cuda.Stream(non_blocking=True)
    for c in configs[:6]:
        run = cudnn.build(p, c, be)
        out = cp.full(p.result_shape, cp.nan, dtype=cp.float32)
        # the NaN fill runs on the current stream, which a non-blocking stream does not wait for: let it land first,
        # or the fill can overwrite the engine's output (an all-NaN result seen once on the H100)
        cp.cuda.Device().synchronize()
        run.launch(a.data.ptr, b.data.ptr, out.data.ptr, stream)
        stream.synchronize()
        assert relative_error(cp, out, ref) <= 1e-5, c.label()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout", [("float32", "channels_last"), ("bfloat16", "channels_first"),
                                           ("bfloat16", "channels_last"), ("float16", "channels_last")])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_engines_read_half_precision_and_channels_last_themselves(dtype, layout, pass_):
    """cuDNN's engines run a problem's dtype and layout natively (no float32 channels-first conversions): in 1-D
    (a height-1 problem on (N, L, C) memory), 2-D and 3-D, each within the dtype's bound against float64, in the
    problem's layout; the call the planner times (``timed``, on 16-bit memory prepared once) runs too."""
    import cupy as cp
    from convtune import ConvProblem, precision
    be, cudnn = get_backend("cupy"), get_strategy("cudnn")
    for size, kernel in (((23,), 5), ((11, 9), 3), ((5, 6, 7), 3)):
        p = ConvProblem.make(batch=2, in_channels=8, out_channels=16, input_size=size, kernel_size=kernel,
                             padding=1, pass_=pass_, dtype=dtype, layout=layout)
        assert cudnn.reads(p)
        a, b = random_operands(be, p, 7)
        ref = get_strategy("reference").build(p, None, be)(a.astype(cp.float64), b.astype(cp.float64))
        configs = cudnn.candidates(p, be)
        assert configs, p.describe()
        for c in configs[:3]:
            run = cudnn.executor(p, c, be)
            out = precision.empty_result(cp, p, fill=cp.nan)
            run(a, b, out)
            assert relative_error(cp, out, ref) <= p.tolerance, (c.label(), p.describe())
            if len(size) > 1:
                assert precision.layout_of(run(a, b)) == layout
            run.timed(a, b, out)()
            cp.cuda.Device().synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "wgrad"])
def test_a_half_precision_search_times_cudnns_waiting_plans_only_in_its_second_round(pass_):
    """On a bfloat16 channels_last layer searched against PyTorch's call, cuDNN's plans past the first round are
    either tried (the first round beat PyTorch's call by the margin) or recorded skipped with both times and never
    built; searched without PyTorch's call, every plan is tried in one round."""
    from convtune import ConvProblem
    from convtune.strategies import cudnn as module
    be = get_backend("cupy")
    p = ConvProblem.make(batch=16, in_channels=64, out_channels=64, input_size=(28, 28), kernel_size=3, padding=1,
                         pass_=pass_, dtype="bfloat16", layout="channels_last", math="tf32")
    d = Planner(be, strategies=["cudnn", "torch"]).tune(p)
    cudnn = [o for o in d.outcomes if o.strategy == "cudnn"]
    waiting = [o for o in cudnn if o.rank >= module.FIRST_ROUND_PLANS and not o.reason.startswith("pruned")]
    assert waiting, [o.label for o in cudnn]
    graph = module._CTX.enumerated[p.key()]
    skipped = [o for o in waiting if o.reason.startswith("second round not run")]
    assert not skipped or len(skipped) == len(waiting)
    assert all(o.status == "skipped" and CudnnConfig.from_dict(o.config) not in graph.built for o in skipped)
    assert skipped or any(o.timing is not None for o in waiting)
    left = [CudnnConfig.from_dict(o.config) for o in cudnn if o.reason.startswith("pruned: a plan with knobs set")]
    assert not (left and skipped) and all(c.knobs and c not in graph.built for c in left)  # (the second round's own)
    tried = Planner(be, strategies=["cudnn"]).tune(p)
    assert not any(o.reason.startswith("second round") for o in tried.outcomes)


class _Note:
    def __init__(self, name):
        self.name = name


class _FakeFrontendGraph:
    """A cuDNN frontend graph without cuDNN: plans by (engine, behavior notes); builds are counted."""

    def __init__(self, plans):
        self.plans, self.listed, self.builds = plans, [], []

    def create_execution_plans(self, modes):
        self.listed = list(range(len(self.plans)))

    def get_engine_count(self):
        return 0

    def create_execution_plan(self, engine, knobs):
        self.plans.append((engine, ()))
        self.listed.append(len(self.plans) - 1)

    def get_execution_plan_count(self):
        return len(self.listed)

    def get_engine_and_knobs_at_index(self, index):
        return self.plans[self.listed[index]][0], {}

    def get_behavior_notes_for_plan_at_index(self, index):
        return [_Note(n) for n in self.plans[self.listed[index]][1]]

    def build_plan_at_index(self, index):
        self.builds.append(self.plans[self.listed[index]][0])

    def get_workspace_size_plan_at_index(self, index):
        return 1024 * (index + 1)


def _fake_graph(module, fake, p, kind=None, engine_kind=None):
    """A :class:`~convtune.strategies.cudnn._Graph` of problem ``p`` over ``fake`` (a :class:`_FakeFrontendGraph`),
    nothing built or listed yet, as its constructor leaves one (``kind``, ``engine_kind``: the records' keys)."""
    from types import SimpleNamespace
    graph = object.__new__(module._Graph)
    graph.graph, graph.built, graph.compiled, graph.deferred, graph.unbuilt, graph.waiting = fake, {}, set(), {}, {}, \
        set()
    graph.build_times, graph.failed_s = {}, 0.0
    graph.problem = p
    graph.kind = kind or (p.pass_, p.dtype, p.layout)
    graph.engine_kind = engine_kind or (*graph.kind, p.math)
    graph.cudnn = SimpleNamespace(heur_mode=SimpleNamespace(A=0, B=1, FALLBACK=2), numerical_note=SimpleNamespace())
    return graph


def test_half_precision_plans_past_the_first_round_are_listed_but_built_only_when_their_round_comes(monkeypatch):
    """On a bfloat16 problem the plans past the heuristics' first FIRST_ROUND_PLANS are listed, not built, and say
    they wait for the second round (in their place in the list); asked their workspace (their round came), they are
    built; a float32 problem's plans are all built while listing."""
    from convtune import ConvProblem
    from convtune.strategies import cudnn as module
    monkeypatch.setattr(module._CTX, "compiled", {})
    monkeypatch.setattr(module._CTX, "engines", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    monkeypatch.setattr(module, "FIRST_ROUND_PLANS", 3)
    p = ConvProblem.make(batch=2, in_channels=16, out_channels=32, input_size=(14, 14), kernel_size=3, padding=1,
                         dtype="bfloat16", layout="channels_last")
    fake = _FakeFrontendGraph([(e, ()) for e in (10, 11, 12, 13, 14)])
    graph = _fake_graph(module, fake, p)
    found = graph.enumerate("tf32", "bfloat16")
    assert [c.engine for c, _ws in found] == [10, 11, 12, 13, 14] and fake.builds == [10, 11, 12]
    assert [ws for _c, ws in found] == [1024, 2048, 3072, 0, 0] and not graph.deferred
    strategy = get_strategy("cudnn")
    module._CTX.enumerated[p.key()] = graph
    reasons = [strategy.second_round(p, c, rank) for rank, (c, _ws) in enumerate(found)]
    assert reasons[:3] == [None] * 3 and reasons[3:] == ["past the heuristics' first 3 plans of a bfloat16 problem"] * 2
    assert strategy.pruned(p, CudnnConfig(13), None) is None
    assert strategy.left_out_of_second_round(p, CudnnConfig(13), 3) is None  # (an engine's default plan is tried)
    assert "knobs set past the heuristics' first 3" in strategy.left_out_of_second_round(
        p, CudnnConfig(13, (("TILE_SIZE", 2),)), 3)
    assert strategy.workspace_bytes(p, CudnnConfig(14)) == 5 * 1024 and fake.builds[-1] == 14
    assert graph.waiting == {CudnnConfig(13)} and strategy.verified_at_full_batch(p, CudnnConfig(14))

    def refused(index):
        raise RuntimeError("not supported")
    fake.build_plan_at_index = refused
    with pytest.raises(RuntimeError, match=r"cudnn\[eng13\] .*not supported.*listed for the search's second round"):
        strategy.workspace_bytes(p, CudnnConfig(13))
    assert not graph.waiting
    fake = _FakeFrontendGraph([(e, ()) for e in (10, 11, 12, 13, 14)])
    graph = _fake_graph(module, fake, p.replace(dtype="float32", layout="channels_first"))
    graph.enumerate("fp32")
    assert fake.builds == [10, 11, 12, 13, 14] and not graph.waiting


def test_a_plan_with_a_knob_the_frontend_cannot_name_waits_for_its_round_too(monkeypatch):
    """A heuristics' plan past the first round with a knob the frontend cannot name (NOT_SET, so it cannot be built
    from its place in the list) waits like the others, unbuilt, and is built from its nameable knobs when its round
    comes; left out of that round (knobs set), it is never built."""
    from types import SimpleNamespace

    from convtune import ConvProblem
    from convtune.strategies import cudnn as module
    monkeypatch.setattr(module._CTX, "compiled", {})
    monkeypatch.setattr(module._CTX, "engines", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    monkeypatch.setattr(module, "FIRST_ROUND_PLANS", 1)

    class Knobbed(_FakeFrontendGraph):
        def get_engine_and_knobs_at_index(self, index):
            engine = self.plans[self.listed[index]][0]
            return engine, ({_Note("TILE_SIZE"): 2, _Note("NOT_SET"): 0} if engine == 11 else {})

        def create_execution_plan(self, engine, knobs):
            self.made = (engine, knobs)
            super().create_execution_plan(engine, knobs)
    p = ConvProblem.make(batch=2, in_channels=16, out_channels=32, input_size=(14, 14), kernel_size=3, padding=1,
                         dtype="bfloat16", layout="channels_last")
    fake = Knobbed([(10, ()), (11, ())])
    graph = _fake_graph(module, fake, p)
    graph.cudnn.knob_type = SimpleNamespace(TILE_SIZE="tile")
    found = graph.enumerate("tf32", "bfloat16")
    knobbed = CudnnConfig(11, (("TILE_SIZE", 2),))
    assert [c for c, _ws in found] == [CudnnConfig(10), knobbed] and fake.builds == [10]
    assert graph.waiting == {knobbed} and knobbed not in graph.unbuilt
    strategy = get_strategy("cudnn")
    module._CTX.enumerated[p.key()] = graph
    assert strategy.second_round(p, knobbed, 1) is not None and strategy.left_out_of_second_round(p, knobbed, 1)
    assert strategy.workspace_bytes(p, knobbed) == 3 * 1024 and fake.made == (11, {"tile": 2})
    assert fake.builds == [10, 11] and not graph.waiting


def test_runtime_compiled_engines_that_build_slowly_and_never_come_close_are_not_built_again(monkeypatch):
    """An engine's runtime-compiled plans are listed but not built once its record says they cost seconds and
    came nowhere near a winner; the planner is told why (pruned), an exhaustive search still builds them
    (workspace), and every search's outcomes teach the records of the engines it built."""

    from convtune.plan import CandidateOutcome
    from convtune.strategies import cudnn as module
    from convtune.timing import TimingStats
    monkeypatch.setattr(module._CTX, "compiled", {})
    monkeypatch.setattr(module._CTX, "engines", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    # (in float16: on bfloat16 layers cuDNN's fixed rule prunes engine 69 before any record)
    p = problem("2d-odd").replace(dtype="float16", layout="channels_last")
    kind = (p.pass_, "float16", "channels_last")
    slow = module._CTX.compiled[(69, *kind)] = module.CompileRecord(builds=[1.2] * 5)
    for ratio in (3.0, 2.0, 1.6, 1.4, 1.3):
        slow.tried(ratio)
    near = module._CTX.compiled[(72, *kind)] = module.CompileRecord(builds=[0.5] * 5)
    for ratio in (1.5, 1.5, 1.1, 1.5, 1.5):  # came within RTC_NEAR once: kept
        near.tried(ratio)
    rtc = ("RUNTIME_COMPILATION",)
    fake = _FakeFrontendGraph([(62, ()), (69, rtc), (72, rtc), (70, rtc)])
    graph = _fake_graph(module, fake, p, kind=kind)
    found = graph.enumerate("fp32", "float16")
    assert [c.engine for c, _ws in found] == [62, 69, 72, 70]
    assert fake.builds == [62, 72, 70]
    assert {c.engine for c in graph.compiled} == {72, 70} and [c.engine for c in graph.deferred] == [69]
    assert len(module._CTX.compiled[(70, *kind)].builds) == 1 and len(near.builds) == 6

    strategy = get_strategy("cudnn")
    module._CTX.enumerated[p.key()] = graph
    assert strategy.pruned(p, CudnnConfig(69), None).startswith("runtime-compiled: a build takes 1.20 s")
    assert strategy.pruned(p, CudnnConfig(72), None) is None and strategy.pruned(p, CudnnConfig(62), None) is None
    # the plans built while listing (compiled ahead or at run time) are verified as built, at the full batch; a
    # deferred one is not built yet
    assert [strategy.verified_at_full_batch(p, CudnnConfig(e)) for e in (62, 72, 70, 69)] == [True, True, True, False]
    assert not strategy.verified_at_full_batch(p.replace(batch=p.batch + 1), CudnnConfig(62))  # another problem
    # past FULL_BATCH_VERIFY_FLOPS, only the runtime-compiled plans (two runs at the full batch cost more than a build)
    monkeypatch.setattr(module, "FULL_BATCH_VERIFY_FLOPS", p.flops() - 1)
    assert [strategy.verified_at_full_batch(p, CudnnConfig(e)) for e in (62, 72)] == [False, True]
    monkeypatch.setattr(module, "FULL_BATCH_VERIFY_FLOPS", 8e9)
    depthwise = p.replace(in_channels=4, out_channels=4, groups=4, input_size=(12, 12), kernel_size=(9, 9))  # large, grouped
    module._CTX.enumerated[depthwise.key()] = graph
    assert [strategy.verified_at_full_batch(depthwise, CudnnConfig(e)) for e in (62, 72)] == [False, True]
    assert strategy.workspace_bytes(p, CudnnConfig(69)) == 2048 and fake.builds[-1] == 69  # built on demand, in place

    def outcome(engine, status, median=None, error=None):
        timing = TimingStats(median_s=median, spread_s=0.0, min_s=median, repeats=3) if median else None
        return CandidateOutcome("cudnn", CudnnConfig(engine).as_dict(), f"cudnn[eng{engine}]", status,
                                timing=timing, error=error)
    winner = outcome(62, "winner", 1e-3)
    strategy.observe(p, (winner, outcome(72, "ok", 1.08e-3), outcome(70, "rejected", error=1.0)), winner)
    assert near.trials == 6 and near.closest == pytest.approx(1.08)
    assert module._CTX.compiled[(70, *kind)].trials == 1 and module._CTX.compiled[(70, *kind)].closest == float("inf")
    assert slow.trials == 5  # not built here: nothing learned
    # (the plan compiled ahead, engine 62, teaches its engine's record, not a runtime-compiled one's)
    assert module._CTX.engines[(62, *kind, p.math)].trials == 1 and (62, *kind) not in module._CTX.compiled


def test_engines_whose_plans_never_come_close_are_not_built_again_below_the_heuristics_first(monkeypatch):
    """A plan compiled ahead is listed but not built once its engine's record says that in ENGINE_TRIALS problems of
    the kind (pass, dtype, layout, math mode) its plans never came within ENGINE_NEAR of the winner, unless the
    heuristics rank it among their first HEURISTIC_FIRST; the planner is told why (pruned), an exhaustive search
    still builds it, and the outcomes of the plans built teach their engines' records."""

    from convtune.plan import CandidateOutcome
    from convtune.strategies import cudnn as module
    from convtune.timing import TimingStats
    monkeypatch.setattr(module._CTX, "compiled", {})
    monkeypatch.setattr(module._CTX, "engines", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    p = problem("2d-odd")
    kind = (p.pass_, p.dtype, p.layout, p.math)

    def record(engine, *ratios):
        r = module._CTX.engines[(engine, *kind)] = module.EngineRecord()
        for ratio in ratios:
            r.tried(ratio)
        return r
    far = (1.6, 2.0, 3.0, 1.9, float("inf"))
    record(5, *far)  # first in the heuristics' list: built anyway
    for engine in (6, 7, 8):
        record(engine, 1.0, 1.2, 1.1, 1.3, 1.0)
    skipped = record(9, *far)
    record(10, 1.6, 2.0, 1.4, 1.9, 2.0)  # came within ENGINE_NEAR once
    young = record(11, *far[:4])  # four trials only
    other_math = module._CTX.engines[(12, p.pass_, p.dtype, p.layout, "tf32")] = module.EngineRecord(5, 9.0)
    fake = _FakeFrontendGraph([(e, ()) for e in range(5, 13)])
    graph = _fake_graph(module, fake, p, kind=kind[:3], engine_kind=kind)
    found = graph.enumerate("fp32")
    assert [c.engine for c, _ws in found] == list(range(5, 13))
    assert fake.builds == [5, 6, 7, 8, 10, 11, 12] and [c.engine for c in graph.deferred] == [9]
    assert other_math.trials == 5  # (a tf32 record says nothing of fp32 problems)

    strategy = get_strategy("cudnn")
    module._CTX.enumerated[p.key()] = graph
    assert strategy.pruned(p, CudnnConfig(9), None) == (
        "in 5 problems like this one the engine's plans came no closer than 1.60x the winner, and the heuristics "
        "rank this plan 5th")
    assert all(strategy.pruned(p, CudnnConfig(e), None) is None for e in (5, 10, 11))
    assert strategy.workspace_bytes(p, CudnnConfig(9)) == 5 * 1024 and fake.builds[-1] == 9  # built on demand

    def outcome(engine, status, median=None):
        timing = TimingStats(median_s=median, spread_s=0.0, min_s=median, repeats=3) if median else None
        return CandidateOutcome("cudnn", CudnnConfig(engine).as_dict(), f"cudnn[eng{engine}]", status, timing=timing)
    winner = outcome(6, "winner", 1e-3)
    strategy.observe(p, (winner, outcome(11, "ok", 2e-3), outcome(9, "skipped")), winner)
    assert young.trials == 5 and young.closest == 1.6 and skipped.trials == 5
    assert module._CTX.engines[(6, *kind)].trials == 6


def test_plans_the_fixed_rule_prunes_are_listed_but_not_built(monkeypatch):
    """On a large float32 depthwise layer only engine 0's plans are built while listing; the others are listed with
    the fixed rule as the reason they are pruned (and teach no record), and an exhaustive search builds them on
    demand."""

    from convtune.strategies import cudnn as module
    monkeypatch.setattr(module._CTX, "compiled", {})
    monkeypatch.setattr(module._CTX, "engines", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    from convtune import ConvProblem
    p = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(32, 32), kernel_size=31, padding=15,
                         groups=8)
    fake = _FakeFrontendGraph([(0, ()), (2, ()), (70, ("RUNTIME_COMPILATION",)), (50, ())])
    graph = _fake_graph(module, fake, p)
    built = fake.build_plan_at_index

    def slow_build(index):  # (a build's time is its candidate's, told once: built_elsewhere_s)
        time.sleep(0.02)
        built(index)
    fake.build_plan_at_index = slow_build
    found = graph.enumerate("fp32")
    assert [c.engine for c, _ws in found] == [0, 2, 70, 50] and fake.builds == [0]
    assert 0.02 <= graph.build_times[CudnnConfig(0)] < 1.0 and graph.heuristics_s < 0.02 and graph.failed_s == 0
    assert sorted(c.engine for c in graph.deferred) == [2, 50, 70] and not graph.compiled and not module._CTX.compiled
    strategy = get_strategy("cudnn")
    module._CTX.enumerated[p.key()] = graph
    assert 0.02 <= strategy.built_elsewhere_s(p, CudnnConfig(0)) < 1.0 and strategy.built_elsewhere_s(p, CudnnConfig(0)) == 0
    assert "49 taps or more" in strategy.pruned(p, CudnnConfig(2), None)
    assert strategy.workspace_bytes(p, CudnnConfig(50)) == 4 * 1024 and fake.builds[-1] == 50  # built on demand
    assert strategy.built_elsewhere_s(p, CudnnConfig(50)) >= 0.02 and strategy.built_elsewhere_s(p, CudnnConfig(2)) == 0
    small = p.replace(kernel_size=(3, 3), padding=(1, 1))  # (a 3x3 depthwise layer: engines 0, 5, 6, 25, 61, 80)
    fake = _FakeFrontendGraph([(0, ()), (5, ()), (1, ()), (2, ())])
    graph.graph, graph.built, graph.deferred, graph.problem = fake, {}, {}, small
    graph.enumerate("fp32")
    assert fake.builds == [0, 5] and [c.engine for c in graph.deferred] == [1, 2]

    def barred(index):  # (the frontend bars a plan by its numerical notes only when it is built)
        raise RuntimeError("Deselecting execution plan")
    fake.build_plan_at_index = barred
    with pytest.raises(RuntimeError, match=r"cuDNN does not build plan cudnn\[eng2\] .*Deselecting.*the rules had "
                                           r"pruned it \(engine 2 on a float32 depthwise layer"):
        graph.plan(CudnnConfig(2))
    assert CudnnConfig(2) not in graph.build_times
    graph.built, graph.deferred, graph.build_times = {}, {}, {}  # (engines 0 and 5 fail to build while listing: no
    # candidates, their time the listing's)
    graph.enumerate("fp32")
    assert graph.failed_s > 0 and not graph.build_times


def test_a_listing_tells_its_parts_once(monkeypatch):
    """cuDNN's listing tells the planner its parts (Strategy.listing_parts): loading cuDNN, the operation graph, the
    heuristics and engines, the plans that failed to build (those that build are their candidates'); once, then nothing
    until the next listing."""
    from types import SimpleNamespace

    from convtune import ConvProblem
    from convtune.strategies import cudnn as module

    def load():
        time.sleep(0.01)
        return SimpleNamespace(), None

    class Graph:
        def __init__(self, cudnn, handle, p):
            time.sleep(0.01)

        def enumerate(self, math, dtype):
            self.heuristics_s, self.failed_s = 0.25, 1.5
            return [(CudnnConfig(0), 0)]
    monkeypatch.setattr(module.frontend, "load", load)
    monkeypatch.setattr(module._CTX, "handle", lambda cudnn, xp: object())
    monkeypatch.setattr(module._CTX, "candidates", {})
    monkeypatch.setattr(module._CTX, "enumerated", {})
    monkeypatch.setattr(module, "_Graph", Graph)
    strategy, gpu = get_strategy("cudnn"), SimpleNamespace(name="cupy", xp=None)
    p = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(16, 16), kernel_size=3, padding=1)
    assert strategy.supports(p, gpu) is None and strategy.candidates(p, gpu) == [CudnnConfig(0)]
    parts = strategy.listing_parts()
    assert parts["listing cudnn: loading cuDNN"] >= 0.02  # (both loads: supports' and the listing's)
    assert 0.01 <= parts["listing cudnn: operation graphs"] < 1.0
    assert parts["listing cudnn: heuristics and engines"] == 0.25 and parts["listing cudnn: plans that failed to build"] == 1.5
    assert strategy.listing_parts() == {}
    strategy.candidates(p, gpu)  # (listed already: no listing, no parts)
    assert strategy.listing_parts() == {}


def test_the_graphs_are_dropped_at_exit_once_a_handle_was_made(monkeypatch):
    """The first handle registers the release at exit (the frontend's module, going after them, reports the objects
    still held as leaks); the release drops every problem's graph and listing."""
    from types import SimpleNamespace

    from convtune.strategies import cudnn as module
    registered = []
    monkeypatch.setattr(module.atexit, "register", registered.append)
    ctx = module._Context()
    cp = SimpleNamespace(cuda=SimpleNamespace(Device=lambda: SimpleNamespace(id=0)))
    frontend = SimpleNamespace(create_handle=lambda: "handle")
    assert ctx.handle(frontend, cp) == "handle" and ctx.handle(frontend, cp) == "handle"
    assert registered == [ctx.release]
    ctx.enumerated["k"], ctx.candidates["k"] = object(), []
    registered[0]()
    assert not ctx.enumerated and not ctx.candidates
