"""Where the plan cache lives: the URL given, else ``$CONVTUNE_DB``, else a SQLite file under the user's cache."""

from __future__ import annotations

import os
from pathlib import Path

#: The environment variable naming the plan cache (a SQLite path or a database URL).
ENV_VAR = "CONVTUNE_DB"


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
