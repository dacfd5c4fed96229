"""Planner behaviour with a fake timer: choice, rejection, failure isolation, budgets."""

import time
from dataclasses import dataclass

import numpy as np
import pytest

from convtune import Planner, TuningError
from convtune.strategies import get_strategy, register, unregister
from convtune.strategies.base import Config, Strategy
from cases import problem
from conftest import FakeTimer


@dataclass(frozen=True)
class EmptyConfig(Config):
    pass


def make_strategy(name, behaviour, workspace=0, supported=True, pruned=None):
    """A test strategy whose executor does ``behaviour(a, b, out, problem)`` (``pruned``: its rule)."""

    class TestStrategy(Strategy):
        config_type = EmptyConfig

        def pruned(self, p, config, backend, room=None):
            return pruned(p, config, backend) if pruned else None

        def supports(self, p, backend):
            return None if supported else "not for this test"

        def candidates(self, p, backend):
            return [EmptyConfig()]

        def workspace_bytes(self, p, config):
            return workspace

        def build(self, p, config, backend):
            from convtune.direct.reference import reference

            def run(a, b, out=None):
                return behaviour(a, b, out, p, reference)
            return run
    TestStrategy.name = name
    return TestStrategy


def correct(a, b, out, p, reference):
    if out is None:  # (called between conversions, for a problem the test strategies do not read: channels_last)
        return reference(np, p, a, b).astype(np.float32)
    out[...] = reference(np, p, a, b)
    return out


def slightly_wrong(a, b, out, p, reference):
    return correct(a, b, out, p, reference) * (1 + 1e-4) if out is None else \
        correct(a, b, out, p, reference).__imul__(1 + 1e-4)


def raises_memory(a, b, out, p, reference):
    raise MemoryError("simulated device out of memory")


def leaves_holes(a, b, out, p, reference):
    out[..., :1] = 0.0  # writes only part of the output: the NaN poison must catch it
    return out


def sleeps_then_correct(seconds):
    """A correct behaviour that first sleeps ``seconds`` (a slow candidate)."""

    def behaviour(a, b, out, p, reference):
        time.sleep(seconds)
        return correct(a, b, out, p, reference)
    return behaviour


@pytest.fixture
def extra_strategies():
    """``add(name, behaviour=correct, **kw)`` registers a test strategy for the test's duration (``add(cls)``: a
    strategy class of the test's own, one made by :func:`make_strategy` and changed)."""
    names = []

    def add(name, behaviour=correct, **kw):
        cls = name if isinstance(name, type) else make_strategy(name, behaviour, **kw)
        register(cls)
        names.append(cls.name)
        return cls.name
    yield add
    for n in names:
        unregister(n)


def test_fastest_candidate_wins_and_every_outcome_is_recorded(extra_strategies):
    extra_strategies("t-good", correct)
    timer = FakeTimer({"t-good": 0.001, "im2col[chunk=2]": 0.5}, default=2.0)
    d = Planner("numpy", timer).tune(problem("2d-odd"))
    assert d.winner.strategy == "t-good" and d.winner.status == "winner"
    assert d.winner.timing.median_s == 0.001
    statuses = {o.label: o.status for o in d.outcomes}
    assert statuses["im2col[chunk=2]"] == "ok"
    assert all(o.error is not None and o.error <= 1e-5 for o in d.outcomes if o.status in ("ok", "winner"))
    assert d.runner_up().label == "im2col[chunk=2]"
    assert d.speedup_over_next() == pytest.approx(500)
    assert len(timer.labels) == len([o for o in d.outcomes if o.timing is not None])


def test_a_wrong_candidate_is_rejected_with_its_error(extra_strategies):
    extra_strategies("t-wrong", slightly_wrong)
    timer = FakeTimer({"t-wrong": 1e-9})
    d = Planner("numpy", timer).tune(problem("2d-odd"))
    rejected = [o for o in d.outcomes if o.strategy == "t-wrong"][0]
    assert rejected.status == "rejected"
    assert rejected.error == pytest.approx(1e-4, rel=1e-2)
    assert "over the fp32 tolerance" in rejected.reason
    assert d.winner.strategy != "t-wrong"
    assert not any(label.startswith("t-wrong") for label in timer.labels)


def test_tf32_mode_accepts_what_fp32_rejects(extra_strategies):
    extra_strategies("t-wrong", slightly_wrong)
    timer = FakeTimer({"t-wrong[": 1e-9})
    d = Planner("numpy", timer).tune(problem("2d-odd", math="tf32"))
    assert d.winner.strategy == "t-wrong"
    assert d.winner.error == pytest.approx(1e-4, rel=1e-2)


def test_output_left_unwritten_is_rejected(extra_strategies):
    extra_strategies("t-holes", leaves_holes)
    d = Planner("numpy", FakeTimer()).tune(problem("2d-odd"))
    outcome = [o for o in d.outcomes if o.strategy == "t-holes"][0]
    assert outcome.status == "rejected" and outcome.error == float("inf")


def test_a_failing_candidate_is_recorded_and_tuning_goes_on(extra_strategies):
    extra_strategies("t-oom", raises_memory)
    d = Planner("numpy", FakeTimer()).tune(problem("2d-odd"))
    failed = [o for o in d.outcomes if o.strategy == "t-oom"][0]
    assert failed.status == "failed"
    assert failed.reason.startswith("out of memory")
    assert d.winner.strategy in ("im2col", "fft")


def test_a_strategy_that_raises_while_listing_is_recorded_and_tuning_goes_on(extra_strategies, caplog):
    """(fft-plane's supports() once raised on every 1-D problem, and each such problem's tuning failed whole.)"""
    name = extra_strategies("t-good", correct)
    cls = make_strategy("t-broken", correct)
    cls.supports = lambda self, problem, backend: (_ for _ in ()).throw(ValueError("not enough values to unpack"))
    extra_strategies(cls)
    with caplog.at_level("WARNING", logger="convtune"):
        d = Planner("numpy", FakeTimer({"t-good": 1e-9})).tune(problem("2d-odd"))
    broken = [o for o in d.outcomes if o.strategy == "t-broken"]
    assert [o.status for o in broken] == ["failed"] and "ValueError: not enough values" in broken[0].reason
    assert d.winner.strategy == name
    assert "t-broken" in caplog.text


def test_a_candidate_whose_workspace_raises_fails_alone(extra_strategies):
    name = extra_strategies("t-good", correct)
    cls = make_strategy("t-ws", correct)
    cls.workspace_bytes = lambda self, problem, config: 1 // 0
    extra_strategies(cls)
    d = Planner("numpy", FakeTimer({"t-good": 1e-9})).tune(problem("2d-odd"))
    failed = [o for o in d.outcomes if o.strategy == "t-ws"]
    assert [o.status for o in failed] == ["failed"] and "ZeroDivisionError" in failed[0].reason
    assert d.winner.strategy == name


