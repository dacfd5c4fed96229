"""What the cuDNN strategy (:mod:`convtune.strategies.cudnn`) leaves untried, and why: the rules fitted on stored
searches (:func:`fixed_rule`, which ``benchmarks/check_rules.py`` replays) and the records that learn, in the process,
which engines' plans come nowhere near the winners (:class:`CompileRecord`, :class:`EngineRecord`, which
``benchmarks/replay_cudnn_rules.py`` replays in tuning order). They see a problem and an engine id, never cuDNN."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from ..problem import ConvProblem

#: Runtime-compiled plans (behavior note RUNTIME_COMPILATION) compile a kernel for the shape when they are
#: built: 0.2 to 2.7 s a build on an H100 (cuDNN 9.19), and again for the verification batch. Under AMP they
#: cost ResNet-50's tuning 136 of its 164 s of cuDNN candidates while winning 1 problem in 106, by 0.5%; yet
#: some win by up to 40% (engine 72 on 7x7 and 9x9 bfloat16 layers), and the cheap ones (engines 70 and 71,
#: 0.03 s a build) win 3-D and fp32 problems by up to 2.9x. So no engine is ruled out by name or by
#: note alone: once an engine's runtime-compiled plans have been tried on ``RTC_TRIALS`` problems of the
#: same pass, dtype and layout in this process, taking at least ``RTC_SLOW_BUILD_S`` to build (median) and
#: never coming within ``RTC_NEAR`` times the winner (or after ``RTC_FAR_TRIALS`` problems never within
#: ``RTC_FAR`` times), its runtime-compiled plans for such problems are listed but not built, and the planner
#: records them ``skipped`` with that reason (an exhaustive search builds them). ``benchmarks/replay_cudnn_rules.py``
#: replays the rule on stored searches in their tuning order: on the committed ones (fp32 suites, ConvNeXt-T,
#: ResNet-50 AMP) and further AMP, bfloat16-suite and 3-D searches on the H100 it skips 44 to 53 plans of ResNet-50's and
#: RepLKNet's AMP searches (the second, far condition 4 or 5 of them) and none within 3% of its problem's winner;
#: without the build-time condition it would have skipped engine 70's and 71's fp32 and 3-D winners.
RTC_TRIALS = 5
RTC_NEAR = 1.15
RTC_FAR_TRIALS = 3
RTC_FAR = 1.5
RTC_SLOW_BUILD_S = 0.2

#: Plans compiled ahead (the rest: 55 to 60 a problem, 10 to 40 ms each to build, verify and time) are ruled out by
#: engine too, by what the engine achieved on earlier problems in this process: once an engine's plans have been
#: tried on ``ENGINE_TRIALS`` problems of the same pass, dtype, layout and math mode, never coming within
#: ``ENGINE_NEAR`` times the winner, its plans for such problems are listed but not built, and the planner records
#: them ``skipped`` with that reason, except the heuristics' first ``HEURISTIC_FIRST`` plans (the heuristics see the
#: shape; the record does not). ``benchmarks/replay_cudnn_rules.py`` replays both rules on stored searches in their
#: tuning order: on the seven committed H100 searches (fp32 suites, ResNet-50, ConvNeXt-T, ResNet-50 under AMP) this
#: rule skips 1,505 of their 7,476 plans, the two rules together 144 of the 335 s the plans cost (ResNet-50 under
#: AMP: 98 of 160 s), one skipped plan comes within 3% of its problem's winner (2.8%) and no problem's best plan
#: left is more than 1% slower than its best. A record keyed finer (kernel size and stride too) saved less, and
#: looser bounds (3 trials, or 1.2x) lost winners by up to 19% on the public suite's backward-data problems.
ENGINE_TRIALS = 5
ENGINE_NEAR = 1.5
HEURISTIC_FIRST = 4

#: Engines not tried on float32 depthwise layers (:func:`fixed_rule`).
DEPTHWISE_SLOW_ENGINES = frozenset({1})
#: On float32 depthwise layers with kernels of this many taps or more (stride and dilation 1), only these engines are
#: tried (:func:`fixed_rule`).
LARGE_DEPTHWISE_TAPS, LARGE_DEPTHWISE_ENGINES = 49, frozenset({0})
#: Engines not tried on bfloat16 channels_last 2-D layers of one group (:func:`fixed_rule`).
DENSE_BFLOAT16_SLOW_ENGINES = frozenset({0, 1, 15, 17, 19, 24, 25, 30, 33, 34, 35, 49, 50, 53, 56, 60, 68, 69, 74, 76})
#: Engines not tried on bfloat16 channels_last 2-D layers of one group, runtime-compiled ones whose builds cost the
#: most and that never came close (:func:`fixed_rule`).
DENSE_BFLOAT16_COSTLY_ENGINES = frozenset({77})
#: Engines not tried on float32 channels_last layers of one group, runtime-compiled ones (:func:`fixed_rule`).
DENSE_FLOAT32_CHANNELS_LAST_COSTLY_ENGINES = frozenset({80, 84})
#: Engines not tried on float32 channels-first layers of one group in fp32 math (:func:`fixed_rule`).
DENSE_FLOAT32_SLOW_ENGINES = frozenset({0})
#: On depthwise layers of these dtypes (bfloat16: channels_last ones), only these engines are tried (fixed_rule).
DEPTHWISE_ENGINES = {"float32": frozenset({0, 5, 6, 25, 61, 80}), "bfloat16": frozenset({0, 5, 6, 16})}


def trial_ratio(status: str, median_s: float | None, error: float | None, winner_s: float) -> float | None:
    """What a candidate's outcome teaches a :class:`CompileRecord`: its time over the winner's; infinity where
    it failed, was rejected or was too slow to time; ``None`` where it was not tried (a spent time budget, say).

    >>> trial_ratio("ok", 2e-3, 0.0, 1e-3), trial_ratio("rejected", None, 1.0, 1e-3), trial_ratio("skipped", None, None, 1e-3)
    (2.0, inf, None)
    """
    if median_s:
        return median_s / winner_s
    if status in ("rejected", "failed") or (status == "skipped" and error is not None):
        return math.inf
    return None


@dataclass
class _Trials:
    """How close one engine's plans came to the winners over the problems they were tried on."""

    trials: int = 0
    closest: float = math.inf  #: the best time / the winner's time over the trials

    def tried(self, ratio: float) -> None:
        self.trials += 1
        self.closest = min(self.closest, ratio)


