"""The plan cache's database connection: who may write, and how long a call may take.

**SQLite** runs in WAL mode. A write transaction takes the lock at its start (``BEGIN IMMEDIATE``:
one that upgrades later can fail at once under concurrent writers) and is retried on contention;
a read is a deferred transaction, which in WAL mode never waits for a writer. After each write a
passive checkpoint folds the WAL into the main file, and :meth:`Database.close` truncates it, so a
copy of the file alone holds what was committed (``convtune backup`` makes a consistent copy at
any time).

A file that cannot be written (its permissions, its directory's, or a read-only mount) is opened
read-only, immutable where not even SQLite's shared-memory file can be made, and serves reads;
:attr:`Database.read_only` says so and :attr:`Database.read_only_reason` why. An existing file's
tables are listed (:attr:`Database.tables`) before any connection of the engine touches it, so that
the cache can refuse another application's database untouched. Parent directories are made only
for the default cache location.

**PostgreSQL** connections have connect and statement timeouts, and every call also runs under a
client-side deadline (a frozen server never answers, and a socket waiting on it ignores the
server's own timeouts). Lost or refused connections are retried with backoff (writes for up to
``retry_s``, reads once; a pooled connection the server dropped is found so, not by a ping before every call);
reads run without a transaction (one round trip each). After a call that failed or timed out, the database is
left alone for a while (:func:`cooldown`), in which calls fail at once with :class:`~convtune.errors.CacheError`,
so that a training process falls back instead of waiting.
"""

from __future__ import annotations

import logging
import os
import queue
import sqlite3
import threading
import time
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, NoSuchModuleError, OperationalError

from ..errors import CacheError

log = logging.getLogger("convtune")

DIALECTS = ("sqlite", "postgresql")
#: Seconds a PostgreSQL call may take (also the connect and statement timeouts).
DEFAULT_TIMEOUT_S = 10.0
#: Seconds a write keeps retrying a lost PostgreSQL connection (backoff 0.25 s doubling, at most 2 s).
DEFAULT_RETRY_S = 15.0
#: Seconds a PostgreSQL database that failed is left alone at most (after failures in a row).
DEFAULT_COOLDOWN_S = 30.0
#: Seconds it is left alone after a first failure (doubling with each failure in a row).
FIRST_COOLDOWN_S = 1.0


def cooldown(failures_in_a_row: int, most_s: float) -> float:
    """Seconds a database that failed so many times in a row is left alone: :data:`FIRST_COOLDOWN_S`, doubling with
    each failure, at most ``most_s``; so a server back after a restart or a freeze is asked again within a second or
    two, and one that stays down costs a call's wait only now and then."""
    return min(most_s, FIRST_COOLDOWN_S * 2 ** min(failures_in_a_row - 1, 16))


class Cooldown:
    """Failures in a row of something asked of a database (its calls, a lazy cache's open), and until when it is
    left alone after the last (:func:`cooldown`), with that failure's reason."""

    __slots__ = ("failures", "until", "reason")

    def __init__(self):
        self.failures, self.until, self.reason = 0, 0.0, ""

    def left_s(self) -> float:
        """Seconds it is still left alone (0: ask it)."""
        return max(0.0, self.until - time.monotonic())

    def failed(self, reason: str, most_s: float) -> None:
        self.failures += 1
        self.until, self.reason = time.monotonic() + cooldown(self.failures, most_s), reason

    def answered(self) -> None:
        self.failures = 0


