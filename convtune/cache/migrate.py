"""Schema upgrades of the plan cache: an older database is backed up, then upgraded in place.

Each step adds what its version added (:data:`~convtune.cache.schema.COLUMNS_ADDED`,
:data:`~convtune.cache.schema.TABLES_ADDED`) and nothing is rewritten: every stored plan and measurement stays as it was. Before the first step the database is
copied (:func:`convtune.cache.backup.backup`): a SQLite file next to itself, as
``NAME.schemaN-TIMESTAMP.bak``; a PostgreSQL database into a SQLite file under
``$XDG_CACHE_HOME/convtune/backups/``. The steps then run in one transaction, the version row last.
A database that cannot be written (read-only) is not upgraded: it is read as it is.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from pathlib import Path

from sqlalchemy import Float, Integer, String, inspect, update
from sqlalchemy.engine import make_url

from ..errors import CacheError
from .backup import backup
from .paths import default_path
from .schema import COLUMNS_ADDED, SCHEMA_VERSION, TABLES_ADDED, measurements, meta, metadata, problems

log = logging.getLogger("convtune")

#: The type of each added column, as the DDL writes it (the tables' own definitions say the same).
_TYPES = {"build_s": Float(), "verify_s": Float(), "timing_s": Float(), "rank": Integer(), "layout": String(16),
          "first_run_s": Float(), "warm_run_s": Float()}
#: What an added column holds in the rows that were there before it (none: NULL).
_DEFAULTS = {"layout": "'channels_first' NOT NULL"}
_TABLES = {"measurements": measurements, "problems": problems}


def backup_path(cache, found: int) -> Path:
    """Where the copy made before upgrading from schema ``found`` goes: a name no earlier copy has (two upgrades in
    one second, or a retry after a failed one, each keep their own)."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S")
    if cache.dialect == "sqlite":
        db = Path(make_url(cache.url).database)
        folder, name, suffix = db.parent, db.name, "bak"
    else:
        folder, name, suffix = default_path().parent / "backups", make_url(cache.url).database or "postgres", "db"
        folder.mkdir(parents=True, exist_ok=True)
    path, n = folder / f"{name}.schema{found}-{stamp}.{suffix}", 1
    while path.exists():
        n += 1
        path = folder / f"{name}.schema{found}-{stamp}-{n}.{suffix}"
    return path


def upgrade(cache, found: int) -> Path:
    """Back ``cache`` (a :class:`~convtune.cache.PlanCache` at schema ``found``) up, then upgrade it to
    :data:`SCHEMA_VERSION`; returns the backup's path."""
    if found >= SCHEMA_VERSION:
        raise CacheError(f"nothing to upgrade: {cache.display_url} is at schema {found}")
    copy = backup_path(cache, found)
    backup(cache, copy, schema_version=found)

    def steps(conn):
        for version in range(found + 1, SCHEMA_VERSION + 1):
            for table in TABLES_ADDED.get(version, ()):
                metadata.tables[table].create(conn, checkfirst=True)
            for table, columns in COLUMNS_ADDED.get(version, {}).items():
                there = {c["name"] for c in inspect(conn).get_columns(_TABLES[table].name)}
                for column in columns:
                    if column in there:  # (a version row lower than the tables: the column is there already)
                        continue
                    kind = _TYPES[column].compile(dialect=conn.dialect)
                    name = conn.dialect.identifier_preparer.quote(column)
                    default = f" DEFAULT {_DEFAULTS[column]}" if column in _DEFAULTS else ""
                    conn.exec_driver_sql(f"ALTER TABLE {_TABLES[table].name} ADD COLUMN {name} {kind}{default}")
        conn.execute(update(meta).where(meta.c.key == "schema_version").values(value=str(SCHEMA_VERSION)))
    cache.db.write(steps)
    log.warning("plan cache %s upgraded from schema %d to %d (every plan and measurement kept); the database as it "
                "was is at %s", cache.display_url, found, SCHEMA_VERSION, copy)
    return copy