def test_failure_during_timing_is_recorded(extra_strategies):
    extra_strategies("t-good", correct)

    class ExplodingTimer(FakeTimer):
        def __call__(self, fn, backend=None, label=""):
            if label.startswith("t-good"):
                raise RuntimeError("launch failed")
            return super().__call__(fn, backend, label)
    d = Planner("numpy", ExplodingTimer()).tune(problem("2d-odd"))
    failed = [o for o in d.outcomes if o.strategy == "t-good"][0]
    assert failed.status == "failed" and "launch failed" in failed.reason
    assert failed.error is not None


def test_workspace_budget_drops_candidates(extra_strategies):
    extra_strategies("t-huge", correct, workspace=10 ** 12)
    d = Planner("numpy", FakeTimer(), workspace_limit=10 ** 9).tune(problem("2d-odd"))
    huge = [o for o in d.outcomes if o.strategy == "t-huge"][0]
    assert huge.status == "over_budget" and huge.workspace_bytes == 10 ** 12
    assert "over the limit" in huge.reason


def test_unsupported_strategies_say_why(extra_strategies):
    extra_strategies("t-never", correct, supported=False)
    d = Planner("numpy", FakeTimer()).tune(problem("2d-odd"))
    never = [o for o in d.outcomes if o.strategy == "t-never"][0]
    assert never.status == "unsupported" and never.reason == "not for this test"


def test_no_survivor_raises_tuning_error_with_the_record(extra_strategies):
    extra_strategies("t-wrong", slightly_wrong)
    with pytest.raises(TuningError, match="no candidate survived") as info:
        Planner("numpy", FakeTimer(), strategies=["t-wrong"]).tune(problem("2d-odd"))
    assert [o.status for o in info.value.decision.outcomes] == ["rejected"]


def test_a_lone_survivor_is_not_timed(extra_strategies):
    extra_strategies("t-good", correct)
    timer = FakeTimer()
    d = Planner("numpy", timer, strategies=["t-good"]).tune(problem("2d-odd"))
    assert timer.labels == []
    assert d.winner.strategy == "t-good" and d.winner.timing is None
    assert "not timed" in d.winner.reason


def test_time_budget_skips_the_rest_but_times_at_least_one():
    timer = FakeTimer()
    d = Planner("numpy", timer, time_budget_s=0.0).tune(problem("2d-large-kernel"))
    # the first candidate, and PyTorch's convolution (where PyTorch is installed, the reference point is always
    # timed: first, where its run on the verification batch was the fastest, or after the first)
    reference = [label for label in timer.labels if label.startswith("torch[")]
    assert len(timer.labels) - len(reference) == (0 if timer.labels[0].startswith("torch[") else 1)
    assert len(reference) == (get_strategy("torch").supports(problem("2d-large-kernel"), Planner("numpy").backend)
                              is None)
    skipped = [o for o in d.outcomes if o.status == "skipped"]
    assert skipped and all("time budget" in o.reason for o in skipped)


def test_unknown_strategy_names_are_refused():
    with pytest.raises(ValueError, match="registered strategies"):
        Planner("numpy", strategies=["nope"])


def test_verification_runs_on_a_reduced_batch(extra_strategies):
    seen = []

    def recording(a, b, out, p, reference):
        seen.append(a.shape[0])
        return correct(a, b, out, p, reference)
    extra_strategies("t-rec", recording)
    Planner("numpy", FakeTimer(), verify_batch=1).tune(problem("2d-odd", batch=6))
    assert seen[0] == 1 and 6 in seen[1:]


def test_real_cpu_timer_produces_statistics():
    d = Planner("numpy", strategies=["im2col"]).tune(problem("2d-odd"))
    for o in d.outcomes:
        if o.timing is not None:
            assert o.timing.median_s > 0 and o.timing.repeats >= 1 and o.timing.spread_s >= 0


def test_survivors_are_timed_fastest_first(extra_strategies, monkeypatch):
    monkeypatch.setattr("convtune.planner.SLOW_FACTOR", 1e9)  # (slower, not hopelessly so)
    extra_strategies("t-slow", sleeps_then_correct(0.02))
    extra_strategies("t-fast", correct)
    timer = FakeTimer()
    Planner("numpy", timer, strategies=["t-slow", "t-fast"]).tune(problem("2d-odd"))
    assert [label.split("[")[0] for label in timer.labels] == ["t-fast", "t-slow"]


def test_a_hopelessly_slow_candidate_is_skipped_not_timed(extra_strategies, monkeypatch):
    monkeypatch.setattr("convtune.planner.SLOW_FLOOR_S", 0.0)
    extra_strategies("t-fast", correct)
    extra_strategies("t-crawl", sleeps_then_correct(0.05))
    timer = FakeTimer()
    d = Planner("numpy", timer, strategies=["t-fast", "t-crawl"]).tune(problem("2d-odd"))
    crawled = [o for o in d.outcomes if o.strategy == "t-crawl"][0]
    assert crawled.status == "skipped" and "slower than the best" in crawled.reason
    assert not any(label.startswith("t-crawl") for label in timer.labels)


def test_a_hopelessly_slow_candidate_verified_first_is_skipped_too(extra_strategies, monkeypatch):
    """Judged against the best of all the verified, not the best so far: a slow strategy listed before the fast
    ones (as im2col is before the FFT paths on a large kernel) is not timed either."""
    monkeypatch.setattr("convtune.planner.SLOW_FLOOR_S", 0.0)
    extra_strategies("t-crawl", sleeps_then_correct(0.05))
    extra_strategies("t-fast", correct)
    timer = FakeTimer()
    d = Planner("numpy", timer, strategies=["t-crawl", "t-fast"]).tune(problem("2d-odd"))
    crawled = [o for o in d.outcomes if o.strategy == "t-crawl"][0]
    assert crawled.status == "skipped" and "slower than the best" in crawled.reason
    assert crawled.verify_s > 0.05  # verified (and its verification's cost recorded) before it was judged
    assert not any(label.startswith("t-crawl") for label in timer.labels) and d.winner.strategy == "t-fast"


