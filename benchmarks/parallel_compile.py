"""Device probe: do NVRTC compiles of convtune's depthwise kernels run at once on threads (CuPy releasing the GIL)?

    source scripts/gpu-env.sh
    for m in "seq 1" "par 8"; do rm -rf /tmp/cc; CUPY_CACHE_DIR=/tmp/cc python3 benchmarks/parallel_compile.py $m; done

(each run with an empty CuPy kernel cache: a cached kernel is not compiled). Result on the H100 machine:
docs/device-logs/2026-11-24-s20-parallel-compile.txt.
"""
import sys, time
from concurrent.futures import ThreadPoolExecutor
import cupy as cp
from convtune.direct.depthwise import _kernel
mode, workers = sys.argv[1], int(sys.argv[2])
jobs = [("tiled-fwd", k, k, 1, 1, r, 4) for k in (3, 5, 7, 9, 11, 13, 15, 17) for r in (2, 4)]
cp.cuda.Device(0).use(); cp.zeros(1)
t = time.perf_counter()
if mode == "seq":
    for j in jobs:
        _kernel(cp, *j)
else:
    def one(j):
        cp.cuda.Device(0).use()
        return _kernel(cp, *j)
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(one, jobs))
print(f"{mode} x{workers}: {len(jobs)} kernels compiled in {time.perf_counter() - t:.2f} s")
