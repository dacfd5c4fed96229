"""The PyTorch layer's own host cost per call, on the CPU: a tiny layer whose convolution takes a few
microseconds, so what convtune adds in Python shows (the GPU figures come from torch_overhead.py).

For each route kind, a patched ``nn.Conv2d`` against the plain one, inference (``no_grad``) and a
training forward (gradients on): ``torch`` plans (the native route: PyTorch's own call after one
lookup), and ``im2col`` plans through convtune's autograd function and executor, against calling
that plan directly on NumPy views (what the executor itself costs). Median of rounds of many calls.

    python benchmarks/torch_host_cpu.py
"""

from __future__ import annotations

import copy
import platform
import statistics
import sys
import time

import torch

import convtune
import convtune.torch as ct
from convtune import MemoryPlanStore, Runtime
from convtune.timing import TimingStats


class _OneRun:
    """A planner timer that times nothing: the plans' choice is fixed by the strategy list."""

    def __call__(self, fn, backend=None, label=""):
        fn()
        return TimingStats(1.0, 0.0, 1.0, 1)


def host_us(fn, calls=3000, rounds=7, sync=None) -> float:
    """Host µs per call of ``fn``, the median of ``rounds`` rounds of ``calls`` calls (``sync()`` after the
    warm-up and after each round: a GPU's queue drained between rounds)."""
    sync = sync or (lambda: None)
    for _ in range(200):
        fn()
    sync()
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return statistics.median(samples)


def main() -> int:
    torch.set_num_threads(1)
    x = torch.randn(1, 8, 8, 8)
    xg = x.clone().requires_grad_()
    plain = torch.nn.Conv2d(8, 8, 3, padding=1)
    print(f"{platform.machine()} {platform.processor() or ''}, torch {torch.__version__}, convtune "
          f"{convtune.__version__}, Python {platform.python_version()}; layer 1x8x8x8, 3x3, padding 1")
    print("| plans | call | PyTorch µs | convtune µs | added µs |")
    print("|---|---|---|---|---|")
    for strategy in ("torch", "im2col"):
        rt = Runtime(store=MemoryPlanStore(), planner_options={"timer": _OneRun(), "strategies": [strategy]})
        ours = copy.deepcopy(plain)
        ct.patch(ours, runtime=rt)
        ours(xg).sum().backward()
        with torch.no_grad():
            rows = [("inference", host_us(lambda: plain(x)), host_us(lambda: ours(x)))]
        rows.append(("training forward", host_us(lambda: plain(xg)), host_us(lambda: ours(xg))))
        if strategy != "torch":
            (route,) = rt.layer_memo("torch").values()
            plan = route.fwd_exec.plan
            a, b = x.numpy(), plain.weight.detach().numpy()
            out = torch.empty(1, 8, 8, 8).numpy()
            rows.append(("the plan alone, on arrays", host_us(lambda: plan(a, b, out)), host_us(lambda: ours(x))))
        for name, theirs, mine in rows:
            print(f"| {strategy} | {name} | {theirs:.2f} | {mine:.2f} | {mine - theirs:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
