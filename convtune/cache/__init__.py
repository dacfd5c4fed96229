"""The persistent plan cache (SQLAlchemy: SQLite by default, PostgreSQL for a shared cache)."""

from .schema import SCHEMA_VERSION
from .store import ENV_VAR, LazyPlanCache, PlanCache, default_path, resolve_url
from .exchange import read_export, write_export

__all__ = ["PlanCache", "LazyPlanCache", "SCHEMA_VERSION", "ENV_VAR", "default_path", "resolve_url",
           "read_export", "write_export"]
