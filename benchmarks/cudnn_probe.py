"""Device probe of the cuDNN strategy: plans per pass, their workspace, error and a quick time."""

import time

from convtune import ConvProblem, CudaEventTimer
from convtune.backend import get_backend
from convtune.planner import random_operands, relative_error
from convtune.strategies import get_strategy

be = get_backend("cupy")
xp = be.xp
cudnn = get_strategy("cudnn")
timer = CudaEventTimer(repeats=10)
for math in ("fp32", "tf32"):
    for pass_ in ("fwd", "dgrad", "wgrad"):
        p = ConvProblem.make(batch=64, in_channels=64, out_channels=64, input_size=(56, 56), kernel_size=3,
                             padding=1, pass_=pass_, math=math)
        t0 = time.perf_counter()
        configs = cudnn.candidates(p, be)
        t1 = time.perf_counter()
        a, b = random_operands(be, p, 1)
        ref = get_strategy("reference").build(p, None, be)(a.astype(xp.float64), b.astype(xp.float64))
        print(f"== {math} {pass_}: {len(configs)} plans, enumerated in {t1 - t0:.2f} s")
        for c in configs:
            try:
                run = cudnn.build(p, c, be)
                err = relative_error(xp, run(a, b), ref)
                ms = timer(lambda: run(a, b), be).median_s * 1e3
                print(f"   {c.label():50s} ws={cudnn.workspace_bytes(p, c) / 2**20:8.1f}MiB err={err:.1e} {ms:8.3f} ms")
            except Exception as exc:
                print(f"   {c.label():50s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
