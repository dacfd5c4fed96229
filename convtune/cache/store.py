"""The persistent plan cache: SQLite by default, PostgreSQL for a shared cache.

:class:`PlanCache` implements the runtime's plan-store interface (``get``/``put``)
and reads each key from the database once per process, then from memory.
Writes are portable upserts (``INSERT ... ON CONFLICT``) in short transactions,
so concurrent writers never lose each other's rows; SQLite runs in WAL mode
with a busy timeout and takes its write lock up front (``BEGIN IMMEDIATE``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import create_engine, event, inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, OperationalError, \
    ProgrammingError, SQLAlchemyError

from ..backend import DeviceInfo
from ..errors import CacheError
from ..plan import CandidateOutcome, Decision
from ..problem import ConvProblem
from ..strategies import strategy_versions
from ..timing import TimingStats
from . import schema
from .schema import DEVICE_FIELDS, PLAN_FIELDS, SCHEMA_VERSION, devices, measurements, meta, plans, problems

log = logging.getLogger("convtune")

ENV_VAR = "CONVTUNE_DB"
DIALECTS = ("sqlite", "postgresql")


#: Meta-table keys of FFT cost-model calibrations.
CALIBRATION_PREFIX = "fft_cost:"
#: Meta-table keys of round-trip (kept spectra) decisions.
TRIP_PREFIX = "trip:"


def default_path() -> Path:
    """``$XDG_CACHE_HOME/convtune/plans.db`` (``~/.cache/convtune/plans.db`` without the variable)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "convtune" / "plans.db"


def resolve_url(url: str | None = None) -> str:
    """The database URL: ``url``, else ``$CONVTUNE_DB``, else the default SQLite file.

    A plain path means a SQLite file; ``postgresql://`` and ``postgres://`` use psycopg 3.
    """
    url = url or os.environ.get(ENV_VAR) or str(default_path())
    if "://" not in url:
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _dims(values) -> str:
    return "x".join(str(v) for v in values)


def _version() -> str:
    from .. import __version__
    return __version__


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
                measured_at=now, convtune_version=version)


