"""Host time of one block round trip's call (the trip's Python and launch work, the GPU not waited for), warm and
right after the torch-fft peer, and where it goes (cProfile of 200 warm calls): what ``paired_gap.py`` found exposed
when a trip is queued on an idle GPU after the peer.

    source scripts/gpu-env.sh; python3 benchmarks/trip_host_profile.py [--layers replknet-dw31,hyena-long-dw]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import time

from convtune.bench import torchfft
from convtune.roundtrip import RoundTrip, round_trip_operands

from block_fft import setup
from paired_gap import layer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="replknet-dw31,hyena-long-dw")
    args = ap.parse_args(argv)
    torch, be, timer, _ = setup(5)
    for name in args.layers.split(","):
        base, config = layer(name)
        x, w, dy = round_trip_operands(be, base, seed=1)
        trip = RoundTrip(base, config, be)
        peer = torchfft.round_trip(torch, base, x, w, dy)
        for _ in range(3):
            trip(x, w, dy)
            peer()
        be.synchronize()
        warm, cold = [], []
        for _ in range(30):
            t0 = time.perf_counter()
            trip(x, w, dy)
            warm.append(time.perf_counter() - t0)
            be.synchronize()
            peer()
            be.synchronize()
            t0 = time.perf_counter()
            trip(x, w, dy)
            cold.append(time.perf_counter() - t0)
            be.synchronize()
        print(f"== {name} {config.label()}: host us per call, warm {statistics.median(warm) * 1e6:.0f}, "
              f"after the peer {statistics.median(cold) * 1e6:.0f}", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(200):
            trip(x, w, dy)
            be.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
