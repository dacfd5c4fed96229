"""The planner's choices with a deterministic timer: what a change to the code does to them, without timing noise.

Every candidate is "timed" by a hash of its label (the same in every process and version), and no candidate is
skipped for a slow verification run (a rule on the wall clock), so two versions of convtune that enumerate, verify
and rank candidates alike produce the same dump: each problem's winner and every candidate's status.

    python benchmarks/planner_choices.py dump before.json [--networks public-suite,resnet18] [--backend numpy]
    (in another checkout)  python benchmarks/planner_choices.py dump after.json
    python benchmarks/planner_choices.py compare before.json after.json

The networks are tuned at batch 1, in float32 and in bfloat16 channels_last, every pass; problems over
``--max-gflop`` are left out (the NumPy backend runs every candidate once).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib

from convtune import Planner
from convtune import planner as planner_module
from convtune.network import load_network, unique_problems
from convtune.timing import TimingStats


class HashTimer:
    """Times a call by a hash of its label, after running it once."""

    def __call__(self, fn, backend=None, label="", stop_above=None):
        fn()
        t = 1e-3 * (1 + zlib.crc32(label.encode()) % 1000 / 100)
        return TimingStats(t, 0.0, t, 3)


def dump(path: str, networks: list[str], backend: str, max_gflop: float) -> None:
    planner_module.SLOW_FACTOR = float("inf")  # (a wall-clock rule: the only one that depends on the machine)
    out, start = {}, time.time()
    for net in networks:
        for dtype, layout in (("float32", "channels_first"), ("bfloat16", "channels_last")):
            planner = Planner(backend, HashTimer())
            for problem, _names in unique_problems(load_network(net, batch=1, dtype=dtype, layout=layout),
                                                   ("fwd", "dgrad", "wgrad")):
                if problem.flops() > max_gflop * 1e9:
                    continue
                d = planner.tune(problem)
                out[problem.key()] = {"winner": d.winner.label,
                                      "candidates": sorted([o.label, o.status] for o in d.outcomes)}
        print(f"{net}: {len(out)} problems so far, {time.time() - start:.0f} s", file=sys.stderr, flush=True)
    with open(path, "w") as fh:
        json.dump(out, fh, indent=0, sort_keys=True)


def compare(before: str, after: str) -> int:
    a, b = (json.load(open(p)) for p in (before, after))
    differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    print(f"{len(a)} and {len(b)} problems; {len(differ)} differ")
    for key in differ[:20]:
        print(f"  {key}: {(a.get(key) or {}).get('winner')} -> {(b.get(key) or {}).get('winner')}")
    return 1 if differ else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump")
    d.add_argument("output")
    d.add_argument("--networks", default="public-suite,starter,alexnet,resnet18,convnext-tiny")
    d.add_argument("--backend", default="numpy", choices=["numpy", "cupy"])
    d.add_argument("--max-gflop", type=float, default=2.0)
    c = sub.add_parser("compare")
    c.add_argument("before")
    c.add_argument("after")
    args = ap.parse_args(argv)
    if args.command == "dump":
        dump(args.output, args.networks.split(","), args.backend, args.max_gflop)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
