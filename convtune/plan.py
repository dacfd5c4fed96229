"""Decisions and plans.

A :class:`Decision` records what the planner found for one problem: every
candidate's :class:`CandidateOutcome` and the winner. A :class:`Plan` is the
immutable executor built from a decision's winner, called many times.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from .backend import DeviceInfo
from .executor import Executor
from .problem import ConvProblem
from .timing import TimingStats

#: Where a decision came from.
SOURCES = ("measured", "cache", "heuristic", "explicit")

#: Candidate statuses, in the order a candidate passes through them.
STATUSES = ("winner", "ok", "unsupported", "over_budget", "rejected", "failed", "skipped")


@dataclass(frozen=True)
class CandidateOutcome:
    """One candidate's outcome: timing, workspace, error vs float64, failure and reason."""

    strategy: str
    config: dict
    label: str
    status: str
    workspace_bytes: int = 0
    error: float | None = None
    timing: TimingStats | None = None
    reason: str = ""
    #: what it cost to search: seconds spent building it (on the verification batch and the full one),
    #: verifying it (its runs on the verification batch and the error check; in caches tuned before 2026-11-24
    #: this also held the verification batch's build) and timing it, and its place in its
    #: strategy's list (the heuristics' order for cuDNN)
    build_s: float | None = None
    verify_s: float | None = None
    timing_s: float | None = None
    rank: int | None = None
    #: its first run and its second (warm) run on the verification batch, each in seconds scaled to the full problem's
    #: samples (a run at the full batch, zero-extended, as its share of the verification batch's samples), with the
    #: host's work and a synchronisation: the planner's rough clock for ranking, not a timing (see
    #: :mod:`convtune.planner`); ``None`` where the candidate did not get that far
    first_run_s: float | None = None
    warm_run_s: float | None = None

    @property
    def median_s(self) -> float | None:
        return self.timing.median_s if self.timing else None

    def as_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["timing"] = self.timing.as_dict() if self.timing else None
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CandidateOutcome":
        data = dict(data)
        if data.get("timing"):
            data["timing"] = TimingStats(**data["timing"])
        return cls(**data)


@dataclass(frozen=True)
class Decision:
    """The planner's verdict for one problem and pass."""

    problem: ConvProblem
    device: DeviceInfo
    winner: CandidateOutcome
    outcomes: tuple[CandidateOutcome, ...] = ()
    source: str = "measured"
    tuning_s: float = 0.0
    #: seconds of the search not spent on one candidate: listing each strategy's candidates, making the
    #: operands and the float64 reference, the full-batch check
    phases: dict = field(default_factory=dict)

    @property
    def device_key(self) -> str:
        return self.device.key()

    def runner_up(self) -> CandidateOutcome | None:
        """The fastest timed candidate that is not the winner."""
        timed = [o for o in self.outcomes if o.status == "ok" and o.timing is not None]
        return min(timed, key=lambda o: o.timing.median_s, default=None)

    def speedup_over_next(self) -> float | None:
        nxt = self.runner_up()
        if nxt is None or self.winner.timing is None or self.winner.timing.median_s <= 0:
            return None
        return nxt.timing.median_s / self.winner.timing.median_s


@dataclass(frozen=True, eq=False)
class Plan:
    """An executor for one problem, built once, called many times.

    ``plan(a, b, out=None)`` takes the pass's two operands (see
    :mod:`convtune.problem`) and returns the result, an array of the operands' kind.
    """

    problem: ConvProblem
    strategy: str
    config: Any
    backend: str
    source: str = "measured"
    run: Executor | None = field(default=None, repr=False)

    def __call__(self, a, b, out=None):
        a_shape, b_shape = self.problem.operand_shapes
        if a.shape != a_shape or b.shape != b_shape:
            raise ValueError(f"this plan is for operands of shapes {a_shape} and {b_shape} "
                             f"({self.problem.describe()}); got {a.shape} and {b.shape}")
        if out is not None and out.shape != self.problem.result_shape:
            raise ValueError(f"out has shape {out.shape}; this plan writes {self.problem.result_shape}")
        return self.run.run(a, b, out)

    @property
    def launch(self):
        """The executor's by-address form (:attr:`convtune.executor.Executor.launch`), or ``None``."""
        return self.run.launch

    @property
    def label(self) -> str:
        return f"{self.strategy}[{self.config.label()}]"
