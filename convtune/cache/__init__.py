"""The plan store: one interface (:class:`PlanStore`), kept in a database (:class:`PlanCache`: SQLAlchemy, SQLite
by default, PostgreSQL for a shared cache) or in memory (:class:`MemoryPlanStore`)."""

from .exchange import read_export, write_export
from .memory import MemoryPlanStore
from .paths import ENV_VAR, default_path, resolve_url
from .protocol import PlanStore
from .records import RECORD_KINDS
from .schema import SCHEMA_VERSION
from .store import PlanCache

__all__ = ["PlanStore", "PlanCache", "MemoryPlanStore", "RECORD_KINDS", "SCHEMA_VERSION", "ENV_VAR", "default_path",
           "resolve_url", "read_export", "write_export"]
