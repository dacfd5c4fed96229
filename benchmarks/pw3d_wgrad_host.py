"""uxnet3d-encoder's 1x1x1 tf32 filter gradients (stage3.pw2, stage4.pw1): six forms of PyTorch's one call
(as bench's peer makes it, native_pass with and without cuDNN flags, through Route.run, with a real weight, with a
placeholder made once), their host time per call, then their GPU medians timed in turns (CudaEventTimer.interleaved)
and each one's ratio to the first. GPU only:
    source scripts/gpu-env.sh; python3 benchmarks/pw3d_wgrad_host.py
(18th session, at c03b7cf, when interleaved reversed the order every other repeat instead of rotating it: forms that
run the same code came out 0.95x and 1.00x of the first; BENCHMARKS.md's 3-D section.)"""
import time

import torch
from convtune.backend import get_backend
from convtune.timing import CudaEventTimer, paired_ratio
from convtune.strategies.pytorch import native_pass
from convtune.torch import _dispatch as D
be = get_backend("cupy")
timer = CudaEventTimer()
def host(fn, n=3000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n): fn()
        best.append((time.perf_counter() - t) / n * 1e6)
        torch.cuda.synchronize()
    return min(best)
for name, C, K, S in (("stage3.pw2", 768, 192, 12), ("stage4.pw1", 384, 1536, 6)):
    xs, ws = (2, C, S, S, S), (K, C, 1, 1, 1)
    x = torch.randn(xs, device="cuda"); dy = torch.randn((2, K, S, S, S), device="cuda")
    w = torch.randn(ws, device="cuda")
    comp = native_pass("wgrad", xs, ws, (1,)*3, (0,)*3, (1,)*3, 1)
    flagged = native_pass("wgrad", xs, ws, (1,)*3, (0,)*3, (1,)*3, 1, benchmark=True, tf32=True)
    r = D.Route.__new__(D.Route); r.wgrad_exec = D.Native(flagged, "torch")
    torch.backends.cudnn.benchmark = True; torch.backends.cudnn.allow_tf32 = True
    bw = torch.ops.aten.convolution_backward.default
    real = lambda: bw(dy, x, w, None, [1]*3, [0]*3, [1]*3, False, [0]*3, 1, [False, True, False])[1]
    ph = x.new_empty(()).expand(ws)
    cached = lambda: bw(dy, x, ph, None, [1]*3, [0]*3, [1]*3, False, [0]*3, 1, [False, True, False])[1]
    def peer_like():
        torch.backends.cudnn.benchmark = True; torch.backends.cudnn.allow_tf32 = True
        torch.backends.cuda.matmul.allow_tf32 = True
        return comp(x, dy)
    fns = {"peer-like": peer_like, "compute": lambda: comp(x, dy), "flagged": lambda: flagged(x, dy),
           "route.run": lambda: r.run("wgrad", x, dy), "real-w": real, "cached-ph": cached}
    for k, f in fns.items():
        print(f"{name} host {k:10s} {host(f):7.2f} us/call (no sync)")
    stats = timer.interleaved(list(fns.values()), be, name, repeats=200)
    base = stats[0]
    for k, s in zip(fns, stats):
        print(f"{name} gpu  {k:10s} median {s.median_s*1e6:7.2f} us  peer-like/it {paired_ratio(base, s).median_s:.3f}")
