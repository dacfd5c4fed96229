"""Helpers that run in worker processes (spawned: they are imported by name there, so they live in a
module of their own): fake devices, a deterministic timer, and worker entry points."""

from __future__ import annotations

import json
import os
import time
import zlib

from convtune.backend import NumpyBackend
from convtune.timing import TimingStats


class DeterministicTimer:
    """Times every candidate by a hash of its label (the same in every process, so every worker ranks
    the candidates alike), after sleeping ``delay`` seconds (so that workers overlap as real ones do)."""

    def __init__(self, delay: float = 0.0):
        self.delay = delay

    def __call__(self, fn, backend=None, label="", stop_above=None):
        fn()
        time.sleep(self.delay)
        t = 1e-3 * (1 + zlib.crc32(label.encode()) % 1000 / 100)
        return TimingStats(t, 0.0, t, 3)


class FakeGpu(NumpyBackend):
    """A 'GPU' that computes with NumPy: the device a worker was given, and its model as the device reports it."""

    def __init__(self, device: str, model: str | None = None):
        super().__init__()
        self.device, self._model = device, model

    def device_info(self):
        info = super().device_info()
        if self._model is None:
            return info
        import dataclasses
        return dataclasses.replace(info, model=self._model)


def fake_gpu(device):
    return FakeGpu(device)


def mixed_gpus(device):
    """Device 1 is another model than device 0."""
    return FakeGpu(device, model="other-model" if device == "1" else None)


def broken_second_gpu(device):
    if device == "1":
        raise RuntimeError("cudaErrorNoDevice (a test's broken GPU)")
    return FakeGpu(device)


def lease_worker(url: str, keys: list[str], out: str, delay: float, ttl_s: float = 30.0, poll_s: float = 0.05):
    """A Worklist over ``keys`` on ``url`` (its own process), with a planner that times slowly; writes what
    became of each problem to ``out``."""
    from convtune import ConvProblem, Planner
    from convtune.cache import PlanCache
    from convtune.worklist import Worklist, rotated
    cache = PlanCache(url)
    backend = FakeGpu("0")
    planner = Planner(backend, DeterministicTimer(delay), strategies=["im2col", "reference"])
    index = int(os.environ.get("WORKER_INDEX", "0"))
    problems = rotated([ConvProblem.from_key(k) for k in keys], index, int(os.environ.get("WORKERS", "1")))
    outcomes = {}
    with Worklist(cache, backend.device_info(), planner.tune, ttl_s=ttl_s, poll_s=poll_s) as work:
        for p in problems:
            outcome = work.attempt(p)
            if outcome is not None:
                outcomes[p.key()] = outcome.source
        for outcome in work.finish():
            outcomes[outcome.problem.key()] = outcome.source
    with open(out, "w") as f:
        json.dump(outcomes, f)


def stuck_worker(url: str, key: str, ttl_s: float, ready: str):
    """Takes the lease on ``key`` and never gives it back (it is killed while 'tuning')."""
    from convtune import ConvProblem
    from convtune.cache import PlanCache
    cache = PlanCache(url)
    assert cache.take_lease(ConvProblem.from_key(key), FakeGpu("0").device_info(), "stuck-worker", ttl_s) is None
    open(ready, "w").close()
    time.sleep(3600)


def ddp_worker(rank: int, world: int, init_file: str, db: str, out: str, delay: float):
    """One rank of a gloo job: tune a small model ahead on the shared cache, report what it did."""
    import torch
    import torch.distributed as dist
    import convtune
    import convtune.torch as ct
    from convtune.cache import PlanCache
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        chans = [3, 4, 5, 6, 7]
        model = torch.nn.Sequential(*[torch.nn.Conv2d(chans[i], chans[i + 1], 3 + 2 * (i % 2), padding=1 + i % 2)
                                      for i in range(4)])
        runtime = convtune.Runtime(store=PlanCache(db), planner_options={
            "timer": DeterministicTimer(delay), "strategies": ["im2col", "reference", "torch"]})
        report = ct.tune(model, torch.randn(2, 3, 12, 12), runtime=runtime, progress=False)
        dist.barrier()
        with open(out, "w") as f:
            json.dump({"tuned": report.tuned, "cached": report.cached, "elsewhere": report.elsewhere,
                       "failed": [str(r) for _p, r in report.failed], "problems": len(report.problems)}, f)
    finally:
        dist.destroy_process_group()