@dataclass
class EngineRecord(_Trials):
    """How close one engine's plans came to the winners, in this process, for problems of one kind (see
    ``ENGINE_TRIALS``): the rule on plans compiled ahead.

    >>> r = EngineRecord()
    >>> for ratio in (2.0, 1.7, 3.0, 1.6):
    ...     r.tried(ratio)
    >>> r.skip_reason(3) is None, r.skip_reason(4) is None
    (True, True)
    >>> r.tried(float("inf")); r.skip_reason(3) is None
    True
    >>> print(r.skip_reason(4))
    in 5 problems like this one the engine's plans came no closer than 1.60x the winner, and the heuristics rank this plan 5th
    >>> r.tried(1.2); r.skip_reason(9) is None
    True
    """

    def skip_reason(self, position: int) -> str | None:
        """Why the engine's plan at ``position`` (0: the heuristics' first) is not built, or ``None``."""
        if position < HEURISTIC_FIRST or self.trials < ENGINE_TRIALS or self.closest <= ENGINE_NEAR:
            return None
        return (f"in {self.trials} problems like this one the engine's plans came no closer than "
                f"{self.closest:.2f}x the winner, and the heuristics rank this plan {_ordinal(position + 1)}")


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


@dataclass
class CompileRecord(_Trials):
    """What one engine's runtime-compiled plans cost to build and how close they came to the winners, in this
    process, for problems of one pass, dtype and layout."""

    builds: list[float] = field(default_factory=list)

    def skip_reason(self) -> str | None:
        """Why the engine's runtime-compiled plans are not built any more, or ``None``.

        >>> r = CompileRecord(builds=[0.6, 1.9, 0.5])
        >>> for ratio in (2.2, 1.9, 1.3, 1.6, 1.7):
        ...     r.tried(ratio)
        >>> r.skip_reason()
        'runtime-compiled: a build takes 0.60 s (median of 3), and in 5 problems like this one its plans came no closer than 1.30x the winner'
        >>> r.tried(1.1); r.skip_reason() is None
        True
        >>> far = CompileRecord(builds=[1.0])
        >>> for ratio in (40.0, 9.0, 2.0):
        ...     far.tried(ratio)
        >>> far.skip_reason() is not None, CompileRecord(builds=[0.05], trials=9, closest=3.0).skip_reason()
        (True, None)
        """
        if not self.builds or not (self.trials >= RTC_TRIALS and self.closest > RTC_NEAR or
                                   self.trials >= RTC_FAR_TRIALS and self.closest > RTC_FAR):
            return None
        build = statistics.median(self.builds)
        if build < RTC_SLOW_BUILD_S:
            return None
        return (f"runtime-compiled: a build takes {build:.2f} s (median of {len(self.builds)}), and in {self.trials} "
                f"problems like this one its plans came no closer than {self.closest:.2f}x the winner")


