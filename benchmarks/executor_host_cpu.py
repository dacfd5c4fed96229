"""One executor call's wall time on the CPU, beside PyTorch's convolution on the same operands in the
same process: how much of a small layer's time is convtune's Python (host) work.

    python benchmarks/executor_host_cpu.py [--strategy im2col] [--kernels 3,7] [--calls 2000]

Prints, per kernel size (a 1x8x16x16 input, 8 output channels, same padding, forward pass), the best of
five rounds of ``--calls`` calls, in microseconds per call.
"""

from __future__ import annotations

import argparse
import timeit

import numpy as np

from convtune import ConvProblem
from convtune.backend import get_backend
from convtune.planner import random_operands
from convtune.strategies import get_strategy


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--strategy", default="im2col")
    ap.add_argument("--kernels", default="3,7")
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    backend = get_backend("numpy")
    strategy = get_strategy(args.strategy)
    print(f"| kernel | {args.strategy} executor µs | PyTorch conv2d µs |\n|---|---|---|")
    for k in (int(v) for v in args.kernels.split(",")):
        p = ConvProblem.make(batch=1, in_channels=8, out_channels=8, input_size=(16, 16), kernel_size=k, padding=k // 2)
        run = strategy.build(p, strategy.candidates(p, backend)[0], backend)
        a, b = random_operands(backend, p, 0)
        out = np.empty(p.result_shape, np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)

        def best(fn):
            fn()
            return min(timeit.repeat(fn, number=args.calls, repeat=5)) / args.calls * 1e6
        ours = best(lambda: run(a, b, out))
        theirs = best(lambda: torch.nn.functional.conv2d(ta, tb, padding=k // 2))
        print(f"| {k}x{k} | {ours:.1f} | {theirs:.1f} |")


if __name__ == "__main__":
    main()