def test_a_candidate_whose_warm_run_stalls_once_is_run_again_and_timed(extra_strategies):
    """A warm run slower than the floor is run once more and the faster counts: one stall (a garbage collection, a
    lazy load) does not rule out a candidate verified before the others, which had no best to be slow against."""
    calls = []

    def stalls_on_its_warm_run(a, b, out, p, reference):
        calls.append(a.shape[0])
        if len(calls) == 2:  # (the first run, then its warm run)
            time.sleep(0.05)
        return correct(a, b, out, p, reference)
    extra_strategies("t-stall", stalls_on_its_warm_run)
    extra_strategies("t-fast", correct)
    timer = FakeTimer()
    d = Planner("numpy", timer, strategies=["t-stall", "t-fast"], verify_batch=1).tune(problem("2d-odd", batch=1))
    stalled = [o for o in d.outcomes if o.strategy == "t-stall"][0]
    assert stalled.status in ("winner", "ok"), stalled.reason
    assert any(label.startswith("t-stall") for label in timer.labels)
    assert len(calls) >= 3 and stalled.warm_run_s < 0.05


def wrong_past_two_samples(a, b, out, p, reference):
    """Exact on the verification batch, off by 1e-4 on larger ones (like a lossy filter-gradient sum)."""
    out[...] = reference(np, p, a, b) * (1 + (1e-4 if p.batch > 2 else 0.0))
    return out


def test_filter_gradient_winner_is_checked_again_on_the_full_batch(extra_strategies):
    extra_strategies("t-lossy", wrong_past_two_samples)
    timer = FakeTimer({"t-lossy": 1e-6}, default=1.0)
    wgrad = problem("2d-odd", "wgrad", batch=6)
    d = Planner("numpy", timer).tune(wgrad)
    lossy = next(o for o in d.outcomes if o.strategy == "t-lossy")
    assert lossy.status == "rejected" and "full batch of 6" in lossy.reason
    assert lossy.error == pytest.approx(1e-4, rel=1e-2)
    assert d.winner.strategy != "t-lossy" and d.winner.error <= 1e-5
    # the forward pass does not sum over the batch: no second check, the fast candidate wins
    assert Planner("numpy", timer).tune(problem("2d-odd", "fwd", batch=6)).winner.strategy == "t-lossy"


def test_strategies_are_told_every_outcome_and_the_winner_once_a_search_ends(extra_strategies):
    """Strategy.observe sees the whole search (its rules may learn from it); a strategy whose lesson fails
    costs nothing but a warning."""
    seen = []

    class Watching(make_strategy("t-watch", correct)):
        def observe(self, p, outcomes, winner):
            seen.append((p, [o.label for o in outcomes], winner.label))

    class Broken(make_strategy("t-broken", sleeps_then_correct(0.005))):
        def observe(self, p, outcomes, winner):
            raise RuntimeError("no lesson")
    extra_strategies(Watching)
    extra_strategies(Broken)
    p = problem("2d-odd")
    d = Planner("numpy", FakeTimer({"t-watch": 0.001}, default=2.0)).tune(p)
    assert d.winner.strategy == "t-watch"
    assert len(seen) == 1 and seen[0][0] == p and seen[0][2] == d.winner.label
    assert seen[0][1] == [o.label for o in d.outcomes]


def test_strategies_prepare_their_candidates_before_verification(extra_strategies):
    """Strategy.prepare gets each strategy's candidates once, before any is verified, and its time is a phase
    of the search; a failing prepare costs nothing (the candidates' own builds say what is wrong)."""
    events = []

    class Preparing(make_strategy("t-prep", correct)):
        def prepare(self, p, configs, backend):
            events.append(("prepare", len(configs)))
            time.sleep(0.01)

        def build(self, p, config, backend):
            events.append(("build", p.batch))
            return super().build(p, config, backend)

    class Broken(make_strategy("t-unprepared", correct)):
        def prepare(self, p, configs, backend):
            raise RuntimeError("cannot prepare")
    extra_strategies(Preparing)
    extra_strategies(Broken)
    d = Planner("numpy", FakeTimer({"t-prep": 0.001}, default=2.0)).tune(problem("2d-odd"))
    assert events[0] == ("prepare", 1) and ("build", 2) in events[1:]
    assert d.phases["preparing t-prep"] >= 0.01 and "preparing t-prep-broken" not in d.phases
    assert d.winner.strategy == "t-prep"
    assert any(o.strategy == "t-unprepared" and o.status == "ok" for o in d.outcomes)


def test_a_strategy_prepares_by_compiling_its_kernel_builds_at_once(extra_strategies, monkeypatch):
    """By default Strategy.prepare hands the configs' kernel_builds to build_concurrently, in one call; the planner's
    builds ahead (builds_ahead) are the kernel builds of a strategy that has them, none of one that has neither."""
    from convtune import compiling
    handed, compiled = [], []
    monkeypatch.setattr(compiling, "build_concurrently", lambda builds, backend: handed.append(list(builds)) or 0)

    class Compiling(make_strategy("t-kernels", correct)):
        def kernel_builds(self, p, configs, backend):
            return [lambda c=c: compiled.append(c) for c in configs]
    extra_strategies(Compiling)
    p = problem("2d-odd")
    get_strategy("t-kernels").prepare(p, [EmptyConfig(), EmptyConfig()], None)
    assert len(handed) == 1 and len(handed[0]) == 2 and not compiled
    handed.clear()
    builds = Planner("numpy", FakeTimer(), strategies=["t-kernels", "im2col"]).builds_ahead(p)
    assert len(builds) == 1 and not handed and not compiled  # (im2col has nothing to compile: none of its)
    builds[0]()
    assert compiled == [EmptyConfig()]


def test_compile_ahead_compiles_the_kernels_of_stored_winners_at_once(extra_strategies, monkeypatch):
    """convtune.building.compile_ahead: every decision's winner's kernel builds in one build_concurrently; a winner
    whose strategy is not here is counted failed, the others compiled all the same."""
    import dataclasses
    from convtune import compiling
    from convtune.building import compile_ahead
    handed, compiled = [], []

    def run_all(builds, backend):
        handed.append(len(builds))
        for build in builds:
            build()
        return 0
    monkeypatch.setattr(compiling, "build_concurrently", run_all)

    class Compiling(make_strategy("t-kernels", correct)):
        def kernel_builds(self, p, configs, backend):
            return [lambda: compiled.append(p.pass_) for _c in configs]
    extra_strategies(Compiling)
    planner = Planner("numpy", FakeTimer({"t-kernels": 0.001}, default=2.0), strategies=["t-kernels", "im2col"])
    decisions = [planner.tune(problem("2d-odd").for_pass(pass_)) for pass_ in ("fwd", "dgrad", "wgrad")]
    assert all(d.winner.strategy == "t-kernels" for d in decisions)
    handed.clear(), compiled.clear()  # (the searches prepared their candidates)
    gone = dataclasses.replace(decisions[0], winner=dataclasses.replace(decisions[0].winner, strategy="t-not-here"))
    assert compile_ahead(decisions + [gone], planner.backend) == 1
    assert handed == [3] and compiled == ["fwd", "dgrad", "wgrad"]


