"""Tuning spread over GPUs: one worker process per GPU, one plan cache (``convtune tune --devices``).

Each worker is a fresh process (spawned, so that no CUDA state is inherited) that sees only its GPU
(``CUDA_VISIBLE_DEVICES``), opens the plan cache and goes through the whole problem list with a
:class:`~convtune.worklist.Worklist`, starting ``i/n`` of the way in: the cache's leases give each
problem to one worker, and a worker that runs out of problems of its own waits for, or takes over,
what the others hold. So the GPUs stay busy until the list is done, a worker that dies costs only a
lease's length, and several ``--devices`` runs (on several machines, one PostgreSQL cache) share the
work the same way. Every problem gets the same search a serial run gives it, on the same kind of GPU:
the plans are a serial run's, up to timing noise.

The GPUs must be of one kind (one device fingerprint): a plan is stored for its device's model, and
a worker on another kind would tune plans the others cannot use. The workers report what they do to
the parent (:func:`tune_parallel`), which shows progress and returns every problem's outcome.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import time
from dataclasses import dataclass, field
from typing import Callable

from .backend import get_backend
from .cache import PlanCache
from .compiling import CompileAhead
from .errors import ConvtuneError
from .fft import cost
from .planner import Planner
from .problem import ConvProblem
from .worklist import Worklist, rotated

log = logging.getLogger("convtune")

#: Seconds the parent waits for the workers to report their devices.
READY_TIMEOUT_S = 300.0


def parse_devices(text: str) -> list[str]:
    """``--devices``: comma-separated GPU indices (``0,1``), each once."""
    devices = [d.strip() for d in text.split(",") if d.strip()]
    if not devices or not all(d.isdigit() for d in devices):
        raise ValueError(f"--devices takes GPU indices separated by commas (0,1,...), got {text!r}")
    if len(set(devices)) != len(devices):
        raise ValueError(f"--devices names a GPU twice: {text!r}")
    return devices


@dataclass(frozen=True)
class Job:
    """What every worker needs (sent to each; everything in it pickles)."""

    cache_url: str
    backend: str | Callable  # a backend name, or make_backend(device) (a module-level function: tests' fakes)
    problem_keys: tuple[str, ...]
    planner_options: dict = field(default_factory=dict)
    retune: bool = False


@dataclass
class Result:
    """Every problem's source (``tuned``, ``cache``, ``FAILED``), the decisions the workers made, the
    device fingerprint, and the workers that failed (device, reason)."""

    sources: dict[str, str] = field(default_factory=dict)
    decisions: list = field(default_factory=list)
    device_key: str = ""
    worker_failures: list[tuple[str, str]] = field(default_factory=list)
    tuned_by: dict[str, str] = field(default_factory=dict)  # problem key -> device that tuned it


def _backend_for(job: Job, device: str):
    if callable(job.backend):
        return job.backend(device)
    return get_backend(job.backend)


def _worker(device: str, index: int, count: int, job: Job, events, go, abort) -> None:
    """One worker (in its own process): report the device, wait for the go, work through the list."""
    if job.backend == "cupy":
        os.environ["CUDA_VISIBLE_DEVICES"] = device  # before CuPy is imported: this GPU only, as device 0
    try:
        backend = _backend_for(job, device)
        info = backend.device_info()
        events.put(("ready", device, info.key()))
        while not go.wait(0.2):
            if abort.is_set():
                return
        if abort.is_set():
            return
        cache = PlanCache(job.cache_url)
        cost.load_calibrations(cache)
        planner = Planner(backend, **job.planner_options)
        problems = rotated([ConvProblem.from_key(k) for k in job.problem_keys], index, count)
        with Worklist(cache, info, planner.tune, retune=job.retune,
                      on_tune=lambda p: events.put(("start", device, p.key()))) as work, \
                CompileAhead(planner.builds_ahead, problems, backend) as ahead:
            for index, problem in enumerate(problems):
                ahead.reached(index)
                if abort.is_set():
                    return
                outcome = work.attempt(problem)
                if outcome is not None:
                    events.put(("done", device, problem.key(), outcome.source, outcome.decision))
            for outcome in work.finish():
                events.put(("done", device, outcome.problem.key(), outcome.source, outcome.decision))
        events.put(("exit", device))
    except KeyboardInterrupt:
        events.put(("exit", device))
    except BaseException as exc:  # reported to the parent, which says so and goes on with the others
        events.put(("error", device, f"{type(exc).__name__}: {exc}"))


#: A problem's source from several workers' reports: tuned here beats everything else.
_PRECEDENCE = {"tuned": 3, "FAILED": 2, "cache": 1, "elsewhere": 0}


def tune_parallel(job: Job, devices: list[str], on_event: Callable | None = None) -> Result:
    """Run one worker per device on ``job`` and collect what they did.

    ``on_event(kind, device, problem_key, source)`` is called in this process as reports come:
    ``kind`` is ``start`` (a worker starts tuning a problem), ``settled`` (the first report of a problem's
    outcome), or ``failed`` (a worker died; ``source`` says why). A worker that fails is reported and
    the others finish the list; where every worker failed, :class:`~convtune.errors.ConvtuneError`.
    """
    ctx = multiprocessing.get_context("spawn")
    events, go, abort = ctx.Queue(), ctx.Event(), ctx.Event()
    workers = {d: ctx.Process(target=_worker, args=(d, i, len(devices), job, events, go, abort),
                              name=f"convtune-tune-{d}", daemon=True) for i, d in enumerate(devices)}
    result = Result()
    notify = on_event or (lambda *a: None)
    fingerprints: dict[str, str] = {}
    exited: set[str] = set()
    for p in workers.values():
        p.start()
    try:
        started = time.monotonic()
        while not go.is_set():
            if len(fingerprints) + len(exited) == len(workers):
                if len(set(fingerprints.values())) > 1:
                    kinds = "; ".join(f"{d}: {fp}" for d, fp in sorted(fingerprints.items()))
                    abort.set()
                    raise ConvtuneError(f"--devices needs GPUs of one kind (a plan is stored per device model), "
                                        f"found {kinds}; tune each kind with its own run")
                result.device_key = next(iter(fingerprints.values()), "")
                go.set()
                break
            if time.monotonic() - started > READY_TIMEOUT_S:
                abort.set()
                raise ConvtuneError(f"the workers did not report their devices within {READY_TIMEOUT_S:.0f} s")
            _handle(_next(events, workers, exited), result, fingerprints, exited, notify)
        while len(exited) < len(workers):
            _handle(_next(events, workers, exited), result, fingerprints, exited, notify)
    except BaseException:
        abort.set()
        for p in workers.values():  # SIGINT: a worker gives its leases back on the way out
            if p.is_alive():
                os.kill(p.pid, signal.SIGINT)
        for p in workers.values():
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
        raise
    for p in workers.values():
        p.join(timeout=10)
    if len(result.worker_failures) == len(workers):
        raise ConvtuneError("every worker failed: " + "; ".join(f"device {d}: {why}"
                                                                for d, why in result.worker_failures))
    return result


def _next(events, workers, exited):
    """The next report; a worker process that ended without saying so is reported as dead."""
    while True:
        try:
            return events.get(timeout=0.5)
        except queue.Empty:
            for device, p in workers.items():
                if device not in exited and not p.is_alive():
                    try:  # its last words may still be on the way
                        return events.get(timeout=1.0)
                    except queue.Empty:
                        return ("error", device, f"the worker process ended (exit code {p.exitcode}) without a "
                                                 "report; its leases run out and the others take its problems")


def _handle(event, result: Result, fingerprints, exited, notify) -> None:
    kind, device = event[0], event[1]
    if kind == "ready":
        fingerprints[device] = event[2]
    elif kind == "start":
        notify("start", device, event[2], None)
    elif kind == "done":
        key, source, decision = event[2], event[3], event[4]
        first = key not in result.sources
        if first or _PRECEDENCE[source] > _PRECEDENCE[result.sources[key]]:
            result.sources[key] = source
        if source in ("tuned", "FAILED"):
            result.tuned_by[key] = device
        if decision is not None:
            result.decisions.append(decision)
        if first:
            notify("settled", device, key, source)
    elif kind == "error":
        exited.add(device)
        result.worker_failures.append((device, event[2]))
        log.warning("convtune: the tuning worker on device %s failed: %s", device, event[2])
        notify("failed", device, None, event[2])
    elif kind == "exit":
        exited.add(device)