class _Callers:
    """Daemon threads that run calls handed to them, each kept for the next call once its call returns (a call that
    hangs keeps its thread; the next call gets another). Daemon threads: a process whose server froze still exits."""

    def __init__(self):
        self.pid = os.getpid()
        self._idle: list[queue.SimpleQueue] = []  # the idle threads' inboxes
        self._lock = threading.Lock()

    def call(self, run) -> tuple[dict, threading.Event]:
        """Start ``run()`` on an idle thread (a new one where none is): ``(box, done)``, ``done`` set once ``box``
        holds its ``value`` or its ``error``."""
        with self._lock:
            inbox = self._idle.pop() if self._idle else None
        if inbox is None:
            inbox = queue.SimpleQueue()
            threading.Thread(target=self._serve, args=(inbox,), name="convtune-cache-call", daemon=True).start()
        box, done = {}, threading.Event()
        inbox.put((run, box, done))
        return box, done

    def _serve(self, inbox: queue.SimpleQueue) -> None:
        while True:
            run, box, done = inbox.get()
            try:
                box["value"] = run()
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            with self._lock:  # (idle before the caller wakes: its next call finds this thread, not a new one)
                self._idle.append(inbox)
            done.set()


def _sqlite_tables(path: str) -> tuple[list[str], bool]:
    """Table names of an existing SQLite file, read without changing anything (``CacheError`` if it is
    not a database), and whether it could be read only as immutable: a WAL-mode file beside which SQLite cannot
    make its ``-wal`` and ``-shm`` files (a copy of the file alone on read-only media). SQLite opens lazily, so an
    open that cannot work shows at the first statement, which is where this finds it."""
    query = "SELECT name FROM sqlite_master WHERE type = 'table'"
    for immutable in (False, True):
        conn = None
        try:
            conn = sqlite3.connect(f"file:{quote(path)}?mode=ro" + ("&immutable=1" if immutable else ""), uri=True)
            return [r[0] for r in conn.execute(query)], immutable
        except sqlite3.Error as exc:
            failure = exc
        finally:
            if conn is not None:
                conn.close()
    raise CacheError(f"cannot open the plan cache at {path}: {failure}") from None


