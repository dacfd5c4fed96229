"""Warm dispatch overhead (see convtune/bench/dispatch.py).

Usage: python benchmarks/dispatch_overhead.py [numpy|cupy] [--calls N]
(`convtune bench` measures and records it too.)
"""

import argparse

from convtune.backend import get_backend
from convtune.bench.dispatch import measure_dispatch_overhead


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", nargs="?", default="numpy", choices=["numpy", "cupy"])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    r = measure_dispatch_overhead(get_backend(args.backend), args.calls)
    print(f"{r['backend']} on {r['device']}, plan {r['plan']}, {r['calls']} calls x {r['rounds']} rounds (median):")
    print(f"  plan called directly : {r['direct_us']:8.2f} us/call")
    print(f"  convtune.conv (hit)  : {r['dispatched_us']:8.2f} us/call")
    print(f"  dispatch overhead    : {r['overhead_us']:8.2f} us/call")


if __name__ == "__main__":
    main()
