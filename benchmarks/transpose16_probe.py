"""fbfft-L2's four channels_last transposes in bfloat16 (x and dy in, y and dx out) through each 16-bit transposing
kernel of :mod:`convtune.fft.fft64`, against a plain device copy of the same bytes. Each kernel's result is checked
against CuPy's transpose before it is timed (convtune's CUDA-event timer: an L2 flush before each run, median of 50). GPU:

    source scripts/gpu-env.sh; python3 benchmarks/transpose16_probe.py
"""
import cupy
import numpy

from convtune.backend import get_backend
from convtune.fft import fft64
from convtune.timing import CudaEventTimer

SHAPES = {"x in": (128, 4096, 64), "dy in": (128, 3136, 128), "y out": (128, 128, 3136), "dx out": (128, 64, 4096)}
#: name -> (kernel, rows of R a block takes)
#: (the 28th session also timed the quads two tiles a block, slower: BENCHMARKS.md; not kept)
KERNELS = {"pairs": ("convtune_transpose16_pairs", 64), "quads": ("convtune_transpose16_quads", 64)}


def timed(fn, timer=CudaEventTimer(repeats=50, max_total_s=5.0), backend=get_backend("cupy")):
    return timer(fn, backend).median_s * 1e3


def main():
    totals = {name: 0.0 for name in (*KERNELS, "copy")}
    for label, (n, r, s) in SHAPES.items():
        src = cupy.random.default_rng(1).integers(0, 65535, size=(n, r, s), dtype=cupy.uint16)
        dst = cupy.empty((n, s, r), cupy.uint16)
        want = cupy.ascontiguousarray(src.transpose(0, 2, 1))
        row = [f"{label} {n}x{r}x{s}"]
        for name, (kernel, rows) in KERNELS.items():
            k = fft64._kernel(kernel)
            grid = ((s + 63) // 64, (r + rows - 1) // rows, n)

            def run():
                k(grid, (256,), (src, dst, numpy.int32(r), numpy.int32(s)))
            dst.fill(0)
            run()
            assert bool((dst == want).all()), (name, label)
            ms = timed(run)
            totals[name] += ms
            row.append(f"{name} {ms:.4f} ms ({2 * src.nbytes / ms / 1e6:.0f} GB/s)")
        copy = cupy.empty_like(src)
        ms = timed(lambda: cupy.copyto(copy, src))
        totals["copy"] += ms
        row.append(f"copy {ms:.4f} ms ({2 * src.nbytes / ms / 1e6:.0f} GB/s)")
        print(" | ".join(row), flush=True)
    print("== totals: " + ", ".join(f"{k} {v:.4f} ms" for k, v in totals.items()))


if __name__ == "__main__":
    main()
