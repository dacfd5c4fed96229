"""Compiling CUDA kernels once, and many at once.

NVRTC compiles a kernel in 0.3 to 1 s of host time, and CuPy releases the GIL while it does: on the H100
machine's 16 cores, 16 of the depthwise kernels compiled in 9.3 s one after another and in 2.4 s on 8
threads (``docs/device-logs/2026-11-24-s20-parallel-compile.txt``). Tuning ConvNeXt-T under AMP from an
empty cache had spent about 24 s compiling depthwise kernels one at a time. So a strategy whose candidates
need kernels compiled builds them all at once before the planner verifies them
(:meth:`~convtune.strategies.base.Strategy.prepare`, :func:`build_concurrently`), and its kernel caches
are :func:`compiled_once`: a kernel that two threads want is compiled by one of them.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger("convtune")

#: Threads that compile at once, at most (and never more than the machine's cores).
MAX_THREADS = 8


def compiled_once(fn):
    """``functools.cache`` for kernel factories called from several threads: a key's value is made once,
    by the first caller, while the others wait for it; a hit is one dict lookup, as before.

    >>> calls = []
    >>> @compiled_once
    ... def square(n):
    ...     calls.append(n)
    ...     return n * n
    >>> square(3), square(3), calls
    (9, 9, [3])
    """
    made: dict = {}
    locks: dict = {}
    guard = threading.Lock()

    @functools.wraps(fn)
    def get(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items()))) if kwargs else args
        try:
            return made[key]
        except KeyError:
            pass
        with guard:
            lock = locks.setdefault(key, threading.Lock())
        with lock:
            if key not in made:
                made[key] = fn(*args, **kwargs)
        return made[key]
    get.cache_clear = lambda: (made.clear(), locks.clear())
    return get


def threads() -> int:
    return max(1, min(MAX_THREADS, os.cpu_count() or 1))


def build_concurrently(builds, backend) -> int:
    """Run ``builds`` (callables of no arguments; their results are dropped) on :func:`threads` threads
    on the calling thread's GPU, so that the kernels they compile land in their caches. A build that
    fails is left to fail again where the planner builds that candidate (and records why). Returns how
    many failed."""
    builds = list(builds)
    if len(builds) < 2 or threads() < 2:
        return 0
    device = backend.xp.cuda.Device().id if getattr(backend, "name", "") == "cupy" else None

    def run(build) -> bool:
        try:
            if device is not None:
                backend.xp.cuda.Device(device).use()
            build()
            return True
        except Exception as exc:  # recorded by the planner's own build of the candidate
            log.debug("convtune: a concurrent build failed (%s: %s)", type(exc).__name__, exc)
            return False
    with ThreadPoolExecutor(min(threads(), len(builds)), thread_name_prefix="convtune-compile") as pool:
        return sum(1 for ok in pool.map(run, builds) if not ok)