def costly_strategy(name, behaviour, builds, workspace=0):
    """A test strategy whose builds are costly (verified at the full batch), each build noted in ``builds``."""
    class Costly(make_strategy(name, behaviour, workspace=workspace)):
        def verified_at_full_batch(self, p, config):
            return True

        def build(self, p, config, backend):
            builds.append((name, p.batch))
            return super().build(p, config, backend)
    return Costly


def test_costly_builds_are_verified_at_the_full_batch_and_timed_as_built(extra_strategies):
    """A configuration the strategy says is costly to build (a runtime compilation per shape) is built once, for
    the full batch: verified there on the verification operands zero-extended along the batch, and that executor
    is timed. Wrong results are still rejected, in every pass and layout."""
    builds = []
    extra_strategies(costly_strategy("t-costly", correct, builds))
    extra_strategies(costly_strategy("t-costly-wrong", slightly_wrong, builds))
    timer = FakeTimer({"t-costly": 1e-6, "t-costly-wrong": 1e-7}, default=1.0)
    for pass_ in ("fwd", "dgrad", "wgrad"):
        for layout in ("channels_first", "channels_last"):
            builds.clear()
            p = problem("2d-odd", pass_, batch=6, layout=layout)
            d = Planner("numpy", timer, verify_batch=2).tune(p)
            assert d.winner.strategy == "t-costly", (pass_, layout)
            assert d.winner.error <= 1e-6
            wrong = next(o for o in d.outcomes if o.strategy == "t-costly-wrong")
            assert wrong.status == "rejected" and wrong.error == pytest.approx(1e-4, rel=1e-2)
            # once each, never at the verification batch (a filter gradient's winner is checked again on random
            # full-batch operands, built again as every strategy's is)
            assert builds == [("t-costly", 6), ("t-costly-wrong", 6)] + [("t-costly", 6)] * (pass_ == "wgrad")
    # a strategy that does not say so is built at both batches, as before
    builds.clear()

    class Plain(make_strategy("t-plain", correct)):
        def build(self, p, config, backend):
            builds.append(("t-plain", p.batch))
            return super().build(p, config, backend)
    extra_strategies(Plain)
    Planner("numpy", FakeTimer({"t-plain": 1e-8}, default=1.0), verify_batch=2).tune(problem("2d-odd", batch=6))
    assert [b for b in builds if b[0] == "t-plain"] == [("t-plain", 2), ("t-plain", 6)]


def test_full_batch_executors_are_kept_for_their_timing_within_a_memory_budget(extra_strategies, monkeypatch):
    """A full-batch executor built for verification is timed as built while the kept executors' workspaces stay
    within PREBUILT_BYTES; past it, it is built again for its timing, so that the memory it holds is free meanwhile."""
    import convtune.planner as planner_module
    monkeypatch.setattr(planner_module, "PREBUILT_BYTES", 3 << 20)
    builds = []
    for name, ws in (("t-small-ws", 1 << 20), ("t-big-ws", 4 << 20), ("t-small-ws-2", 2 << 20)):
        extra_strategies(costly_strategy(name, correct, builds, workspace=ws))
    Planner("numpy", FakeTimer({"t-small-ws": 1e-7, "t-big-ws": 2e-7, "t-small-ws-2": 3e-7}, default=1.0),
            verify_batch=2).tune(problem("2d-odd", batch=6))
    counts = {name: builds.count((name, 6)) for name in ("t-small-ws", "t-big-ws", "t-small-ws-2")}
    assert counts == {"t-small-ws": 1, "t-big-ws": 2, "t-small-ws-2": 1}, builds  # (1 + 2 MiB kept; 4 MiB not)
    assert all(batch == 6 for _name, batch in builds)


def test_a_costly_build_that_fails_its_full_batch_verification_is_recorded(extra_strategies):
    class CostlyBroken(make_strategy("t-costly-broken", raises_memory)):
        def verified_at_full_batch(self, p, config):
            return True
    extra_strategies(CostlyBroken)
    d = Planner("numpy", FakeTimer(), verify_batch=2).tune(problem("2d-odd", batch=6))
    broken = next(o for o in d.outcomes if o.strategy == "t-costly-broken")
    assert broken.status == "failed" and "out of memory" in broken.reason
    assert d.winner.strategy != "t-costly-broken"


def writes_past_the_samples(a, b, out, p, reference):
    """Right on the first two samples, garbage on the others (a batch stride gone wrong past them)."""
    out = correct(a, b, out, p, reference)
    out[2:] += 1.0
    return out


def test_a_costly_build_is_checked_on_the_zero_samples_too(extra_strategies):
    """Zero-extended operands give zero results past the verification samples: an executor that writes anything
    else there is rejected, as one wrong on the verification samples is."""
    class Striding(make_strategy("t-costly-striding", writes_past_the_samples)):
        def verified_at_full_batch(self, p, config):
            return True
    extra_strategies(Striding)
    d = Planner("numpy", FakeTimer({"t-costly-striding": 1e-9}, default=1.0), verify_batch=2).tune(
        problem("2d-odd", batch=6))
    striding = next(o for o in d.outcomes if o.strategy == "t-costly-striding")
    assert striding.status == "rejected" and striding.error > 0.1


def test_the_verification_batch_runs_the_strategys_verification_config_and_the_full_batch_its_own(extra_strategies):
    """A strategy may verify a cheaper configuration at the verification batch (PyTorch's call without its algorithm
    search, which picks for that batch only): the planner builds that one there, and the candidate's own at the full
    batch it times and stores."""
    @dataclass(frozen=True)
    class Searching(Config):
        search: bool = True

    built = []
    cls = make_strategy("t-searching", correct)
    cls.config_type = Searching
    cls.candidates = lambda self, p, backend: [Searching()]
    cls.verification_config = lambda self, config: Searching(search=False)
    plain = cls.build
    cls.build = lambda self, p, config, backend: built.append((p.batch, config.search)) or plain(self, p, config,
                                                                                                    backend)
    searching, other = extra_strategies(cls), extra_strategies("t-other")
    d = Planner("numpy", FakeTimer({"t-searching": 0.001}, default=1.0), strategies=[searching, other],
                verify_batch=1).tune(problem("2d-odd"))
    assert d.winner.config == {"search": True}
    assert built[0] == (1, False) and (2, True) in built[1:]  # (the problem's batch is 2)


