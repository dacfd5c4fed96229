"""Host time per call: convtune's PyTorch layer against PyTorch's own convolution, on a model's layers.

For every distinct convolution of the model (at its training shapes), with the plans from the
cache (tuned first where missing):

* ``fwd-infer``: the module's forward under ``torch.no_grad()``;
* ``fwd-train``: the forward with gradients on (what training calls: PyTorch's autograd node, or
  convtune's autograd function, or the native route's PyTorch call);
* ``dgrad``/``wgrad``: one backward pass through the layer's route (convtune) against PyTorch's
  ``convolution_backward`` for that pass alone, with cuDNN's benchmark on.

Host time is the wall time to issue ``--calls`` calls without synchronising, divided by the count
(the GPU work of these layers is longer than their host work, so the launch queue absorbs them and
the clock sees the host side only); a synchronisation separates rounds. PyTorch's call and convtune's
run in turn, round by round (what drifts during a measurement weighs on both), and the added time of a
problem is the median over ``--rounds`` of its rounds' differences; each side's time is its median
round. Each pass's row is filed under the strategy that ran it (``torch``: PyTorch's own call, the plan or the
duel's verdict). Prints a table and writes JSON.

    python benchmarks/torch_overhead.py torchvision:resnet50 --batch 32 --db plans.db -o overhead.json

``--strategies cudnn`` (a comma-separated list) tunes with those strategies only: PyTorch's call is then no
candidate and no duel hands a layer back to it, so every pass the strategies support runs their plan, and the table
says what each strategy's launches cost the host.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

import convtune
import convtune.torch as ct
from convtune.cache import PlanCache
from convtune.strategies.pytorch import native_for
from convtune.torch import models


def host_us(theirs, ours, calls: int, rounds: int) -> tuple[float, float, float]:
    """``(PyTorch's µs, convtune's µs, added µs)`` per call: medians of alternating rounds, and the median of
    the rounds' differences."""
    for fn in (theirs, ours):
        for _ in range(3):
            fn()
    torch.cuda.synchronize()

    def one_round(fn):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        elapsed = (time.perf_counter() - t0) / calls
        torch.cuda.synchronize()
        return elapsed * 1e6
    pairs = [(one_round(theirs), one_round(ours)) for _ in range(rounds)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(b - a for a, b in pairs))


def _strategy(label: str) -> str:
    """The strategy of an executor's label: ``cudnn[eng0]`` -> ``cudnn``; PyTorch's call (a plan of its own, a
    duel's or a settling's verdict, a fallback) -> ``torch``."""
    name = label.split("[")[0].split(" ")[0]
    return "torch" if name in ("torch", "pytorch") else name


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--db", default=None)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--strategies", default=None, help="tune with these strategies only (comma-separated)")
    ap.add_argument("-o", "--output", default="torch-overhead.json")
    args = ap.parse_args(argv)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    options = {"strategies": args.strategies.split(",")} if args.strategies else {}
    runtime = convtune.Runtime(store=PlanCache(args.db), miss_policy="tune", planner_options=options)
    model = models.build_model(args.model, "cuda")
    shape = models.input_shape_for(args.model, model, args.batch, None)
    x = torch.randn(shape, device="cuda")
    found = ct.collect(model, x)
    modules = dict(model.named_modules())
    rows, seen = [], set()
    for item in found:
        key = item.problem.key()
        if key in seen:
            continue
        seen.add(key)
        plain = modules[item.name]
        ours = copy.deepcopy(plain)
        ct.patch(ours, runtime=runtime)
        p = item.problem
        inp = torch.randn(p.x_shape, device="cuda")
        if p.layout == "channels_last":  # (as the model hands it over: ConvNeXt's blocks permute their activations)
            inp = inp.contiguous(memory_format=torch.channels_last if inp.dim() == 4 else torch.channels_last_3d)
        inp_grad = inp.clone().requires_grad_("dgrad" in item.passes)
        report = ct.tune(ours, inp, runtime=runtime, progress=False)
        ours(inp_grad).sum().backward()  # resolves every route executor the layer needs
        route = next((r for r in runtime.layer_memo("torch").values() if r.problem == p), None)
        if route is None:  # (a call PyTorch runs without a route: a strategy set that cannot run it, say)
            print(f"{item.name:24s} no route: PyTorch runs it", flush=True)
            continue
        labels = route.labels()
        infer = route.fwd_infer or route.fwd_exec
        ran = {"fwd-infer": infer.label, "fwd-train": labels.get("fwd"), "dgrad": labels.get("dgrad"),
               "wgrad": labels.get("wgrad")}
        row = {"layer": item.name, "problem": key, "routes": labels, "tuned_now": report.tuned,
               "strategy": {kind: _strategy(label) for kind, label in ran.items() if label}}
        with torch.no_grad():
            row["fwd-infer"] = host_us(lambda: plain(inp), lambda: ours(inp), args.calls, args.rounds)
        row["fwd-train"] = host_us(lambda: plain(inp_grad), lambda: ours(inp_grad), args.calls, args.rounds)
        dy = torch.randn(p.y_shape, device="cuda")
        w = plain.weight.detach()
        for pass_, a, b in (("dgrad", dy, w), ("wgrad", inp, dy)):
            if pass_ not in item.passes:
                continue
            theirs = native_for(p.for_pass(pass_))  # PyTorch's own pass, with the process's flags
            row[pass_] = host_us(lambda: theirs(a, b), lambda: route.run(pass_, a, b), args.calls, args.rounds)
        rows.append(row)
        cells = "  ".join(f"{k} {row[k][0]:6.1f}/{row[k][1]:6.1f}/{row[k][2]:+6.1f}"
                          for k in ("fwd-infer", "fwd-train", "dgrad", "wgrad") if k in row)
        print(f"{item.name:24s} {cells}  {route.labels()}", flush=True)
    summary = {}
    for kind in ("fwd-infer", "fwd-train", "dgrad", "wgrad"):
        for strategy in sorted({row["strategy"].get(kind) for row in rows if kind in row} - {None}):
            pairs = [row[kind] for row in rows if kind in row and row["strategy"].get(kind) == strategy]
            summary[f"{kind} {strategy}"] = {
                "pytorch_us": statistics.median(a for a, _, _ in pairs),
                "convtune_us": statistics.median(b for _, b, _ in pairs),
                "added_us_median": statistics.median(d for _, _, d in pairs),
                "added_us_max": max(d for _, _, d in pairs), "problems": len(pairs)}
    doc = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": " ".join(sys.argv),
           "device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
           "batch": args.batch, "calls": args.calls, "rounds": args.rounds, "rows": rows, "summary": summary}
    with open(args.output, "w") as fh:
        json.dump(doc, fh, indent=1)
    print("host us per call, median over the model's problems, by the strategy that ran the pass "
          "(PyTorch / convtune / added):")
    for kind, s in summary.items():
        print(f"  {kind:24s} {s['pytorch_us']:7.1f} / {s['convtune_us']:7.1f} / {s['added_us_median']:+6.1f} "
              f"(max {s['added_us_max']:+.1f}, {s['problems']} problems)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
