"""Why a round trip timed whole beside the torch-fft peer comes out slower than timed alone (issue 22's "paired"
figures, 5 to 30% on the H100 in the 25th and 26th sessions): one trip timed after four kinds of preceding work, in
turns (the order rotated every round), each run after an L2 flush and between its own CUDA events, as
``CudaEventTimer.interleaved`` times it:

* ``alone``: after its own previous run (what ``time_round_trip`` and ``timer(trip)`` see);
* ``after-peer``: after the torch-fft peer's round trip (what the paired figure sees);
* ``after-sparse``: after one 4-byte write every 64 KiB of a buffer as large as the peer's peak memory (almost no
  traffic, every page touched: the GPU's TLB refilled with other pages);
* ``after-dense``: after a write of all of that buffer (the same pages, and all that traffic);
* ``after-peer-synced``: after the peer's trip and a synchronize, so the GPU is idle when the trip is queued, as in
  ``CudaEventTimer.interleaved``, where the peer is timed too;
* ``after-peer-synced-nogc``: the same with Python's garbage collector off while the trip is queued.

If ``after-sparse`` is as slow as ``after-peer``, the trip pays for its pages' translations after other work; if
only ``after-dense`` is, for something the traffic leaves behind; if neither, the cause is the peer itself.

    source scripts/gpu-env.sh; python3 benchmarks/paired_gap.py [--layers replknet-dw31,hyena-long-dw,dense-k31] [-o gap.json]
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics

from convtune.bench import torchfft
from convtune.problem import ConvProblem
from convtune.roundtrip import RoundTrip, TripConfig, round_trip_operands
from convtune.timing import _interleave

from block_fft import LAYERS, problem, setup

#: The trips timed: the planners' winners of the 26th session.
TRIPS = {"replknet-dw31": TripConfig(sizes=(72, 72), product="block", radices="16x9"),
         "hyena-long-dw": TripConfig(sizes=(8192,), product="block", radices="16", fused=True),
         "slak-dw51": TripConfig(sizes=(81, 96), product="block", radices="16x9", threads=512, fused=True),
         "long-16k-dw": TripConfig(sizes=(32768,), product="block", threads=1024)}
#: Dense layers of the public suite and the trips their planners chose in the 26th session (cuFFT, fused callbacks).
DENSE = {"dense-k31": (dict(batch=8, in_channels=64, out_channels=64, input_size=(64, 64), kernel_size=31,
                            padding=15), TripConfig(sizes=(80, 80), fused=True))}


def layer(name):
    """The forward problem of ``name`` and the trip timed for it (``None``: a layer of ``LAYERS`` without one)."""
    if name in DENSE:
        spec, config = DENSE[name]
        return ConvProblem.make(**spec), config
    return problem(LAYERS[name][0], "float32", "channels_first"), TRIPS.get(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="replknet-dw31,hyena-long-dw")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    torch, be, timer, _ = setup(5)
    cp = be.xp
    rows = []
    for name in args.layers.split(","):
        base, config = layer(name)
        x, w, dy = round_trip_operands(be, base, seed=1)
        trip = RoundTrip(base, config, be)
        peer = torchfft.round_trip(torch, base, x, w, dy)
        torch.cuda.reset_peak_memory_stats()
        peer()
        torch.cuda.synchronize()
        peak = max(torch.cuda.max_memory_allocated(), 1 << 30)
        big = cp.empty(peak // 4, dtype=cp.float32)
        sparse = big[::16384]  # (one float every 64 KiB)
        def peer_synced():
            peer()
            be.synchronize()
        before = {"alone": lambda: None, "after-peer": peer, "after-sparse": lambda: sparse.fill(1.0),
                  "after-dense": lambda: big.fill(1.0), "after-peer-synced": peer_synced,
                  "after-peer-synced-nogc": peer_synced}
        for _ in range(3):
            for fn in before.values():
                fn()
            trip(x, w, dy)
        be.synchronize()
        stream = cp.cuda.get_current_stream()
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def once(i, kind):
            before[kind]()
            nogc = kind.endswith("nogc")
            if nogc:
                gc.disable()
            timer._flush(cp)
            start.record(stream)
            trip(x, w, dy)
            end.record(stream)
            if nogc:
                gc.enable()
            end.synchronize()
            return cp.cuda.get_elapsed_time(start, end)
        kinds = list(before)
        stats = _interleave(kinds, args.rounds, once)
        row = {"layer": name, "trip": config.label(), "peer_peak_bytes": peak,
               "ms": {k: statistics.median(s.samples) for k, s in zip(kinds, stats)},
               "iqr_ms": {k: s.spread_s for k, s in zip(kinds, stats)}}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del big, sparse, x, w, dy, trip, peer
        cp.get_default_memory_pool().free_all_blocks()
        torch.cuda.empty_cache()
    if args.output:
        with open(args.output, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
