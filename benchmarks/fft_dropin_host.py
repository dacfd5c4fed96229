"""Host time of a depthwise FFT pass through the PyTorch drop-in (the route's executor on CUDA tensors):
per call back to back and with the device idle, with and without Python's garbage collector, and a cProfile
of 100 calls. hyena-long-dw and long-16k-dw, forward and backward-data, plans tuned on the spot (FFT only).

    source scripts/gpu-env.sh; python3 benchmarks/fft_dropin_host.py

BENCHMARKS.md (19th session): on a quiet host about 0.2 ms per call, under the passes' 0.4-0.6 ms on the
device; seven kernel launches and seven allocations through PyTorch's caching allocator.
"""
import cProfile
import gc
import io
import pstats
import statistics
import time

import cupy
import torch

from convtune import MemoryPlanStore, Runtime
from convtune.torch._dispatch import route_for

LAYERS = {"hyena-long-dw": (4, 768, 4096, 4096), "long-16k-dw": (2, 256, 16384, 16384)}


def host_per_call(fn, calls=40, rounds=7):
    fn(); torch.cuda.synchronize()
    host, dev = [], []
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        host.append((time.perf_counter() - t0) / calls * 1e3)
        e.record(); e.synchronize(); dev.append(s.elapsed_time(e) / calls)
    return statistics.median(host), statistics.median(dev), min(host)


for name, (B, C, L, K) in LAYERS.items():
    rt = Runtime(store=MemoryPlanStore(), planner_options={"strategies": ["fft"], "time_budget_s": 3})
    x = torch.randn(B, C, L, device="cuda"); w = torch.randn(C, 1, K, device="cuda")
    dy = torch.randn(B, C, L + K - 1, device="cuda")
    route = route_for((B, C, L), (C, 1, K), (1,), (K - 1,), (1,), C, "fp32", x.device, rt)
    for pass_, (a, b) in {"fwd": (x, w), "dgrad": (dy, w)}.items():
        ex = route.resolve(pass_)
        fn = lambda: ex(a, b)  # noqa: E731
        h, d, hmin = host_per_call(fn)
        gc.disable()
        hg, dg, hgmin = host_per_call(fn)
        gc.enable()
        # host alone: the device kept busy far ahead is not what is measured here; a sync per call
        def synced():
            torch.cuda.synchronize(); t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
        alone = statistics.median([synced() for _ in range(60)]) * 1e3
        print(f"{name} {pass_} {ex.label}: host/dev ms per call back to back {h:.3f}/{d:.3f} (min host {hmin:.3f}); "
              f"gc off {hg:.3f}/{dg:.3f} (min {hgmin:.3f}); host of one call with the device idle {alone:.3f}", flush=True)
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print("\n".join(l for l in out.getvalue().splitlines() if l.strip())[:3500], flush=True)
    del route
    torch.cuda.empty_cache(); cupy.get_default_memory_pool().free_all_blocks()
