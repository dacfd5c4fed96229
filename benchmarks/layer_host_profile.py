"""One training step (forward and both gradients) of a patched depthwise layer against PyTorch's: the
host's time to issue it and its wall time (median of 30 steps, synchronised before each), then 20
steps under cProfile (``$OUT/<layer>.prof.txt`` and ``.pstats``); JSON in ``$OUT/host_profile.json``.

    LAYERS=C:H:K:N,... [CL=1 (channels_last)] [DB=plans.db] python3 benchmarks/layer_host_profile.py

(on the device machine after ``source scripts/gpu-env.sh``; ``DEV=cpu`` runs it on CPU tensors).
Defaults: RepLKNet-31B's and SLaK-T's large depthwise layers at batch 16.
"""
import cProfile
import io
import json
import os
import pstats
import statistics
import time

import torch
import convtune, convtune.torch as ct
DEV = os.environ.get("DEV", "cuda")
sync = torch.cuda.synchronize if DEV == "cuda" else (lambda: None)

out = os.environ.get("OUT", "/tmp")
rt = convtune.use_cache(os.environ.get("DB", "/tmp/hp.db"))
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
LAYERS = [l.split(":") for l in os.environ.get("LAYERS", "128:56:31:16,256:28:29:16,512:14:27:16,1024:7:13:16,96:56:51:16,192:28:49:16,384:14:47:16").split(",")]
res = {}
for C, H, K, N in [[int(v) for v in l] for l in LAYERS]:
    name = f"dw{K}-c{C}-{H}x{H}-n{N}"
    m = torch.nn.Sequential(torch.nn.Conv2d(C, C, K, padding=K // 2, groups=C, bias=False)).to(DEV)
    ref = torch.nn.Sequential(torch.nn.Conv2d(C, C, K, padding=K // 2, groups=C, bias=False)).to(DEV)
    ref.load_state_dict(m.state_dict())
    ct.patch(m)
    x = torch.randn(N, C, H, H, device=DEV, requires_grad=True)
    gy = torch.randn(N, C, H, H, device=DEV)
    if os.environ.get("CL"):
        name += "-cl"
        m = m.to(memory_format=torch.channels_last); ref = ref.to(memory_format=torch.channels_last)
        x = x.detach().contiguous(memory_format=torch.channels_last).requires_grad_()
        gy = gy.contiguous(memory_format=torch.channels_last)
    t0 = time.perf_counter(); ct.tune(m, x, progress=False); tune_s = time.perf_counter() - t0
    def step(mod=m, x=x, gy=gy):
        y = mod(x)
        y.backward(gy)
    for _ in range(5):
        step(); step(ref)
    sync()
    routes = [(r.problem.layout, r.labels()) for k, r in rt.layer_memo("torch").items() if r.problem.x_shape == (N, C, H, H)]
    rec = {"tune_s": tune_s, "routes": routes}
    for label, mod in (("convtune", m), ("torch", ref)):
        host, dev = [], []
        for _ in range(30):
            sync()
            t0 = time.perf_counter(); step(mod); t1 = time.perf_counter()
            sync(); t2 = time.perf_counter()
            host.append((t1 - t0) * 1e6); dev.append((t2 - t0) * 1e6)
        rec[label] = {"host_us": statistics.median(host), "wall_us": statistics.median(dev)}
    pr = cProfile.Profile()
    sync()
    pr.enable()
    for _ in range(20):
        step()
        sync()
    pr.disable()
    s = io.StringIO()
    st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(40)
    st.sort_stats("cumulative").print_stats(60)
    st.dump_stats(f"{out}/{name}.pstats")
    with open(f"{out}/{name}.prof.txt", "w") as f:
        f.write(s.getvalue())
    res[name] = rec
    print(name, json.dumps(rec), flush=True)
    del m, ref, x, gy
with open(f"{out}/host_profile{os.environ.get('CL', '')}.json", "w") as f:
    json.dump(res, f, indent=1)
