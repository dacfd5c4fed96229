"""Tuning a list of problems alongside other workers: leases, waiting and taking over.

Workers that share a plan cache (``convtune tune`` runs, the processes of ``--devices``, machines on
one PostgreSQL cache, the ranks of a ``torch.distributed`` job) never tune one problem twice at
once. Each worker goes through the problems from its own starting point (worker ``i`` of ``n``
starts ``i/n`` of the way in, so that they begin apart) and, for each problem the cache lacks, takes
the problem's **lease** in the cache, tunes, stores the plan and gives the lease back. A problem
whose lease another worker holds is put aside; :meth:`Worklist.finish` comes back to each: its plan
is read from the cache once the other worker has stored it, or, where that worker's lease ran out
(it died, or lost its connection), the lease is taken over and the problem tuned here.

A heartbeat thread renews this worker's leases every third of :data:`LEASE_TTL_S` while it tunes, so
a live worker keeps its problems however long one takes, and a dead one's run out after
:data:`LEASE_TTL_S` seconds. A cache without leases (a read-only or in-memory one) is worked
through alone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Callable

from .errors import CacheError, TuningError
from .plan import Decision
from .problem import ConvProblem

log = logging.getLogger("convtune")

#: Seconds a lease lasts unless renewed (a dead worker's problems wait this long to be taken over).
LEASE_TTL_S = 90.0
#: Seconds between looks at the problems another worker is tuning.
POLL_S = 0.5


def holder_name() -> str:
    """This worker's name in the leases table: host, process and a token (unique per worker)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass
class Outcome:
    """What became of one problem: ``cache`` (its plan was there), ``tuned`` (here), ``elsewhere``
    (another worker tuned it meanwhile) or ``FAILED`` (here: no candidate survived, see ``error``)."""

    problem: ConvProblem
    source: str
    decision: Decision | None = None
    error: TuningError | None = None


def rotated(items: list, worker: int, workers: int) -> list:
    """``items`` starting ``worker/workers`` of the way in (wrapping round)."""
    if workers <= 1 or not items:
        return list(items)
    start = len(items) * worker // workers
    return items[start:] + items[:start]


class Leases:
    """This process's leases on one plan cache: taken and given back per problem, renewed by a heartbeat
    thread (every third of ``ttl_s``) while any is held. ``holder``: the name in the leases table."""

    def __init__(self, cache, ttl_s: float = LEASE_TTL_S, holder: str | None = None):
        self.cache, self.ttl_s = cache, ttl_s
        self.holder = holder or holder_name()
        self._held: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._unreleased = 0  # leases not given back while the cache failed (warned of once, then at DEBUG)

    def take(self, problem: ConvProblem, device) -> str | None:
        """Take the lease on ``problem`` on ``device``: ``None`` where it is this holder's now, else who
        holds it."""
        other = self.cache.take_lease(problem, device, self.holder, self.ttl_s)
        if other is None:
            with self._lock:
                self._held.add((problem.key(), device.key()))
                if self._heartbeat is None:
                    self._heartbeat = threading.Thread(target=self._renew, name="convtune-leases", daemon=True)
                    self._heartbeat.start()
        return other

    def release(self, problem: ConvProblem, device_key: str) -> None:
        with self._lock:
            self._held.discard((problem.key(), device_key))
        try:
            self.cache.release_lease(problem, device_key, self.holder)
        except CacheError as exc:  # it runs out by itself
            self._unreleased += 1
            log.log(logging.WARNING if self._unreleased == 1 else logging.DEBUG,
                    "convtune: could not give back the lease of %s (%s); it runs out in %.0f s%s", problem.describe(),
                    exc, self.ttl_s, " (further leases not given back are logged at DEBUG)"
                    if self._unreleased == 1 else "")

    def _renew(self):
        while not self._stop.wait(self.ttl_s / 3):
            if self._held:
                try:
                    self.cache.renew_leases(self.holder, self.ttl_s)
                except CacheError as exc:  # the next renewal may get through; the lease lasts ttl_s meanwhile
                    log.warning("convtune: could not renew the leases of %s: %s", self.holder, exc)

    def close(self) -> None:
        """Stop the heartbeat (leases still held run out)."""
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)


