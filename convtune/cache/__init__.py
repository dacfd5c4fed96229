"""The persistent plan cache (SQLAlchemy: SQLite by default, PostgreSQL for a shared cache)."""

from .schema import SCHEMA_VERSION
from .paths import ENV_VAR, default_path, resolve_url
from .store import LazyPlanCache, PlanCache
from .exchange import read_export, write_export

__all__ = ["PlanCache", "LazyPlanCache", "SCHEMA_VERSION", "ENV_VAR", "default_path", "resolve_url",
           "read_export", "write_export"]
