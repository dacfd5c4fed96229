"""Device time per call of depthwise FFT passes (the plan on CuPy arrays, back to back, CUDA events: median of
7 rounds of 20 calls) and the device time of their zero-extension and gather kernels (torch.profiler), for
the convtune on PYTHONPATH: long-16k-dw, hyena-long-dw, replknet-dw31 and slak-dw51, each pass with a fixed
FFT plan (no tuning).

    source scripts/gpu-env.sh; python3 benchmarks/fft_row_kernels.py TAG

TAG labels the output lines. To compare two versions, run it once with PYTHONPATH=/tmp/site:COPY, a copy of
the package with the older files (BENCHMARKS.md, 19th session: the row kernels before and after).
"""
import statistics
import sys

import cupy
import torch

from convtune.backend import get_backend
from convtune.planner import build_from_config
from convtune.problem import ConvProblem

be = get_backend("cupy")
LAYERS = {"long-16k-dw": dict(batch=2, in_channels=256, out_channels=256, input_size=(16384,), kernel_size=(16384,), padding=(16383,), groups=256),
          "hyena-long-dw": dict(batch=4, in_channels=768, out_channels=768, input_size=(4096,), kernel_size=(4096,), padding=(4095,), groups=768),
          "replknet-dw31": dict(batch=16, in_channels=128, out_channels=128, input_size=(56, 56), kernel_size=(31, 31), padding=(15, 15), groups=128),
          "slak-dw51": dict(batch=16, in_channels=96, out_channels=96, input_size=(56, 56), kernel_size=(51, 51), padding=(25, 25), groups=96)}
SIZES = {"long-16k-dw": (32768,), "hyena-long-dw": (8192,), "replknet-dw31": (72, 72), "slak-dw51": (108, 108)}


def per_call(fn, calls=20, rounds=7):
    fn(); cupy.cuda.Device().synchronize()
    out = []
    for _ in range(rounds):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        for _ in range(calls):
            fn()
        e.record(); e.synchronize()
        out.append(cupy.cuda.get_elapsed_time(s, e) / calls)
    return statistics.median(out)


tag = sys.argv[1] if len(sys.argv) > 1 else "run"
for name, kw in LAYERS.items():
    base = ConvProblem.make(**kw)
    parts = []
    for pass_ in ("fwd", "dgrad", "wgrad"):
        p = base.for_pass(pass_)
        plan = build_from_config(p, "fft", {"sizes": SIZES[name], "product": "pointwise", "chunk": p.batch}, be, "benchmark")
        (sa, sb), so = p.operand_shapes, p.result_shape
        a, b = cupy.random.standard_normal(sa, dtype=cupy.float32), cupy.random.standard_normal(sb, dtype=cupy.float32)
        out = cupy.empty(so, dtype=cupy.float32)
        t = per_call(lambda: plan(a, b, out))
        cupy.cuda.Device().synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                plan(a, b, out)
            cupy.cuda.Device().synchronize()
        k = {e.key: getattr(e, "device_time_total", 0) / 5e3 for e in prof.key_averages()}
        emb = sum(v for key, v in k.items() if "embed" in key)
        gat = sum(v for key, v in k.items() if "gather" in key)
        parts.append(f"{pass_} {t:.3f} ms (embed {emb:.3f}, gather {gat:.3f})")
        del a, b, out, plan
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"[{tag}] {name}: " + "; ".join(parts), flush=True)