def test_pytorchs_call_is_verified_without_its_algorithm_search():
    from convtune.strategies.pytorch import TorchConfig
    torch = get_strategy("torch")
    assert torch.verification_config(TorchConfig(benchmark=True)) == TorchConfig(benchmark=False)
    assert get_strategy("im2col").verification_config("any") == "any"


def test_pytorchs_search_is_floored_by_its_heuristic_pick_measured_on_a_thread_of_its_own(monkeypatch):
    """The torch strategy's floor (Strategy.lower_bound): only for its searched configuration on the GPU, only where
    the heuristic pick's warm run, scaled to the full batch, is a quarter of the search's expected gain times the best
    or more (else nothing is measured), then the pick's median (measured on another thread, on the operands' device)
    over that gain (search_gain: the general bound here)."""
    import contextlib
    import threading
    import types

    from convtune.strategies import pytorch
    torch_strategy, searched = get_strategy("torch"), pytorch.TorchConfig(benchmark=True)
    calls = []

    def median(self, p, backend, a, b):
        calls.append((threading.get_ident(), p, a, b))
        return 0.128
    monkeypatch.setattr(pytorch.TorchStrategy, "_heuristic_median", median)
    devices = []

    class Array:
        device = types.SimpleNamespace(id=1)
    cuda = types.SimpleNamespace(Device=lambda i: devices.append(i) or contextlib.nullcontext())
    gpu = types.SimpleNamespace(name="cupy", xp=types.SimpleNamespace(cuda=cuda), synchronize=lambda: None)
    p, a, b = problem("2d-odd"), Array(), Array()
    gain = pytorch.search_gain(p)
    assert gain == pytorch.SEARCH_GAIN
    assert torch_strategy.lower_bound(p, pytorch.TorchConfig(benchmark=False), gpu, (a, b), 1e-3, 1.0) is None
    assert torch_strategy.lower_bound(p, searched, types.SimpleNamespace(name="numpy"),
                                      (a, b), 1e-3, 1.0) is None
    assert torch_strategy.lower_bound(p, searched, gpu, (a, b), 1e-3, 0.99 * gain / 4 * 1e-3) is None and not calls
    floor, why = torch_strategy.lower_bound(p, searched, gpu, (a, b), 1e-3, gain / 4 * 1e-3)
    assert floor == pytest.approx(0.128 / gain) and "0.128" not in why and "128.000 ms" in why
    assert calls[0][0] != threading.get_ident() and calls[0][1:] == (p, a, b) and devices == [1]
    assert torch_strategy.lower_bound(p, searched, gpu, (a, b), 1e-3, None)[0] == pytest.approx(0.128 / gain)


def test_pytorchs_search_is_expected_to_gain_less_on_large_depthwise_kernels_in_half_precision(monkeypatch):
    """search_gain: the bound on what the search buys over cuDNN's heuristic pick is tighter on 2-D depthwise layers of
    kernels 11x11 or more in bfloat16 (measured there: 3.1x at most), and the general one elsewhere: float32, smaller or
    dense kernels, other ranks. The floor divides the heuristic pick's time by it."""
    import contextlib
    import types

    from convtune.problem import ConvProblem
    from convtune.strategies import pytorch

    def make(**kw):
        shape = dict(batch=16, in_channels=96, out_channels=96, input_size=(56, 56), kernel_size=51, padding=25,
                     groups=96, dtype="bfloat16", layout="channels_last")
        return ConvProblem.make(**{**shape, **kw})
    large = make()
    assert pytorch.search_gain(large) == pytorch.LARGE_DEPTHWISE_HALF_GAIN < pytorch.SEARCH_GAIN
    assert pytorch.search_gain(make(kernel_size=11, padding=5)) == pytorch.LARGE_DEPTHWISE_HALF_GAIN
    assert pytorch.search_gain(large.for_pass("dgrad")) == pytorch.LARGE_DEPTHWISE_HALF_GAIN
    for other in (make(dtype="float32", layout="channels_first"), make(kernel_size=7, padding=3),
                  make(kernel_size=(51, 7), padding=(25, 3)), make(groups=1), make(groups=48),
                  make(input_size=(4096,), kernel_size=4095, padding=2047)):
        assert pytorch.search_gain(other) == pytorch.SEARCH_GAIN, other.describe()

    strategy, searched = get_strategy("torch"), pytorch.TorchConfig(benchmark=True)
    cuda = types.SimpleNamespace(Device=lambda i: contextlib.nullcontext())
    gpu = types.SimpleNamespace(name="cupy", synchronize=lambda: None, xp=types.SimpleNamespace(cuda=cuda))
    array = types.SimpleNamespace(device=types.SimpleNamespace(id=0))
    picks = []
    monkeypatch.setattr(pytorch.TorchStrategy, "_heuristic_median",
                        lambda self, p, backend, a, b: picks.append(p) or 0.016)
    floor, why = strategy.lower_bound(large, searched, gpu, (array, array), 1e-3, None)
    assert floor == pytest.approx(0.016 / pytorch.LARGE_DEPTHWISE_HALF_GAIN) and "8x faster" in why and picks == [large]
    # (measured only where the scaled estimate is a quarter of that gain times the best or more)
    assert strategy.lower_bound(large, searched, gpu, (array, array), 1e-3, 1.9e-3) is None


def test_the_search_measurement_says_what_each_bound_holds_and_where_a_gain_is_over_it():
    """benchmarks/torch_search.py ends with each bound of search_gain and the largest gain seen under it, and says so
    where a gain is over its bound (the bound then needs refitting)."""
    import importlib.util
    from pathlib import Path
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location(
        "torch_search", Path(__file__).resolve().parent.parent / "benchmarks" / "torch_search.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    rows = [{"bound": 64.0, "gain": 48.8, "describe": "3x3 wgrad"}, {"bound": 64.0, "gain": 1.0, "describe": "1x1"},
            {"bound": 8.0, "gain": 3.1, "describe": "31x31 fwd"}, {"bound": 8.0, "gain": 9.5, "describe": "51x51"}]
    assert script.bound_lines(rows) == ["search_gain 8x: 2 problems, the largest gain 9.50x (51x51); OVER THE BOUND",
                                        "search_gain 64x: 2 problems, the largest gain 48.80x (3x3 wgrad)"]
    assert script.bound_lines(rows[:3])[0] == "search_gain 8x: 1 problem, the largest gain 3.10x (31x31 fwd)"


@dataclass(frozen=True)
class SizeConfig(Config):
    size: int = 0


