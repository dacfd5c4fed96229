"""The persistent plan cache: SQLite by default, PostgreSQL for a shared cache.

:class:`PlanCache` implements the runtime's plan-store interface (``get``/``put``)
and reads each key from the database once per process, then from memory (a key found
missing is asked again after :data:`MISS_TTL_S` seconds). Writes are portable upserts
(``INSERT ... ON CONFLICT``) in short transactions, so concurrent writers never lose each
other's rows; how reads, writes, read-only databases and PostgreSQL's timeouts work is
:mod:`convtune.cache.connect`'s part.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import threading
import time
import uuid

from sqlalchemy import inspect, select
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError, SQLAlchemyError

from .._version import __version__
from ..backend import DeviceInfo
from ..errors import CacheError
from ..plan import CandidateOutcome, Decision
from ..problem import ConvProblem
from ..timing import TimingStats
from ..versioning import strategy_versions, versions_agree
from . import connect, migrate, schema
from .paths import ENV_VAR, resolve_url
from .records import record_kind
from .shared import SharedWork, dims, utc_now

from .schema import (DEVICE_FIELDS, PLAN_FIELDS, SCHEMA_VERSION, devices, measurements, meta, pending, plans,
                     problems)

log = logging.getLogger("convtune")

DIALECTS = connect.DIALECTS
#: Seconds a key found missing stays missing in a process's memory before the database is asked again.
MISS_TTL_S = 30.0




def _better(new: dict, old: dict) -> bool:
    """Is ``new`` the better-measured plan? Timed beats untimed, then the faster median wins."""
    if new.get("time_median_s") is None:
        return False
    if old.get("time_median_s") is None:
        return True
    return new["time_median_s"] < old["time_median_s"]


def _measurement_row(o: CandidateOutcome, run_id, problem_id, device_id, versions, now, version) -> dict:
    t = o.timing
    finite = o.error is None or math.isfinite(o.error)
    return dict(run_id=run_id, problem_id=problem_id, device_id=device_id, strategy_versions=versions,
                strategy=o.strategy, config=json.dumps(o.config, sort_keys=True), label=o.label, status=o.status,
                time_median_s=t.median_s if t else None, time_spread_s=t.spread_s if t else None,
                time_min_s=t.min_s if t else None, repeats=t.repeats if t else None,
                workspace_bytes=o.workspace_bytes,
                # a non-finite error (NaN or unwritten output) is stored as NULL with the fact in the reason
                error=o.error if finite else None,
                reason=o.reason if finite else f"{o.reason} (error not finite)".strip(),
                measured_at=now, convtune_version=version, build_s=o.build_s, verify_s=o.verify_s,
                timing_s=o.timing_s, rank=o.rank, first_run_s=o.first_run_s, warm_run_s=o.warm_run_s)


class PlanCache(SharedWork):
    """Plans and measurements in a database.

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL or SQLite path; defaults to ``$CONVTUNE_DB`` or
        ``~/.cache/convtune/plans.db``.
    create : bool
        Create the tables in an empty database (else a missing schema is an error).
    read_only : bool, optional
        Open without writing (``None``: read-only where the SQLite file cannot be written). A
        read-only cache serves lookups; what the runtime tunes stays in this process's memory, and
        it says so once.
    miss_ttl_s : float
        A key found missing is looked up again after this many seconds, so plans another process
        stored since are picked up (:data:`MISS_TTL_S`).
    timeout_s : float
        Most seconds one PostgreSQL call may take (see :mod:`convtune.cache.connect`).

    lazy : bool
        Connect on first use rather than here (the default runtime's cache: importing convtune touches no
        file); an open that fails is tried again after a second, doubling with each failure in a row up to
        ``cooldown_s`` seconds (:func:`~convtune.cache.connect.cooldown`).

    Examples
    --------
    >>> import tempfile, os
    >>> cache = PlanCache(os.path.join(tempfile.mkdtemp(), "plans.db"))
    >>> from convtune.cache.schema import SCHEMA_VERSION
    >>> cache.schema_version() == SCHEMA_VERSION
    True
    """

    def __init__(self, url: str | None = None, *, create: bool = True, read_only: bool | None = None,
                 busy_timeout_s: float = 60.0, miss_ttl_s: float | None = None,
                 timeout_s: float = connect.DEFAULT_TIMEOUT_S, lazy: bool = False,
                 cooldown_s: float = connect.DEFAULT_COOLDOWN_S):
        default_location = url is None and not os.environ.get(ENV_VAR)
        self.url = resolve_url(url)
        self._open_args = dict(create=create, read_only=read_only, busy_timeout_s=busy_timeout_s,
                               timeout_s=timeout_s, default_location=default_location)
        self._db: connect.Database | None = None
        self._cooldown_s = cooldown_s
        self._open_failures = connect.Cooldown()  # opens that failed in a row
        self.miss_ttl_s = MISS_TTL_S if miss_ttl_s is None else miss_ttl_s
        self._memo: dict[tuple[str, str], Decision] = {}
        self._misses: dict[tuple[str, str], float] = {}  # key -> when to look again
        self._lock = threading.Lock()
        self._open_lock = threading.Lock()
        self._said_read_only = False
        self.reads = 0
        self.upgraded = None  # (old version, new version, backup path) where opening upgraded the schema
        self.found_version = SCHEMA_VERSION
        self._missing: dict[str, set[str]] = {}  # columns an older, read-only database lacks
        if not lazy:
            self._open()

    def _open(self) -> connect.Database:
        """Connect and check (or create, or upgrade) the schema. An open that fails is not tried again for a
        while (a second, doubling with each failure in a row up to ``cooldown_s``): a lazy cache's process then runs
        without it (see :class:`~convtune.runtime.Runtime`) instead of waiting on it at every lookup."""
        with self._open_lock:
            if self._db is not None:
                return self._db
            left = self._open_failures.left_s()
            if left > 0:
                raise CacheError(f"{self._open_failures.reason} (not tried again for {left:.1f} s)")
            try:
                self._db = connect.Database(self.url, **self._open_args)
                self._ensure_schema(self._open_args["create"])
            except CacheError as exc:
                self._db = None
                self._open_failures.failed(str(exc), self._cooldown_s)
                raise
            self._open_failures.answered()
            return self._db

    @property
    def db(self) -> connect.Database:
        """The database connection, opened on first use where the cache was made ``lazy``."""
        return self._db if self._db is not None else self._open()

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def dialect(self) -> str:
        return self.db.dialect

    @property
    def engine(self):
        return self.db.engine

    @property
    def display_url(self) -> str:
        return self._db.display_url if self._db is not None else connect.display_url(self.url)

    @property
    def read_only(self) -> bool:
        return self.db.read_only

    def _transaction(self, fn):
        """``fn(conn)`` in one write transaction (see :meth:`convtune.cache.connect.Database.write`)."""
        return self.db.write(fn)

    def _read_rows(self, fn):
        """``fn(conn)`` in one read transaction, its errors as :class:`CacheError`."""
        try:
            return self.db.read(fn)
        except SQLAlchemyError as exc:
            raise CacheError(f"cannot read the plan cache {self.display_url}: {getattr(exc, 'orig', exc)}") from exc

    def _ensure_schema(self, create: bool):
        try:
            names = set(self.db.tables) if self.dialect == "sqlite" and self.db.tables else \
                set(self.db.read(lambda conn: inspect(conn).get_table_names()))
        except (SQLAlchemyError, CacheError) as exc:
            reason = getattr(exc, "orig", None) or exc
            raise CacheError(f"cannot open the plan cache at {self.display_url}: {reason}; "
                             f"check --db or ${ENV_VAR}") from exc
        ours = {t.name for t in schema.metadata.sorted_tables}
        if meta.name not in names:
            if names & ours:
                raise CacheError(f"{self.display_url} has convtune's tables but no schema version: it was not "
                                 "made by convtune or is damaged; use another --db")
            if names:
                shown = ", ".join(sorted(names)[:5]) + (", ..." if len(names) > 5 else "")
                raise CacheError(f"{self.display_url} is a database of another application (tables: {shown}); "
                                 "convtune keeps its plans in a database of its own: give another --db")
            if not create:
                raise CacheError(f"{self.display_url} holds no plan cache")
            if self.read_only:
                raise CacheError(f"{self.display_url} holds no plan cache, and it is read-only "
                                 f"({self.db.read_only_reason})")

            def make(conn):
                # tables and version row in one transaction: no other process ever sees one without the other
                schema.metadata.create_all(conn)
                conn.execute(self._insert(meta).values(key="schema_version", value=str(SCHEMA_VERSION))
                             .on_conflict_do_nothing(index_elements=["key"]))
            for attempt in range(5):
                try:
                    self.db.write(make)
                    break
                except (CacheError, OperationalError, IntegrityError, ProgrammingError):
                    if attempt == 4:
                        raise
                    time.sleep(0.1 * (attempt + 1))  # a concurrent creator won; the version check decides
        found = self.schema_version()
        if found > SCHEMA_VERSION:
            raise CacheError(f"{self.display_url} has plan-cache schema version {found}, made by a newer convtune; "
                             f"this convtune reads version {SCHEMA_VERSION}. Upgrade convtune, or use another --db")
        if found < SCHEMA_VERSION:
            if self.read_only:  # read as it is: what it lacks reads as unknown
                self._missing = schema.columns_missing(found)
                self.found_version = found
            else:  # backed up, then upgraded: every plan and measurement kept
                self.upgraded = (found, SCHEMA_VERSION, migrate.upgrade(self, found))

    def schema_version(self) -> int:
        value = self._get_meta("schema_version")
        try:
            return int(value)
        except (TypeError, ValueError):
            raise CacheError(f"{self.display_url} has an unreadable schema version {value!r}") from None

    def _insert(self, table):
        if self.dialect == "sqlite":
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        return insert(table)

    def _not_stored(self, what: str) -> bool:
        """On a read-only cache: say once that nothing is stored, and return True."""
        if not self.read_only:
            return False
        if not self._said_read_only:
            self._said_read_only = True
            log.warning("plan cache %s is read-only (%s): %s and what else this process tunes stay in its memory, "
                        "nothing is stored", self.display_url, self.db.read_only_reason, what)
        return True

    # -- ids --------------------------------------------------------------------------
    def _device_id(self, conn, device: DeviceInfo | dict, fingerprint: str | None = None) -> int:
        fields = device.as_dict() if isinstance(device, DeviceInfo) else dict(device)
        fp = fingerprint or DeviceInfo(**{k: fields[k] for k in DEVICE_FIELDS}).key()
        row = {k: fields[k] for k in DEVICE_FIELDS}
        conn.execute(self._insert(devices).values(fingerprint=fp, first_seen=utc_now(), **row)
                     .on_conflict_do_nothing(index_elements=["fingerprint"]))
        return conn.execute(select(devices.c.id).where(devices.c.fingerprint == fp)).scalar_one()

    def _problem_id(self, conn, p: ConvProblem) -> int:
        conn.execute(self._insert(problems).values(
            key=p.key(), rank=p.rank, pass_=p.pass_, dtype=p.dtype, math=p.math, batch=p.batch,
            in_channels=p.in_channels, out_channels=p.out_channels, input_size=dims(p.input_size),
            kernel_size=dims(p.kernel_size), stride=dims(p.stride), padding=dims(p.padding),
            dilation=dims(p.dilation), groups=p.groups, flops=p.flops(), layout=p.layout)
            .on_conflict_do_nothing(index_elements=["key"]))
        return conn.execute(select(problems.c.id).where(problems.c.key == p.key())).scalar_one()

    # -- the plan-store interface ----------------------------------------------------------
    def put(self, decision: Decision) -> str | None:
        """Record every outcome of ``decision`` and, if it has a winner, upsert its plan. Returns the run id
        (``None`` on a read-only cache, which keeps the decision in memory only)."""
        if self._not_stored(f"the plan of {decision.problem.key()}"):
            if decision.winner.status == "winner":
                with self._lock:
                    self._memo[(decision.device_key, decision.problem.key())] = decision
            return None
        run_id = str(uuid.uuid4())
        versions = strategy_versions()
        now, version = utc_now(), __version__

        def write(conn):
            dev = self._device_id(conn, decision.device)
            prob = self._problem_id(conn, decision.problem)
            rows = [_measurement_row(o, run_id, prob, dev, versions, now, version) for o in decision.outcomes]
            if rows:
                conn.execute(measurements.insert(), rows)
            if decision.phases:  # where the run's own time went, beside its candidates' costs (in this transaction)
                self._write_record(conn, "search", run_id, {"run_id": run_id, "problem": decision.problem.key(),
                                                            "device_key": decision.device_key,
                                                            "tuning_s": decision.tuning_s, "phases": decision.phases})
            w = decision.winner
            if w.status != "winner":
                return
            nxt = decision.runner_up()
            values = dict(strategy=w.strategy, config=json.dumps(w.config, sort_keys=True), label=w.label,
                          time_median_s=w.timing.median_s if w.timing else None,
                          time_spread_s=w.timing.spread_s if w.timing else None,
                          repeats=w.timing.repeats if w.timing else None, error=w.error,
                          workspace_bytes=w.workspace_bytes, runner_up=nxt.label if nxt else "",
                          speedup_next=decision.speedup_over_next(), tuning_s=decision.tuning_s, run_id=run_id,
                          tuned_at=now, convtune_version=version, source="measured")
            stmt = self._insert(plans).values(problem_id=prob, device_id=dev, strategy_versions=versions, **values)
            conn.execute(stmt.on_conflict_do_update(index_elements=["problem_id", "device_id", "strategy_versions"],
                                                    set_=values))
            conn.execute(pending.delete().where(pending.c.problem_id == prob, pending.c.device_id == dev))

        self._transaction(write)
        if decision.winner.status == "winner":
            with self._lock:
                self._memo[(decision.device_key, decision.problem.key())] = decision
        return run_id

    def get(self, problem: ConvProblem, device_key: str, fresh: bool = False) -> Decision | None:
        """The stored decision for this problem on this device and strategy versions, or ``None``
        (``fresh``: a miss remembered from an earlier lookup is asked again at once)."""
        memo_key = (device_key, problem.key())
        with self._lock:
            found = self._memo.get(memo_key)
            if found is not None or (not fresh and self._misses.get(memo_key, 0.0) > time.monotonic()):
                return found
        decision = self._read(problem, device_key)
        with self._lock:
            if decision is None:  # a miss is asked again later: another process may store the plan meanwhile
                self._misses[memo_key] = time.monotonic() + self.miss_ttl_s
            else:
                self._memo[memo_key] = decision
                self._misses.pop(memo_key, None)
        return decision

    def _read(self, problem: ConvProblem, device_key: str) -> Decision | None:
        """The plan of this convtune's strategy versions, or else the newest one stored under versions that
        differ only where they cannot change this problem's plan (:func:`versions_agree`)."""
        self.reads += 1
        query = (select(plans, *[devices.c[f] for f in DEVICE_FIELDS])
                 .join(problems, plans.c.problem_id == problems.c.id)
                 .join(devices, plans.c.device_id == devices.c.id)
                 .where(problems.c.key == problem.key(), devices.c.fingerprint == device_key)
                 .order_by(plans.c.tuned_at.desc(), plans.c.id.desc()))
        rows = self._read_rows(lambda conn: list(conn.execute(query).mappings()))
        row = self._agreeing(rows, problem)
        if row is None:
            return None
        timing = None
        if row["time_median_s"] is not None:
            timing = TimingStats(row["time_median_s"], row["time_spread_s"] or 0.0, row["time_median_s"],
                                 row["repeats"] or 0)
        winner = CandidateOutcome(row["strategy"], json.loads(row["config"]), row["label"], "winner",
                                  row["workspace_bytes"], row["error"], timing)
        device = DeviceInfo(**{f: row[f] for f in DEVICE_FIELDS})
        return Decision(problem, device, winner, (), "cache", row["tuning_s"] or 0.0)

    @staticmethod
    def _agreeing(rows, problem: ConvProblem):
        """Of plan rows (newest first), the one of this convtune's strategy versions, else the first whose
        versions agree with them for ``problem``; ``None`` where none does."""
        current = strategy_versions()
        exact = next((r for r in rows if r["strategy_versions"] == current), None)
        if exact is not None:
            return exact
        return next((r for r in rows if versions_agree(r["strategy_versions"], problem, r["strategy"], current)), None)

    def forget_memo(self) -> None:
        with self._lock:
            self._memo.clear()
            self._misses.clear()

    # -- listings ------------------------------------------------------------------------
    def plan_rows(self, problem_key: str | None = None, fingerprint: str | None = None) -> list[dict]:
        """Every plan (or those of one problem / device) with its problem key, device fingerprint and model;
        ``current_versions`` marks this convtune's strategy versions."""
        query = (select(problems.c.key.label("problem_key"), devices.c.fingerprint, devices.c.model,
                        devices.c.backend, plans.c.strategy_versions, *[plans.c[f] for f in PLAN_FIELDS])
                 .join(problems, plans.c.problem_id == problems.c.id)
                 .join(devices, plans.c.device_id == devices.c.id)
                 .order_by(devices.c.fingerprint, problems.c.key, plans.c.strategy_versions))
        if problem_key is not None:
            query = query.where(problems.c.key == problem_key)
        if fingerprint is not None:
            query = query.where(devices.c.fingerprint == fingerprint)
        versions = strategy_versions()
        rows = self._read_rows(lambda conn: [dict(r) for r in conn.execute(query).mappings()])
        for r in rows:  # (the versions this convtune would look the plan up under: see _agreeing)
            r["current_versions"] = versions_agree(r["strategy_versions"], ConvProblem.from_key(r["problem_key"]),
                                                   r["strategy"], versions)
        return rows

    def plan_row(self, problem_key: str, fingerprint: str) -> dict | None:
        """The plan this convtune looks up for one problem on one device (see :meth:`_read`)."""
        rows = self.plan_rows(problem_key=problem_key, fingerprint=fingerprint)
        rows.sort(key=lambda r: r["tuned_at"] or "", reverse=True)
        return self._agreeing(rows, ConvProblem.from_key(problem_key))

    def measurement_rows(self, problem_key: str, fingerprint: str | None = None) -> list[dict]:
        """Every candidate of the latest tuning run for a problem (on one device if given)."""
        lacking = self._missing.get("measurements", ())
        base = (select(*[c for c in measurements.columns if c.name not in lacking], devices.c.fingerprint)
                .join(problems, measurements.c.problem_id == problems.c.id)
                .join(devices, measurements.c.device_id == devices.c.id)
                .where(problems.c.key == problem_key))
        if fingerprint:
            base = base.where(devices.c.fingerprint == fingerprint)
        rows = self._read_rows(lambda conn: [{**dict.fromkeys(lacking), **dict(r)}
                                             for r in conn.execute(base.order_by(measurements.c.id)).mappings()])
        if not rows:
            return []
        latest = max(rows, key=lambda r: (r["measured_at"], r["id"]))["run_id"]
        return [r for r in rows if r["run_id"] == latest]

    def device_rows(self) -> list[dict]:
        return self._read_rows(lambda conn: [dict(r) for r in conn.execute(select(devices).order_by(devices.c.id))
                                             .mappings()])

    # -- typed records: round-trip decisions, layer duels, FFT calibrations -------------------------
    # Rows of the key/value meta table, so a new kind of record needs no schema change: the key is the kind's
    # prefix and a hash of the record's key text (at most 64 characters), the value the record as JSON. Each
    # record's owner encodes and decodes it (convtune.roundtrip, convtune.torch._dispatch, convtune.fft.cost).
    @staticmethod
    def _record_key(kind: str, key: str) -> str:
        prefix, digits = record_kind(kind)
        return prefix + hashlib.sha256(key.encode()).hexdigest()[:digits]

    def _get_meta(self, key: str) -> str | None:
        """A meta row's value (``None`` where there is none)."""
        return self._read_rows(lambda conn: conn.execute(select(meta.c.value).where(meta.c.key == key)).scalar())

    def put_record(self, kind: str, key: str, doc: dict) -> None:
        """Store (replacing) the record of ``kind`` under ``key``; on a read-only cache, nothing (said once)."""
        if self._not_stored(f"the {kind} record of {key}"):
            return
        self._transaction(lambda conn: self._write_record(conn, kind, key, doc))

    def _write_record(self, conn, kind: str, key: str, doc: dict) -> None:
        """Store (replacing) the record of ``kind`` under ``key`` in the transaction of ``conn``."""
        value = json.dumps(doc)
        stmt = self._insert(meta).values(key=self._record_key(kind, key), value=value)
        conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": value}))

    def get_record(self, kind: str, key: str) -> dict | None:
        """The record of ``kind`` stored under ``key``, or ``None`` (an unreadable one too, with a warning)."""
        value = self._get_meta(self._record_key(kind, key))
        if value is None:
            return None
        try:
            doc = json.loads(value)
        except ValueError:
            log.warning("plan cache %s: unreadable %s record for %s skipped", self.display_url, kind, key)
            return None
        return doc if isinstance(doc, dict) else None

    def records(self, kind: str) -> list[dict]:
        """Every stored record of ``kind``, in key order; an unreadable one is skipped with a warning."""
        prefix, _ = record_kind(kind)
        values = self._read_rows(lambda conn: conn.execute(select(meta.c.value).where(meta.c.key.like(prefix + "%"))
                                                           .order_by(meta.c.key)).scalars().all())
        docs = []
        for value in values:
            try:
                doc = json.loads(value)
            except ValueError:
                doc = None
            if isinstance(doc, dict):
                docs.append(doc)
            else:
                log.warning("plan cache %s: unreadable %s record skipped", self.display_url, kind)
        return docs

    def counts(self) -> dict:
        from sqlalchemy import func
        return self._read_rows(lambda conn: {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                                             for t in (devices, problems, measurements, plans)})

    # -- export / import ---------------------------------------------------------------
    def export_records(self) -> list[dict]:
        """Every plan as a flat record: device fields, problem key, strategy versions, plan fields."""
        query = (select(devices.c.fingerprint, *[devices.c[f] for f in DEVICE_FIELDS],
                        problems.c.key.label("problem_key"), plans.c.strategy_versions,
                        *[plans.c[f] for f in PLAN_FIELDS])
                 .join(problems, plans.c.problem_id == problems.c.id)
                 .join(devices, plans.c.device_id == devices.c.id)
                 .order_by(devices.c.fingerprint, problems.c.key, plans.c.strategy_versions))
        return self._read_rows(lambda conn: [dict(r) for r in conn.execute(query).mappings()])

    def import_records(self, records: list[dict]) -> dict:
        """Merge exported records, all or nothing (one transaction, every record checked first): new plans
        are added; where a plan exists, the better-measured one is kept (timed beats untimed, then the
        faster median). Returns counts and the list of conflicts."""
        checked = []
        for number, rec in enumerate(records, 1):
            try:
                checked.append((rec, ConvProblem.from_key(rec["problem_key"]), {f: rec.get(f) for f in PLAN_FIELDS}))
            except (ValueError, KeyError, TypeError) as exc:
                raise CacheError(f"plan {number} of the import: {exc}; nothing was imported") from None

        def merge(conn, rec, problem, incoming):
            dev = self._device_id(conn, {f: rec[f] for f in DEVICE_FIELDS}, rec["fingerprint"])
            prob = self._problem_id(conn, problem)
            where = ((plans.c.problem_id == prob) & (plans.c.device_id == dev)
                     & (plans.c.strategy_versions == rec["strategy_versions"]))
            existing = conn.execute(select(*[plans.c[f] for f in PLAN_FIELDS]).where(where)).mappings().first()
            if existing is None:
                conn.execute(self._insert(plans).values(problem_id=prob, device_id=dev,
                                                        strategy_versions=rec["strategy_versions"], **incoming)
                             .on_conflict_do_nothing(index_elements=["problem_id", "device_id", "strategy_versions"]))
                return "added", None
            existing = dict(existing)
            if existing == incoming:
                return "identical", None
            same_choice = (existing["strategy"], existing["config"]) == (incoming["strategy"], incoming["config"])
            take = _better(incoming, existing)
            if take:
                conn.execute(plans.update().where(where).values(**incoming))
            conflict = None if same_choice else {
                "problem_key": rec["problem_key"], "fingerprint": rec["fingerprint"],
                "ours": existing["label"], "theirs": incoming["label"],
                "kept": incoming["label"] if take else existing["label"]}
            return ("replaced" if take else "kept"), conflict

        results = self._transaction(lambda conn: [merge(conn, *item) for item in checked])
        report = {"added": 0, "replaced": 0, "kept": 0, "identical": 0, "conflicts": []}
        for outcome, conflict in results:
            report[outcome] += 1
            if conflict:
                report["conflicts"].append(conflict)
        self.forget_memo()
        return report

    def close(self) -> None:
        """Fold SQLite's WAL into the main file and let the connections go."""
        if self._db is not None:
            self._db.close()

    def __repr__(self):
        state = f"memo={len(self._memo)} reads={self.reads}" if self.is_open else "(unopened)"
        return f"<PlanCache {self.display_url} {state}>"
