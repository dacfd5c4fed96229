"""``convtune backup``: a consistent copy of a plan cache in one SQLite file.

A SQLite cache in WAL mode keeps recent commits in its ``-wal`` file until a checkpoint, so a copy
of the main file alone can lack them (after a killed tuner it can even lack the tables). The copy
made here is SQLite's online backup of the source (a consistent snapshot, WAL included, while
others keep reading and writing), switched to a rollback journal so that it is one self-contained
file: fit to ship with a model and to open read-only. A PostgreSQL cache is copied table by table in
one read transaction into a new SQLite file. The copy is written next to its destination and renamed
into place, so a failure leaves no half-made file.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy import create_engine, insert, select

from ..errors import CacheError
from . import schema


def backup(cache, out: str | os.PathLike, force: bool = False, schema_version: int | None = None) -> dict:
    """Write a consistent single-file SQLite copy of ``cache`` (a :class:`~convtune.cache.PlanCache`) to
    ``out``; returns the copy's row counts. ``schema_version``: the source's, where it is older than this
    convtune's (the copy is then of that version too)."""
    out = Path(out)
    if out.exists() and not force:
        raise CacheError(f"{out} exists; give a new file name (or --force to replace it)")
    if not out.parent.is_dir():
        raise CacheError(f"cannot write {out}: the directory {out.parent} does not exist")
    part = out.with_name(out.name + ".part")
    for leftover in (part, Path(f"{part}-wal"), Path(f"{part}-shm"), Path(f"{part}-journal")):
        leftover.unlink(missing_ok=True)
    try:
        if cache.dialect == "sqlite":
            _sqlite_backup(cache, part)
        else:
            _copy_tables(cache, part, schema_version or schema.SCHEMA_VERSION)
        os.replace(part, out)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    return _counts(out)


def _counts(path: Path) -> dict:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]
                for t in ("devices", "problems", "measurements", "plans")}
    finally:
        conn.close()


def _sqlite_backup(cache, part: Path) -> None:
    raw = cache.engine.raw_connection()
    try:
        target = sqlite3.connect(part)
        try:
            raw.driver_connection.backup(target)
            target.execute("PRAGMA journal_mode=DELETE")  # one file: no -wal or -shm beside it
        finally:
            target.close()
    except sqlite3.Error as exc:
        raise CacheError(f"backup of {cache.display_url} failed: {exc}") from exc
    finally:
        raw.close()


def _copy_tables(cache, part: Path, version: int) -> None:
    """Every row of every table (ids kept, so the references hold), read in one transaction, into a SQLite
    file of the source's schema ``version``."""
    missing, absent = schema.columns_missing(version), schema.tables_missing(version)
    tables = [t for t in schema.metadata.sorted_tables if t.name not in absent]

    def columns(table):
        return [c for c in table.columns if c.name not in missing.get(table.name, ())]

    def read(conn):
        return {t.name: [dict(r) for r in conn.execute(select(*columns(t))).mappings()] for t in tables}
    rows = cache._read_rows(read)
    engine = create_engine(f"sqlite:///{part}")
    try:
        with engine.begin() as conn:
            schema.metadata.create_all(conn, tables=tables)
            for table, names in missing.items():  # the copy is of the source's version
                for name in names:
                    conn.exec_driver_sql(f'ALTER TABLE {table} DROP COLUMN "{name}"')
            for table in tables:  # parents before children
                if rows[table.name]:  # the rows' keys name the columns written: a lacking one is not
                    conn.execute(insert(table), rows[table.name])
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode=DELETE")
    finally:
        engine.dispose()
