"""Warm dispatch overhead: ``convtune.conv`` on a cache hit versus calling the plan directly.

Both loops run the same plan on a small, launch-bound problem; the difference per
call is what the runtime's lookup adds. On the GPU the loops are timed on the host
with a synchronisation at the end (the work is queued asynchronously, so host time
per call is the launch-side cost that the overhead competes with).
"""

from __future__ import annotations

import statistics
import time

from ..problem import ConvProblem
from ..arrayapi import conv
from ..runtime import MemoryPlanStore, Runtime, tune


def measure_dispatch_overhead(backend, calls: int = 2000, rounds: int = 7, timer=None) -> dict:
    xp = backend.xp
    rng = xp.random.default_rng(0)
    x = rng.standard_normal((1, 8, 16, 16), dtype=xp.float32)
    w = rng.standard_normal((8, 8, 3, 3), dtype=xp.float32)
    out = xp.empty((1, 8, 16, 16), dtype=xp.float32)
    options = {"time_budget_s": 1.0} if timer is None else {"timer": timer}
    rt = Runtime(store=MemoryPlanStore(), planner_options=options)
    # tuned ahead (a miss inside conv() would say "was not in the plan cache" about the bench's own probe)
    tune(ConvProblem.make(batch=1, in_channels=8, out_channels=8, input_size=(16, 16), kernel_size=3, padding=1),
         runtime=rt, backend=backend)
    conv(x, w, padding=1, out=out, runtime=rt)
    plan = next(iter(rt._memo.values()))

    def direct():
        for _ in range(calls):
            plan(x, w, out)
        backend.synchronize()

    def dispatched():
        for _ in range(calls):
            conv(x, w, padding=1, out=out, runtime=rt)
        backend.synchronize()

    samples = {"direct": [], "dispatched": []}
    for _ in range(rounds):
        for name, fn in (("direct", direct), ("dispatched", dispatched)):
            t0 = time.perf_counter()
            fn()
            samples[name].append((time.perf_counter() - t0) / calls)
    d, c = statistics.median(samples["direct"]), statistics.median(samples["dispatched"])
    return {"backend": backend.name, "device": backend.device_info().model, "plan": plan.label,
            "direct_us": d * 1e6, "dispatched_us": c * 1e6, "overhead_us": (c - d) * 1e6, "calls": calls,
            "rounds": rounds}
