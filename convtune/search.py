"""One search's state and records, for the planner (:mod:`convtune.planner`): a candidate (a strategy's
configuration and its place in the strategy's list), what a search has found and spent so far, and the helpers that
make its outcomes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from .plan import CandidateOutcome
from .problem import ConvProblem
from .strategies.base import Config, Strategy


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

    def spend(self, cand, what: str, seconds: float) -> None:
        entry = self.costs.setdefault(cand.label, {})
        entry[what] = entry.get(what, 0.0) + seconds

    def phase(self, what: str, seconds: float) -> None:
        self.phases[what] = self.phases.get(what, 0.0) + seconds


def with_(outcome: CandidateOutcome, **changes) -> CandidateOutcome:
    return dataclasses.replace(outcome, **changes)


NO_WINNER = CandidateOutcome("", {}, "", "failed", reason="no candidate survived")


def summary(outcomes) -> str:
    return "\n".join(f"  {o.label}: {o.status} ({o.reason})" for o in outcomes)
