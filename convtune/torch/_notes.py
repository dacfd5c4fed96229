"""Notices said once per process: why a layer runs what it runs (a fallback, a duel's verdict, a capture)."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("convtune")

_said: set[str] = set()
_said_lock = threading.Lock()


def say_once(key: str, message: str, *args, level: int = logging.WARNING) -> None:
    """Log ``message`` the first time ``key`` is seen in this process."""
    with _said_lock:
        if key in _said:
            return
        _said.add(key)
    log.log(level, message, *args)