def test_builds_ahead_prepare_what_the_search_will_and_record_nothing(extra_strategies):
    prepared = []

    def compiling(name, supported=True):
        class Compiling(make_strategy(name, correct, supported=supported,
                                      pruned=lambda p, c, b: "too small" if c.size == 1 else None)):
            config_type = SizeConfig

            def candidates(self, p, backend):
                return [SizeConfig(1), SizeConfig(2), SizeConfig(3)]

            def prepare(self, p, configs, backend):
                prepared.append((self.name, p.pass_, [c.size for c in configs]))
        Compiling.name = name
        return extra_strategies(Compiling)
    names = [compiling("t-compiles"), compiling("t-elsewhere", supported=False), extra_strategies("t-plain")]
    planner = Planner("numpy", strategies=names)
    assert planner.builds_ahead(problem("2d-odd", "dgrad")) == []  # (a prepare of its own: run, not handed back)
    assert prepared == [("t-compiles", "dgrad", [2, 3])]  # (pruned and unsupported left out, as the search would)
    Planner("numpy", strategies=names, exhaustive=True).builds_ahead(problem("2d-odd"))
    assert prepared[-1] == ("t-compiles", "fwd", [1, 2, 3])
    d = planner.tune(problem("2d-odd", "dgrad"))
    assert prepared[-1] == ("t-compiles", "dgrad", [2, 3]) and len(prepared) == 3  # the search prepares as before
    assert {o.strategy for o in d.outcomes} >= {"t-compiles", "t-plain"}


def test_a_strategy_that_tells_the_parts_of_its_listing_has_them_as_phases(extra_strategies):
    """A strategy's listing parts (Strategy.listing_parts: cuDNN's operation graphs, heuristics and plan builds) are
    phases of the search, the listing's phase then its rest; a strategy that tells none has one listing phase."""
    class Parted(make_strategy("t-parts", correct)):
        told = []

        def candidates(self, p, backend):
            time.sleep(0.02)
            self.told.append({"listing t-parts: building plans": 0.015})
            return super().candidates(p, backend)

        def listing_parts(self):
            return self.told.pop() if self.told else {}
    extra_strategies(Parted)
    d = Planner("numpy", FakeTimer({"t-parts": 0.001}, default=2.0)).tune(problem("2d-odd"))
    assert d.phases["listing t-parts: building plans"] == 0.015
    assert 0.004 <= d.phases["listing t-parts: the rest"] < 0.5 and "listing t-parts" not in d.phases
    assert "listing im2col" in d.phases and not any(k.startswith("listing im2col:") for k in d.phases)


def test_a_build_while_listing_or_asked_the_workspace_is_its_candidates_build_and_counted_once(extra_strategies):
    """Seconds a strategy spent building a candidate while listing, or when its workspace was asked
    (Strategy.built_elsewhere_s: cuDNN's plans), are that candidate's build_s, not the listing's phase: the search's
    phases and its candidates' costs still add up to no more than its time."""
    class Built(make_strategy("t-built", correct)):
        pending = {}

        def candidates(self, p, backend):
            time.sleep(0.03)  # (building while listing)
            self.pending[EmptyConfig()] = 0.03
            return super().candidates(p, backend)

        def built_elsewhere_s(self, p, config):
            return self.pending.pop(config, 0.0)
    extra_strategies(Built)
    d = Planner("numpy", FakeTimer({"t-built": 0.001}, default=2.0)).tune(problem("2d-odd"))
    built = next(o for o in d.outcomes if o.strategy == "t-built")
    assert built.build_s >= 0.03 and d.phases["listing t-built"] < 0.03
    spent = sum((o.build_s or 0) + (o.verify_s or 0) + (o.timing_s or 0) for o in d.outcomes)
    assert sum(d.phases.values()) + spent <= d.tuning_s + 1e-6


def floored(name, floor_s, seen):
    """A test strategy that puts ``floor_s`` under its median (``None``: none), recording what the planner told it; its
    verification runs are slower than ``correct``'s, so that it is timed after such a strategy's."""
    class Floored(make_strategy(name, sleeps_then_correct(0.005))):  # (timed after t-fast: slower when verified)
        def lower_bound(self, p, config, backend, operands, best_s, estimate_s):
            seen.append((best_s, estimate_s, tuple(x.shape for x in operands)))
            return None if floor_s is None else (floor_s, "a floor for the test")
    Floored.name = name
    return Floored


def test_a_candidate_whose_floor_is_above_the_best_so_far_is_not_timed(extra_strategies, monkeypatch):
    """Strategy.lower_bound: asked once a best median is known, with the full problem's operands and the candidate's
    warm run scaled to the full batch; a floor over the best skips the candidate untimed, with the strategy's reason and
    the floor's cost as its timing cost; a floor under the best, or none, leaves it timed; an exhaustive search asks
    none."""
    monkeypatch.setattr("convtune.planner.SLOW_FACTOR", 1e9)
    seen = []
    extra_strategies("t-fast", correct)
    extra_strategies(floored("t-floor", 0.01, seen))
    p = problem("2d-odd", batch=6)
    timer = FakeTimer({"t-fast": 0.001, "t-floor": 0.0005})
    d = Planner("numpy", timer, strategies=["t-fast", "t-floor"], verify_batch=2).tune(p)
    floor = next(o for o in d.outcomes if o.strategy == "t-floor")
    assert floor.status == "skipped" and floor.timing is None and "a floor for the test" in floor.reason
    assert "10.000 ms, 10.00x the best so far" in floor.reason and floor.timing_s >= 0
    assert d.winner.strategy == "t-fast" and not any(label.startswith("t-floor") for label in timer.labels)
    best_s, estimate_s, shapes = seen[0]
    assert best_s == 0.001 and shapes == p.operand_shapes
    assert estimate_s == pytest.approx(3 * next(o for o in d.outcomes if o.strategy == "t-floor").warm_run_s)
    # a floor at or under the best: timed (and here it wins)
    extra_strategies(floored("t-low", 0.001, seen))
    timer = FakeTimer({"t-fast": 0.001, "t-low": 0.0005, "t-floor": 0.0005})
    d = Planner("numpy", timer, strategies=["t-fast", "t-low"]).tune(p)
    assert d.winner.strategy == "t-low" and seen[-1][0] == 0.001
    asked = len(seen)
    d = Planner("numpy", timer, strategies=["t-fast", "t-floor"], exhaustive=True).tune(p)
    assert len(seen) == asked and d.winner.strategy == "t-floor"


