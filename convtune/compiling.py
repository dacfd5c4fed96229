"""Compiling CUDA kernels once, and many at once.

NVRTC compiles a kernel in 0.3 to 1 s of host time, and CuPy releases the GIL while it does: on a 16-core
host with an H100, 16 of the depthwise kernels compiled in 9.3 s one after another and in 2.4 s on 8
threads. Tuning ConvNeXt-T under AMP from an
empty cache had spent about 24 s compiling depthwise kernels one at a time. So a strategy whose candidates
need kernels compiled builds them all at once before the planner verifies them
(:meth:`~convtune.strategies.base.Strategy.prepare`, :func:`build_concurrently`), and its kernel caches
are :func:`compiled_once`: a kernel that two threads want is compiled by one of them.

Tuning many problems (a network's), the next problems' kernels compile on a background thread while the planner
verifies and times the current one on the GPU (:class:`CompileAhead`): the compiler's host time then overlaps the
searches' device time instead of coming between them.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

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


_KERNEL = re.compile(r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\(')


def only_kernels(code: str, names) -> str:
    """``code`` with only the ``extern "C"`` kernels ``names`` (their bodies, brace-matched, removed for the others):
    NVRTC then instantiates only the templates they use. A pass's two kernels of an 81x96 ``fft-plane`` source
    compile in 1.3 s where all eleven take 7.3 (NVRTC 13.5)."""
    pieces, pos, found = [], 0, set()
    while m := _KERNEL.search(code, pos):
        end = depth = 0
        for end in range(code.index("{", m.end()), len(code)):
            depth += {"{": 1, "}": -1}.get(code[end], 0)
            if depth == 0:
                break
        pieces.append(code[pos:m.start()])
        if m.group(1) in names:
            pieces.append(code[m.start():end + 1])
            found.add(m.group(1))
        pos = end + 1
    missing = set(names) - found
    if missing:
        raise ValueError(f"the source has no kernel {sorted(missing)}")
    return "".join(pieces) + code[pos:]


def launchables(code: str, names, smem: int, device_id: int) -> tuple:
    """The kernels ``names`` of ``code`` as launchable functions on device ``device_id`` (one module of them alone,
    :func:`only_kernels`: CuPy compiles it once for them all), each allowed ``smem`` bytes of dynamic shared memory
    (over the 48 KiB a block gets without opting in)."""
    import cupy
    code = only_kernels(code, names)
    out = []
    with cupy.cuda.Device(device_id):
        for name in names:
            kernel = cupy.RawKernel(code, name, options=("--std=c++17",))
            kernel.max_dynamic_shared_size_bytes = smem
            out.append(kernel.kernel)
    return tuple(out)


@functools.cache
def _driver():
    """The CUDA driver library (``None`` where this machine has none)."""
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None


def resident_blocks(kernel, threads: int, shared: int) -> int:
    """How many blocks of ``threads`` threads and ``shared`` bytes of dynamic shared memory a multiprocessor holds at
    once running launchable ``kernel`` (a CuPy function; the driver's occupancy, which weighs its registers too);
    0 where the driver cannot say (no driver, or a stand-in kernel without a device function)."""
    ptr, lib = getattr(kernel, "ptr", None), _driver()
    if not ptr or lib is None:
        return 0
    blocks = ctypes.c_int(0)
    status = lib.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(blocks), ctypes.c_void_p(ptr),
                                                             ctypes.c_int(threads), ctypes.c_size_t(shared))
    return blocks.value if status == 0 else 0


def allow_shared(kernel, shared: int) -> bool:
    """Lets launchable ``kernel`` (a CuPy function) take ``shared`` bytes of dynamic shared memory a block, over the 48
    KiB a block gets without opting in (the driver's ``CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES``); False where
    the driver refuses (the device gives a block less), True where done or nothing is asked (a stand-in kernel without
    a device function, no driver)."""
    ptr, lib = getattr(kernel, "ptr", None), _driver()
    if not ptr or lib is None:
        return True
    return lib.cuFuncSetAttribute(ctypes.c_void_p(ptr), ctypes.c_int(8), ctypes.c_int(shared)) == 0


def pass_names(names, pass_: str) -> tuple:
    """The kernels of a one-block FFT module's ``names`` (its filter spectrum, forward, backward-data, then
    filter-gradient kernels: :data:`convtune.fft.rowconv.NAMES`, :data:`convtune.fft.planeconv.NAMES`) that ``pass_``
    launches."""
    return {"fwd": names[:2], "dgrad": names[:1] + names[2:3], "wgrad": names[3:]}[pass_]


def pass_kernels(names, pass_names, compiled) -> tuple:
    """The launchables in ``names``' order, ``None`` for those the pass does not launch (``compiled``: those of
    ``pass_names``, in their order)."""
    got = dict(zip(pass_names, compiled))
    return tuple(got.get(name) for name in names)


def pass_launchables(code: str, names, pass_: str, smem: int, device_id: int) -> tuple:
    """A one-block FFT module's kernels ``names`` in order: those ``pass_`` launches (:func:`pass_names`) compiled
    alone (:func:`launchables`), ``None`` for the others."""
    wanted = pass_names(names, pass_)
    return pass_kernels(names, wanted, launchables(code, wanted, smem, device_id))


class CompileAhead:
    """``prepare(item)`` for each of ``items`` in order, on a background thread, while the caller works through the
    same items: the planner's :meth:`~convtune.planner.Planner.builds_ahead`, which lists what a problem's search
    will compile, so that the search finds its kernels built (:func:`compiled_once` makes a search that arrives
    while they compile wait for them rather than compile them again).

    ``prepare`` returns the item's builds (calls of no arguments; :func:`build_concurrently`'s) or ``None`` where it
    did its work itself. The builds of every item go to one pool of :func:`threads` threads, in the items' order, and
    the thread goes on to the next item's without waiting for them: one problem's few kernels do not hold back the
    next problem's, and the pool stays busy (SLaK-T's fp32 tune from an empty kernel cache on an H100 waited 3.9 s
    for its plane FFTs' kernels where, one problem's at a time, it had waited 9.1 s; the tune as a whole was not
    faster in that pair: BENCHMARKS.md).

    The caller says which item it has reached (:meth:`reached`); those not yet listed are skipped, their searches
    having prepared them. :meth:`close` stops before the next item, drops the builds not yet started and waits for
    those under way; a context manager starts and closes it. A ``prepare`` or a build that raises costs its own head
    start only (its search compiles what it needs and records any failure). ``backend``: that of the searches; on
    CuPy, the caller's current device (when started) is made current on the threads, the kernels being compiled for
    it. Nothing is started with fewer than two items, or on a machine with one core.

    >>> done = []
    >>> ahead = CompileAhead(done.append, ["a", "b", "c"])
    >>> ahead.reached(0)  # (the caller's search of "a" prepares it)
    >>> with ahead:
    ...     pass  # the searches, here none: closing stops the thread before its next item
    >>> set(done) <= {"b", "c"}
    True
    """

    def __init__(self, prepare: Callable, items, backend=None):
        self._prepare, self._items, self._backend = prepare, list(items), backend
        self._at = -1  # the last item the caller has reached
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.prepared = 0  # items prepared here (their builds listed, or their prepare done)
        self.built = 0  # builds run here
        self.seconds = 0.0  # spent preparing them and running their builds (summed over the threads)

    def start(self) -> CompileAhead:
        if self._thread is None and len(self._items) > 1 and threads() > 1:
            cupy = getattr(self._backend, "name", "") == "cupy"
            device = self._backend.xp.cuda.Device().id if cupy else None
            self._pool = ThreadPoolExecutor(threads(), thread_name_prefix="convtune-compile-ahead",
                                            initializer=self._use, initargs=(device,))
            self._thread = threading.Thread(target=self._run, args=(device,), name="convtune-compile-ahead",
                                            daemon=True)
            self._thread.start()
        return self

    def reached(self, index: int) -> None:
        """The caller is at ``items[index]``: the thread skips it and those before it."""
        self._at = max(self._at, index)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
            if self.prepared:
                log.debug("convtune: compiled ahead for %d of %d problems (%d builds) in %.1f s", self.prepared,
                          len(self._items), self.built, self.seconds)

    def __enter__(self) -> CompileAhead:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def _use(self, device: int | None) -> None:
        if device is not None:
            self._backend.xp.cuda.Device(device).use()

    def _spent(self, seconds: float, built: int = 0) -> None:
        with self._lock:
            self.seconds += seconds
            self.built += built

    def _build(self, build) -> None:
        if self._stop.is_set():
            return
        t0 = time.perf_counter()
        try:
            build()
        except Exception as exc:  # recorded by the planner's own build of the candidate
            log.debug("convtune: a build ahead failed (%s: %s)", type(exc).__name__, exc)
        self._spent(time.perf_counter() - t0, 1)

    def _run(self, device: int | None) -> None:
        self._use(device)
        for index, item in enumerate(self._items):
            if self._stop.is_set():
                return
            if index <= self._at:
                continue
            t0 = time.perf_counter()
            try:
                builds = self._prepare(item)
                self.prepared += 1
            except Exception as exc:  # its search compiles what it needs, and records what fails
                log.debug("convtune: compiling ahead for %s failed (%s: %s)", item, type(exc).__name__, exc)
                builds = None
            self._spent(time.perf_counter() - t0)
            for build in builds or ():
                if self._stop.is_set():
                    return
                self._pool.submit(self._build, build)
