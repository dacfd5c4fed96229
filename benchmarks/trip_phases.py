"""Device probe: a layer's kept-spectra round trip (fbfft-L2 by default), step by step: convtune's own
transforms with the packed product, cuFFT with the packed product, and the own transforms with cuBLAS.

Usage: python3 benchmarks/trip_phases.py [LAYER [SIZES]]   (run from the repository root on the device machine;
reads .carry/layers.yaml, a copy of ../shared/bench/layers.yaml)
"""
import sys
import cupy as cp
from convtune import CudaEventTimer
from convtune.backend import get_backend
from convtune.fft import freqmajor
from convtune.network import load_network
from convtune.roundtrip import round_trip_operands

be = get_backend("cupy")
timer = CudaEventTimer(repeats=20)
name = sys.argv[1] if len(sys.argv) > 1 else "fbfft-L2"
sizes = tuple(int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "64x64").split("x"))
p = {l.name: l for l in load_network(".carry/layers.yaml")}[name].problem.for_pass("fwd")
x, w, dy = round_trip_operands(be, p)


def ms(fn):
    return timer(fn, be).median_s * 1e3


def probe(packed, own):
    ex = freqmajor.FreqMajorConv(cp, p, sizes, p.batch, fused=not own, packed=packed, own=own)
    ops = ex.ops
    y, dx, dw = cp.empty(p.y_shape, cp.float32), cp.empty(p.x_shape, cp.float32), cp.empty(p.w_shape, cp.float32)
    xs, ws, dys = ex.x_spectrum(x), ex.w_spectrum(w), ex.dy_spectrum(dy)
    fs = ex._times_weight(xs, p.in_per_group, ex._weight_groups(ws), "C", p.out_channels, p.out_per_group)
    ds = ex._times_weight(dys, p.out_per_group, ex._weight_groups(ws), "N", p.in_channels, p.in_per_group)
    acc = ops.empty_spectrum(p.out_channels, p.in_per_group)
    steps = [
        ("R2C x", lambda: ex.x_spectrum(x)),
        ("R2C w (placed 9x9)", lambda: ex.w_spectrum(w)),
        ("fwd GEMM", lambda: ex._times_weight(xs, p.in_per_group, ex._weight_groups(ws), "C", p.out_channels, p.out_per_group)),
        ("C2R y (cropped)", lambda: ops.irfft_into(fs, y, ex._fwd_geometry, ex._fwd_index)),
        ("R2C dy (placed)", lambda: ex.dy_spectrum(dy)),
        ("dgrad GEMM", lambda: ex._times_weight(dys, p.out_per_group, ex._weight_groups(ws), "N", p.in_channels, p.in_per_group)),
        ("C2R dx", lambda: ops.irfft(ds, out=dx.reshape((-1,) + sizes)) if ex._dgrad_whole
            else ops.irfft_into(ds, dx, ex._dgrad_geometry, ex._dgrad_index)),
        ("wgrad GEMM", lambda: ops.gemm(dys, "C", xs, "N", acc, 1.0)),
        ("C2R dw (taps)", lambda: ops.irfft_into(acc.reshape(ex.F, -1), dw, ex._wgrad_geometry, ex._wgrad_index)),
    ]
    total = 0.0
    print(f"== {name} sizes={sizes} packed={packed} own={own} dgrad_whole={ex._dgrad_whole}")
    for label, fn in steps:
        t = ms(fn)
        total += t
        print(f"   {label:22s} {t:7.3f} ms")
    print(f"   {'sum':22s} {total:7.3f} ms")
    whole = [lambda: ex.forward_from(ex.x_spectrum(x), ex.w_spectrum(w), y),
             lambda: ex.backward_data_from(ex.dy_spectrum(dy), ws, dx),
             lambda: ex.backward_filter_from([(dys, xs)], dw)]
    print(f"   whole passes (sequence) {timer.sequence(whole, be).median_s * 1e3:7.3f} ms")
    # plain cuFFT, no callbacks, for comparison
    if packed and not own:
        yb = cp.empty((p.batch * p.out_channels,) + sizes, cp.float32)
        spec = cp.empty((p.batch * p.out_channels, ex.F), cp.complex64)
        plan_f, plan_i = ops._plan(True, yb.shape[0]), ops._plan(False, yb.shape[0])
        yb[...] = 1.0
        print(f"   plain R2C of n*K images {ms(lambda: plan_f.fft(yb, spec, ops._cufft.CUFFT_FORWARD)):7.3f} ms")
        print(f"   plain C2R of n*K images {ms(lambda: plan_i.fft(spec, yb, ops._cufft.CUFFT_INVERSE)):7.3f} ms")
        print(f"   copy of n*K images      {ms(lambda: yb.copy()):7.3f} ms")


for packed, own in ((True, True), (True, False), (False, True)):
    probe(packed, own)
    cp.get_default_memory_pool().free_all_blocks()