def test_a_floor_that_raises_leaves_the_candidate_timed(extra_strategies, monkeypatch):
    monkeypatch.setattr("convtune.planner.SLOW_FACTOR", 1e9)

    class Broken(make_strategy("t-broken", sleeps_then_correct(0.005))):
        def lower_bound(self, *args):
            raise RuntimeError("no floor today")
    extra_strategies("t-fast", correct)
    extra_strategies(Broken)
    timer = FakeTimer({"t-fast": 0.001, "t-broken": 0.0005})
    d = Planner("numpy", timer, strategies=["t-fast", "t-broken"]).tune(problem("2d-odd"))
    assert d.winner.strategy == "t-broken"


def test_a_floors_cost_counts_against_the_time_budget(extra_strategies, monkeypatch):
    monkeypatch.setattr("convtune.planner.SLOW_FACTOR", 1e9)

    class SlowFloor(make_strategy("t-slow-floor", sleeps_then_correct(0.005))):
        def lower_bound(self, *args):
            time.sleep(0.05)  # (no floor found, after a while)
            return None
    extra_strategies("t-fast", correct)
    extra_strategies(SlowFloor)
    extra_strategies("t-third", sleeps_then_correct(0.02))
    d = Planner("numpy", FakeTimer(), strategies=["t-fast", "t-slow-floor", "t-third"],
                time_budget_s=0.03).tune(problem("2d-odd"))
    status = {o.strategy: (o.status, o.reason) for o in d.outcomes}
    assert status["t-slow-floor"][0] == "ok" and status["t-slow-floor"][1] == ""
    assert status["t-third"] == ("skipped", "time budget of 0.03 s spent")


@dataclass(frozen=True)
class NumberedConfig(Config):
    i: int = 0


def rounds_strategies(extra_strategies, waits_from=1, configs=3, reference_floor=None, reference=correct):
    """A point of reference (``t-ref``, always timed, like PyTorch's call; ``reference_floor``: its floor;
    ``reference``: its behaviour) and a
    strategy of ``configs`` candidates ``t-many[i=N]`` of which those from ``waits_from`` on wait for the second
    round; returns the names and the configurations each strategy built, in order."""
    built = []

    class Reference(make_strategy("t-ref", reference)):
        always_timed = True

        def build(self, p, config, backend):
            built.append(self.describe(config))
            return super().build(p, config, backend)

        def lower_bound(self, p, config, backend, operands, best_s, estimate_s):
            return None if reference_floor is None else (reference_floor, "a floor for the test")
    Reference.name = "t-ref"

    class Many(make_strategy("t-many", correct)):
        config_type = NumberedConfig

        def candidates(self, p, backend):
            return [NumberedConfig(i) for i in range(configs)]

        def second_round(self, p, config, rank):
            assert rank == config.i  # (its place in the list)
            return "waits for the test" if rank >= waits_from else None

        def build(self, p, config, backend):
            built.append(self.describe(config))
            return super().build(p, config, backend)
    Many.name = "t-many"
    return [extra_strategies(Reference), extra_strategies(Many)], built


def test_waiting_candidates_are_left_untried_where_the_first_round_does_not_beat_the_reference(extra_strategies):
    """Strategy.second_round: the first round (the reference and the candidates that do not wait) is verified and
    timed; where none beats the reference by FIRST_ROUND_MARGIN, the waiting candidates are recorded skipped with
    both times, never built; within the margin the faster of the first round still wins."""
    names, built = rounds_strategies(extra_strategies)
    timer = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.00098, "t-many": 0.0001})
    d = Planner("numpy", timer, strategies=names).tune(problem("2d-odd"))
    assert sorted(timer.labels) == ["t-many[i=0]", "t-ref[]"]
    assert not any(label in built for label in ("t-many[i=1]", "t-many[i=2]"))
    waiting = [o for o in d.outcomes if o.label in ("t-many[i=1]", "t-many[i=2]")]
    assert [o.status for o in waiting] == ["skipped", "skipped"]
    assert all(o.reason == "second round not run: no candidate of the first beat t-ref[] (1.000 ms) by 1.05x "
                           "(the best, t-many[i=0], 0.980 ms)" for o in waiting)
    assert all(o.timing is None and o.workspace_bytes == 0 and o.rank in (1, 2) for o in waiting)
    assert d.winner.label == "t-many[i=0]"


def test_the_second_round_runs_where_the_first_beat_the_reference_on_the_same_operands(extra_strategies, monkeypatch):
    """A first round that beats the reference by the margin: the waiting candidates are verified on the same
    operands and float64 reference (made once) and timed; a faster one wins."""
    names, built = rounds_strategies(extra_strategies)
    references = []
    reference = type(get_strategy("reference"))
    build = reference.build
    monkeypatch.setattr(reference, "build", lambda self, *args: references.append(args) or build(self, *args))
    timer = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.0009, "t-many[i=1]": 0.0005, "t-many[i=2]": 0.002})
    d = Planner("numpy", timer, strategies=names).tune(problem("2d-odd"))
    assert sorted(timer.labels) == ["t-many[i=0]", "t-many[i=1]", "t-many[i=2]", "t-ref[]"]
    assert d.winner.label == "t-many[i=1]"
    assert {o.label: o.status for o in d.outcomes} == {"t-ref[]": "ok", "t-many[i=0]": "ok", "t-many[i=1]": "winner",
                                                       "t-many[i=2]": "ok"}
    assert len(references) == 1  # (the verification's float64 reference, for both rounds)
    assert d.phases["the second round's workspaces"] >= 0  # (a waiting cuDNN plan is built when asked its workspace)


def test_candidates_their_strategy_leaves_out_of_the_second_round_are_not_tried_in_it(extra_strategies):
    """Strategy.left_out_of_second_round: where the second round runs, a waiting candidate its strategy leaves out is
    recorded skipped with the reason as a rule's, never built or timed; where the round does not run it is skipped for
    that reason, like the others; an exhaustive search tries it."""
    names, built = rounds_strategies(extra_strategies)
    many = type(get_strategy("t-many"))
    many.left_out_of_second_round = lambda self, p, config, rank: "left out for the test" if config.i == 2 else None
    timer = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.0009, "t-many[i=1]": 0.0005, "t-many[i=2]": 0.0001})
    d = Planner("numpy", timer, strategies=names).tune(problem("2d-odd"))
    left = next(o for o in d.outcomes if o.label == "t-many[i=2]")
    assert left.status == "skipped" and left.reason == "pruned: left out for the test" and left.rank == 2
    assert "t-many[i=2]" not in built and "t-many[i=2]" not in timer.labels and d.winner.label == "t-many[i=1]"
    slow = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.0011, "t-many": 0.0001})
    d = Planner("numpy", slow, strategies=names).tune(problem("2d-odd"))
    assert next(o for o in d.outcomes if o.label == "t-many[i=2]").reason.startswith("second round not run")
    d = Planner("numpy", FakeTimer(dict(timer.times)), strategies=names, exhaustive=True).tune(problem("2d-odd"))
    assert d.winner.label == "t-many[i=2]"


