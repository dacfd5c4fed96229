"""The one interface of a plan store: every operation the runtime, the tuners and the front ends use.

Two implementations: :class:`~convtune.cache.PlanCache` (SQL: SQLite, PostgreSQL) and
:class:`~convtune.cache.MemoryPlanStore`. A store knows problems, devices, decisions and typed records
(:mod:`convtune.cache.records`); it knows nothing of strategies beyond their version string
(:mod:`convtune.versioning`), and each record's owner encodes and decodes its records.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ..backend import DeviceInfo
from ..plan import Decision
from ..problem import ConvProblem


@runtime_checkable
class PlanStore(Protocol):
    """Where decisions and records live between calls."""

    #: Nothing can be written: what is tuned stays in the process (said once).
    read_only: bool
    #: Workers can take leases here (one worker tunes a problem at a time: :mod:`convtune.worklist`).
    has_leases: bool

    # -- plans
    def get(self, problem: ConvProblem, device_key: str, fresh: bool = False) -> Decision | None:
        """The stored decision of ``problem`` on the device under this convtune's strategy versions."""

    def put(self, decision: Decision) -> str | None:
        """Record every outcome of ``decision`` and, where it has a winner, its plan; the run id (or ``None``)."""

    def nearest(self, problem: ConvProblem, device_key: str) -> Decision | None:
        """The decision of the tuned problem of ``problem``'s kind nearest in batch and input size, or ``None``."""

    # -- pending work
    def add_pending(self, problem: ConvProblem, device: DeviceInfo, served_by: str) -> None:
        """Note that ``problem`` was served without a plan of its own (for ``convtune tune --pending``)."""

    def pending_problems(self, device_key: str) -> list[tuple[ConvProblem, str]]:
        """The problems pending on a device, with what served each meanwhile, oldest first."""

    # -- leases
    def take_lease(self, problem: ConvProblem, device: DeviceInfo, holder: str, ttl_s: float) -> str | None:
        """Take the lease on tuning ``problem``: ``None`` where it is now ``holder``'s, else who holds it."""

    def renew_leases(self, holder: str, ttl_s: float) -> int:
        """Extend every lease of ``holder``; how many there were."""

    def release_lease(self, problem: ConvProblem, device_key: str, holder: str) -> None:
        """Give ``holder``'s lease on ``problem`` back."""

    def lease_holder(self, problem: ConvProblem, device_key: str) -> tuple[str, float] | None:
        """Who holds the lease on ``problem`` and for how many more seconds, or ``None``."""

    # -- typed records (round-trip decisions, duels, calibrations: convtune.cache.records)
    def get_record(self, kind: str, key: str) -> dict | None:
        """The record of ``kind`` stored under ``key``, or ``None``."""

    def put_record(self, kind: str, key: str, doc: dict) -> None:
        """Store (replacing) the record of ``kind`` under ``key``."""

    def records(self, kind: str) -> list[dict]:
        """Every stored record of ``kind``."""
