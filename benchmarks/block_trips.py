"""Large depthwise layers through the block round trips (``fft-trip[...,block]``: kept spectra on the one-block
transforms, :mod:`convtune.fft.blockkept`), and dense ones through the planner's other trips (``--all``), in one
process: every candidate of
:func:`convtune.roundtrip.block_trip_configs` checked against float64 in all three passes, then timed as the planner
times a trip (each pass after its own L2 flush, CUDA events, median of the summed passes), beside the torch-fft
peer's round trip timed as a whole; the best candidate's kernels get their device times (torch.profiler), so the trip
says which kernel costs what. Then the best trip and the peer, each a whole round trip after an L2 flush, are timed
side by side (``CudaEventTimer.interleaved``: in turns, the order rotated) and compared repeat by repeat: the peer's
own time moved by up to 30% between processes on long-16k-dw, so only the paired ratio is a claim.

With ``--all`` every round-trip candidate of the planner (:func:`convtune.roundtrip.trip_candidates`: the cuFFT
trips with and without callbacks, packed, narrow, own transforms, and the block ones) is timed instead,
and each candidate also whole (one call after one L2 flush) with its host time per call (the GPU not waited for): a
trip the planner ranks first by its summed passes may lose timed whole, where its host time shows.

    python3 benchmarks/block_trips.py [--layers hyena-long-dw,long-16k-dw] [--all] [-o trips.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from convtune.backend import get_backend
from convtune.bench import torchfft
from convtune.bench.runner import copy_bandwidth
from convtune.planner import relative_error
from convtune.problem import ConvProblem
from convtune.roundtrip import (RoundTrip, block_trip_configs, compile_block_trips, round_trip_operands,
                                round_trip_references, time_round_trip, trip_candidates)
from convtune.timing import CudaEventTimer, paired_ratio

#: name -> (the depthwise layer's shape, the transform size of its best trip)
LAYERS = {
    "long-16k-dw": (dict(batch=2, in_channels=256, input_size=(16384,), kernel_size=16384, padding=16383), (32768,)),
    "hyena-long-dw": (dict(batch=4, in_channels=768, input_size=(4096,), kernel_size=4096, padding=4095), (8192,)),
    "replknet-dw31": (dict(batch=16, in_channels=128, input_size=(56, 56), kernel_size=31, padding=15), (72, 72)),
    "slak-dw51": (dict(batch=16, in_channels=96, input_size=(56, 56), kernel_size=51, padding=25), (81, 81)),
    "convnext-t-dw7": (dict(batch=64, in_channels=96, input_size=(56, 56), kernel_size=7, padding=3), (64, 64)),
}
#: dense layers: the public suite's, and the class of dense 25-35-wide kernels on 64-256-pixel planes with 16-64
#: channels (with --all: every candidate of the planner)
DENSE = {"dense-k31": dict(batch=8, in_channels=64, out_channels=64, input_size=(64, 64), kernel_size=31, padding=15),
         "fbfft-L1": dict(batch=128, in_channels=3, out_channels=96, input_size=(128, 128), kernel_size=11),
         "dense-k25-p128-c32": dict(batch=8, in_channels=32, out_channels=32, input_size=(128, 128), kernel_size=25,
                                    padding=12),
         "dense-k27-p96-c48": dict(batch=8, in_channels=48, out_channels=48, input_size=(96, 96), kernel_size=27,
                                   padding=13),
         "dense-k35-p256-c16": dict(batch=4, in_channels=16, out_channels=16, input_size=(256, 256), kernel_size=35,
                                    padding=17)}


def layer(name) -> ConvProblem:
    """The forward problem of ``name``."""
    if name in DENSE:
        return ConvProblem.make(**DENSE[name])
    spec = LAYERS[name][0]
    c = spec["in_channels"]
    return ConvProblem.make(out_channels=c, groups=c, **spec)


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
    (printed)."""
    import torch
    be = get_backend("cupy")
    timer = CudaEventTimer(warmup=3, repeats=repeats, max_total_s=5.0)
    bandwidth = copy_bandwidth(be, timer)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s", flush=True)
    return torch, be, timer, bandwidth


def host_us(trip, x, w, dy, be, calls: int = 20) -> float:
    """Median host microseconds of one whole round trip's call (launches queued, the GPU waited for after each)."""
    spent = []
    for _ in range(calls):
        be.synchronize()
        t0 = time.perf_counter()
        trip(x, w, dy)
        spent.append(time.perf_counter() - t0)
    be.synchronize()
    return statistics.median(spent) * 1e6