class PlanCache:
    """Plans and measurements in a database.

    Parameters
    ----------
    url : str, optional
        SQLAlchemy URL or SQLite path; defaults to ``$CONVTUNE_DB`` or
        ``~/.cache/convtune/plans.db``.
    create : bool
        Create the tables in an empty database (else a missing schema is an error).

    Examples
    --------
    >>> import tempfile, os
    >>> cache = PlanCache(os.path.join(tempfile.mkdtemp(), "plans.db"))
    >>> cache.schema_version()
    1
    """

    def __init__(self, url: str | None = None, *, create: bool = True, busy_timeout_s: float = 60.0):
        self.url = resolve_url(url)
        try:
            parsed = make_url(self.url)
        except ArgumentError as exc:
            raise CacheError(f"not a database URL: {url!r} ({exc}); use a file path, sqlite:///PATH or "
                             "postgresql://USER@HOST/DB") from exc
        self.dialect = parsed.get_backend_name()
        if self.dialect not in DIALECTS:
            raise CacheError(f"unsupported database {self.dialect!r}; acceptable: {', '.join(DIALECTS)}")
        self.display_url = parsed.render_as_string(hide_password=True)
        if (not create and self.dialect == "sqlite" and parsed.database not in (None, "", ":memory:")
                and not Path(parsed.database).exists()):
            raise CacheError(f"no plan cache at {parsed.database}; run `convtune tune` first or give --db")
        self._busy_timeout_s = busy_timeout_s
        self.engine = self._make_engine(parsed)
        self._memo: dict[tuple[str, str], Decision | None] = {}
        self._lock = threading.Lock()
        self.reads = 0
        self._ensure_schema(create)
        self._register_calibrations()

    # -- connection ----------------------------------------------------------------
    def _make_engine(self, parsed):
        try:
            if self.dialect == "sqlite":
                if parsed.database and parsed.database != ":memory:":
                    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
                engine = create_engine(parsed, connect_args={"timeout": self._busy_timeout_s})
                timeout_ms = int(self._busy_timeout_s * 1000)

                @event.listens_for(engine, "connect")
                def _sqlite_connect(dbapi_conn, _record):
                    dbapi_conn.isolation_level = None  # we issue BEGIN ourselves, below
                    cur = dbapi_conn.cursor()
                    cur.execute(f"PRAGMA busy_timeout={timeout_ms}")
                    cur.execute("PRAGMA journal_mode=WAL")
                    cur.execute("PRAGMA foreign_keys=ON")
                    cur.close()

                @event.listens_for(engine, "begin")
                def _sqlite_begin(conn):
                    # take the write lock at the start: a deferred transaction that later upgrades can fail
                    # at once with SQLITE_BUSY under concurrent writers, whatever the busy timeout
                    conn.exec_driver_sql("BEGIN IMMEDIATE")
                return engine
            return create_engine(parsed, pool_pre_ping=True)
        except (NoSuchModuleError, ImportError) as exc:
            raise CacheError(f"no driver for {self.display_url}: {exc}; for PostgreSQL install "
                             "'convtune[postgres]' (psycopg 3)") from exc
        except OSError as exc:
            raise CacheError(f"cannot create the plan cache at {self.display_url}: {exc}") from exc

    def _transaction(self, fn, retries: int = 5):
        """Run ``fn(conn)`` in one transaction, retrying on lock contention."""
        for attempt in range(retries):
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except OperationalError as exc:
                if "locked" in str(exc).lower() and attempt < retries - 1:
                    time.sleep(0.1 * (attempt + 1))
                    continue
                raise CacheError(f"plan cache {self.display_url}: {exc.orig or exc}") from exc
            except IntegrityError:
                if attempt < retries - 1:  # a concurrent writer inserted the same unique row first
                    continue
                raise
            except DBAPIError as exc:
                raise CacheError(f"plan cache {self.display_url}: {exc.orig or exc}") from exc

    def _ensure_schema(self, create: bool):
        try:
            names = set(inspect(self.engine).get_table_names())
        except SQLAlchemyError as exc:
            raise CacheError(f"cannot open the plan cache at {self.display_url}: {getattr(exc, 'orig', exc)}; "
                             f"check --db or ${ENV_VAR}") from exc
        ours = {t.name for t in schema.metadata.sorted_tables}
        if meta.name not in names:
            if names & ours:
                raise CacheError(f"{self.display_url} has convtune's tables but no schema version: it was not "
                                 "made by convtune or is damaged; use another --db")
            if not create:
                raise CacheError(f"{self.display_url} holds no plan cache")
            def create(conn):
                # tables and version row in one transaction: no other process ever sees one without the other
                schema.metadata.create_all(conn)
                conn.execute(self._insert(meta).values(key="schema_version", value=str(SCHEMA_VERSION))
                             .on_conflict_do_nothing(index_elements=["key"]))
            for attempt in range(5):
                try:
                    with self.engine.begin() as conn:
                        create(conn)
                    break
                except (OperationalError, IntegrityError, ProgrammingError):
                    time.sleep(0.1 * (attempt + 1))  # a concurrent creator won; the version check decides
        found = self.schema_version()
        if found != SCHEMA_VERSION:
            newer = "a newer" if found > SCHEMA_VERSION else "an older"
            raise CacheError(f"{self.display_url} has plan-cache schema version {found}, made by {newer} convtune; "
                             f"this convtune reads version {SCHEMA_VERSION}. Upgrade convtune, or use another --db")

    def schema_version(self) -> int:
        with self.engine.connect() as conn:
            value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
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

    # -- ids --------------------------------------------------------------------------
    def _device_id(self, conn, device: DeviceInfo | dict, fingerprint: str | None = None) -> int:
        fields = device.as_dict() if isinstance(device, DeviceInfo) else dict(device)
        fp = fingerprint or DeviceInfo(**{k: fields[k] for k in DEVICE_FIELDS}).key()
        row = {k: fields[k] for k in DEVICE_FIELDS}
        conn.execute(self._insert(devices).values(fingerprint=fp, first_seen=_now(), **row)
                     .on_conflict_do_nothing(index_elements=["fingerprint"]))
        return conn.execute(select(devices.c.id).where(devices.c.fingerprint == fp)).scalar_one()

    def _problem_id(self, conn, p: ConvProblem) -> int:
        conn.execute(self._insert(problems).values(
            key=p.key(), rank=p.rank, pass_=p.pass_, dtype=p.dtype, math=p.math, batch=p.batch,
            in_channels=p.in_channels, out_channels=p.out_channels, input_size=_dims(p.input_size),
            kernel_size=_dims(p.kernel_size), stride=_dims(p.stride), padding=_dims(p.padding),
            dilation=_dims(p.dilation), groups=p.groups, flops=p.flops()).on_conflict_do_nothing(index_elements=["key"]))
        return conn.execute(select(problems.c.id).where(problems.c.key == p.key())).scalar_one()

    # -- the plan-store interface ----------------------------------------------------------
    def put(self, decision: Decision) -> str:
        """Record every outcome of ``decision`` and, if it has a winner, upsert its plan. Returns the run id."""
        run_id = str(uuid.uuid4())
        versions = strategy_versions()
        now, version = _now(), _version()

        def write(conn):
            dev = self._device_id(conn, decision.device)
            prob = self._problem_id(conn, decision.problem)
            rows = [_measurement_row(o, run_id, prob, dev, versions, now, version) for o in decision.outcomes]
            if rows:
                conn.execute(measurements.insert(), rows)
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

        self._transaction(write)
        if decision.winner.status == "winner":
            with self._lock:
                self._memo[(decision.device_key, decision.problem.key())] = decision
        return run_id

    def get(self, problem: ConvProblem, device_key: str) -> Decision | None:
        """The stored decision for this problem on this device and strategy versions, or ``None``."""
        memo_key = (device_key, problem.key())
        with self._lock:
            if memo_key in self._memo:
                return self._memo[memo_key]
        decision = self._read(problem, device_key)
        with self._lock:
            self._memo[memo_key] = decision
        return decision

    def _read(self, problem: ConvProblem, device_key: str) -> Decision | None:
        self.reads += 1
        query = (select(plans, *[devices.c[f] for f in DEVICE_FIELDS])
                 .join(problems, plans.c.problem_id == problems.c.id)
                 .join(devices, plans.c.device_id == devices.c.id)
                 .where(problems.c.key == problem.key(), devices.c.fingerprint == device_key,
                        plans.c.strategy_versions == strategy_versions()))
        try:
            with self.engine.connect() as conn:
                row = conn.execute(query).mappings().first()
        except SQLAlchemyError as exc:
            raise CacheError(f"cannot read the plan cache {self.display_url}: {getattr(exc, 'orig', exc)}") from exc
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

    def forget_memo(self) -> None:
        with self._lock:
            self._memo.clear()

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
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(query).mappings()]
        for r in rows:
            r["current_versions"] = r["strategy_versions"] == versions
        return rows

    def plan_row(self, problem_key: str, fingerprint: str) -> dict | None:
        """The plan of this convtune's strategy versions for one problem on one device."""
        versions = strategy_versions()
        for row in self.plan_rows(problem_key=problem_key, fingerprint=fingerprint):
            if row["strategy_versions"] == versions:
                return row
        return None

    def measurement_rows(self, problem_key: str, fingerprint: str | None = None) -> list[dict]:
        """Every candidate of the latest tuning run for a problem (on one device if given)."""
        base = (select(measurements, devices.c.fingerprint)
                .join(problems, measurements.c.problem_id == problems.c.id)
                .join(devices, measurements.c.device_id == devices.c.id)
                .where(problems.c.key == problem_key))
        if fingerprint:
            base = base.where(devices.c.fingerprint == fingerprint)
        with self.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(base.order_by(measurements.c.id)).mappings()]
        if not rows:
            return []
        latest = max(rows, key=lambda r: (r["measured_at"], r["id"]))["run_id"]
        return [r for r in rows if r["run_id"] == latest]

    def device_rows(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(select(devices).order_by(devices.c.id)).mappings()]

    # -- FFT cost-model calibrations ---------------------------------------------------
    # Stored as rows of the key/value meta table (``fft_cost:`` + a hash of the device key), so a
    # calibration needs no schema change; the value carries the full device key.
    @staticmethod
    def _hashed_key(prefix: str, text: str, digits: int) -> str:
        """A meta-table key (at most 64 characters): ``prefix`` and the first hex digits of a hash."""
        import hashlib
        return prefix + hashlib.sha256(text.encode()).hexdigest()[:digits]

    def _put_meta(self, key: str, value: str) -> None:
        def write(conn):
            stmt = self._insert(meta).values(key=key, value=value)
            conn.execute(stmt.on_conflict_do_update(index_elements=["key"], set_={"value": value}))
        self._transaction(write)

    def _meta_docs(self, prefix: str, what: str) -> list:
        """The JSON values of the meta rows whose keys start with ``prefix``, in key order; an
        unreadable one is skipped with a warning that names ``what`` it is."""
        with self.engine.connect() as conn:
            values = conn.execute(select(meta.c.value).where(meta.c.key.like(prefix + "%"))
                                  .order_by(meta.c.key)).scalars().all()
        docs = []
        for value in values:
            try:
                docs.append(json.loads(value))
            except ValueError:
                log.warning("plan cache %s: unreadable %s row skipped", self.display_url, what)
        return docs

    @classmethod
    def _calibration_key(cls, device_key: str) -> str:
        return cls._hashed_key(CALIBRATION_PREFIX, device_key, 40)

    def put_calibration(self, device_key: str, calibration: dict) -> None:
        """Store (replacing) the FFT cost-model calibration of a device and use it from now on."""
        from ..fft import cost
        cost.register_calibration(device_key, calibration)
        self._put_meta(self._calibration_key(device_key), json.dumps({"device": device_key, **calibration}))

    def calibrations(self) -> dict[str, dict]:
        """Stored calibrations by device key."""
        out = {}
        for doc in self._meta_docs(CALIBRATION_PREFIX, "FFT calibration"):
            try:
                out[doc.pop("device")] = doc
            except (KeyError, TypeError, AttributeError):
                log.warning("plan cache %s: unreadable FFT calibration row skipped", self.display_url)
        return out

    def _register_calibrations(self) -> None:
        from ..fft import cost
        for device_key, calibration in self.calibrations().items():
            try:
                cost.register_calibration(device_key, calibration)
            except ValueError as exc:
                log.warning("plan cache %s: %s; using the default", self.display_url, exc)

    # -- round-trip decisions (kept spectra) --------------------------------------------
    # Also rows of the meta table (``trip:`` + a hash of device and problem keys); the value is the
    # whole decision, readable keys included.
    @classmethod
    def _trip_key(cls, device_key: str, problem: ConvProblem) -> str:
        return cls._hashed_key(TRIP_PREFIX, f"{device_key}|{problem.for_pass('fwd').key()}", 64 - len(TRIP_PREFIX))

    def put_trip(self, decision) -> None:
        """Store (replacing) a layer's round-trip decision (:class:`~convtune.roundtrip.TripDecision`)."""
        self._put_meta(self._trip_key(decision.device_key, decision.problem), json.dumps(decision.as_dict()))

    def get_trip(self, problem: ConvProblem, device_key: str):
        """The stored round-trip decision of ``problem``'s layer on the device, or ``None``."""
        from ..roundtrip import TripDecision
        with self.engine.connect() as conn:
            value = conn.execute(select(meta.c.value).where(meta.c.key == self._trip_key(device_key, problem))).scalar()
        if value is None:
            return None
        try:
            return TripDecision.from_dict(json.loads(value))
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("plan cache %s: unreadable round-trip decision for %s skipped (%s)", self.display_url,
                        problem.key(), exc)
            return None

    def trip_decisions(self) -> list[dict]:
        """Every stored round-trip decision, as its dict (the form exports carry)."""
        return self._meta_docs(TRIP_PREFIX, "round-trip decision")

    def trip_count(self) -> int:
        from sqlalchemy import func
        with self.engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(meta)
                                .where(meta.c.key.like(TRIP_PREFIX + "%"))).scalar_one()

    def counts(self) -> dict:
        from sqlalchemy import func
        with self.engine.connect() as conn:
            return {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
                    for t in (devices, problems, measurements, plans)}

    # -- export / import ---------------------------------------------------------------
    def export_records(self) -> list[dict]:
        """Every plan as a flat record: device fields, problem key, strategy versions, plan fields."""
        query = (select(devices.c.fingerprint, *[devices.c[f] for f in DEVICE_FIELDS],
                        problems.c.key.label("problem_key"), plans.c.strategy_versions,
                        *[plans.c[f] for f in PLAN_FIELDS])
                 .join(problems, plans.c.problem_id == problems.c.id)
                 .join(devices, plans.c.device_id == devices.c.id)
                 .order_by(devices.c.fingerprint, problems.c.key, plans.c.strategy_versions))
        with self.engine.connect() as conn:
            return [dict(r) for r in conn.execute(query).mappings()]

    def import_records(self, records: list[dict]) -> dict:
        """Merge exported records: new plans are added; where a plan exists, the better-measured one is kept
        (timed beats untimed, then the faster median). Returns counts and the list of conflicts."""
        report = {"added": 0, "replaced": 0, "kept": 0, "identical": 0, "conflicts": []}
        for rec in records:
            problem = ConvProblem.from_key(rec["problem_key"])
            incoming = {f: rec.get(f) for f in PLAN_FIELDS}

            def merge(conn, rec=rec, problem=problem, incoming=incoming):
                dev = self._device_id(conn, {f: rec[f] for f in DEVICE_FIELDS}, rec["fingerprint"])
                prob = self._problem_id(conn, problem)
                where = ((plans.c.problem_id == prob) & (plans.c.device_id == dev)
                         & (plans.c.strategy_versions == rec["strategy_versions"]))
                existing = conn.execute(select(*[plans.c[f] for f in PLAN_FIELDS]).where(where)).mappings().first()
                if existing is None:
                    conn.execute(self._insert(plans).values(problem_id=prob, device_id=dev,
                                                            strategy_versions=rec["strategy_versions"], **incoming)
                                 .on_conflict_do_nothing(index_elements=["problem_id", "device_id",
                                                                         "strategy_versions"]))
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

            outcome, conflict = self._transaction(merge)
            report[outcome] += 1
            if conflict:
                report["conflicts"].append(conflict)
        self.forget_memo()
        return report

    def close(self) -> None:
        self.engine.dispose()

    def __repr__(self):
        return f"<PlanCache {self.display_url} memo={len(self._memo)} reads={self.reads}>"


class LazyPlanCache:
    """Opens the default :class:`PlanCache` on first use, so importing convtune touches no file."""

    def __init__(self, url: str | None = None):
        self._url = url
        self._cache: PlanCache | None = None

    @property
    def cache(self) -> PlanCache:
        if self._cache is None:
            self._cache = PlanCache(self._url)
        return self._cache

    def get(self, problem, device_key):
        return self.cache.get(problem, device_key)

    def put(self, decision):
        return self.cache.put(decision)

    def get_trip(self, problem, device_key):
        return self.cache.get_trip(problem, device_key)

    def put_trip(self, decision):
        return self.cache.put_trip(decision)

    def __repr__(self):
        return f"<LazyPlanCache {self._cache!r}>" if self._cache else f"<LazyPlanCache {resolve_url(self._url)} (unopened)>"
