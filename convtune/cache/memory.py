"""A plan store in this process's memory: decisions and records in dicts, lost at exit."""

from __future__ import annotations

import copy

from ..plan import Decision
from .records import record_kind


class MemoryPlanStore:
    """Decisions keyed by ``(device key, problem key)`` and records by ``(kind, key)``; lost at exit.

    It serves no nearest problem, keeps no pending list and no leases (one process: nobody to share with).
    """

    read_only = False
    has_leases = False

    def __init__(self):
        self._decisions: dict[tuple[str, str], Decision] = {}
        self._records: dict[tuple[str, str], dict] = {}
        self.hits = 0
        self.misses = 0

    def get(self, problem, device_key, fresh=False):
        decision = self._decisions.get((device_key, problem.key()))
        if decision is None:
            self.misses += 1
        else:
            self.hits += 1
        return decision

    def put(self, decision):
        self._decisions[(decision.device_key, decision.problem.key())] = decision
        return None

    def nearest(self, problem, device_key):
        return None

    def add_pending(self, problem, device, served_by):
        return None

    def pending_problems(self, device_key):
        return []

    def take_lease(self, problem, device, holder, ttl_s):
        return None

    def renew_leases(self, holder, ttl_s):
        return 0

    def release_lease(self, problem, device_key, holder):
        return None

    def lease_holder(self, problem, device_key):
        return None

    def get_record(self, kind, key):
        record_kind(kind)
        found = self._records.get((kind, key))
        return copy.deepcopy(found) if found is not None else None

    def put_record(self, kind, key, doc):
        record_kind(kind)
        self._records[(kind, key)] = copy.deepcopy(doc)

    def records(self, kind):
        record_kind(kind)
        return [copy.deepcopy(doc) for (k, key), doc in sorted(self._records.items()) if k == kind]

    def __len__(self):
        return len(self._decisions)

    def __repr__(self):
        return f"<MemoryPlanStore {len(self)} decisions, hits={self.hits} misses={self.misses}>"
