"""What PyTorch's algorithm search (``cudnn.benchmark``) buys over cuDNN's heuristic pick, and what it costs.

For every distinct convolution problem of a network (each pass, at its training shape), on CUDA tensors of the
network's dtype and layout:

* ``search s``: the wall time of the first call with ``cudnn.benchmark`` on (PyTorch's search: it times the
  engines cuDNN offers and keeps the fastest), then ``searched ms``: that pick's median;
* ``heuristic ms``: the median of the call with ``cudnn.benchmark`` off (cuDNN's heuristic pick), run on a thread
  of its own: PyTorch keeps the plan a shape first got in a cache per thread whatever the flag, so a pick made on
  the measuring thread would stand for the other;
* ``gain``: heuristic over searched. The planner's torch strategy skips the search where the heuristic pick is
  further from the best candidate than the largest gain seen here allows on its class of problems (``search_gain``
  in ``convtune/strategies/pytorch.py``: ``SEARCH_GAIN`` in general, ``LARGE_DEPTHWISE_HALF_GAIN`` on large
  depthwise kernels in half precision).

Medians of CUDA-event timings, each run after a write of 256 MiB (L2 flushed), on random operands. Prints a table
(largest gain first), then each bound of ``search_gain`` with the largest gain seen under it (a gain over its bound
is said: the bound needs refitting), and writes JSON.

    python benchmarks/torch_search.py convtune:slak-t --batch 16 --dtype bfloat16 --layout channels_last -o s.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from convtune.network import load_network, unique_problems
from convtune.strategies.pytorch import native_for, search_gain

FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def operand(shape, dtype, layout):
    t = torch.randn(shape, device="cuda", dtype=torch.float32).to(dtype)
    fmt = FORMATS.get(len(shape)) if layout == "channels_last" else None
    return t.contiguous(memory_format=fmt) if fmt is not None else t


def median_ms(fn, repeats: int, flush) -> float:
    times = []
    for _ in range(repeats):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def measure(problem, repeats: int, flush) -> dict:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[problem.dtype]
    a, b = (operand(s, dtype, problem.layout) for s in problem.operand_shapes)
    tf32 = problem.math == "tf32"
    searched = native_for(problem, benchmark=True, tf32=tf32)
    t0 = time.perf_counter()
    searched(a, b)
    torch.cuda.synchronize()
    search_s = time.perf_counter() - t0
    searched_ms = median_ms(lambda: searched(a, b), repeats, flush)
    heuristic = native_for(problem, benchmark=False, tf32=tf32)

    def pick():
        t0 = time.perf_counter()
        heuristic(a, b)
        torch.cuda.synchronize()
        first_s = time.perf_counter() - t0
        return first_s, median_ms(lambda: heuristic(a, b), repeats, flush)
    with ThreadPoolExecutor(1) as thread:  # (its own thread: its own plan cache)
        heuristic_first_s, heuristic_ms = thread.submit(pick).result()
    return {"problem": problem.key(), "describe": problem.describe(), "search_s": search_s,
            "searched_ms": searched_ms, "heuristic_ms": heuristic_ms, "heuristic_first_s": heuristic_first_s,
            "gain": heuristic_ms / searched_ms}


def bound_lines(rows) -> list[str]:
    """Each bound of ``search_gain`` among ``rows`` (each with its ``bound``, ``gain`` and ``describe``), with how many
    problems it holds for and the largest gain seen among them, said where that gain is over the bound."""
    lines = []
    for bound in sorted({r["bound"] for r in rows}):
        held = [r for r in rows if r["bound"] == bound]
        top = max(held, key=lambda r: r["gain"])
        plural = "s" if len(held) != 1 else ""
        lines.append(f"search_gain {bound:g}x: {len(held)} problem{plural}, the largest gain {top['gain']:.2f}x "
                     f"({top['describe']}){'; OVER THE BOUND' if top['gain'] > bound else ''}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("network", help="a network: a file, a built-in network, torchvision:NAME, timm:NAME, convtune:NAME")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--layout", choices=["channels_first", "channels_last"], default="channels_first")
    ap.add_argument("--math", choices=["fp32", "tf32"], default="fp32")
    ap.add_argument("--passes", default="fwd,dgrad,wgrad")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("-o", "--output", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("torch_search.py measures cuDNN: it needs a CUDA device", file=sys.stderr)
        return 2
    layers = load_network(args.network, batch=args.batch, math=args.math, dtype=args.dtype, layout=args.layout)
    problems = [p for p, _names in unique_problems(layers, args.passes.split(","))]
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    rows = []
    for i, problem in enumerate(problems, 1):
        try:
            rows.append(measure(problem, args.repeats, flush) | {"bound": search_gain(problem)})
        except Exception as exc:  # one problem PyTorch cannot run: said, and the others measured
            print(f"{problem.describe()}: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        print(f"[{i}/{len(problems)}] {rows[-1]['search_s']:.2f} s {problem.describe()}", file=sys.stderr)
    rows.sort(key=lambda r: -r["gain"])
    print(f"{args.network} batch {args.batch} {args.dtype} {args.layout} {args.math}: {len(rows)} problems, "
          f"PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    print(f"{'gain':>6} {'heuristic ms':>12} {'searched ms':>11} {'search s':>8}  problem")
    for r in rows:
        print(f"{r['gain']:6.2f} {r['heuristic_ms']:12.3f} {r['searched_ms']:11.3f} {r['search_s']:8.2f}  "
              f"{r['describe']}")
    print(f"search total {sum(r['search_s'] for r in rows):.1f} s; heuristic first calls total "
          f"{sum(r['heuristic_first_s'] for r in rows):.2f} s")
    for line in bound_lines(rows):
        print(line)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"network": args.network, "batch": args.batch, "dtype": args.dtype, "layout": args.layout,
                       "math": args.math, "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
                       "device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
