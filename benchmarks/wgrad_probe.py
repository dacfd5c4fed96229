"""Device probe: why PyTorch's backward-filter beats every cuDNN plan convtune builds on a layer.

Times every cuDNN candidate of the layer's wgrad (bench timer), lists the knobs the best engines
accept, and names the GPU kernels PyTorch and convtune's best plan
launch (torch.profiler). Usage: python3 benchmarks/wgrad_probe.py [LAYER] (default vgg16-conv1_2).
"""

import sys

import torch

from convtune import CudaEventTimer
from convtune.backend import get_backend
from convtune.network import load_network
from convtune.planner import random_operands, relative_error
from convtune.strategies import get_strategy
from convtune.strategies import cudnn as cmod

name = sys.argv[1] if len(sys.argv) > 1 else "vgg16-conv1_2"
layer = {l.name: l for l in load_network(".carry/layers.yaml")}[name]
p = layer.problem.for_pass("wgrad")
be = get_backend("cupy")
xp = be.xp
timer = CudaEventTimer(repeats=15)
strategy = get_strategy("cudnn")
a, b = random_operands(be, p, 1)
ref = get_strategy("reference").build(p, None, be)(a.astype(xp.float64), b.astype(xp.float64))


def measure(config):
    run = strategy.build(p, config, be)
    err = relative_error(xp, run(a, b), ref)
    return timer(lambda: run(a, b), be).median_s * 1e3, err


rows = []
for c in strategy.candidates(p, be):
    try:
        ms, err = measure(c)
        rows.append((ms, err, c))
    except Exception as exc:
        print(f"  {c.label():40s} FAILED {str(exc)[:120]}")
rows.sort(key=lambda r: r[0])
print(f"== {name} wgrad: {len(rows)} cuDNN candidates; fastest 8:")
for ms, err, c in rows[:8]:
    print(f"  {c.label():40s} {ms:8.3f} ms err={err:.1e} ws={strategy.workspace_bytes(p, c) / 2**20:.1f} MiB")

graph = cmod._CTX.enumerated[p.key()]
g = graph.graph
for _ms, _err, c in rows[:3]:
    try:
        knobs = g.get_knobs_for_engine(c.engine)
    except Exception as exc:
        print(f"  knobs of eng{c.engine}: {exc}")
        continue
    print(f"== eng{c.engine} knobs: {knobs!r}"[:1500])

ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
kw = dict(stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.groups)
fn = lambda: torch.nn.grad.conv2d_weight(ta, p.w_shape, tb, **kw)
fn()
print(f"== torch-fp32 {timer(fn, be).median_s * 1e3:.3f} ms")
best = strategy.build(p, rows[0][2], be)
for label, f in (("torch", fn), ("convtune-best-cudnn", lambda: best(a, b))):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            f()
        torch.cuda.synchronize()
    print(f"== kernels of {label}:")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=6, max_name_column_width=110))

from convtune.planner import Planner  # noqa: E402

decision = Planner(be, time_budget_s=2.0).tune(p)
print(f"== planner (time budget 2 s): winner {decision.winner.label}")
for o in sorted(decision.outcomes, key=lambda o: (o.timing.median_s if o.timing else 1e9)):
    t = f"{o.timing.median_s * 1e3:8.3f} ms" if o.timing else " " * 11
    print(f"   {o.status:9s} {o.label:55s} {t} {o.reason or ''}"[:200])
