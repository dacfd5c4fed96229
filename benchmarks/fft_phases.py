"""Device probe: where the time of an FFT plan goes, step by step, against the bytes each step moves.

For each layer and pass it times, with the bench timer, the frequency-major path's steps
(zero-extend + R2C of each operand, the strided-batched CGEMM, C2R) and the whole ``fgemm``
(with both ways to reach its layout) and ``gemm`` executors at the cheapest transform size, and prints achieved GB/s per step
(bytes counted from the shapes: what each step must read and write at least).

Usage: python3 benchmarks/fft_phases.py LAYER[,LAYER...] [--sizes 64x64]
"""

import math
import sys

from convtune import CudaEventTimer
from convtune.backend import get_backend
from convtune.fft import arrayops, callbacks, freqmajor
from convtune.fft.cost import spectrum_elems
from convtune.fft.sizes import minimal_sizes, size_candidates
from convtune.fft import cost
from convtune.network import load_network
from convtune.planner import random_operands, relative_error
from convtune.strategies import get_strategy
from convtune.strategies.fft import FftConfig

be = get_backend("cupy")
xp = be.xp
timer = CudaEventTimer(repeats=15)
layers = {l.name: l for l in load_network("public-suite")}  # the public layer suite, built in
names = sys.argv[1].split(",")
forced = None
if "--sizes" in sys.argv:
    forced = tuple(int(v) for v in sys.argv[sys.argv.index("--sizes") + 1].split("x"))


def ms(fn):
    return timer(fn, be).median_s * 1e3


def host_ms(fn, calls=50):
    """Host time per call to enqueue ``fn`` (no synchronisation inside the loop): when it is near
    the GPU time, the plan is launch-bound and its event timings wander."""
    import time
    fn()
    be.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    t1 = time.perf_counter()
    be.synchronize()
    return (t1 - t0) / calls * 1e3


def row(label, t_ms, nbytes):
    gbs = nbytes / (t_ms * 1e-3) / 1e9 if t_ms else float("nan")
    print(f"   {label:34s} {t_ms:8.3f} ms {nbytes / 1e6:9.1f} MB {gbs:8.0f} GB/s")


for name in names:
    base = layers[name].problem
    for pass_ in ("fwd", "dgrad", "wgrad"):
        p = base.for_pass(pass_)
        sizes = forced or min(size_candidates(p), key=lambda s: cost.estimate(p, s))
        F, N = spectrum_elems(sizes), math.prod(sizes)
        a, b = random_operands(be, p, 1)
        ref = get_strategy("reference").build(p, None, be)(a.astype(xp.float64), b.astype(xp.float64))
        print(f"== {name} {pass_} sizes={'x'.join(map(str, sizes))} (minimal {minimal_sizes(p)}) F={F}")
        fft = get_strategy("fft")
        for product in ("gemm", "fgemm"):
            run = fft.build(p, FftConfig(sizes=sizes, product=product, chunk=p.batch), be)
            err = relative_error(xp, run(a, b), ref)
            print(f"   whole {product:28s} {ms(lambda: run(a, b)):8.3f} ms  error {err:.1e}  "
                  f"host enqueue {host_ms(lambda: run(a, b)):.3f} ms/call")
        ex = freqmajor.FreqMajorConv(xp, p, sizes, p.batch)
        strided = arrayops.CupyOps(xp, sizes, strided=True)
        ex_strided = freqmajor.FreqMajorConv(xp, p, sizes, p.batch)
        ex_strided.ops = strided
        print(f"   whole fgemm, strided cuFFT layout {ms(lambda: ex_strided(a, b, xp.empty(p.result_shape, xp.float32))):8.3f} ms")
        if callbacks.callbacks_available():
            fused = fft.build(p, FftConfig(sizes=sizes, product="fgemm", chunk=p.batch, fused=True), be)
            err = relative_error(xp, fused(a, b), ref)
            print(f"   whole fgemm, fused callbacks      {ms(lambda: fused(a, b)):8.3f} ms  error {err:.1e}  "
                  f"host enqueue {host_ms(lambda: fused(a, b)):.3f} ms/call")
        else:
            print(f"   fused callbacks unavailable: {callbacks.callbacks_unavailable_reason()}")
        ops = ex.ops
        n, C, K, Cg = p.batch, p.in_channels, p.out_channels, p.in_per_group
        x = a if pass_ != "dgrad" else None
        dy = a if pass_ == "dgrad" else (b if pass_ == "wgrad" else None)
        w = b if pass_ in ("fwd", "dgrad") else None
        if x is not None:
            xf = x.reshape((n * C,) + x.shape[2:])
            row("embed + R2C x + transpose", ms(lambda: ops.rfft(xf, ex._x_at)), 4 * x.size + 8 * n * C * F)
            row("same, strided", ms(lambda: strided.rfft(xf, ex._x_at)), 4 * x.size + 8 * n * C * F)
        if dy is not None:
            df = dy.reshape((n * K,) + dy.shape[2:])
            row("embed dy", ms(lambda: ops.embed(df, ex._dy_at)), 4 * dy.size + 4 * n * K * N)
            row("embed + R2C dy + transpose", ms(lambda: ops.rfft(df, ex._dy_at)), 4 * dy.size + 8 * n * K * F)
        if w is not None:
            wf = w.reshape((K * Cg,) + w.shape[2:])
            row("embed w", ms(lambda: ops.embed(wf, ex._w_at)), 4 * w.size + 4 * K * Cg * N)
            row("embed + R2C w + transpose", ms(lambda: ops.rfft(wf, ex._w_at)), 4 * w.size + 8 * K * Cg * F)
        xs = xp.ones((F, n, C), dtype=xp.complex64)
        ys = xp.ones((F, n, K), dtype=xp.complex64)
        ws = xp.ones((F, K, Cg), dtype=xp.complex64)
        flops = 8 * F * n * K * Cg
        if pass_ == "fwd":
            t = ms(lambda: ops.gemm(xs, "N", ws, "C", ys, 1.0))
        elif pass_ == "dgrad":
            t = ms(lambda: ops.gemm(ys, "N", ws, "N", xs, 1.0))
        else:
            t = ms(lambda: ops.gemm(ys, "C", xs, "N", ws, 1.0))
        row(f"CGEMM ({flops / t / 1e9:.1f} TFLOP/s)", t, 8 * F * (n * C + n * K + K * Cg))
        rows_out = {"fwd": n * K, "dgrad": n * C, "wgrad": K * Cg}[pass_]
        spec = xp.ones((F, rows_out), dtype=xp.complex64)
        row("transpose + C2R", ms(lambda: ops.irfft(spec)), 8 * F * rows_out + 4 * N * rows_out)
        row("transpose alone", ms(lambda: ops._transpose(spec)), 16 * F * rows_out)
