"""Tune a few full-size suite layers and print every candidate: how long tuning takes,
and what wins. Usage: python benchmarks/tune_probe.py [numpy|cupy]"""

import sys
import time

from convtune import ConvProblem, Planner

LAYERS = {
    "resnet50-res2-3x3@32": dict(batch=32, in_channels=64, out_channels=64, input_size=(56, 56), kernel_size=3,
                                 padding=1),
    "fbfft-L3": dict(batch=128, in_channels=128, out_channels=128, input_size=(32, 32), kernel_size=9),
    "hyena-long-dw": dict(batch=4, in_channels=768, out_channels=768, input_size=(4096,), kernel_size=4096,
                          padding=4095, groups=768),
}


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "cupy"
    planner = Planner(backend, time_budget_s=10.0)
    for name, kw in LAYERS.items():
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = ConvProblem.make(**kw, pass_=pass_)
            t0 = time.perf_counter()
            d = planner.tune(p)
            print(f"== {name} {pass_}: tuned in {time.perf_counter() - t0:.2f} s; winner {d.winner.label}")
            for o in d.outcomes:
                ms = f"{o.timing.median_s * 1e3:9.3f} ms" if o.timing else " " * 12
                err = f"{o.error:.1e}" if o.error is not None else "-"
                print(f"   {o.status:11s} {ms} err={err:8s} ws={o.workspace_bytes / 2**20:8.1f}MiB {o.label} {o.reason}")


if __name__ == "__main__":
    main()
