"""The planner: for one problem, list, verify, time and choose.

Shapes only come in; a :class:`~convtune.plan.Decision` goes out. Arrays never
reach the planner's callers: it makes its own random operands on the backend.

Steps, each recorded per candidate:

1. every registered strategy says whether it supports the problem (else
   ``unsupported`` with its reason) and lists configurations;
2. a configuration whose workspace exceeds the budget is ``over_budget``;
3. verification on a reduced batch against the float64 reference computed on
   the same device, with the output poisoned with NaN first so an unwritten
   element fails; past the math mode's tolerance it is ``rejected``, an
   exception is ``failed`` (out-of-memory included) and tuning goes on; one
   whose run is ``SLOW_FACTOR`` times slower than the best so far is ``skipped`` (never one of
   an ``always_timed`` strategy: PyTorch's own convolution, the point of reference);
4. the survivors are timed on the full problem, fastest first by a warm run on
   the reduced batch (so a time budget goes to the likely winners); a lone
   survivor is not timed;
5. backward-filter sums over the batch, so its error grows with the batch: when
   the verification batch was smaller, the fastest timed candidate is checked
   again on the full batch (and ``rejected`` if it now misses the tolerance,
   the next fastest then checked in turn);
6. the fastest that passed wins; with no survivor, :class:`~convtune.errors.TuningError`.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Callable

from .backend import Backend, get_backend
from .errors import TuningError
from .plan import CandidateOutcome, Decision, Plan
from .problem import ConvProblem
from .strategies import all_strategies, get_strategy
from .strategies.base import Config, Strategy
from .text import human_bytes
from .timing import default_timer

log = logging.getLogger("convtune")

#: Default cap on any candidate's workspace.
DEFAULT_WORKSPACE_LIMIT = 4 << 30
#: A verified candidate whose warm run on the verification batch is this many times slower than
#: the best warm run so far (and slower than the floor) is skipped, not timed.
SLOW_FACTOR = 50.0
SLOW_FLOOR_S = 0.01
#: A first run (one-time costs included) rules a candidate out only past this.
FIRST_RUN_FLOOR_S = 1.0


@dataclass(frozen=True)
class Candidate:
    strategy: Strategy
    config: Config

    @property
    def label(self) -> str:
        return self.strategy.describe(self.config)


def relative_error(xp, out, ref) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere gives infinity."""
    out64 = out.astype(xp.float64)
    err = float(xp.linalg.norm((out64 - ref).ravel()))
    norm = float(xp.linalg.norm(ref.ravel()))
    if not math.isfinite(err):
        return math.inf
    return err / norm if norm > 0 else err


def random_operands(backend: Backend, problem: ConvProblem, seed: int):
    """Fresh standard-normal float32 operands for the problem's pass (never zeros)."""
    xp = backend.xp
    rng = xp.random.default_rng(seed)
    return tuple(rng.standard_normal(shape, dtype=xp.float32) for shape in problem.operand_shapes)


def _failure_reason(backend: Backend, exc: BaseException) -> str:
    if backend.is_out_of_memory(exc):
        return f"out of memory: {exc}"
    return f"{type(exc).__name__}: {exc}"


