"""One search's state and records, for the planner (:mod:`convtune.planner`): a candidate (a strategy's
configuration and its place in the strategy's list), what a search has found and spent so far, and the helpers that
make its outcomes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from . import precision
from .plan import CandidateOutcome
from .problem import ConvProblem
from .strategies.base import Config, Strategy, get_strategy

#: Where strategies hold candidates back for a second round (:meth:`~convtune.strategies.base.Strategy.second_round`:
#: cuDNN's plans past the heuristics' first eight on half-precision problems), the second round runs only where a
#: candidate of the first beat the point of reference (PyTorch's call) by this factor, the margin by which a plan must
#: beat PyTorch's call in the PyTorch layer's duel (:data:`convtune.torch._duel.DUEL_MARGIN`) to replace it.
FIRST_ROUND_MARGIN = 1.05


@dataclass(frozen=True)
class Candidate:
    strategy: Strategy
    config: Config
    rank: int = 0  # its place in its strategy's list of candidates

    @property
    def label(self) -> str:
        return self.strategy.describe(self.config)


@dataclass
class Search:
    """One :meth:`Planner.tune` call's state: its outcomes and what each candidate and phase cost."""

    problem: ConvProblem
    outcomes: list = field(default_factory=list)
    costs: dict = field(default_factory=dict)  # label -> {"build_s", "verify_s", "timing_s", "first_run_s", ...}
    phases: dict = field(default_factory=dict)  # phase -> seconds
    full_operands: tuple | None = None  # the timing operands, for the full-batch check
    prebuilt: dict = field(default_factory=dict)  # label -> a full-batch executor built for verification, to time
    prebuilt_bytes: int = 0  # the workspaces that ``prebuilt`` holds (at most the planner's PREBUILT_BYTES)
    zero_extended: tuple | None = None  # the verification operands zero-extended to the full batch, and a result
    verification: tuple | None = None  # the verification operands and their float64 reference, made once
    best_warm: float = float("inf")  # the best warm run on the verification batch so far
    timing_spent: float = 0.0  # seconds spent timing so far (the time budget's count)

    def spend(self, cand, what: str, seconds: float) -> None:
        entry = self.costs.setdefault(cand.label, {})
        entry[what] = entry.get(what, 0.0) + seconds

    def built_elsewhere(self, cand) -> float:
        """The seconds ``cand``'s strategy spent building it outside its build (while listing, or asked its workspace:
        :meth:`~convtune.strategies.base.Strategy.built_elsewhere_s`), now counted in its ``build_s``."""
        seconds = cand.strategy.built_elsewhere_s(self.problem, cand.config)
        if seconds:
            self.spend(cand, "build_s", seconds)
        return seconds

    def second_round(self, later: list, outcome) -> list:
        """The waiting candidates ``later`` that the second round tries: those their strategy does not leave out of it
        (:meth:`~convtune.strategies.base.Strategy.left_out_of_second_round`), the others recorded ``skipped`` with its
        reason as a rule's (``outcome``: the planner's, ``outcome(search, cand, status, workspace=, reason=)``)."""
        tried = []
        for cand in later:
            why = cand.strategy.left_out_of_second_round(self.problem, cand.config, cand.rank)
            if why is None:
                tried.append(cand)
            else:
                self.outcomes.append(outcome(self, cand, "skipped", workspace=0, reason=f"pruned: {why}"))
        return tried

    def phase(self, what: str, seconds: float) -> None:
        self.phases[what] = self.phases.get(what, 0.0) + seconds

    def extend(self, xp, small: ConvProblem, a, b, ref) -> None:
        """:attr:`zero_extended`: the verification operands ``a``, ``b`` (of ``small``) zero-extended along the batch
        to the full problem's, a full-batch result and its reference (``ref`` zero-extended too, but a filter
        gradient's: zero samples add nothing to it)."""
        problem = self.problem

        def extended(v, shape):
            if v.shape == tuple(shape):  # the filter (an operand, or the filter gradient): no batch axis
                return v
            full = precision.laid_out(xp, xp.zeros(shape, dtype=v.dtype), problem.layout)
            full[:small.batch] = v
            return full
        (sa, sb) = problem.operand_shapes
        self.zero_extended = (extended(a, sa), extended(b, sb), precision.empty_result(xp, problem, fill=xp.nan),
                              extended(ref, problem.result_shape))


def with_(outcome: CandidateOutcome, **changes) -> CandidateOutcome:
    return dataclasses.replace(outcome, **changes)


NO_WINNER = CandidateOutcome("", {}, "", "failed", reason="no candidate survived")


def summary(outcomes) -> str:
    return "\n".join(f"  {o.label}: {o.status} ({o.reason})" for o in outcomes)


def first_round_settles(timed) -> str | None:
    """Why a search's second round is not run after a first that timed ``timed`` (outcomes): none of its candidates
    beat the point of reference (an ``always_timed`` strategy's: PyTorch's call) by :data:`FIRST_ROUND_MARGIN`.
    ``None`` where one did, where the reference has no median (its floor was over the best so far: it lost already) or
    where nothing else was timed (nothing to judge the rest by)."""
    medians = {o.label: o.timing.median_s for o in timed if o.timing and o.timing.median_s}
    refs = [o for o in timed if o.label in medians and get_strategy(o.strategy).always_timed]
    others = [o for o in timed if o.label in medians and not get_strategy(o.strategy).always_timed]
    if not refs or not others:
        return None
    ref = min(refs, key=lambda o: medians[o.label])
    best = min(others, key=lambda o: medians[o.label])
    if medians[best.label] * FIRST_ROUND_MARGIN <= medians[ref.label]:
        return None
    return (f"second round not run: no candidate of the first beat {ref.label} ({medians[ref.label] * 1e3:.3f} ms) "
            f"by {FIRST_ROUND_MARGIN:g}x (the best, {best.label}, {medians[best.label] * 1e3:.3f} ms)")
