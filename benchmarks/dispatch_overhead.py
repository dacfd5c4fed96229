"""Warm dispatch overhead: ``convtune.conv`` on a cache hit versus calling the plan directly.

Usage: python benchmarks/dispatch_overhead.py [numpy|cupy] [--calls N]

Both loops run the same plan on a small, launch-bound problem; the difference
per call is what the runtime's lookup adds. On the GPU the loops are timed on
the host with a synchronisation at the end (the work queues asynchronously, so
host time per call is the launch-side cost the overhead competes with).
"""

from __future__ import annotations

import argparse
import statistics
import time

import convtune
from convtune.backend import get_backend


def measure(backend_name: str, calls: int, rounds: int = 7) -> dict:
    backend = get_backend(backend_name)
    xp = backend.xp
    rng = xp.random.default_rng(0)
    x = rng.standard_normal((1, 8, 16, 16), dtype=xp.float32)
    w = rng.standard_normal((8, 8, 3, 3), dtype=xp.float32)
    out = xp.empty((1, 8, 16, 16), dtype=xp.float32)
    rt = convtune.Runtime(planner_options={"time_budget_s": 1.0})
    convtune.conv(x, w, padding=1, out=out, runtime=rt)  # tune once
    plan = next(iter(rt._memo.values()))

    def direct():
        for _ in range(calls):
            plan(x, w, out)
        backend.synchronize()

    def dispatched():
        for _ in range(calls):
            convtune.conv(x, w, padding=1, out=out, runtime=rt)
        backend.synchronize()

    results = {"direct": [], "dispatched": []}
    for _ in range(rounds):
        for name, fn in (("direct", direct), ("dispatched", dispatched)):
            t0 = time.perf_counter()
            fn()
            results[name].append((time.perf_counter() - t0) / calls)
    d, c = statistics.median(results["direct"]), statistics.median(results["dispatched"])
    return {"backend": backend_name, "device": backend.device_info().model, "plan": plan.label,
            "direct_us": d * 1e6, "dispatched_us": c * 1e6, "overhead_us": (c - d) * 1e6, "calls": calls,
            "rounds": rounds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", nargs="?", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    r = measure(args.backend, args.calls)
    print(f"{r['backend']} on {r['device']}, plan {r['plan']}, {r['calls']} calls x {r['rounds']} rounds (median):")
    print(f"  plan called directly : {r['direct_us']:8.2f} us/call")
    print(f"  convtune.conv (hit)  : {r['dispatched_us']:8.2f} us/call")
    print(f"  dispatch overhead    : {r['overhead_us']:8.2f} us/call")


if __name__ == "__main__":
    main()
