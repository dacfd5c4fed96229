"""The PyTorch layer's host cost per call under autocast (AMP), on the CPU: a tiny 3x3 layer whose passes
are PyTorch's own convolution (the native route), patched against plain, with autocast off and on
(bfloat16), inference and training forward calls. Median over rounds of the added microseconds.

    python benchmarks/amp_host_cpu.py [--calls 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from torch import nn

import convtune
import convtune.torch as ct


def per_call(module, x, amp: bool, calls: int) -> float:
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        for _ in range(200):
            module(x)
        t0 = time.perf_counter()
        for _ in range(calls):
            module(x)
        return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    plain = nn.Conv2d(8, 8, 3, padding=1)
    patched = copy.deepcopy(plain)
    ct.patch(patched, runtime=convtune.Runtime(store=convtune.MemoryPlanStore(),
                                               planner_options={"strategies": ["torch"]}))
    print(f"PyTorch {torch.__version__}, convtune {convtune.__version__}; 1x8x8x8, 3x3; median of {args.rounds} "
          f"rounds of {args.calls} calls")
    for amp in (False, True):
        for train in (False, True):
            x = torch.randn(1, 8, 8, 8, requires_grad=train)
            rounds = sorted(((per_call(plain, x, amp, args.calls), per_call(patched, x, amp, args.calls))
                             for _ in range(args.rounds)), key=lambda r: r[1] - r[0])
            base, ours = rounds[len(rounds) // 2]
            print(f"autocast {'bf16' if amp else 'off '}  {'training ' if train else 'inference'}  "
                  f"plain {base:6.2f} us  patched {ours:6.2f} us  added {ours - base:+6.2f} us")


if __name__ == "__main__":
    main()
