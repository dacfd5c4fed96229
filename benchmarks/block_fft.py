"""Issue 22's layers through the one-block FFT strategies (``fft-row`` for 1-D, ``fft-plane`` for 2-D), in one process:
each pass, every candidate of the strategy, verified against float64 first, then timed (the best counts; CUDA
events, L2 flushed before every run, median), beside the FFT strategy's per-pass plan for the same layer (a fixed
configuration: the sizes the tuned suite chose, pointwise product, whole batch; no tuning) and the torch-fft peer's
round trip (PyTorch's FFT recipe, forward + one backward by autograd). Round trips are the three passes' medians
summed; the floor is the six tensors moved once at the measured copy bandwidth. Each pass's best candidate also gets
its kernels' device times (torch.profiler), so a slow pass says which kernel. With ``--dtype`` other than float32 the
peer runs on the operands' float32 storage of the half-precision values (a float32 peer).

    source scripts/gpu-env.sh; python3 benchmarks/block_fft.py [--layers long-16k-dw,hyena-long-dw] [--dtype bfloat16]
        [--layout channels_last] [--repeats 25] [-o block-fft.json]
"""

from __future__ import annotations

import argparse
import json
import sys

from convtune.backend import get_backend
from convtune.bench import torchfft
from convtune.bench.runner import copy_bandwidth
from convtune.planner import build_from_config, random_operands, relative_error
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy
from convtune.timing import CudaEventTimer

LAYERS = {
    "long-16k-dw": (dict(batch=2, in_channels=256, input_size=(16384,), kernel_size=16384, padding=16383), (32768,)),
    "hyena-long-dw": (dict(batch=4, in_channels=768, input_size=(4096,), kernel_size=4096, padding=4095), (8192,)),
    "replknet-dw31": (dict(batch=16, in_channels=128, input_size=(56, 56), kernel_size=31, padding=15), (72, 72)),
    "slak-dw51": (dict(batch=16, in_channels=96, input_size=(56, 56), kernel_size=51, padding=25), (81, 81)),
    "convnext-t-dw7": (dict(batch=64, in_channels=96, input_size=(56, 56), kernel_size=7, padding=3), (64, 64)),
}


def problem(spec: dict, dtype: str, layout: str) -> ConvProblem:
    c = spec["in_channels"]
    return ConvProblem.make(out_channels=c, groups=c, dtype=dtype, layout=layout, **spec)


def kernel_times(torch, fn, be, calls: int = 5) -> dict:
    """Device ms per call of each kernel ``fn`` launches (torch.profiler's CUDA activity, ``calls`` calls)."""
    be.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        be.synchronize()
    return {e.key: round(getattr(e, "device_time_total", 0) / 1e3 / calls, 4) for e in prof.key_averages()
            if getattr(e, "device_time_total", 0) > 0}


def setup(repeats: int):
    """PyTorch, the CuPy backend, the CUDA-event timer (``repeats``, L2 flushed) and the measured copy bandwidth
    (printed): what each of these benchmarks starts with."""
    import torch
    be = get_backend("cupy")
    timer = CudaEventTimer(warmup=3, repeats=repeats, max_total_s=5.0)
    bandwidth = copy_bandwidth(be, timer)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    return torch, be, timer, bandwidth


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--layout", default="channels_first")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--plane-shape", help="THREADS,BLOCKS: fft-plane's launch shape instead of its policy's "
                    "(planeconv.launch_shape), to compare shapes")
    ap.add_argument("--plane-points", type=int, help="fft-plane's points per thread in one call of its batched passes "
                    "(planeconv.POINTS_PER_THREAD, 16): fewer spill less under the register cap "
                    "(benchmarks/kernel_registers.py) and synchronise more")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.plane_points:
        from convtune.fft import planeconv
        planeconv.POINTS_PER_THREAD = args.plane_points
    if args.plane_shape:
        from convtune.fft import planeconv
        shape = tuple(int(v) for v in args.plane_shape.split(","))
        planeconv.launch_shape = lambda sizes: shape
    torch, be, timer, bandwidth = setup(args.repeats)
    rows = []
    for name in args.layers.split(","):
        spec, fft_sizes = LAYERS[name]
        base = problem(spec, args.dtype, args.layout)
        block = get_strategy("fft-row" if base.rank == 1 else "fft-plane")
        row = {"layer": name, "problem": base.key(), "strategy": block.name, "passes": {}}
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = base.for_pass(pass_)
            a, b = random_operands(be, p, seed=1)
            ref = get_strategy("reference").build(p, None, be)(a.astype(be.xp.float64), b.astype(be.xp.float64))
            entry = {}
            why = block.supports(p, be)
            if why is None:
                entry["candidates"] = {}
                for config in block.candidates(p, be):  # (fft-plane: powers of two, and 2^a 3^b sizes)
                    run = block.executor(p, config, be)
                    got = {"error": relative_error(be.xp, run(a, b), ref)}
                    if got["error"] <= p.tolerance:
                        got["ms"] = timer(run.timed(a, b, None), be).median_s * 1e3
                    entry["candidates"][config.label()] = got
                    if "ms" in got and got["ms"] < entry.get("ms", float("inf")):
                        entry["ms"], entry["config"] = got["ms"], config.label()
                        entry["kernels"] = kernel_times(torch, run.timed(a, b, None), be)
            else:
                entry["unsupported"] = why
            try:
                plan = build_from_config(p, "fft", {"sizes": fft_sizes, "product": "pointwise", "chunk": p.batch}, be,
                                         "benchmark")
                out = be.xp.empty(p.result_shape, dtype=be.xp.float32) if p.dtype == "float32" else None
                entry["fft_error"] = relative_error(be.xp, plan(a, b), ref)
                entry["fft_ms"] = timer((lambda: plan(a, b, out)) if out is not None else (lambda: plan(a, b)),
                                        be).median_s * 1e3
            except Exception as exc:  # the comparison plan is context, not the subject
                entry["fft_failed"] = f"{type(exc).__name__}: {exc}"
            row["passes"][pass_] = entry
            print(f"{name} {pass_}: {json.dumps(entry)}", flush=True)
            del a, b, ref
            be.xp.get_default_memory_pool().free_all_blocks()
        if torchfft.unsupported_reason(base) is None:
            x, w = random_operands(be, base, seed=2)
            dy = random_operands(be, base.for_pass("dgrad"), seed=3)[0]
            peer = torchfft.round_trip(torch, base, x, w, dy)
            row["torch_fft_ms"] = timer(peer, be).median_s * 1e3
            del x, w, dy, peer
        passes = row["passes"].values()
        if all("ms" in e for e in passes):
            row["round_trip_ms"] = sum(e["ms"] for e in passes)
        if all("fft_ms" in e for e in passes):
            row["fft_round_trip_ms"] = sum(e["fft_ms"] for e in passes)
        row["floor_ms"] = torchfft.floor_ms(base, bandwidth, round_trip_=True)
        if "round_trip_ms" in row and "torch_fft_ms" in row:
            row["vs_torch_fft"] = row["torch_fft_ms"] / row["round_trip_ms"]
        rows.append(row)
        print(f"== {name}: round trip {row.get('round_trip_ms')} ms (fft plans {row.get('fft_round_trip_ms')}), "
              f"torch-fft {row.get('torch_fft_ms')}, vs torch-fft {row.get('vs_torch_fft')}, floor {row['floor_ms']}",
              flush=True)
        be.xp.get_default_memory_pool().free_all_blocks()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"dtype": args.dtype, "layout": args.layout, "copy_bandwidth_GBps": bandwidth / 1e9,
                       "layers": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
