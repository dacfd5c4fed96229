"""The plan cache's tables (SQLAlchemy Core; SQLite and PostgreSQL).

* ``meta``: the schema version.
* ``devices``: one row per device fingerprint, every field a column.
* ``problems``: one row per problem key, with typed columns (``layout`` since schema 4; the
  problems of an older database are all channels-first).
* ``measurements``: every candidate outcome of every tuning run (append-only), with what searching
  it cost (schema 2) and its two runs on the verification batch (schema 5: what predicts its time on the full
  problem, for the rules and cost models fitted on stored searches).
* ``plans``: the winner per problem (pass and math mode are in the problem) x
  device fingerprint x strategy versions.
* ``pending`` (schema 2): problems a runtime served without a plan of their own (from the nearest
  tuned problem, or the heuristic), for ``convtune tune --pending`` to tune later.
* ``leases`` (schema 3): which worker is tuning a problem now, until when (:mod:`convtune.worklist`):
  workers sharing a cache (processes, GPUs, machines, DDP ranks) never tune one problem twice at once,
  and a dead worker's lease runs out.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Float, ForeignKey, Integer, MetaData, String, Table, Text, UniqueConstraint

#: Bump on any table change, with its migration in :mod:`convtune.cache.migrate` (an older database is
#: upgraded after a backup, never discarded; a newer one is refused, never altered).
SCHEMA_VERSION = 5
#: The columns each version added to the tables (what a migration adds, and what an older database lacks).
COLUMNS_ADDED = {2: {"measurements": ("build_s", "verify_s", "timing_s", "rank")},
                 4: {"problems": ("layout",)},
                 5: {"measurements": ("first_run_s", "warm_run_s")}}
#: The tables each version added.
TABLES_ADDED = {2: ("pending",), 3: ("leases",)}

metadata = MetaData()

meta = Table(
    "convtune_meta", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", Text, nullable=False),
)

devices = Table(
    "devices", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("fingerprint", String(512), nullable=False, unique=True),
    Column("backend", String(16), nullable=False),
    Column("model", String(128), nullable=False),
    Column("compute_capability", String(16), nullable=False, default=""),
    Column("sm_count", Integer, nullable=False, default=0),
    Column("memory_bytes", BigInteger, nullable=False, default=0),
    Column("driver", String(32), nullable=False, default=""),
    Column("cuda_runtime", String(32), nullable=False, default=""),
    Column("cufft", String(32), nullable=False, default=""),
    Column("cublas", String(32), nullable=False, default=""),
    Column("cudnn", String(32), nullable=False, default=""),
    Column("numpy", String(32), nullable=False, default=""),
    Column("cupy", String(32), nullable=False, default=""),
    Column("first_seen", String(32), nullable=False),
)

problems = Table(
    "problems", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("key", String(256), nullable=False, unique=True),
    Column("rank", Integer, nullable=False),
    Column("pass_", String(8), nullable=False),
    Column("dtype", String(16), nullable=False),
    Column("math", String(8), nullable=False),
    Column("batch", Integer, nullable=False),
    Column("in_channels", Integer, nullable=False),
    Column("out_channels", Integer, nullable=False),
    Column("input_size", String(64), nullable=False),
    Column("kernel_size", String(64), nullable=False),
    Column("stride", String(64), nullable=False),
    Column("padding", String(64), nullable=False),
    Column("dilation", String(64), nullable=False),
    Column("groups", Integer, nullable=False),
    Column("flops", BigInteger, nullable=False),
    Column("layout", String(16), nullable=False, server_default="channels_first"),
)

measurements = Table(
    "measurements", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(36), nullable=False, index=True),
    Column("problem_id", Integer, ForeignKey("problems.id"), nullable=False, index=True),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False, index=True),
    Column("strategy_versions", String(256), nullable=False),
    Column("strategy", String(64), nullable=False),
    Column("config", Text, nullable=False),
    Column("label", String(256), nullable=False),
    Column("status", String(16), nullable=False),
    Column("time_median_s", Float),
    Column("time_spread_s", Float),
    Column("time_min_s", Float),
    Column("repeats", Integer),
    Column("workspace_bytes", BigInteger, nullable=False, default=0),
    Column("error", Float),
    Column("reason", Text, nullable=False, default=""),
    Column("measured_at", String(32), nullable=False),
    Column("convtune_version", String(32), nullable=False),
    # schema 2: what the search spent on the candidate, and its place in its strategy's list
    Column("build_s", Float),
    Column("verify_s", Float),
    Column("timing_s", Float),
    Column("rank", Integer),
    # schema 5: its first and its second (warm) run on the verification batch, in seconds per full problem
    Column("first_run_s", Float),
    Column("warm_run_s", Float),
)

plans = Table(
    "plans", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem_id", Integer, ForeignKey("problems.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("strategy_versions", String(256), nullable=False),
    Column("strategy", String(64), nullable=False),
    Column("config", Text, nullable=False),
    Column("label", String(256), nullable=False),
    Column("time_median_s", Float),
    Column("time_spread_s", Float),
    Column("repeats", Integer),
    Column("error", Float),
    Column("workspace_bytes", BigInteger, nullable=False, default=0),
    Column("runner_up", String(256), nullable=False, default=""),
    Column("speedup_next", Float),
    Column("tuning_s", Float),
    Column("run_id", String(36), nullable=False),
    Column("tuned_at", String(32), nullable=False),
    Column("convtune_version", String(32), nullable=False),
    Column("source", String(16), nullable=False),
    UniqueConstraint("problem_id", "device_id", "strategy_versions", name="uq_plan"),
)

pending = Table(
    "pending", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem_id", Integer, ForeignKey("problems.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    # what served the problem meanwhile: the key of the nearest tuned problem, or "heuristic"
    Column("served_by", String(256), nullable=False),
    Column("first_seen", String(32), nullable=False),
    UniqueConstraint("problem_id", "device_id", name="uq_pending"),
)

leases = Table(
    "leases", metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("problem_id", Integer, ForeignKey("problems.id"), nullable=False),
    Column("device_id", Integer, ForeignKey("devices.id"), nullable=False),
    Column("holder", String(160), nullable=False),  # host:pid:token of the worker tuning the problem
    # seconds since the epoch by the database's own clock (workers' clocks may disagree)
    Column("expires_at", Float, nullable=False),
    Column("taken_at", String(32), nullable=False),
    UniqueConstraint("problem_id", "device_id", name="uq_lease"),
)

DEVICE_FIELDS = ("backend", "model", "compute_capability", "sm_count", "memory_bytes", "driver", "cuda_runtime",
                 "cufft", "cublas", "cudnn", "numpy", "cupy")
#: The columns that make up a plan's content (what export/import carries).
PLAN_FIELDS = ("strategy", "config", "label", "time_median_s", "time_spread_s", "repeats", "error",
               "workspace_bytes", "runner_up", "speedup_next", "tuning_s", "run_id", "tuned_at", "convtune_version",
               "source")


def columns_missing(found: int) -> dict[str, set[str]]:
    """The columns a database at schema ``found`` lacks, by table."""
    missing: dict[str, set[str]] = {}
    for version in range(found + 1, SCHEMA_VERSION + 1):
        for table, columns in COLUMNS_ADDED.get(version, {}).items():
            missing.setdefault(table, set()).update(columns)
    return missing


def tables_missing(found: int) -> set[str]:
    """The tables a database at schema ``found`` lacks."""
    return {t for version in range(found + 1, SCHEMA_VERSION + 1) for t in TABLES_ADDED.get(version, ())}
