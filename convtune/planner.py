"""The planner: for one problem, list, verify, time and choose.

Shapes only come in; a :class:`~convtune.plan.Decision` goes out. Arrays never
reach the planner's callers: it makes its own random operands on the backend.

Steps, each recorded per candidate, with what it cost (seconds spent building it, while listing too, verifying and
timing it, its rank in its strategy's list, which for cuDNN is the heuristics' order, and the times of its first and
its warm run on the verification batch):

1. every registered strategy says whether it supports the problem (else ``unsupported`` with its reason) and lists
   configurations; a configuration that a strategy's rules say cannot win here is ``skipped`` with the rule as its
   reason (:meth:`~convtune.strategies.base.Strategy.pruned`; not in an ``exhaustive`` search, nor where the rules
   would leave no candidate at all); a configuration that its strategy holds back
   (:meth:`~convtune.strategies.base.Strategy.second_round`: cuDNN's plans past the heuristics' first eight on a
   half-precision problem) waits: steps 2 to 4 run first on the others, PyTorch's call among them, and then on the
   waiting ones (less those their strategy leaves out of it, ``skipped`` as pruned:
   :meth:`~convtune.strategies.base.Strategy.left_out_of_second_round`) only where a candidate beat PyTorch's call
   by ``search.FIRST_ROUND_MARGIN``; otherwise they are ``skipped``, with both times as the reason (not in an
   ``exhaustive`` search; where PyTorch's call is not among the candidates, nothing waits);
2. a configuration whose workspace exceeds the budget is ``over_budget``;
3. each strategy prepares its candidates at once (:meth:`~convtune.strategies.base.Strategy.prepare`: compiling
   their kernels on several threads); verification on a reduced batch against the float64 reference computed on the
   same device, with the output poisoned with NaN first so an unwritten element fails; past the math mode's
   tolerance it is ``rejected``, an exception is ``failed`` (out-of-memory included) and tuning goes on; one whose
   first run is ``SLOW_FACTOR`` times the best warm run so far, or whose warm run is ``SLOW_FACTOR`` times the best
   of them all (judged once every candidate is verified, so that registry order does not spare a slow one verified
   first), is ``skipped`` (never one of an ``always_timed`` strategy: PyTorch's own convolution, the point of
   reference); a configuration that is costly to build
   (:meth:`~convtune.strategies.base.Strategy.verified_at_full_batch`: cuDNN's plans, built for the full batch while
   listing) is built once, for the full batch, and verified there on the verification operands zero-extended along
   the batch (the zero samples' results must come out zero), then timed as built (kept from verification to timing
   while their workspaces stay within ``PREBUILT_BYTES``); a reference point verified as timed
   (:meth:`~convtune.strategies.base.Strategy.verified_as_timed`: PyTorch's call on the GPU, on small kernels) is not
   verified here but timed first, then checked on the zero-extended operands with the executor timed;
4. the survivors are timed on the full problem, fastest first by a warm run on the reduced batch (so a time budget
   goes to the likely winners); a lone survivor is not timed; a candidate whose first timed run is ``EARLY_STOP``
   times the best median so far is not run again (early stopping; not in an ``exhaustive`` search, never for an
   ``always_timed`` strategy), and the timers repeat only until the runs agree (:mod:`convtune.timing`); one whose
   strategy puts a floor under its median above the best so far, for less than its timing costs, is ``skipped``
   untimed (:meth:`~convtune.strategies.base.Strategy.lower_bound`: PyTorch's call, whose algorithm search can take
   half a minute; not in an ``exhaustive`` search);
5. backward-filter sums over the batch, so its error grows with the batch: when the verification batch was smaller,
   the fastest timed candidate is checked again on the full batch (and ``rejected`` if it now misses the tolerance,
   the next fastest then checked in turn);
6. the fastest that passed wins; with no survivor, :class:`~convtune.errors.TuningError`; every strategy is then
   shown the whole search (:meth:`~convtune.strategies.base.Strategy.observe`: rules learned in the process, such as
   cuDNN's on runtime-compiled engines, learn from it).

The decision also says where the search's own time went (:attr:`Decision.phases`: listing, the float64 reference,
the operands, the full-batch check).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable

from . import precision
from .backend import Backend, get_backend
from .building import build_plan, failure_reason, random_operands, relative_error
from .errors import TuningError
from .fullbatch import confirm_full_batch
from .plan import CandidateOutcome, Decision, Plan
from .problem import ConvProblem
from .search import NO_WINNER, Candidate, Search, first_round_settles, summary, with_
from .strategies import all_strategies, get_strategy
from .strategies.base import Strategy
from .text import human_bytes
from .timing import default_timer, takes_stop_above

log = logging.getLogger("convtune")

#: Default cap on any candidate's workspace.
DEFAULT_WORKSPACE_LIMIT = 4 << 30
#: A verified candidate whose warm run on the verification batch (run twice where the first is past the floor: one
#: stall rules nothing out) is this many times slower than the best so far, and the floor, is skipped, not timed.
SLOW_FACTOR = 50.0
SLOW_FLOOR_S = 0.01
#: A first run (one-time costs included) rules a candidate out only past this.
FIRST_RUN_FLOOR_S = 1.0
#: A candidate whose first timed run takes this many times the best median so far is not run again.
#: (Of 2151 candidates timed for resnet50 on the H100 in plans.db.example, 1775 were more than 1.5x the
#: best so far when timed, and none of those came within 3% of the winner.)
EARLY_STOP = 1.5
#: Full-batch executors built for verification are kept for their timing while their workspaces together stay within
#: this; past it, one is built again when it is timed (the memory the timing of the others needs stays free).
PREBUILT_BYTES = 256 << 20


class Planner:
    """Explores candidates for a problem and returns a :class:`Decision`.

    Parameters
    ----------
    backend : Backend or str
        Where candidates run (``'numpy'`` or ``'cupy'``).
    timer : callable, optional
        ``timer(fn, backend, label[, stop_above=seconds]) -> TimingStats``; defaults to the backend's
        real timer (adaptive repeats, early stopping; fixed repeats in an exhaustive search).
    workspace_limit : int, optional
        Candidates needing more temporary bytes are skipped (``over_budget``).
    time_budget_s : float, optional
        After this many seconds of timing one problem, remaining candidates are
        ``skipped``; at least one candidate is always timed.
    strategies : list of str, optional
        Restrict the search to these strategies.
    verify_batch : int
        Batch size of the verification run.
    exhaustive : bool
        Time every correct candidate in full: no strategy rules, no early stopping, fixed repeats.

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
                 progress: Callable[[str], None] | None = None, exhaustive: bool = False):
        self.backend = get_backend(backend) if isinstance(backend, str) else backend
        self.exhaustive = exhaustive
        self.timer = timer if timer is not None else default_timer(self.backend, adaptive=not exhaustive)
        self._early_stop = not exhaustive and takes_stop_above(self.timer)
        self.workspace_limit, self.time_budget_s = workspace_limit, time_budget_s
        self.strategy_names = list(strategies) if strategies else None
        if self.strategy_names:
            for name in self.strategy_names:
                get_strategy(name)  # unknown names raise, listing the valid ones
        self.verify_batch, self.seed, self.progress = verify_batch, seed, progress

    # -- public ------------------------------------------------------------------
    def tune(self, problem: ConvProblem) -> Decision:
        """Verify and time every candidate for ``problem``; return the decision."""
        started = time.perf_counter()
        s = Search(problem)
        candidates, later = self._enumerate(s)  # (later: the second round's, see Strategy.second_round)
        if candidates and not self._operands_fit(s, candidates, "the problem", 1, "its operands and result"):
            # checked before anything is verified: it cannot be timed here
            s.outcomes.extend(self._outcome(s, cand, "failed", workspace=0, reason=s.outcomes[-1].reason)
                              for cand in later)
            candidates = later = []
        self._prepare(s, candidates)
        survivors = self._verify(s, candidates)
        timed = self._time(s, survivors, lone_untimed=not later)
        if later:
            settled = first_round_settles(timed)
            if settled is None:
                self._report("second round")
                later, t0 = s.second_round(later, self._outcome), time.perf_counter()
                later, built = self._admitted(s, later)  # (their workspaces: a waiting cuDNN plan is built here)
                s.phase("the second round's workspaces", max(0.0, time.perf_counter() - t0 - built))
                self._prepare(s, later)
                timed += self._time(s, self._verify(s, later), best=min(
                    (o.timing.median_s for o in timed if o.timing), default=math.inf))
            else:
                s.outcomes.extend(self._outcome(s, cand, "skipped", workspace=0, reason=settled) for cand in later)
        timed = confirm_full_batch(s, timed, self.backend, self.verify_batch, self.seed, self._report)
        s.full_operands = s.verification = None
        s.prebuilt.clear()
        outcomes = s.outcomes
        if not timed:
            decision = Decision(problem, self.backend.device_info(), NO_WINNER, tuple(outcomes),
                                "measured", time.perf_counter() - started, dict(s.phases))
            raise TuningError(f"no candidate survived for {problem.describe()}:\n" + summary(outcomes), decision)
        best = min(timed, key=lambda o: o.timing.median_s if o.timing else 0.0)
        winner = with_(best, status="winner")
        outcomes = [winner if o is best else o for o in outcomes]
        for strategy in self._strategies():
            try:
                strategy.observe(problem, tuple(outcomes), winner)
            except Exception as exc:  # a lesson not learned costs search time, never the decision
                log.warning("%s could not learn from %s's search: %s", strategy.name, problem.describe(), exc)
        log.info("tuned %s: %s (%s)", problem.key(), winner.label,
                 f"{winner.timing.median_s * 1e3:.3f} ms" if winner.timing else "only candidate, not timed")
        return Decision(problem, self.backend.device_info(), winner, tuple(outcomes), "measured",
                        time.perf_counter() - started, dict(s.phases))

    def plan(self, problem: ConvProblem) -> Plan:
        """Tune and build the winner."""
        return build_plan(self.tune(problem), self.backend)

    def builds_ahead(self, problem: ConvProblem) -> list:
        """What :meth:`tune` of ``problem`` will compile, as calls of no arguments: its candidates' (listed and pruned
        as there) :meth:`~Strategy.kernel_builds`; a strategy with a :meth:`~Strategy.prepare` of its own prepares
        here. Nothing is recorded, a failure is the search's to meet. For many problems
        :class:`convtune.compiling.CompileAhead` runs them on a pool of threads while another problem is searched."""
        room, builds = None if self.exhaustive else self._room(problem), []
        for strategy in self._strategies():
            own = type(strategy).prepare is not Strategy.prepare
            if (not own and type(strategy).kernel_builds is Strategy.kernel_builds) \
                    or strategy.supports(problem, self.backend) is not None:
                continue
            configs = [c for c in strategy.candidates(problem, self.backend) if self.exhaustive or
                       strategy.pruned(problem, c, self.backend, room) is None]
            if own:
                strategy.prepare(problem, configs, self.backend)
            elif configs:
                builds += strategy.kernel_builds(problem, configs, self.backend)
        return builds

    # -- steps ----------------------------------------------------------------------
    def _strategies(self) -> list[Strategy]:
        if self.strategy_names:
            return [get_strategy(n) for n in self.strategy_names if get_strategy(n).selectable]
        return all_strategies(selectable_only=True)

    def _room(self, problem: ConvProblem) -> int | None:
        """The workspace a candidate may have: the limit, and the free memory beside the operands."""
        free = self.backend.free_memory_bytes()
        if free is not None:
            free = max(0, free - 3 * problem.min_bytes())
        limits = [v for v in (self.workspace_limit, free) if v is not None]
        return min(limits) if limits else None

    def _enumerate(self, s: Search) -> tuple[list[Candidate], list[Candidate]]:
        """The candidates of the first round and those that wait for the second (:meth:`Strategy.second_round`)."""
        problem, kept, pruned, later = s.problem, [], [], []
        room = None if self.exhaustive else self._room(problem)
        for strategy in self._strategies():
            t0 = time.perf_counter()
            try:
                reason = strategy.supports(problem, self.backend)
                configs = strategy.candidates(problem, self.backend) if reason is None else []
            except Exception as exc:  # one strategy's bug costs its candidates, not the problem's tuning
                why = failure_reason(self.backend, exc)
                log.warning("%s: listing %s's candidates raised %s; tuning goes on without them",
                            problem.describe(), strategy.name, why)
                s.phase(f"listing {strategy.name}", time.perf_counter() - t0)
                s.outcomes.append(CandidateOutcome(strategy.name, {}, f"{strategy.name}[*]", "failed",
                                                   reason=f"listing its candidates raised {why}"))
                continue
            spent, parts = time.perf_counter() - t0, strategy.listing_parts()
            cands = [Candidate(strategy, config, rank) for rank, config in enumerate(configs)]
            built = sum(s.built_elsewhere(cand) for cand in cands)  # (their candidates' builds, not the phase's)
            s.phase(f"listing {strategy.name}" + (": the rest" if parts else ""),
                    max(0.0, spent - sum(parts.values()) - built))
            for what, seconds in parts.items():
                s.phase(what, seconds)
            if reason is not None:
                s.outcomes.append(CandidateOutcome(strategy.name, {}, f"{strategy.name}[*]", "unsupported",
                                                   reason=reason))
                continue
            for cand in cands:
                config, rank = cand.config, cand.rank
                try:
                    rule = None if self.exhaustive else strategy.pruned(problem, config, self.backend, room)
                    if rule is not None:
                        # (workspace unknown, recorded as 0: knowing it can cost the build the rule saves)
                        outcome = self._outcome(s, cand, "skipped", workspace=0, reason=f"pruned: {rule}")
                        s.outcomes.append(outcome)
                        pruned.append((cand, outcome))
                    elif not self.exhaustive and strategy.second_round(problem, config, rank) is not None:
                        later.append(cand)  # (its workspace asked when its round comes: that can cost a build)
                    else:
                        self._within_limit(s, cand, kept)
                except Exception as exc:  # (its rule or its workspace): this candidate fails, not the search
                    s.outcomes.append(self._outcome(s, cand, "failed", reason=(
                        f"its rule or workspace raised {failure_reason(self.backend, exc)}")))
        if later and not any(cand.strategy.always_timed for cand in kept):
            kept, later = kept + self._admitted(s, later)[0], []  # no point of reference in the first round: one round
        if pruned and not kept:
            # a rule says another candidate will win; with none left (a search restricted to the pruned
            # strategy, say) the rules do not hold, and the pruned candidates are tried after all
            log.info("%s: the strategies' rules would prune every candidate left; trying them all", problem.describe())
            for cand, outcome in pruned:
                s.outcomes.remove(outcome)
                self._within_limit(s, cand, kept)
        return kept, later

    def _admitted(self, s: Search, candidates: list[Candidate]) -> tuple[list[Candidate], float]:
        """``candidates`` within the workspace limit (the others recorded ``over_budget``), and the seconds asking
        their workspaces spent building them (counted in their ``build_s``)."""
        kept, built = [], 0.0
        for cand in candidates:
            try:
                built += self._within_limit(s, cand, kept)
            except Exception as exc:  # (its workspace): this candidate fails, not the search
                s.outcomes.append(self._outcome(s, cand, "failed", workspace=0, reason=(
                    f"its workspace raised {failure_reason(self.backend, exc)}")))
        return kept, built

    def _prepare(self, s: Search, candidates: list[Candidate]) -> None:
        """Each strategy's :meth:`~convtune.strategies.base.Strategy.prepare` on its candidates, timed as a phase."""
        by_strategy: dict = {}
        for cand in candidates:
            by_strategy.setdefault(cand.strategy.name, (cand.strategy, []))[1].append(cand.config)
        for name, (strategy, configs) in by_strategy.items():
            t0 = time.perf_counter()
            try:
                strategy.prepare(s.problem, configs, self.backend)
            except Exception as exc:  # the candidates' own builds say what is wrong
                log.debug("%s could not prepare %s: %s", name, s.problem.describe(), exc)
            spent = time.perf_counter() - t0
            if spent > 1e-3:
                s.phase(f"preparing {name}", spent)

    def _within_limit(self, s: Search, cand: Candidate, kept: list) -> float:
        """``cand`` into ``kept``, or recorded ``over_budget`` where its workspace is over the limit; returns the
        seconds that asking its workspace spent building it (counted in its ``build_s``)."""
        ws = cand.strategy.workspace(s.problem, cand.config)
        built = s.built_elsewhere(cand)
        if self.workspace_limit is not None and ws > self.workspace_limit:
            s.outcomes.append(self._outcome(s, cand, "over_budget", reason=(
                f"workspace {human_bytes(ws)} over the limit {human_bytes(self.workspace_limit)}")))
        else:
            kept.append(cand)
        return built

    def _operands_fit(self, s: Search, candidates, what: str, factor: int, of: str, problem=None) -> bool:
        """Is there memory for ``factor`` times the problem's float32 operands and result? If not, every
        candidate fails with the reason (nothing is allocated)."""
        problem = problem or s.problem
        need = factor * problem.min_bytes()
        available = self.backend.free_memory_bytes()
        if available is None or need <= available:
            return True
        reason = (f"{what} needs {human_bytes(need)} for {of}, and only {human_bytes(available)} of "
                  f"{'device' if self.backend.name == 'cupy' else 'host'} memory is available")
        s.outcomes.extend(self._outcome(s, c, "failed", reason=reason) for c in candidates)
        log.warning("%s: %s", s.problem.describe(), reason)
        return False

    def _operands(self, s: Search, problem, candidates, what: str, seed: int, reference: bool):
        """Random operands (and the float64 reference) of ``problem``, or ``None`` with every candidate
        failed where memory runs out making them."""
        xp = self.backend.xp
        t0 = time.perf_counter()
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
            s.outcomes.extend(self._outcome(s, c, "failed", reason=reason) for c in candidates)
            log.warning("%s: %s", s.problem.describe(), reason)
            return None
        finally:
            s.phase("the float64 reference" if reference else "operands", time.perf_counter() - t0)

    def _verify(self, s: Search, candidates) -> list[tuple[Candidate, float]]:
        if not candidates:
            return []
        problem, xp = s.problem, self.backend.xp
        small = problem.replace(batch=min(problem.batch, self.verify_batch))
        # float32 operands and result, their float64 copies, the float64 reference
        if not self._operands_fit(s, candidates, "verification", 4,
                                  "its operands and result, their float64 copies and the float64 reference", small):
            return []
        made = s.verification or self._operands(s, small, candidates, "verification", self.seed, reference=True)
        if made is None:
            return []
        a, b, ref = s.verification = made
        survivors = []
        best_warm = s.best_warm
        for cand in candidates:
            if cand.strategy.always_timed and cand.strategy.verified_as_timed(problem, cand.config):
                survivors.append((cand, None, 0.0))  # (timed first, then verified: _time)
                continue
            self._report(f"verify {cand.label}")
            started = time.perf_counter()
            try:
                full = small.batch < problem.batch and cand.strategy.verified_at_full_batch(problem, cand.config) \
                    and self._zero_extended(s, small, a, b, ref) is not None
                if full:  # built once, at the full batch, and timed as built (see Strategy.verified_at_full_batch)
                    run = cand.strategy.executor(problem, cand.config, self.backend)
                    held = cand.strategy.workspace(problem, cand.config)
                    if s.prebuilt_bytes + held <= PREBUILT_BYTES:
                        s.prebuilt[cand.label], s.prebuilt_bytes = run, s.prebuilt_bytes + held
                    va, vb, out, vref = s.zero_extended
                    out[...] = xp.nan
                else:
                    out = precision.empty_result(xp, small, fill=xp.nan)
                    run = cand.strategy.executor(small, cand.strategy.verification_config(cand.config), self.backend)
                    va, vb, vref = a, b, ref
                built = time.perf_counter()
                s.spend(cand, "build_s", built - started)
                started = built  # verify_s is the runs and the check, not the build again (tune's totals add them)
                # (a run of the full batch ranks as its share of the verification batch's samples)
                share = small.batch / problem.batch if full else 1.0
                first_s = s.costs[cand.label]["first_run_s"] = self._synchronized_run(run, va, vb, out) * share
                err = relative_error(xp, out, vref)
                if not err <= problem.tolerance:
                    s.spend(cand, "verify_s", time.perf_counter() - started)
                    s.outcomes.append(self._outcome(s, cand, "rejected", error=err,
                                                    reason=f"error {err:.3g} over the {problem.math} tolerance "
                                                           f"{problem.tolerance:g}"))
                    continue
                # A first run also pays one-time costs (CUDA loads kernel modules lazily, FFT plans are made),
                # so it only rules a candidate out past a hard floor; otherwise the warm run decides.
                reference_point = cand.strategy.always_timed  # what the user had: never ruled out unmeasured
                if not reference_point and first_s > max(SLOW_FACTOR * best_warm, FIRST_RUN_FLOOR_S):
                    s.spend(cand, "verify_s", time.perf_counter() - started)
                    s.outcomes.append(self._outcome(s, cand, "skipped", error=err, reason=(
                        f"first run on the verification batch took {first_s:.2f} s, {first_s / best_warm:.0f}x the "
                        "best; not timed")))
                    continue
                # a second, warm run on the small batch ranks the candidates for timing (fastest first),
                # so a time budget is spent on the likely winners, not on registry order
                warm_s = s.costs[cand.label]["warm_run_s"] = self._synchronized_run(run, va, vb, out,
                                                                                     SLOW_FLOOR_S / share) * share
                s.spend(cand, "verify_s", time.perf_counter() - started)
                best_warm = min(best_warm, warm_s)
            except Exception as exc:  # a failing candidate is recorded; tuning goes on
                s.spend(cand, "verify_s", time.perf_counter() - started)
                s.outcomes.append(self._outcome(s, cand, "failed", reason=failure_reason(self.backend, exc)))
                log.debug("candidate %s failed verification", cand.label, exc_info=True)
                continue
            survivors.append((cand, err, warm_s))
        s.zero_extended, s.best_warm = None, best_warm
        survivors = self._slow_against_the_last(s, survivors, best_warm)
        for label in set(s.prebuilt) - {cand.label for cand, _err, _warm in survivors}:
            del s.prebuilt[label]  # (only survivors are timed)
        survivors.sort(key=lambda item: item[2])
        return [(cand, err) for cand, err, _warm in survivors]

    def _slow_against_the_last(self, s: Search, survivors, best_warm: float) -> list:
        """The survivors less those whose warm run is ``SLOW_FACTOR`` times the best of all: a candidate verified
        before the fast ones (registry order) met no best to be slow against when it was verified."""
        kept = []
        for cand, err, warm_s in survivors:
            if not cand.strategy.always_timed and warm_s > max(SLOW_FACTOR * best_warm, SLOW_FLOOR_S):
                s.outcomes.append(self._outcome(s, cand, "skipped", error=err, reason=(
                    f"{warm_s / best_warm:.0f}x slower than the best candidate on the verification batch; "
                    "not timed")))
            else:
                kept.append((cand, err, warm_s))
        return kept

    def _zero_extended(self, s: Search, small: ConvProblem, a, b, ref):
        """:meth:`Search.extend` made once per search; ``None`` where it does not fit in memory."""
        if s.zero_extended is None:
            if not self._operands_fit(s, [], "verification at the full batch", 1, "its operands and result"):
                return None
            s.extend(self.backend.xp, small, a, b, ref)
        return s.zero_extended

    def _verified_as_timed(self, s: Search, cand, run) -> float:
        """``cand``'s error, checked after its timing with ``run``, the executor timed: on the verification operands
        zero-extended to the full batch (the verification batch itself where those do not fit, built for it)."""
        problem, xp, (a, b, ref) = s.problem, self.backend.xp, s.verification
        small = problem.replace(batch=min(problem.batch, self.verify_batch))
        started = time.perf_counter()
        try:
            full = self._zero_extended(s, small, a, b, ref)
            if full is None:
                run, full = cand.strategy.executor(small, cand.config, self.backend), (
                    a, b, precision.empty_result(xp, small), ref)
            va, vb, out, vref = full
            out[...] = xp.nan
            run(va, vb, out)
            return relative_error(xp, out, vref)
        finally:
            s.zero_extended = None
            s.spend(cand, "verify_s", time.perf_counter() - started)

    def _synchronized_run(self, run, a, b, out, again_past: float = math.inf) -> float:
        """Seconds one run takes, device work included (a rough clock for ranking, not a timing); past ``again_past``
        seconds it runs once more and the faster counts."""
        t0 = time.perf_counter()
        run(a, b, out)
        self.backend.synchronize()
        took = time.perf_counter() - t0
        return min(took, self._synchronized_run(run, a, b, out)) if took > again_past else took

    def _time(self, s: Search, survivors, best: float = math.inf, lone_untimed: bool = True) -> list[CandidateOutcome]:
        """Time ``survivors``; ``best``: an earlier round's best median; ``lone_untimed``: a lone survivor is not."""
        problem = s.problem
        if len(survivors) == 1 and lone_untimed and not math.isfinite(best) and survivors[0][1] is not None:
            cand, err = survivors[0]
            outcome = self._outcome(s, cand, "ok", error=err, reason="only candidate; not timed")
            s.outcomes.append(outcome)
            return [outcome]
        if not survivors:
            return []
        cands = [cand for cand, _err in survivors]
        available = self.backend.free_memory_bytes()
        if not self._operands_fit(s, cands, "timing the full problem", 1, "its operands and result"):
            return []
        made = (*s.full_operands, None) if s.full_operands else \
            self._operands(s, problem, cands, "timing the full problem", self.seed + 1, reference=False)
        if made is None:
            return []
        a, b, _ = made
        s.full_operands = (a, b)
        xp = self.backend.xp
        out = precision.empty_result(xp, problem)
        left = None if available is None else available - problem.min_bytes()
        timed = []
        spent = s.timing_spent  # (an earlier round's count too)
        for cand, err in survivors:
            reference_point = cand.strategy.always_timed
            if self.time_budget_s is not None and (timed or math.isfinite(best)) and spent > self.time_budget_s \
                    and not reference_point:
                s.outcomes.append(self._outcome(s, cand, "skipped", error=err,
                                                reason=f"time budget of {self.time_budget_s:g} s spent"))
                continue
            ws = cand.strategy.workspace(problem, cand.config)
            if left is not None and ws > left:  # checked before it allocates
                s.outcomes.append(self._outcome(s, cand, "over_budget", error=err, reason=(
                    f"workspace {human_bytes(ws)} over the {human_bytes(left)} of memory left beside the operands")))
                continue
            if not self.exhaustive and math.isfinite(best):
                t0 = time.perf_counter()
                beyond = self._beyond_best(s, cand, err, (a, b), best)
                spent += time.perf_counter() - t0  # (a floor's cost is timing's, the time budget's too)
                if beyond:
                    continue
            self._report(f"time {cand.label}")
            stop_above = EARLY_STOP * best if self._early_stop and math.isfinite(best) and not reference_point \
                else None
            t0 = t_timing = time.perf_counter()
            try:
                run = s.prebuilt.pop(cand.label, None) or cand.strategy.executor(problem, cand.config, self.backend)
                t_timing = time.perf_counter()
                s.spend(cand, "build_s", t_timing - t0)
                # timed as the runtime calls it: into ``out``, or making its own result where it does; an
                # executor with a ``timed`` form is timed through it (see Strategy.build)
                target = None if cand.strategy.allocates_result else out
                fn = run.timed(a, b, target) if run.timed is not None else lambda: run(a, b, target)
                stats = self.timer(fn, self.backend, cand.label, stop_above=stop_above) if stop_above is not None \
                    else self.timer(fn, self.backend, cand.label)
            except Exception as exc:
                s.outcomes.append(self._outcome(s, cand, "failed", error=err, reason=failure_reason(self.backend, exc)))
                log.debug("candidate %s failed timing", cand.label, exc_info=True)
                continue
            finally:
                now = time.perf_counter()
                spent += now - t0
                s.spend(cand, "timing_s", now - t_timing)
            if err is None:  # (verified as timed: Strategy.verified_as_timed)
                try:
                    err = self._verified_as_timed(s, cand, run)
                except Exception as exc:
                    s.outcomes.append(self._outcome(s, cand, "failed", timing=stats, reason=failure_reason(
                        self.backend, exc)))
                    continue
                if not err <= problem.tolerance:
                    s.outcomes.append(self._outcome(s, cand, "rejected", error=err, timing=stats, reason=(
                        f"error {err:.3g} over the {problem.math} tolerance {problem.tolerance:g}, verified after "
                        "its timing")))
                    continue
            reason = ""
            if stop_above is not None and stats.median_s > stop_above:
                reason = (f"timing stopped after {stats.repeats} run(s): {stats.median_s / best:.2f}x the best so far "
                          f"(more than {EARLY_STOP:g}x)")
            best = min(best, stats.median_s)
            outcome = self._outcome(s, cand, "ok", error=err, timing=stats, reason=reason)
            s.outcomes.append(outcome)
            timed.append(outcome)
        s.timing_spent = spent
        return timed

    def _beyond_best(self, s: Search, cand, err, operands, best: float) -> bool:
        """Does ``cand``'s strategy put a floor under its median above ``best`` (:meth:`Strategy.lower_bound`)? Then it
        is recorded ``skipped`` with the strategy's reason; the floor's cost is its timing cost."""
        small = min(s.problem.batch, self.verify_batch)
        warm = s.costs.get(cand.label, {}).get("warm_run_s")
        t0 = time.perf_counter()
        try:
            floor = cand.strategy.lower_bound(s.problem, cand.config, self.backend, operands, best,
                                              None if warm is None else warm * s.problem.batch / small)
        except Exception as exc:  # no floor: it is timed
            log.debug("%s: no floor for %s: %s", s.problem.key(), cand.label, failure_reason(self.backend, exc))
            floor = None
        s.spend(cand, "timing_s", time.perf_counter() - t0)
        if floor is None or not floor[0] > best:
            return False
        s.outcomes.append(self._outcome(s, cand, "skipped", error=err, reason=(
            f"not timed: its median cannot be under {floor[0] * 1e3:.3f} ms, {floor[0] / best:.2f}x the best so far: "
            f"{floor[1]}")))
        return True

    def _outcome(self, s: Search, cand, status, workspace: int | None = None, **fields) -> CandidateOutcome:
        """``cand``'s outcome, with its costs so far and its workspace (the strategy's, where not given)."""
        cost = s.costs.get(cand.label, {})
        try:
            if workspace is None:
                workspace = cand.strategy.workspace(s.problem, cand.config)
        except Exception:  # unknown (0 in the cache's column); the caller records this candidate's failure
            workspace = 0
        return CandidateOutcome(cand.strategy.name, cand.config.as_dict(), cand.label, status,
                                workspace_bytes=workspace,
                                build_s=cost.get("build_s"), verify_s=cost.get("verify_s"),
                                timing_s=cost.get("timing_s"), rank=cand.rank, first_run_s=cost.get("first_run_s"),
                                warm_run_s=cost.get("warm_run_s"), **fields)

    def _report(self, text: str) -> None:
        if self.progress is not None:
            self.progress(text)
