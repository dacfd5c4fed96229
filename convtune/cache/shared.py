"""What a SQL plan store shares between processes beyond plans: the nearest tuned problem for a new shape, the
problems served meanwhile without a plan of their own (pending), and leases, so that one worker tunes a problem at a
time (:mod:`convtune.worklist`). A part of :class:`~convtune.cache.PlanCache`, which it assumes: its transactions,
its ids of problems and devices, its lookups and what its schema version lacks."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timezone

from sqlalchemy import false, or_, select, true, update

from ..backend import DeviceInfo
from ..plan import Decision
from ..problem import ConvProblem
from ..versioning import strategy_versions, versions_agree
from . import schema
from .schema import devices, leases, measurements, pending, plans, problems

log = logging.getLogger("convtune")


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def dims(values) -> str:
    return "x".join(str(v) for v in values)


class SharedWork:
    """The nearest problem, pending problems and leases of a :class:`~convtune.cache.PlanCache`."""

    # -- serving new shapes: the nearest tuned problem, and the problems pending ----------------------
    def _layout_is(self, problem: ConvProblem):
        """The condition that a stored problem has ``problem``'s layout (an older, read-only database
        without the column holds channels-first problems only)."""
        if "layout" in self._missing.get("problems", ()):
            return true() if problem.layout == "channels_first" else false()
        return problems.c.layout == problem.layout

    def _same_kind(self, problem: ConvProblem):
        """The typed-column conditions of problems of ``problem``'s kind: all but batch and input size."""
        return (self._layout_is(problem),
                problems.c.pass_ == problem.pass_, problems.c.dtype == problem.dtype, problems.c.math == problem.math,
                problems.c.rank == problem.rank, problems.c.in_channels == problem.in_channels,
                problems.c.out_channels == problem.out_channels, problems.c.kernel_size == dims(problem.kernel_size),
                problems.c.stride == dims(problem.stride), problems.c.padding == dims(problem.padding),
                problems.c.dilation == dims(problem.dilation), problems.c.groups == problem.groups)

    def nearest(self, problem: ConvProblem, device_key: str) -> Decision | None:
        """The stored decision, on this device and strategy versions, of the tuned problem of ``problem``'s
        kind (the same pass, channels, kernel, stride, padding, dilation, groups, dtype and math mode)
        nearest in batch and input size (by the sum of their log ratios); ``None`` where there is none."""
        query = (select(problems.c.key, problems.c.batch, problems.c.input_size, plans.c.strategy_versions,
                        plans.c.strategy)
                 .join(plans, plans.c.problem_id == problems.c.id).join(devices, plans.c.device_id == devices.c.id)
                 .where(devices.c.fingerprint == device_key, problems.c.key != problem.key(),
                        *self._same_kind(problem)))
        current = strategy_versions()
        rows = [r for r in self._read_rows(lambda conn: conn.execute(query).all())
                if versions_agree(r.strategy_versions, problem, r.strategy, current)]

        def distance(row):
            sizes = [int(v) for v in row.input_size.split("x")]
            return abs(math.log(row.batch / problem.batch)) + sum(abs(math.log(n / m))
                                                                  for n, m in zip(sizes, problem.input_size))
        if not rows:
            return None
        best = min(rows, key=distance)
        return self.get(ConvProblem.from_key(best.key), device_key)

    def add_pending(self, problem: ConvProblem, device: DeviceInfo, served_by: str) -> None:
        """Note that ``problem`` was served without a plan of its own (by ``served_by``), for
        ``convtune tune --pending``; nothing where the cache is read-only or older than schema 2."""
        if self.read_only or "pending" in schema.tables_missing(self.found_version):
            return

        def write(conn):
            dev, prob = self._device_id(conn, device), self._problem_id(conn, problem)
            conn.execute(self._insert(pending).values(problem_id=prob, device_id=dev, served_by=served_by,
                                                      first_seen=utc_now())
                         .on_conflict_do_nothing(index_elements=["problem_id", "device_id"]))
        self._transaction(write)

    def pending_problems(self, device_key: str) -> list[tuple[ConvProblem, str]]:
        """The problems pending on a device, with what served each meanwhile, oldest first."""
        if "pending" in schema.tables_missing(self.found_version):
            return []
        query = (select(problems.c.key, pending.c.served_by).join(problems, pending.c.problem_id == problems.c.id)
                 .join(devices, pending.c.device_id == devices.c.id)
                 .where(devices.c.fingerprint == device_key).order_by(pending.c.id))
        return [(ConvProblem.from_key(key), served) for key, served in self._read_rows(lambda c: c.execute(query).all())]

    # -- leases: one worker tunes a problem at a time (see convtune.worklist) ---------------------------
    @property
    def has_leases(self) -> bool:
        """Can workers take leases here (a writable cache at schema 3 or later)?"""
        return not self.read_only and "leases" not in schema.tables_missing(self.found_version)

    def _clock(self, conn) -> float:
        """Seconds since the epoch by the database's clock: the one clock every worker of a shared
        PostgreSQL cache agrees on (a SQLite file is on one machine)."""
        if self.dialect == "sqlite":
            return float(conn.exec_driver_sql("SELECT (julianday('now') - 2440587.5) * 86400.0").scalar())
        return float(conn.exec_driver_sql("SELECT extract(epoch FROM clock_timestamp())").scalar())

    def take_lease(self, problem: ConvProblem, device: DeviceInfo, holder: str, ttl_s: float) -> str | None:
        """Take the lease on tuning ``problem`` on ``device`` for ``ttl_s`` seconds: ``None`` where it is
        now ``holder``'s (it was free, ran out, or was ``holder``'s already), else who holds it."""
        def write(conn):
            dev, prob = self._device_id(conn, device), self._problem_id(conn, problem)
            now = self._clock(conn)
            mine = dict(holder=holder, expires_at=now + ttl_s, taken_at=utc_now())
            inserted = conn.execute(self._insert(leases).values(problem_id=prob, device_id=dev, **mine)
                                    .on_conflict_do_nothing(index_elements=["problem_id", "device_id"])
                                    .returning(leases.c.id)).first()  # (rowcount is -1 here on psycopg)
            if inserted is not None:
                return None
            where = (leases.c.problem_id == prob, leases.c.device_id == dev)
            before = conn.execute(select(leases.c.holder, leases.c.expires_at).where(*where)).first()
            # one statement decides: of workers racing for a run-out lease, one updates the row
            if conn.execute(update(leases).where(*where, or_(leases.c.expires_at < now, leases.c.holder == holder))
                            .values(**mine)).rowcount:
                if before is not None and before.holder != holder:
                    log.info("convtune: the lease of %s by %s ran out %.0f s ago (a worker that died?); taken over "
                             "by %s", problem.describe(), before.holder, now - before.expires_at, holder)
                return None
            return conn.execute(select(leases.c.holder).where(*where)).scalar() or "another worker"
        return self._transaction(write)

    def renew_leases(self, holder: str, ttl_s: float) -> int:
        """Extend every lease of ``holder`` to ``ttl_s`` seconds from now; how many there were."""
        def write(conn):
            now = self._clock(conn)
            return conn.execute(update(leases).where(leases.c.holder == holder)
                                .values(expires_at=now + ttl_s)).rowcount
        return self._transaction(write)

    def release_lease(self, problem: ConvProblem, device_key: str, holder: str) -> None:
        """Give ``holder``'s lease on ``problem`` back (nothing where it has none)."""
        def write(conn):
            ids = (select(problems.c.id).where(problems.c.key == problem.key()).scalar_subquery(),
                   select(devices.c.id).where(devices.c.fingerprint == device_key).scalar_subquery())
            conn.execute(leases.delete().where(leases.c.problem_id == ids[0], leases.c.device_id == ids[1],
                                               leases.c.holder == holder))
        self._transaction(write)

    def lease_holder(self, problem: ConvProblem, device_key: str) -> tuple[str, float] | None:
        """Who holds the lease on ``problem`` and for how many more seconds (negative: run out), or ``None``."""
        def read(conn):
            row = conn.execute(select(leases.c.holder, leases.c.expires_at)
                               .join(problems, leases.c.problem_id == problems.c.id)
                               .join(devices, leases.c.device_id == devices.c.id)
                               .where(problems.c.key == problem.key(), devices.c.fingerprint == device_key)).first()
            return None if row is None else (row.holder, row.expires_at - self._clock(conn))
        return self._read_rows(read)

    def measured_batches(self, problem: ConvProblem) -> list[int]:
        """Batch sizes other than ``problem``'s at which its layer shape (same pass and math mode) has
        measurements, on any device."""
        query = (select(problems.c.batch).distinct().join(measurements, measurements.c.problem_id == problems.c.id)
                 .where(*self._same_kind(problem), problems.c.input_size == dims(problem.input_size),
                        problems.c.batch != problem.batch)
                 .order_by(problems.c.batch))
        return self._read_rows(lambda conn: [int(b) for b in conn.execute(query).scalars()])

