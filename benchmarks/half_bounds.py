"""What relative error PyTorch's own half-precision convolutions (cuDNN's engines, fp32 accumulation)
reach against float64, per pass, dtype and layout, on a network's layers: the evidence for convtune's
half-precision bounds (``convtune.precision``: 4u, bfloat16 1.6e-2, float16 2.0e-3).

The error is convtune's definition (``convtune.planner.relative_error``): ``||out - ref|| / ||ref||``,
where ``ref`` is the float64 result of the same half-rounded operands (standard normal, rounded to the
dtype). PyTorch runs with ``cudnn.benchmark = True`` and TF32 off, as a tuned PyTorch user has it.

    python3 benchmarks/half_bounds.py ../shared/bench/layers.yaml [--layers a,b] [-o out.json]

(on the CPU it runs oneDNN's kernels instead).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

from convtune.network import load_network
from convtune.strategies.pytorch import native_pass

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def relative_error(out, ref) -> float:
    err = float((out.double() - ref).norm())
    norm = float(ref.norm())
    return math.inf if not math.isfinite(err) else (err / norm if norm > 0 else err)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("network")
    ap.add_argument("--layers", default=None, help="comma-separated layer names (default: all)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("-o", "--output", default=None)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    layers = load_network(args.network)
    if args.layers:
        wanted = set(args.layers.split(","))
        layers = [layer for layer in layers if layer.name in wanted]
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(0)
    for layer in layers:
        p = layer.problem
        for pass_ in ("fwd", "dgrad", "wgrad"):
            q = p.for_pass(pass_)
            t0 = time.perf_counter()
            run = native_pass(pass_, p.x_shape, p.w_shape, p.stride, p.padding, p.dilation, p.groups)
            base = [torch.randn(shape, generator=gen) for shape in q.operand_shapes]
            for dtype_name, dtype in DTYPES.items():
                rounded = [t.to(dtype) for t in base]
                ref = run(*[t.to(device=device, dtype=torch.float64) for t in rounded])
                for layout in ("channels_first", "channels_last"):
                    fmt = torch.channels_last if layout == "channels_last" and len(q.operand_shapes[0]) == 4 else None
                    if layout == "channels_last" and fmt is None:
                        continue  # (1-D: PyTorch has no channels_last memory format)
                    ops = [t.to(device) for t in rounded]
                    if fmt is not None:
                        ops = [t.contiguous(memory_format=fmt) for t in ops]
                    out = run(*ops)
                    error = relative_error(out, ref)
                    bound = q.replace(dtype=dtype_name, layout=layout).tolerance
                    rows.append({"layer": layer.name, "pass": pass_, "dtype": dtype_name, "layout": layout,
                                 "error": error, "bound": bound, "within": error <= bound})
                    print(f"{layer.name:24s} {pass_:6s} {dtype_name:9s} {layout:15s} {error:.3e}"
                          f"{'' if error <= bound else '  ABOVE ' + format(bound, '.1e')}", flush=True)
                del ref
            if device.type == "cuda":
                torch.cuda.empty_cache()
            print(f"  ({layer.name} {pass_}: {time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    summary = {}
    for dtype_name in DTYPES:
        errors = sorted(r["error"] for r in rows if r["dtype"] == dtype_name)
        if not errors:
            continue
        above = [r for r in rows if r["dtype"] == dtype_name and not r["within"]]
        summary[dtype_name] = {"cases": len(errors), "median": statistics.median(errors), "max": errors[-1],
                               "p90": errors[int(0.9 * (len(errors) - 1))], "above_bound": len(above)}
        print(f"{dtype_name}: {len(errors)} cases, median {summary[dtype_name]['median']:.2e}, "
              f"90th percentile {summary[dtype_name]['p90']:.2e}, max {errors[-1]:.2e}, "
              f"{len(above)} above the bound")
    if args.output:
        with open(args.output, "w") as fh:
            json.dump({"network": args.network, "device": torch.cuda.get_device_name(device)
                       if device.type == "cuda" else "cpu", "torch": torch.__version__,
                       "cudnn": torch.backends.cudnn.version(), "rows": rows, "summary": summary}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