class Planner:
    """Explores candidates for a problem and returns a :class:`Decision`.

    Parameters
    ----------
    backend : Backend or str
        Where candidates run (``'numpy'`` or ``'cupy'``).
    timer : callable, optional
        ``timer(fn, backend, label) -> TimingStats``; defaults to the backend's real timer.
    workspace_limit : int, optional
        Candidates needing more temporary bytes are skipped (``over_budget``).
    time_budget_s : float, optional
        After this many seconds of timing one problem, remaining candidates are
        ``skipped``; at least one candidate is always timed.
    strategies : list of str, optional
        Restrict the search to these strategies.
    verify_batch : int
        Batch size of the verification run.

    Examples
    --------
    >>> from convtune import ConvProblem, Planner
    >>> p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    >>> decision = Planner("numpy").tune(p)
    >>> decision.winner.status
    'winner'
    """

    def __init__(self, backend: Backend | str = "numpy", timer: Callable | None = None, *,
                 workspace_limit: int | None = DEFAULT_WORKSPACE_LIMIT, time_budget_s: float | None = None,
                 strategies: list[str] | None = None, verify_batch: int = 2, seed: int = 0,
                 progress: Callable[[str], None] | None = None):
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.timer = timer if timer is not None else default_timer(self.backend)
        self.workspace_limit = workspace_limit
        self.time_budget_s = time_budget_s
        self.strategy_names = list(strategies) if strategies else None
        if self.strategy_names:
            for name in self.strategy_names:
                get_strategy(name)  # unknown names raise, listing the valid ones
        self.verify_batch = verify_batch
        self.seed = seed
        self.progress = progress

    # -- public ------------------------------------------------------------------
    def tune(self, problem: ConvProblem) -> Decision:
        """Verify and time every candidate for ``problem``; return the decision."""
        started = time.perf_counter()
        outcomes: list[CandidateOutcome] = []
        candidates = self._enumerate(problem, outcomes)
        if candidates and not self._operands_fit(problem, candidates, outcomes, "the problem", 1,
                                                 "its operands and result"):
            candidates = []  # checked before anything is verified: it cannot be timed here
        survivors = self._verify(problem, candidates, outcomes)
        timed = self._time(problem, survivors, outcomes)
        timed = self._confirm_full_batch(problem, timed, outcomes)
        if not timed:
            decision = Decision(problem, self.backend.device_info(), _NO_WINNER, tuple(outcomes),
                                "measured", time.perf_counter() - started)
            raise TuningError(f"no candidate survived for {problem.describe()}:\n" + _summary(outcomes), decision)
        best = min(timed, key=lambda o: o.timing.median_s if o.timing else 0.0)
        winner = _with(best, status="winner")
        outcomes = [winner if o is best else o for o in outcomes]
        log.info("tuned %s: %s (%s)", problem.key(), winner.label,
                 f"{winner.timing.median_s * 1e3:.3f} ms" if winner.timing else "only candidate, not timed")
        return Decision(problem, self.backend.device_info(), winner, tuple(outcomes), "measured",
                        time.perf_counter() - started)

    def plan(self, problem: ConvProblem) -> Plan:
        """Tune and build the winner."""
        return build_plan(self.tune(problem), self.backend)

    # -- steps ----------------------------------------------------------------------
    def _strategies(self) -> list[Strategy]:
        if self.strategy_names:
            return [get_strategy(n) for n in self.strategy_names if get_strategy(n).selectable]
        return all_strategies(selectable_only=True)

    def _enumerate(self, problem, outcomes) -> list[Candidate]:
        kept = []
        for strategy in self._strategies():
            reason = strategy.supports(problem, self.backend)
            if reason is not None:
                outcomes.append(CandidateOutcome(strategy.name, {}, f"{strategy.name}[*]", "unsupported",
                                                 reason=reason))
                continue
            for config in strategy.candidates(problem, self.backend):
                cand = Candidate(strategy, config)
                ws = strategy.workspace_bytes(problem, config)
                if self.workspace_limit is not None and ws > self.workspace_limit:
                    outcomes.append(CandidateOutcome(strategy.name, config.as_dict(), cand.label, "over_budget",
                                                     workspace_bytes=ws,
                                                     reason=f"workspace {human_bytes(ws)} over the limit "
                                                            f"{human_bytes(self.workspace_limit)}"))
                    continue
                kept.append(cand)
        return kept

    def _operands_fit(self, problem, candidates, outcomes, what: str, factor: int, of: str) -> bool:
        """Is there memory for ``factor`` times the problem's float32 operands and result? If not, every
        candidate fails with the reason (nothing is allocated)."""
        need = factor * problem.min_bytes()
        available = self.backend.free_memory_bytes()
        if available is None or need <= available:
            return True
        reason = (f"{what} needs {human_bytes(need)} for {of}, and only {human_bytes(available)} of "
                  f"{'device' if self.backend.name == 'cupy' else 'host'} memory is available")
        outcomes.extend(self._outcome(problem, c, "failed", reason=reason) for c in candidates)
        log.warning("%s: %s", problem.describe(), reason)
        return False

    def _operands(self, problem, candidates, outcomes, what: str, seed: int, reference: bool):
        """Random operands (and the float64 reference) of ``problem``, or ``None`` with every candidate
        failed where memory runs out making them."""
        xp = self.backend.xp
        try:
            a, b = random_operands(self.backend, problem, seed)
            ref = get_strategy("reference").build(problem, None, self.backend)(a.astype(xp.float64),
                                                                               b.astype(xp.float64)) \
                if reference else None
            return a, b, ref
        except Exception as exc:
            if not self.backend.is_out_of_memory(exc):
                raise
            reason = f"{what}: out of memory making the operands ({exc})"
            outcomes.extend(self._outcome(problem, c, "failed", reason=reason) for c in candidates)
            log.warning("%s: %s", problem.describe(), reason)
            return None

    def _verify(self, problem, candidates, outcomes) -> list[tuple[Candidate, float]]:
        if not candidates:
            return []
        xp = self.backend.xp
        small = problem.replace(batch=min(problem.batch, self.verify_batch))
        # float32 operands and result, their float64 copies, the float64 reference
        if not self._operands_fit(small, candidates, outcomes, "verification", 4,
                                  "its operands and result, their float64 copies and the float64 reference"):
            return []
        made = self._operands(small, candidates, outcomes, "verification", self.seed, reference=True)
        if made is None:
            return []
        a, b, ref = made
        survivors = []
        best_warm = math.inf
        for cand in candidates:
            self._report(f"verify {cand.label}")
            try:
                out = xp.full(small.result_shape, xp.nan, dtype=xp.float32)
                run = cand.strategy.build(small, cand.config, self.backend)
                first_s = self._synchronized_run(run, a, b, out)
                err = relative_error(xp, out, ref)
                if not err <= problem.tolerance:
                    outcomes.append(self._outcome(problem, cand, "rejected", error=err,
                                                  reason=f"error {err:.3g} over the {problem.math} tolerance "
                                                         f"{problem.tolerance:g}"))
                    continue
                # A first run also pays one-time costs (CUDA loads kernel modules lazily, FFT plans are made),
                # so it only rules a candidate out past a hard floor; otherwise the warm run decides.
                reference_point = cand.strategy.always_timed  # what the user had: never ruled out unmeasured
                if not reference_point and first_s > max(SLOW_FACTOR * best_warm, FIRST_RUN_FLOOR_S):
                    outcomes.append(self._outcome(problem, cand, "skipped", error=err,
                                                  reason=f"first run on the verification batch took {first_s:.2f} s, "
                                                         f"{first_s / best_warm:.0f}x the best; not timed"))
                    continue
                # a second, warm run on the small batch ranks the candidates for timing (fastest first),
                # so a time budget is spent on the likely winners, not on registry order
                warm_s = self._synchronized_run(run, a, b, out)
                if not reference_point and warm_s > max(SLOW_FACTOR * best_warm, SLOW_FLOOR_S):
                    outcomes.append(self._outcome(problem, cand, "skipped", error=err,
                                                  reason=f"{warm_s / best_warm:.0f}x slower than the best candidate "
                                                         f"on the verification batch; not timed"))
                    continue
                best_warm = min(best_warm, warm_s)
            except Exception as exc:  # a failing candidate is recorded; tuning goes on
                outcomes.append(self._outcome(problem, cand, "failed", reason=_failure_reason(self.backend, exc)))
                log.debug("candidate %s failed verification", cand.label, exc_info=True)
                continue
            survivors.append((cand, err, warm_s))
        survivors.sort(key=lambda item: item[2])
        return [(cand, err) for cand, err, _warm in survivors]

    def _synchronized_run(self, run, a, b, out) -> float:
        """Seconds one run takes, device work included (a rough clock for ranking, not a timing)."""
        t0 = time.perf_counter()
        run(a, b, out)
        self.backend.synchronize()
        return time.perf_counter() - t0

    def _time(self, problem, survivors, outcomes) -> list[CandidateOutcome]:
        if len(survivors) == 1:
            cand, err = survivors[0]
            outcome = self._outcome(problem, cand, "ok", error=err, reason="only candidate; not timed")
            outcomes.append(outcome)
            return [outcome]
        if not survivors:
            return []
        cands = [cand for cand, _err in survivors]
        available = self.backend.free_memory_bytes()
        if not self._operands_fit(problem, cands, outcomes, "timing the full problem", 1, "its operands and result"):
            return []
        made = self._operands(problem, cands, outcomes, "timing the full problem", self.seed + 1, reference=False)
        if made is None:
            return []
        a, b, _ = made
        xp = self.backend.xp
        out = xp.empty(problem.result_shape, dtype=xp.float32)
        left = None if available is None else available - problem.min_bytes()
        timed = []
        spent = 0.0
        for cand, err in survivors:
            if self.time_budget_s is not None and timed and spent > self.time_budget_s and \
                    not cand.strategy.always_timed:
                outcomes.append(self._outcome(problem, cand, "skipped", error=err,
                                              reason=f"time budget of {self.time_budget_s:g} s spent"))
                continue
            ws = cand.strategy.workspace_bytes(problem, cand.config)
            if left is not None and ws > left:  # checked before it allocates
                outcomes.append(self._outcome(problem, cand, "over_budget", error=err, reason=(
                    f"workspace {human_bytes(ws)} over the {human_bytes(left)} of memory left beside the operands")))
                continue
            self._report(f"time {cand.label}")
            t0 = time.perf_counter()
            try:
                run = cand.strategy.build(problem, cand.config, self.backend)
                # timed as the runtime calls it: into ``out``, or making its own result where it does
                target = None if cand.strategy.allocates_result else out
                stats = self.timer(lambda: run(a, b, target), self.backend, cand.label)
            except Exception as exc:
                outcomes.append(self._outcome(problem, cand, "failed", error=err,
                                              reason=_failure_reason(self.backend, exc)))
                log.debug("candidate %s failed timing", cand.label, exc_info=True)
                continue
            finally:
                spent += time.perf_counter() - t0
            outcome = self._outcome(problem, cand, "ok", error=err, timing=stats)
            outcomes.append(outcome)
            timed.append(outcome)
        return timed

    def _confirm_full_batch(self, problem, timed, outcomes) -> list[CandidateOutcome]:
        """Timed outcomes, fastest first, from the first one whose full-batch error is within tolerance
        (wgrad only, when verification used a smaller batch); the ones ahead of it become ``rejected``."""
        ranked = sorted(timed, key=lambda o: o.timing.median_s if o.timing else 0.0)
        if problem.pass_ != "wgrad" or problem.batch <= self.verify_batch or not ranked:
            return ranked
        xp = self.backend.xp
        try:
            a, b = random_operands(self.backend, problem, self.seed + 1)
            ref = get_strategy("reference").build(problem, None, self.backend)(a.astype(xp.float64),
                                                                                b.astype(xp.float64))
        except Exception as exc:  # e.g. the float64 reference does not fit: keep the verification's word
            log.warning("full-batch check of %s skipped: %s", problem.key(), _failure_reason(self.backend, exc))
            return ranked
        for i, outcome in enumerate(ranked):
            self._report(f"check {outcome.label} at the full batch")
            try:
                out = xp.full(problem.result_shape, xp.nan, dtype=xp.float32)
                strategy = get_strategy(outcome.strategy)
                config = strategy.config_type.from_dict(outcome.config)
                strategy.build(problem, config, self.backend)(a, b, out)
                err = relative_error(xp, out, ref)
            except Exception as exc:
                err, failure = math.inf, _failure_reason(self.backend, exc)
            else:
                failure = None
            index = next(k for k, o in enumerate(outcomes) if o is outcome)
            if err <= problem.tolerance:
                ranked[i] = outcomes[index] = _with(outcome, error=err)
                return ranked[i:]
            outcomes[index] = _with(outcome, status="failed" if failure else "rejected", error=None if failure else err,
                                    reason=failure or f"error {err:.3g} on the full batch of {problem.batch} is over "
                                    f"the {problem.math} tolerance {problem.tolerance:g} (the filter gradient sums "
                                    f"over the batch; the verification batch passed)")
        return []

    def _outcome(self, problem, cand, status, **fields) -> CandidateOutcome:
        return CandidateOutcome(cand.strategy.name, cand.config.as_dict(), cand.label, status,
                                workspace_bytes=cand.strategy.workspace_bytes(problem, cand.config), **fields)

    def _report(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)


