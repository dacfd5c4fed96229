"""Channels-first depthwise layers in bfloat16, GPU: the channels-first depthwise kernels reading and writing
bfloat16 themselves against the same kernels' float32 executors between conversions (how such a problem ran before)
and PyTorch's bfloat16 pass (cudnn.benchmark on). Per pass, the best of the strategy's candidates of each kind,
timed as the planner times them (their ``timed`` form: 16-bit memory, as the PyTorch layer calls them), each run
after an L2 flush, median of 20.

    python3 benchmarks/depthwise_half_cf.py
"""
import statistics

import cupy
import torch

from convtune import precision
from convtune.backend import get_backend
from convtune.planner import random_operands
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy

LAYERS = {"convnext-t-dw7 (32x96x56x56, 7x7)": dict(batch=32, c=96, size=(56, 56), k=7),
          "replknet-dw27 (16x512x14x14, 27x27)": dict(batch=16, c=512, size=(14, 14), k=27),
          "replknet-dw31 (16x128x56x56, 31x31)": dict(batch=16, c=128, size=(56, 56), k=31)}
L2 = cupy.empty(64 << 20, dtype=cupy.uint8)


def median_ms(fn, reps=20):
    fn()
    cupy.cuda.Device().synchronize()
    times = []
    for _ in range(reps):
        L2.fill(1)
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


def main():
    be = get_backend("cupy")
    dw = get_strategy("depthwise")
    torch.backends.cudnn.benchmark = True
    print(f"{'layer':38s} {'pass':6s} {'native ms (plan)':48s} {'between conversions ms':24s} {'PyTorch bf16 ms':16s}")
    for name, spec in LAYERS.items():
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = ConvProblem.make(batch=spec["batch"], in_channels=spec["c"], out_channels=spec["c"],
                                 input_size=spec["size"], kernel_size=spec["k"], padding=spec["k"] // 2,
                                 groups=spec["c"], pass_=pass_, dtype="bfloat16")
            a, b = random_operands(be, p, 0)
            out = precision.empty_result(cupy, p)
            native, bounded = [], []
            for config in dw.candidates(p, be):
                run = dw.executor(p, config, be)  # reads bfloat16 itself
                native.append((median_ms(run.timed(a, b, out)), config.label()))
                old = precision.bounded(dw.build(p.in_float32(), config, be), p, cupy)
                bounded.append((median_ms(old.timed(a, b, out)), config.label()))
            # PyTorch's pass on bfloat16 tensors
            x = torch.randn(p.x_shape, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(p.w_shape, device="cuda", dtype=torch.bfloat16)
            g = torch.randn(p.y_shape, device="cuda", dtype=torch.bfloat16)
            pad, groups = p.padding, p.groups
            fn = {"fwd": lambda: torch.nn.functional.conv2d(x, w, padding=pad, groups=groups),
                  "dgrad": lambda: torch.nn.grad.conv2d_input(p.x_shape, w, g, padding=pad, groups=groups),
                  "wgrad": lambda: torch.nn.grad.conv2d_weight(x, p.w_shape, g, padding=pad, groups=groups)}[pass_]
            for _ in range(3):
                fn()
            t_torch = median_ms(fn)
            (tn, ln), (tb, lb) = min(native), min(bounded)
            print(f"{name:38s} {pass_:6s} {tn:8.3f} ({ln[:36]:36s}) {tb:8.3f} ({tb / tn:4.2f}x slower) "
                  f"{t_torch:8.3f} ({t_torch / tn:5.2f}x)", flush=True)
            cupy.get_default_memory_pool().free_all_blocks()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