def trace(torch, fn, be, path: str) -> None:
    """A Chrome trace of three calls of ``fn`` (host and device activity) at ``path``."""
    import os
    os.makedirs(os.path.dirname(path), exist_ok=True)
    be.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(3):
            fn()
        be.synchronize()
    prof.export_chrome_trace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="hyena-long-dw,long-16k-dw,replknet-dw31,slak-dw51")
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--side-by-side", type=int, default=60, help="repeats of the paired timing (0: none)")
    ap.add_argument("--max-table", type=int, help="rowsource.MAX_TABLE: the longest rows whose twiddles come from a "
                    "table (longer ones compute them by sincospif)")
    ap.add_argument("--only", help="only the candidates whose label holds this text (sizes=81x96)")
    ap.add_argument("--trace", help="a directory: a Chrome trace (torch.profiler, host and device) of three whole "
                    "round trips of each layer's best candidate, to see where the device waits")
    ap.add_argument("--all", action="store_true", help="every round-trip candidate of the planner, each also timed "
                    "whole and its host time measured")
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    if args.max_table:
        from convtune.fft import rowsource
        rowsource.MAX_TABLE = args.max_table
    torch, be, timer, bandwidth = setup(args.repeats)
    rows = []
    for name in args.layers.split(","):
        base = layer(name)
        x, w, dy = round_trip_operands(be, base, seed=1)
        refs = round_trip_references(be, base, x, w, dy)
        row = {"layer": name, "problem": base.key(), "candidates": {}}
        best = None
        configs = trip_candidates(base, be) if args.all else block_trip_configs(base, be)
        configs = [c for c in configs if not args.only or args.only in c.label()]
        compile_block_trips(base, configs, be)  # (on several threads, as the planner does)
        for config in configs:
            got = {}
            try:
                trip = RoundTrip(base, config, be)
                results = trip(x, w, dy)
                got["errors"] = [relative_error(be.xp, r, ref) for r, ref in zip(results, refs)]
                trip.release()
                if max(got["errors"]) <= base.tolerance:
                    got["ms"] = time_round_trip(timer, be, trip, x, w, dy).median_s * 1e3
                    if args.all:
                        got["whole_ms"] = timer(lambda: trip(x, w, dy), be).median_s * 1e3
                        got["host_us"] = host_us(trip, x, w, dy, be)
                    if best is None or got["ms"] < row["candidates"][best[0]]["ms"]:
                        best = (config.label(), trip)
            except Exception as exc:  # a failing candidate is a finding, not the end of the run
                got["failed"] = f"{type(exc).__name__}: {exc}"
            row["candidates"][config.label()] = got
            print(f"{name} {config.label()}: {json.dumps(got)}", flush=True)
        if best is not None:
            row["best"], row["ms"] = best[0], row["candidates"][best[0]]["ms"]
            row["kernels"] = kernel_times(torch, lambda: best[1](x, w, dy), be)
            # the same trip as one call after one L2 flush (the planner's figure: each pass after its own flush, the
            # passes' times summed, so host time between passes is not in it)
            row["whole_ms"] = timer(lambda: best[1](x, w, dy), be).median_s * 1e3
            if args.trace:
                trace(torch, lambda: best[1](x, w, dy), be, f"{args.trace}/{name}.json")
        if torchfft.unsupported_reason(base) is None:
            peer = torchfft.round_trip(torch, base, x, w, dy)
            row["torch_fft_ms"] = timer(peer, be).median_s * 1e3
            if best is not None and args.side_by_side:
                # each twice a turn: the peer's ratio to itself and ours to ours say how far apart two runs of one
                # call come in these turns (a trip slower beside the peer than alone shows in neither)
                trip = lambda: best[1](x, w, dy)  # noqa: E731
                theirs, ours, theirs2, ours2 = timer.interleaved([peer, trip, peer, trip], be,
                                                                 repeats=args.side_by_side)
                ratio = paired_ratio(theirs, ours)
                row["side_by_side"] = {"ms": ours.median_s * 1e3, "torch_fft_ms": theirs.median_s * 1e3,
                                       "ratio": ratio.median_s, "ratio_iqr": ratio.spread_s, "ratio_min": ratio.min_s,
                                       "peer_null": paired_ratio(theirs, theirs2).median_s,
                                       "ours_null": paired_ratio(ours, ours2).median_s, "repeats": args.side_by_side}
        row["floor_ms"] = torchfft.floor_ms(base, bandwidth, round_trip_=True)
        if "ms" in row and "torch_fft_ms" in row:
            row["vs_torch_fft"] = row["torch_fft_ms"] / row["ms"]
        rows.append(row)
        print(f"== {name}: best {row.get('best')} {row.get('ms')} ms (whole {row.get('whole_ms')}), torch-fft {row.get('torch_fft_ms')}, "
              f"vs torch-fft {row.get('vs_torch_fft')}, floor {row['floor_ms']}; kernels {row.get('kernels')}; "
              f"side by side {row.get('side_by_side')}",
              flush=True)
        x = w = dy = refs = best = None  # (their memory goes before the next layer's)
        be.xp.get_default_memory_pool().free_all_blocks()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"copy_bandwidth_GBps": bandwidth / 1e9, "layers": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
