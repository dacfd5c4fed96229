"""convtune's exception types.

Every error a user can trigger is one of these (or a ``ValueError`` naming the
allowed values), with a message that says what to do.
"""

from __future__ import annotations


class ConvtuneError(Exception):
    """Base class of every error raised by convtune itself."""


class UnsupportedProblem(ConvtuneError):
    """A strategy cannot run a problem; ``reason`` says why."""

    def __init__(self, strategy: str, reason: str):
        super().__init__(f"strategy {strategy!r} does not support this problem: {reason}")
        self.strategy = strategy
        self.reason = reason


class TuningError(ConvtuneError):
    """No candidate survived verification and timing for a problem."""

    def __init__(self, message: str, decision=None):
        super().__init__(message)
        self.decision = decision


class BackendError(ConvtuneError):
    """An array backend (NumPy, CuPy, cuDNN) is missing or failed."""


class CacheError(ConvtuneError):
    """The plan cache cannot be opened, read or written."""


class NetworkError(ConvtuneError):
    """A network description cannot be read or is invalid."""
