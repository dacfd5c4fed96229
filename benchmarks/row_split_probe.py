"""Would a 32768-sample row split over two blocks (a thread-block cluster, half the row's points each) run faster than
one block holding it all? The same work as long-16k-dw's round trip (2 x 256 rows of 16384 samples, full
convolution: 32768-sample transforms, one block an SM at 144 KiB) against rows of half the transform length twice as
many (4 x 256 rows of 8192 samples: 16384-sample transforms, 72 KiB, two blocks an SM), each block trip's candidates
timed as the planner times them (each pass after its own L2 flush, summed) with their kernels' device times. If the
half-length rows take well under the long rows' time, a cluster split is worth building; if not, it is not.

    source scripts/gpu-env.sh; python3 benchmarks/row_split_probe.py
"""

from __future__ import annotations

from convtune.planner import relative_error
from convtune.problem import ConvProblem
from convtune.roundtrip import (RoundTrip, block_trip_configs, round_trip_operands, round_trip_references,
                                time_round_trip)

from block_fft import kernel_times, setup

SHAPES = {"rows-16k (long-16k-dw)": dict(batch=2, n=16384), "rows-8k x2": dict(batch=4, n=8192)}


def main() -> int:
    torch, be, timer, _ = setup(25)
    for name, s in SHAPES.items():
        p = ConvProblem.make(batch=s["batch"], in_channels=256, out_channels=256, groups=256, input_size=(s["n"],),
                             kernel_size=s["n"], padding=s["n"] - 1)
        x, w, dy = round_trip_operands(be, p, seed=1)
        refs = round_trip_references(be, p, x, w, dy)
        for config in block_trip_configs(p, be):
            if config.fused:
                continue
            trip = RoundTrip(p, config, be)
            err = max(relative_error(be.xp, r, ref) for r, ref in zip(trip(x, w, dy), refs))
            trip.release()
            ms = time_round_trip(timer, be, trip, x, w, dy).median_s * 1e3
            print(f"== {name} {config.label()}: {ms:.4f} ms, error {err:.2g}, kernels "
                  f"{kernel_times(torch, lambda: trip(x, w, dy), be)}", flush=True)
        del x, w, dy, refs
        be.xp.get_default_memory_pool().free_all_blocks()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