def test_a_floor_in_the_second_round_measures_against_the_first_rounds_best(extra_strategies, monkeypatch):
    monkeypatch.setattr("convtune.planner.SLOW_FACTOR", 1e9)
    seen = []
    names, _built = rounds_strategies(extra_strategies, configs=1)
    extra_strategies(floored("t-floor", 0.01, seen))

    class Waits(type(get_strategy("t-floor"))):
        def second_round(self, p, config, rank):
            return "waits for the test"
    Waits.name = "t-floor-later"
    names.append(extra_strategies(Waits))
    timer = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.0009, "t-floor": 0.0001})
    d = Planner("numpy", timer, strategies=names).tune(problem("2d-odd"))
    later = next(o for o in d.outcomes if o.strategy == "t-floor-later")
    assert later.status == "skipped" and "10.000 ms, 11.11x the best so far" in later.reason
    assert seen[0][0] == 0.0009 and d.winner.label == "t-many[i=0]"


def test_the_second_round_runs_where_the_references_floor_ruled_it_out_already(extra_strategies):
    """The reference not timed (its floor over the first round's best): it lost, so the rest is searched."""
    # (the reference slower on the verification batch, so that it is timed after a best is known: its floor is asked)
    names, _built = rounds_strategies(extra_strategies, reference_floor=1.0, reference=sleeps_then_correct(0.005))
    timer = FakeTimer({"t-many[i=0]": 0.0009, "t-many[i=1]": 0.0005, "t-many[i=2]": 0.002, "t-ref": 0.0001})
    d = Planner("numpy", timer, strategies=names).tune(problem("2d-odd"))
    assert next(o for o in d.outcomes if o.strategy == "t-ref").status == "skipped"
    assert d.winner.label == "t-many[i=1]" and "t-many[i=2]" in timer.labels


@pytest.mark.parametrize("why", ["no reference", "exhaustive", "nothing else in the first round"])
def test_nothing_waits_without_a_reference_in_an_exhaustive_search_or_with_nothing_to_judge_by(extra_strategies,
                                                                                              why):
    """Without the point of reference among the candidates there is nothing to judge the first round by, an
    exhaustive search times everything, and a first round of the reference alone says nothing of the rest: each
    candidate is tried."""
    names, built = rounds_strategies(extra_strategies, waits_from=0 if why.startswith("nothing") else 1)
    timer = FakeTimer({"t-ref": 0.0010, "t-many[i=0]": 0.0010, "t-many[i=1]": 0.0003, "t-many[i=2]": 0.002})
    d = Planner("numpy", timer, strategies=names[1:] if why == "no reference" else names,
                exhaustive=why == "exhaustive").tune(problem("2d-odd"))
    assert d.winner.label == "t-many[i=1]"
    assert not any(o.status == "skipped" for o in d.outcomes)


def _timed_then_verified(name, behaviour, calls):
    """A reference-point strategy (always timed) verified after its timing; ``calls`` records each run's batch and
    whether it came before any timing."""
    cls = make_strategy(name, behaviour)

    class Made(cls):
        always_timed = True

        def verified_as_timed(self, p, config):
            return True

        def build(self, p, config, backend):
            run = super().build(p, config, backend)

            def recorded(a, b, out=None):
                calls.append(a.shape[0])
                return run(a, b, out)
            return recorded
    Made.name = name
    return Made


def test_a_reference_point_verified_as_timed_is_timed_first_then_checked_on_the_full_batch(extra_strategies):
    calls = []
    extra_strategies(_timed_then_verified("t-ref", correct, calls))
    extra_strategies("t-other", correct)
    timer = FakeTimer({"t-ref": 0.002, "t-other": 0.001})
    p = problem("2d-odd", batch=6)
    d = Planner("numpy", timer, verify_batch=2, strategies=["t-ref", "t-other"]).tune(p)
    assert timer.labels[0].startswith("t-ref")  # (timed first: no verification run to rank it by)
    assert calls == [6, 6]  # its timing's run, then its check, both of the full batch (none on the verification one)
    ref, = [o for o in d.outcomes if o.strategy == "t-ref"]
    assert ref.status == "ok" and ref.error is not None and ref.error <= p.tolerance and ref.warm_run_s is None
    assert ref.verify_s is not None and d.winner.strategy == "t-other"


def test_a_reference_point_verified_as_timed_that_is_wrong_is_rejected_after_its_timing(extra_strategies):
    calls = []
    extra_strategies(_timed_then_verified("t-ref", slightly_wrong, calls))
    extra_strategies("t-other", correct)
    d = Planner("numpy", FakeTimer({"t-ref": 0.0001}, default=0.01), verify_batch=2,
                strategies=["t-ref", "t-other"]).tune(problem("2d-odd", batch=6))
    ref, = [o for o in d.outcomes if o.strategy == "t-ref"]
    assert ref.status == "rejected" and ref.timing is not None and "verified after its timing" in ref.reason
    assert d.winner.strategy == "t-other"


def test_a_lone_reference_point_verified_as_timed_is_timed_to_be_verified(extra_strategies):
    calls = []
    extra_strategies(_timed_then_verified("t-ref", correct, calls))
    timer = FakeTimer()
    d = Planner("numpy", timer, verify_batch=2, strategies=["t-ref"]).tune(problem("2d-odd", batch=6))
    assert d.winner.strategy == "t-ref" and d.winner.error is not None and d.winner.timing is not None
    assert len(timer.labels) == 1 and calls == [6, 6]


def test_pytorchs_call_is_verified_as_timed_only_with_its_search_and_on_small_kernels():
    from convtune.strategies.pytorch import VERIFIED_AS_TIMED_TAPS, TorchConfig
    torch_strategy = get_strategy("torch")
    small, large = problem("2d-odd"), problem("2d-large-kernel")
    assert np.prod(small.kernel_size) <= VERIFIED_AS_TIMED_TAPS < np.prod(large.kernel_size)
    assert torch_strategy.verified_as_timed(small, TorchConfig(benchmark=True))
    assert not torch_strategy.verified_as_timed(small, TorchConfig(benchmark=False))  # (the CPU's: verified before)
    assert not torch_strategy.verified_as_timed(large, TorchConfig(benchmark=True))