def display_url(url: str) -> str:
    """``url`` as messages show it: its password hidden."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url


class Database:
    """One database URL's engine, with reads, writes and close done as the module docstring says.

    Parameters
    ----------
    url : str
        A SQLAlchemy URL (``sqlite:///PATH`` or ``postgresql+psycopg://...``).
    create : bool
        A missing SQLite file may be created (else it is an error).
    read_only : bool or None
        ``None``: read-only where the file cannot be written.
    default_location : bool
        The URL is convtune's default cache location, whose parent directories it may make.
    """

    def __init__(self, url: str, *, create: bool = True, read_only: bool | None = None,
                 busy_timeout_s: float = 60.0, timeout_s: float = DEFAULT_TIMEOUT_S, retry_s: float = DEFAULT_RETRY_S,
                 cooldown_s: float = DEFAULT_COOLDOWN_S, default_location: bool = False):
        try:
            parsed = make_url(url)
        except ArgumentError as exc:
            raise CacheError(f"not a database URL: {url!r} ({exc}); use a file path, sqlite:///PATH or "
                             "postgresql://USER@HOST/DB") from exc
        self.dialect = parsed.get_backend_name()
        if self.dialect not in DIALECTS:
            raise CacheError(f"unsupported database {self.dialect!r}; acceptable: {', '.join(DIALECTS)}")
        self.display_url = parsed.render_as_string(hide_password=True)
        self.timeout_s, self.retry_s, self.cooldown_s = timeout_s, retry_s, cooldown_s
        self._busy_timeout_s = busy_timeout_s
        self._down = Cooldown()
        self._callers: _Callers | None = None  # PostgreSQL's call threads
        self.read_only, self.read_only_reason = bool(read_only), "opened read-only" if read_only else ""
        self.tables: list[str] = []  # an existing SQLite file's tables, as found before anything was done
        try:
            if self.dialect == "sqlite":
                self.engine = self._sqlite_engine(parsed, create, read_only, default_location)
            else:
                if read_only:
                    self.read_only_reason = "opened read-only"
                # (no ping before each use: a connection the server dropped fails its call, which is tried again
                # on a new one: see _guarded; a ping would cost every lookup a round trip)
                self.engine = create_engine(parsed, pool_pre_ping=False, connect_args={
                    "connect_timeout": max(1, int(round(timeout_s))),
                    "options": f"-c statement_timeout={int(timeout_s * 1000)}"})
        except (NoSuchModuleError, ImportError) as exc:
            raise CacheError(f"no driver for {self.display_url}: {exc}; for PostgreSQL install "
                             "'convtune[postgres]' (psycopg 3)") from exc

    # -- SQLite ----------------------------------------------------------------------------------
    def _sqlite_engine(self, parsed, create, read_only, default_location):
        path = parsed.database
        immutable = False
        if path not in (None, "", ":memory:"):
            file = Path(path)
            if file.is_dir():
                raise CacheError(f"{path} is a directory, not a plan cache file: give a file, e.g. --db "
                                 f"{file / 'plans.db'}")
            if file.exists():
                # read before any connection of the engine changes the file
                self.tables, only_immutable = _sqlite_tables(path)
                writable_dir = os.access(file.parent, os.W_OK)
                if only_immutable:  # (whatever was asked: nothing else can read it)
                    self.read_only = True
                    self.read_only_reason = "SQLite cannot make its -wal and -shm files beside it"
                elif read_only is None and not (os.access(file, os.W_OK) and writable_dir):
                    self.read_only = True
                    self.read_only_reason = (f"{'its directory' if os.access(file, os.W_OK) else 'the file'} "
                                             "cannot be written")
                immutable = only_immutable or (self.read_only and not writable_dir)
            elif not create:
                raise CacheError(f"no plan cache at {path}; run `convtune tune` first or give --db")
            elif read_only:
                raise CacheError(f"no plan cache at {path}: a read-only cache must be an existing database")
            elif not file.parent.exists():
                if not default_location:
                    raise CacheError(f"cannot create the plan cache {path}: the directory {file.parent} does not "
                                     "exist (create it, or give another --db)")
                try:
                    file.parent.mkdir(parents=True, exist_ok=True)
                except OSError as exc:
                    raise CacheError(f"cannot create the plan cache at {path}: {exc}") from exc
        if self.read_only:
            uri = f"file:{quote(path)}?mode=ro" + ("&immutable=1" if immutable else "")
            engine = create_engine(parsed, creator=lambda: sqlite3.connect(
                uri, uri=True, timeout=self._busy_timeout_s, check_same_thread=False))
        else:
            engine = create_engine(parsed, connect_args={"timeout": self._busy_timeout_s})
        timeout_ms = int(self._busy_timeout_s * 1000)
        read_only_now = self.read_only

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # transactions are begun below
            cur = dbapi_conn.cursor()
            cur.execute(f"PRAGMA busy_timeout={timeout_ms}")
            if read_only_now:
                cur.execute("PRAGMA query_only=1")
            else:
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn):
            # a write takes the lock at its start; a read is deferred (in WAL mode it never waits for a writer)
            conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("convtune_write")
                                 else "BEGIN")
        return engine

    # -- calls -----------------------------------------------------------------------------------
    def read(self, fn):
        """``fn(conn)`` in a read transaction."""
        def run():
            deadline = time.monotonic() + self._busy_timeout_s
            delay = 0.01
            while True:
                try:
                    with self.engine.connect() as conn:
                        if self.dialect == "postgresql":  # (a read needs no transaction: no BEGIN, no ROLLBACK)
                            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
                        return fn(conn)
                except OperationalError as exc:
                    # SQLite can answer "locked" without waiting for its busy timeout: while another
                    # process turns a new file into a WAL database, or recovers a WAL; wait and read again
                    if self.dialect != "sqlite" or "locked" not in str(exc).lower() or time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(2 * delay, 0.5)
        return self._guarded(run, write=False)

    def write(self, fn, retries: int = 5):
        """``fn(conn)`` in one write transaction: retried on SQLite lock contention and on concurrent
        inserts of the same unique row; ``CacheError`` on a read-only database."""
        if self.read_only:
            raise CacheError(f"the plan cache {self.display_url} is read-only ({self.read_only_reason}): "
                             "nothing can be stored in it")

        def run():
            for attempt in range(retries):
                try:
                    with self.engine.connect() as conn:
                        conn.execution_options(convtune_write=True)
                        with conn.begin():
                            result = fn(conn)
                    self._checkpoint("PASSIVE")
                    return result
                except OperationalError as exc:
                    if self.dialect == "sqlite" and "locked" in str(exc).lower() and attempt < retries - 1:
                        time.sleep(0.1 * (attempt + 1))
                        continue
                    raise
                except IntegrityError:
                    if attempt < retries - 1:  # a concurrent writer inserted the same unique row first
                        continue
                    raise
        return self._guarded(run, write=True)

    def _guarded(self, run, write: bool):
        """Run a call; on PostgreSQL under a deadline, with retries of lost connections and a cool-down."""
        if self.dialect != "postgresql":
            try:
                return run()
            except DBAPIError as exc:
                raise CacheError(f"plan cache {self.display_url}: {exc.orig or exc}") from exc
        left = self._down.left_s()
        if left > 0:
            raise CacheError(f"plan cache {self.display_url} is not answering ({self._down.reason}); not asked "
                             f"again for {left:.1f} s")
        deadline = time.monotonic() + (self.retry_s if write else self.timeout_s)
        backoff, tries_left = 0.25, (1 << 30) if write else 2
        while True:
            tries_left -= 1
            try:
                result = self._with_deadline(run, min(self.timeout_s, max(deadline - time.monotonic(), 0.5)))
                self._down.answered()
                return result
            except TimeoutError as exc:
                failure = str(exc)
            except DBAPIError as exc:
                if not isinstance(exc, OperationalError) and not exc.connection_invalidated:
                    raise CacheError(f"plan cache {self.display_url}: {exc.orig or exc}") from exc
                failure = f"{type(exc.orig or exc).__name__}: {' '.join(str(exc.orig or exc).split())[:200]}"
                if tries_left > 0 and time.monotonic() + backoff < deadline:
                    log.info("plan cache %s: %s; trying again in %.2f s", self.display_url, failure, backoff)
                    time.sleep(backoff)
                    backoff = min(2 * backoff, 2.0)
                    continue
            self._down.failed(failure, self.cooldown_s)
            raise CacheError(f"plan cache {self.display_url} failed: {failure}")

    def _with_deadline(self, run, seconds: float):
        """``run()`` on one of the database's call threads, given up after ``seconds`` (the call is left to finish
        or hang there). The threads are kept from call to call: starting one per call cost a lookup 0.1 ms on an
        idle machine and several on a loaded one (a new thread waits for the scheduler)."""
        callers = self._callers
        if callers is None or callers.pid != os.getpid():  # (a process forked from this one makes its own)
            callers = self._callers = _Callers()
        box, done = callers.call(run)
        if not done.wait(seconds):
            raise TimeoutError(f"no answer within {seconds:.1f} s (is the server down or frozen?)")
        if "error" in box:
            raise box["error"]
        return box.get("value")

    def _checkpoint(self, mode: str) -> None:
        """Fold SQLite's WAL into the main file (best effort: a reader may hold part of it)."""
        if self.dialect != "sqlite" or self.read_only:
            return
        try:
            raw = self.engine.raw_connection()
            try:
                raw.driver_connection.execute(f"PRAGMA wal_checkpoint({mode})")
            finally:
                raw.close()
        except (sqlite3.Error, DBAPIError) as exc:
            log.debug("plan cache %s: checkpoint %s skipped: %s", self.display_url, mode, exc)

    def close(self) -> None:
        self._checkpoint("TRUNCATE")
        self.engine.dispose()
