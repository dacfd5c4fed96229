"""Device probe: what each cuDNN plan of a problem costs to build, and which ones the frontend says are
compiled at run time (behavior note RUNTIME_COMPILATION), as the cuDNN strategy enumerates them.

Why: under AMP, tuning ResNet-50 from a fresh cache took 123 s on the H100 (19th session), 164 s of it in
cuDNN candidates. Engines 69 and 77 alone cost 97 s there: 22 candidates each, and not one winner. Engines
19 and 78 cost another 20 s. Their builds took 0.2 to 2.7 s each, the cost of a runtime compilation, and the
same engines cost 74 s of RepLKNet's and 20 s of ConvNeXt-T's tuning, again without a winner. Whether those
are the runtime-compiled engines was not checked. This probe checks it before a pruning rule is written:
per plan, its engine and knobs, its notes, the time its build takes on the problem and on the same problem at
batch 2 (the planner's verification batch: a compiled kernel is per shape, so it is built twice).

    source scripts/gpu-env.sh; python3 benchmarks/cudnn_build_cost.py [--dtype bfloat16 --layout channels_last]

Prints one line per plan and per problem the totals by note; compare the engines with the winners of a plan
cache (``convtune explain``, or the ``measurements`` table).
"""

from __future__ import annotations

import argparse
import time

from convtune.backend import get_backend
from convtune.problem import ConvProblem
from convtune.strategies.cudnn import _CTX, _Graph, _load

#: ResNet-50's layers at batch 32 (the ones whose tuning the runtime-compiled engines dominated), one per kind.
PROBLEMS = [dict(in_channels=64, out_channels=64, input_size=(56, 56), kernel_size=3, padding=1),
            dict(in_channels=256, out_channels=64, input_size=(56, 56), kernel_size=1),
            dict(in_channels=512, out_channels=1024, input_size=(28, 28), kernel_size=1, stride=2),
            dict(in_channels=256, out_channels=256, input_size=(14, 14), kernel_size=3, padding=1)]


def notes_of(graph, index) -> list[str]:
    """The behavior notes of plan ``index`` (listed, maybe not built), by name."""
    try:
        return sorted(graph.behavior_notes(index))
    except Exception as exc:  # a frontend whose call takes another form: said, not guessed
        return [f"? ({type(exc).__name__}: {str(exc)[:80]})"]


def probe(p: ConvProblem, be, cudnn) -> None:
    handle = _CTX.handle(cudnn, be.xp)
    t0 = time.perf_counter()
    graph = _Graph(cudnn, handle, p)
    g = graph.list_plans(p.math, p.dtype)  # as the strategy lists them
    listed = time.perf_counter() - t0
    small = _Graph(cudnn, handle, p.replace(batch=2))
    print(f"== {p.describe()}: {g.get_execution_plan_count()} plans listed in {listed:.2f} s")
    totals: dict[str, list[float]] = {}
    for index in range(g.get_execution_plan_count()):
        try:
            engine, knobs = g.get_engine_and_knobs_at_index(index)
        except Exception as exc:
            print(f"   plan {index}: no engine ({exc})")
            continue
        named = tuple(sorted((getattr(k, "name", str(k)), int(v)) for k, v in knobs.items()))
        kind = ",".join(notes_of(graph, index)) or "-"
        t = time.perf_counter()
        try:
            g.build_plan_at_index(index)
            build = time.perf_counter() - t
        except Exception as exc:
            print(f"   eng{engine} {named}: not built ({type(exc).__name__})")
            continue
        t = time.perf_counter()
        try:  # the same engine and knobs at the verification batch: built again
            small.graph.create_execution_plan(int(engine), {getattr(cudnn.knob_type, k): v for k, v in named
                                                            if k != "NOT_SET"})
            small.graph.build_plan_at_index(small.graph.get_execution_plan_count() - 1)
            again = f"{time.perf_counter() - t:.3f}"
        except Exception as exc:
            again = f"failed ({type(exc).__name__})"
        print(f"   eng{int(engine):<3d} notes {kind:40s} build {build:.3f} s, at batch 2 {again} s  {named}")
        totals.setdefault(kind, []).append(build)
    for kind, builds in totals.items():
        print(f"   -- {kind}: {len(builds)} plans, {sum(builds):.2f} s to build, slowest {max(builds):.3f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--layout", default="channels_last")
    parser.add_argument("--batch", type=int, default=32)
    args = parser.parse_args()
    cudnn, reason = _load()
    if cudnn is None:
        raise SystemExit(reason)
    be = get_backend("cupy")
    for spec in PROBLEMS:
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = ConvProblem.make(batch=args.batch, pass_=pass_, dtype=args.dtype, layout=args.layout, **spec)
            probe(p, be, cudnn)


if __name__ == "__main__":
    main()
