"""Why a plan's time in ``convtune bench`` differs from the median the planner stored for it.

For each problem (a layer of a network, its passes), after tuning on a fresh cache: the stored
median; the plan timed with the bench's timer (L2 flush before each run) into a result array made
once, as the planner times it; the same without ``out`` (the plan makes its result); through the
array API's dispatch (what ``convtune bench`` times); and the host's time per call (synchronised before
each call) and per call of a loop of calls issued back to back; then, where PyTorch is installed, the pass
as a patched PyTorch layer runs it on tensors (its route: ``bench``'s drop-in column), timed and its
host time per call.

    python benchmarks/bench_gap.py uxnet3d-encoder --layers stage2.dw,stage4.dw,stage4.pw1

(on the device machine after `source scripts/gpu-env.sh`, which puts the cuDNN frontend on the path)
"""

from __future__ import annotations

import argparse
import time

from convtune import precision
from convtune.backend import get_backend
from convtune.bench.runner import _dispatch_fn, _drop_in_call
from convtune.network import load_network
from convtune.planner import random_operands
from convtune.runtime import Runtime
from convtune.timing import CpuTimer, CudaEventTimer


def host_us(fn, backend, calls=50):
    """The host's time to issue one call with the device idle (synchronised before each: no launch
    queue to wait on), median of ``calls``, and the loop time per call of ``calls`` calls issued back
    to back (the larger of host and device time per call, once the launch queue fills)."""
    issue = []
    for _ in range(calls):
        backend.synchronize()
        t0 = time.perf_counter()
        fn()
        issue.append(time.perf_counter() - t0)
    backend.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    backend.synchronize()
    loop = (time.perf_counter() - t0) / calls
    return sorted(issue)[len(issue) // 2] * 1e6, loop * 1e6


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("network")
    ap.add_argument("--layers", default="")
    ap.add_argument("--passes", default="fwd,dgrad,wgrad")
    ap.add_argument("--backend", default="cupy")
    ap.add_argument("--strategies", default="", help="the planner's strategies (default: all)")
    args = ap.parse_args(argv)
    backend = get_backend(args.backend)
    wanted = set(filter(None, args.layers.split(",")))
    layers = [layer for layer in load_network(args.network) if not wanted or layer.name in wanted]
    options = {"strategies": args.strategies.split(",")} if args.strategies else None
    runtime = Runtime(miss_policy="tune", planner_options=options)  # a fresh cache in memory
    timer = CudaEventTimer(repeats=25) if backend.name == "cupy" else CpuTimer(repeats=7)
    print(f"{'layer':12s} {'pass':6s} {'plan':48s} {'stored':>8s} {'out=':>8s} {'no out':>8s} {'dispatch':>8s} "
          f"{'host us':>8s} {'loop us':>8s} {'drop-in':>8s} {'its host':>8s}  (ms unless said)")
    for layer in layers:
        for pass_ in args.passes.split(","):
            problem = layer.problem.for_pass(pass_)
            a, b = random_operands(backend, problem, 0)
            dispatch = _dispatch_fn(problem, a, b, None, runtime)
            dispatch()  # tunes on the miss
            plan = runtime.plan_in_memo(problem)
            out = precision.empty_result(backend.xp, problem)
            stored = runtime.store.get(problem, backend.device_info().key()).winner.median_s
            t_out = timer(lambda: plan(a, b, out), backend, "out").median_s
            t_new = timer(lambda: plan(a, b), backend, "no out").median_s
            t_dispatch = timer(dispatch, backend, "dispatch").median_s
            host, loop = host_us(dispatch, backend)
            drop_in = _drop_in_call(problem, a, b, runtime)
            if drop_in is not None:
                call, route = drop_in
                call()  # resolves the route (its duel, where it has one)
                t_drop, (host_drop, _) = timer(call, backend, "drop-in").median_s * 1e3, host_us(call, backend)
                drop = f"{t_drop:8.3f} {host_drop:8.1f}  {route.labels()[pass_][:40]}"
            else:
                drop = f"{'-':>8s} {'-':>8s}"
            print(f"{layer.name:12s} {pass_:6s} {plan.label[:48]:48s} {(stored or 0) * 1e3:8.3f} {t_out * 1e3:8.3f} "
                  f"{t_new * 1e3:8.3f} {t_dispatch * 1e3:8.3f} {host:8.1f} {loop:8.1f} {drop}")


if __name__ == "__main__":
    main()
