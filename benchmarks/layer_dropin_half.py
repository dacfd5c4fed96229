"""One layer's training step through the drop-in, GPU: fbfft-L2 (128x64x64x64, 9x9 to 128 channels) in bfloat16
channels_last, patched (per-pass plans, and kept spectra) against PyTorch's own bfloat16 channels_last layer
(cudnn.benchmark on), in the same process. A step is the layer's forward and backward (both gradients), timed
with CUDA events, median of 30 after warm-up; PyTorch is timed before convtune tunes, and again at the end.

    python3 benchmarks/layer_dropin_half.py [--time-budget S] [--tf32]

Without ``--tf32`` cuDNN's TF32 is off (the drop-in keys the layer ``fp32``); with it on, as PyTorch's defaults have
it, the layer is keyed ``tf32`` (bfloat16's bound is the looser one either way).
"""
import argparse
import copy
import statistics

import torch
from torch import nn

import convtune
import convtune.torch as ct


def step_ms(layer, x, g, reps=30):
    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(g)
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, default=10.0)
    parser.add_argument("--tf32", action="store_true", help="cuDNN's TF32 on (PyTorch's default): tf32 plans")
    args = parser.parse_args()
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = args.tf32
    fmt, dtype = torch.channels_last, torch.bfloat16
    plain = nn.Conv2d(64, 128, 9, bias=False).cuda().to(dtype=dtype, memory_format=fmt)
    x = torch.randn(128, 64, 64, 64, device="cuda").to(dtype=dtype, memory_format=fmt).requires_grad_()
    g = torch.randn(128, 128, 56, 56, device="cuda").to(dtype=dtype, memory_format=fmt)
    t_torch = step_ms(plain, x, g)
    print(f"PyTorch bfloat16 channels_last step: {t_torch:.3f} ms", flush=True)
    rt = convtune.Runtime(planner_options={"time_budget_s": args.time_budget})
    for keep in (False, True):
        patched = copy.deepcopy(plain)
        ct.patch(patched, runtime=rt, keep_spectra=keep)
        ct.tune(patched, x, runtime=rt, progress=False)
        t = step_ms(patched, x, g)
        print(f"convtune (keep_spectra={keep}) step: {t:.3f} ms, {t_torch / t:.2f}x PyTorch", flush=True)
        for route in rt.layer_memo("torch").values():  # (the PyTorch layer's routes: its plans, its trip)
            trip = route.trips.get(keep)
            print("   plans:", route.labels(), "| trip:", trip.config.label() if trip is not None else None)
    # PyTorch again, after convtune's runs (its memory given back): how far the peer drifted over the process
    del patched
    torch.cuda.empty_cache()
    t_again = step_ms(plain, x, g)
    print(f"PyTorch bfloat16 channels_last step again: {t_again:.3f} ms", flush=True)


if __name__ == "__main__":
    main()
