"""Device check: a second process rebuilds the cached plans (cuDNN ones included) from the plan cache
without enumerating cuDNN engines, and its times match the tuning process's.

    python3 benchmarks/replay_check.py tune   --db DB -o first.json   # process 1: tune, store, time
    python3 benchmarks/replay_check.py replay --db DB -o second.json  # process 2: load, rebuild, time
    python3 benchmarks/replay_check.py compare first.json second.json

Both processes time each plan the same way (``convtune.conv`` and the backward functions through a
cache-backed runtime: CUDA events, L2 flushed, 25 repeats, median). ``replay`` counts the cuDNN
engine enumerations it performs (there must be none) and each plan's source (must be ``cache``).
"""

import argparse
import json
import sys

LAYERS = ("vgg16-conv1_2", "resnet50-res2-3x3", "resnet50-res2-1x1", "resnet50-res3-3x3s2", "resnet50-res5-3x3",
          "fbfft-L5", "convnext-t-dw7", "fbfft-L3")


def measure(mode, db, math_mode):
    from convtune import CudaEventTimer
    from convtune.backend import get_backend
    from convtune.bench.runner import _dispatch_fn
    from convtune.cache import PlanCache
    from convtune.network import load_network
    from convtune.planner import random_operands
    from convtune.runtime import Runtime
    from convtune.strategies import cudnn as cudnn_mod

    enumerations = []
    original = cudnn_mod._Graph.enumerate

    def counting(self, math):
        enumerations.append(math)
        return original(self, math)
    cudnn_mod._Graph.enumerate = counting

    be = get_backend("cupy")
    xp = be.xp
    timer = CudaEventTimer(repeats=25)
    runtime = Runtime(store=PlanCache(db), miss_policy="tune" if mode == "tune" else "error",
                      planner_options={"time_budget_s": 2.0})
    layers = {l.name: l for l in load_network(".carry/layers.yaml", math=math_mode)}
    rows = []
    for name in LAYERS:
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = layers[name].problem.for_pass(pass_)
            a, b = random_operands(be, p, 7)
            out = xp.empty(p.result_shape, dtype=xp.float32)
            call = _dispatch_fn(p, a, b, out, runtime)
            call()
            plan = runtime.plan_in_memo(p)
            ms = timer(call, be, name).median_s * 1e3
            rows.append({"layer": name, "pass": pass_, "plan": plan.label, "source": plan.source, "ms": ms})
            print(f"{mode:6s} {name:20s} {pass_:5s} {plan.label:60s} {plan.source:8s} {ms:8.3f} ms", flush=True)
            be.xp.get_default_memory_pool().free_all_blocks()
    return {"mode": mode, "math": math_mode, "cudnn_enumerations": len(enumerations), "rows": rows}


def compare(first, second):
    a, b = json.load(open(first)), json.load(open(second))
    print("| layer | pass | plan | tuning process ms | second process ms | ratio | source |")
    print("|---|---|---|---|---|---|---|")
    worst = 0.0
    for ra, rb in zip(a["rows"], b["rows"]):
        assert (ra["layer"], ra["pass"], ra["plan"]) == (rb["layer"], rb["pass"], rb["plan"]), (ra, rb)
        ratio = rb["ms"] / ra["ms"]
        worst = max(worst, abs(ratio - 1))
        print(f"| {ra['layer']} | {ra['pass']} | `{ra['plan']}` | {ra['ms']:.3f} | {rb['ms']:.3f} | {ratio:.3f} | "
              f"{rb['source']} |")
    print(f"\ncuDNN engine enumerations: tuning process {a['cudnn_enumerations']}, second process "
          f"{b['cudnn_enumerations']}; largest time difference {worst * 100:.1f}%")
    return 0 if b["cudnn_enumerations"] == 0 and all(r["source"] == "cache" for r in b["rows"]) else 1


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["tune", "replay", "compare"])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--db")
    parser.add_argument("--math", default="fp32")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    if args.mode == "compare":
        return compare(*args.files)
    result = measure(args.mode, args.db, args.math)
    json.dump(result, open(args.output, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