def _with(outcome: CandidateOutcome, **changes) -> CandidateOutcome:
    import dataclasses
    return dataclasses.replace(outcome, **changes)


_NO_WINNER = CandidateOutcome("", {}, "", "failed", reason="no candidate survived")


def _summary(outcomes) -> str:
    return "\n".join(f"  {o.label}: {o.status} ({o.reason})" for o in outcomes)


def build_plan(decision: Decision, backend: Backend | str, source: str | None = None) -> Plan:
    """Build the executor of a decision's winner."""
    backend = get_backend(backend) if isinstance(backend, str) else backend
    return build_from_config(decision.problem, decision.winner.strategy, decision.winner.config, backend,
                             source or decision.source)


def build_from_config(problem: ConvProblem, strategy_name: str, config: dict | Config, backend: Backend,
                      source: str) -> Plan:
    strategy = get_strategy(strategy_name)
    strategy.check(problem, backend)
    cfg = config if isinstance(config, Config) else strategy.config_type.from_dict(config)
    return Plan(problem, strategy.name, cfg, backend.name, source, strategy.build(problem, cfg, backend))


def heuristic_decision(problem: ConvProblem, backend: Backend) -> tuple[str, Config]:
    """A fast default without timing: PyTorch's own convolution where PyTorch is installed (what a
    PyTorch user had anyway), else FFT for large kernels at stride 1, else im2col."""
    kernel_volume = math.prod(problem.kernel_size)
    names = ["fft", "im2col"] if kernel_volume >= 25 and all(s == 1 for s in problem.stride) else ["im2col", "fft"]
    names.insert(0, "torch")
    for name in names:
        strategy = get_strategy(name)
        if strategy.supports(problem, backend) is None:
            return name, strategy.heuristic_config(problem, backend)
    raise TuningError(f"no strategy supports {problem.describe()}")