def store_leases(store, ttl_s: float = LEASE_TTL_S) -> Leases | None:
    """:class:`Leases` on ``store`` where it keeps them (a writable plan cache at schema 3), else ``None``."""
    try:
        return Leases(store, ttl_s) if store.has_leases else None
    except CacheError:  # a cache that cannot be opened has no leases; its failure is the runtime's to report
        return None


class Worklist:
    """One worker's way through a list of problems (use as a context manager: it stops its lease heartbeat).

    Parameters
    ----------
    cache : PlanCache or any plan store
        Leases are taken where it has them (a writable cache at schema 3).
    device : DeviceInfo
        The device tuned on (leases and plans are per device fingerprint).
    tune : callable
        ``tune(problem) -> Decision``, raising :class:`~convtune.errors.TuningError` (with its decision)
        where no candidate survives; usually :meth:`Planner.tune`.
    retune : bool
        Tune even where the cache has a plan (a problem another worker holds is still left to it).
    ttl_s, poll_s : float
        Lease length and how often :meth:`finish` looks at problems others are tuning.
    on_tune : callable, optional
        ``on_tune(problem)`` just before a problem is tuned here (for progress).
    """

    def __init__(self, cache, device, tune: Callable[[ConvProblem], Decision], *, retune: bool = False,
                 ttl_s: float = LEASE_TTL_S, poll_s: float = POLL_S, holder: str | None = None,
                 on_tune: Callable[[ConvProblem], None] | None = None):
        self.cache, self.device, self._tune, self.retune = cache, device, tune, retune
        self.on_tune = on_tune
        self.device_key = device.key()
        self.poll_s = poll_s
        self.leases = Leases(cache, ttl_s, holder) if cache.has_leases else None
        self.deferred: list[ConvProblem] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.leases is not None:
            self.leases.close()
        return False

    def _stored(self, problem: ConvProblem, fresh: bool = False):
        get = self.cache.get
        return get(problem, self.device_key, fresh=True) if fresh and self.leases else get(problem, self.device_key)

    def attempt(self, problem: ConvProblem) -> Outcome | None:
        """The problem's plan from the cache, or tuned here under its lease; ``None`` where another worker
        holds its lease (it is then in :attr:`deferred`, for :meth:`finish`)."""
        if not self.retune and self._stored(problem) is not None:
            return Outcome(problem, "cache")
        if self.leases is None:
            return self._run(problem)
        if self.leases.take(problem, self.device) is not None:
            self.deferred.append(problem)
            return None
        if not self.retune and self._stored(problem, fresh=True) is not None:  # stored just before the lease
            self.leases.release(problem, self.device_key)
            return Outcome(problem, "elsewhere")
        return self._run(problem, leased=True)

    def _run(self, problem: ConvProblem, leased: bool = False) -> Outcome:
        try:
            if self.on_tune is not None:
                self.on_tune(problem)
            try:
                decision = self._tune(problem)
            except TuningError as exc:
                self.cache.put(exc.decision)  # every candidate's failure is kept
                return Outcome(problem, "FAILED", exc.decision, exc)
            self.cache.put(decision)  # saved at once: an interrupted run loses nothing
            return Outcome(problem, "tuned", decision)
        finally:
            if leased:
                self.leases.release(problem, self.device_key)

    def finish(self, on_wait: Callable[[int, str], None] | None = None):
        """Yield an :class:`Outcome` for each deferred problem as it is settled: its plan stored by the
        worker that held it, or tuned here after that worker's lease ran out. ``on_wait(n, holder)`` is
        called once per round in which ``n`` problems are still held by others (one of them by ``holder``)."""
        waiting = list(self.deferred)
        self.deferred.clear()
        while waiting:
            still = []
            for problem in waiting:
                if self._stored(problem, fresh=True) is not None:
                    yield Outcome(problem, "elsewhere")
                    continue
                holder = self.leases.take(problem, self.device)
                if holder is None:
                    if self._stored(problem, fresh=True) is not None:
                        self.leases.release(problem, self.device_key)
                        yield Outcome(problem, "elsewhere")
                    else:  # free again without a plan: its worker failed or gave up; tuned here
                        yield self._run(problem, leased=True)
                    continue
                still.append((problem, holder))
            if still:
                if on_wait is not None:
                    on_wait(len(still), still[0][1])
                time.sleep(self.poll_s)
            waiting = [p for p, _h in still]