def fixed_rule(problem: ConvProblem, config) -> str | None:
    """The rule fitted on measured searches (``benchmarks/check_rules.py`` replays it):

    * Engine 1 on float32 depthwise layers (one input and one output channel per group): not tried. H100, 20 such
      problems of three exhaustive searches (ConvNeXt-T, tests/data/searches/h100-convnext_tiny-exhaustive.db.gz,
      and the public suite's two): its 35 plans timed there never came within 6.48x of the winner. H200 (2026-11-28):
      on RepLKNet-31B's 1024-channel 3x3 stride-2 depthwise forward pass at batch 16 its plan ran 210,000x the
      winner's time, and its verification alone took 39.6 s of the layer's 45.5 s search.
    * On float32 depthwise layers with kernels of 49 taps or more (7x7 and up, stride and dilation 1), every engine
      but engine 0. In the stored searches of 54 such problems (ConvNeXt-T's 7x7 and the public suite's on the
      H100, exhaustive; RepLKNet-31B's 13x13 to 31x31 and SLaK-T's 13x13 to 51x51 on the H200,
      tests/data/searches/h200-*-tune.db.gz) their 399 plans never came within 3.14x of the winner (engine 0's
      within 1.79x; none won), and they cost 11.2 s of RepLKNet-31B's 40.6 s tune: engines 2, 5 and 50 ran 1.3
      to 1.4 s each on one verification run of its 31x31 backward-data pass, 12,000x the winner.
    * On other float32 depthwise layers, every engine but 0, 5, 6, 25, 61 and 80: in the 81 such problems of those
      stored searches (3x3 to 31x31) the other engines' plans the clauses above leave never came within 4.02x of the
      winner (with engine 1's: 272 plans in 59 of the problems; engine 84's one plan on SLaK-T's 5x5 layers, timed
      again on the H200 on 2026-11-29: 4.01x).
    * On bfloat16 channels_last 2-D layers of one group, engines 0, 1, 15, 17, 19, 24, 25, 30, 33, 34, 35, 49, 50,
      53, 56, 60, 68, 69, 74 and 76: in 136 such problems (ResNet-50 under AMP on the H100, exhaustive for cuDNN,
      tests/data/searches/h100-resnet50-amp-search.db.gz; SLaK-T's, ConvNeXt-T's and RepLKNet-31B's on the H200,
      h200-*-bf16-*.db.gz) their 983 plans timed (in 102 of them) never came within 1.68x of the winner and cost 78
      of the 314 s the problems' candidates cost (engine 69's runtime-compiled plans 1.3 s a build). In ResNet-50's
      search on the H200 (2026-11-29, not stored) the closest came within 1.57x.
    * Engine 77 on bfloat16 channels_last 2-D layers of one group: runtime-compiled, its plans cost 0.4 to 1.9 s a
      build, and counted so (listing builds in candidates' costs since d16bf6e) they were the costliest of cuDNN's in
      ResNet-50's AMP tunes on an H200 (2026-12-06: 2.3 to 10.2 s of the 11.0 to 29.5 s its candidates cost, four
      tunes), never within 1.28x of the winner there; in the 32 stored problems where it was timed (ResNet-50 under
      AMP on the H100, SLaK-T's, ConvNeXt-T's and RepLKNet-31B's on the H200) never within 1.12x, and 39.8 of the
      382 s their candidates cost.
    * Engines 80 and 84 on float32 channels_last layers of one group: runtime-compiled, not tried. The stored such
      layers are SLaK-T's three 2x2 stride-2 downsamplers (tests/data/searches/h200-slak-t-b16-tune.db.gz, and three
      fp32 tunes on H100s of 2026-12-07): engine 80's plans (the forward pass) never came within 24.7x of the winner,
      engine 84's (backward data) never within 4.8x, and their builds took 5.7 s of the 24.0 s tune that was the
      first on a fresh H100 (engine 80's 1.1 to 2.1 s each), 1.1 s in a later process; with three such problems the
      learned rule (:class:`CompileRecord`, five problems) never applies.
    * Engine 0 (the general fallback) on float32 channels-first layers of one group in fp32 math: not tried. In 165
      such problems of the stored searches (1-D and 2-D, 1x1 to 31x31; ResNet-50, ConvNeXt-T and the public suite
      on the H100, RepLKNet-31B and SLaK-T on the H200: tests/data/searches, with the explain logs there) its 399
      plans timed never came within 3.9x of the winner and cost 55.8 s of the searches' 1,246 s: 2.4
      to 2.7 s of ResNet-50's normal searches on the H100 (26.5 and 40.7 s of candidate costs), 1.3 of
      RepLKNet-31B's 21.0 s on the H200.
    * On bfloat16 channels_last depthwise layers, every engine but 0, 5, 6 and 16. H200 (2026-11-29), 61 such
      problems whose cuDNN plans were timed, of SLaK-T's, ConvNeXt-T's and RepLKNet-31B's searches
      (tests/data/searches/h200-*-bf16-*.db.gz; 3x3 to 31x31, stride 1 and 2): the other engines' 938 plans timed
      there never came within 1.42x of the winner (engine 19's 25, in 8 of them; the others' never within 4.33x), and
      their searches cost 63 of the 193 s their problems' candidates cost (engines 5, 6 and 16 won or came within 3%;
      engine 0, the fallback, within 2.19x). Engine 19 was left to be tried until its plans' builds were counted in
      their costs: in ConvNeXt-T's AMP tune (H200, 2026-12-06) its runtime-compiled plans cost 2.0 of the 29.7 s,
      about 0.25 s a build, and came within 1.65x to 4.37x of the winner.
    """
    dense_bfloat16 = (problem.groups == 1 and problem.dtype == "bfloat16" and problem.layout == "channels_last"
                      and problem.rank == 2)
    if dense_bfloat16 and config.engine in DENSE_BFLOAT16_SLOW_ENGINES:
        return (f"engine {config.engine} on a bfloat16 channels_last layer: never within 1.6x of the winner in 136 "
                "stored problems")
    if dense_bfloat16 and config.engine in DENSE_BFLOAT16_COSTLY_ENGINES:
        return (f"engine {config.engine}, runtime-compiled, on a bfloat16 channels_last layer: never within 1.1x of "
                "the winner in 32 stored problems, its plans 0.4 to 1.9 s a build")
    if (problem.groups == 1 and problem.dtype == "float32" and problem.layout == "channels_last"
            and config.engine in DENSE_FLOAT32_CHANNELS_LAST_COSTLY_ENGINES):
        return (f"engine {config.engine}, runtime-compiled, on a float32 channels_last layer of one group: never "
                "within 4.8x of the winner in the stored problems, its plans up to 2.1 s a build")
    if (problem.groups == 1 and problem.dtype == "float32" and problem.layout == "channels_first"
            and problem.math == "fp32" and config.engine in DENSE_FLOAT32_SLOW_ENGINES):
        return (f"engine {config.engine} on a float32 layer of one group: never within 3.9x of the winner in 165 "
                "stored problems")
    if not problem.depthwise or problem.out_per_group != 1 or problem.dtype not in DEPTHWISE_ENGINES:
        return None
    dtype = problem.dtype
    if dtype == "bfloat16" and problem.layout != "channels_last":
        return None  # (measured in channels_last only, as AMP's models run)
    if dtype == "float32" and config.engine in DEPTHWISE_SLOW_ENGINES:
        return (f"engine {config.engine} on a float32 depthwise layer: never within 6x of the winner in 20 "
                "stored problems, and 210,000x on a 1024-channel stride-2 one")
    if (dtype == "float32" and config.engine not in LARGE_DEPTHWISE_ENGINES
            and math.prod(problem.kernel_size) >= LARGE_DEPTHWISE_TAPS
            and set(problem.stride) == {1} and set(problem.dilation) == {1}):
        return (f"engine {config.engine} on a float32 depthwise layer of {LARGE_DEPTHWISE_TAPS} taps or more: "
                "no engine but 0 came within 3x of the winner in 54 stored problems")
    if config.engine not in DEPTHWISE_ENGINES[dtype]:
        evidence = {"float32": "4x of the winner in 81", "bfloat16": "1.4x of the winner in 61"}[dtype]
        return (f"engine {config.engine} on a {dtype} depthwise layer: no engine but "
                f"{', '.join(map(str, sorted(DEPTHWISE_ENGINES[dtype])))} came within {evidence} stored problems")
    return None
