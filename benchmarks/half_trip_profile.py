"""Where fbfft-L2's round trip with kept spectra spends its device time, GPU: float32 channels-first and bfloat16
channels_last, fp32 and tf32 math (the packed product, and cuBLAS's TF32 product with convtune's or cuFFT's
transforms), per-kernel device time from PyTorch's profiler; then the conversions alone (PyTorch's, and the array
form's widening and rounding kernels of convtune.precision).

    python3 benchmarks/half_trip_profile.py
"""
import statistics
import cupy, torch
from torch.profiler import profile, ProfilerActivity
from convtune.problem import ConvProblem
from convtune.roundtrip import RoundTrip, TripConfig
from convtune import precision

def prob(dtype, layout, math="fp32"):
    return ConvProblem.make(batch=128, in_channels=64, out_channels=128, input_size=(64, 64), kernel_size=(9, 9),
                            dtype=dtype, layout=layout, math=math)

def ev_time(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)

def prof_table(fn, title, n=3):
    fn(); torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as pr:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    print(f"== {title} (per {n} calls)")
    print(pr.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))

for dtype, layout, math in (("float32", "channels_first", "fp32"), ("bfloat16", "channels_last", "fp32"),
                             ("float32", "channels_first", "tf32"), ("bfloat16", "channels_last", "tf32")):
    p = prob(dtype, layout, math)
    for cfg in ([TripConfig(sizes=(64, 64), packed=True, own=True)] +
                ([TripConfig(sizes=(64, 64), own=True, tf32=True), TripConfig(sizes=(64, 64), packed=False, own=False, tf32=True)] if math == "tf32" else [])):
        try:
            trip = RoundTrip(p, cfg, "cupy")
        except ValueError as e:
            print("skip", cfg.label(), e); continue
        g = cupy.random.default_rng(0)
        mk = lambda shape: precision.stored(cupy, g.standard_normal(shape, dtype=cupy.float32), p)
        x, w, dy = mk(p.x_shape), mk(p.w_shape), mk(p.y_shape)
        def go():
            trip.forward(x, w); trip.backward_data(dy); trip.backward_filter(dy)
        t = ev_time(go)
        print(f"{dtype} {layout} {math} {cfg.label()}: round trip {t:.3f} ms", flush=True)
        if cfg.packed or math == "tf32":
            prof_table(go, f"{dtype} {layout} {math} {cfg.label()}")
        del trip
        cupy.get_default_memory_pool().free_all_blocks()

# conversions alone: PyTorch's and the array form's
xb = torch.randn(128, 64, 64, 64, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
yb = torch.randn(128, 128, 56, 56, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
y32 = torch.randn(128, 128, 56, 56, device="cuda")
for name, fn in [("torch x bf16 CL -> f32 CF", lambda: xb.to(torch.float32).contiguous()),
                 ("torch x bf16 CL -> f32 CF (one op)", lambda: xb.to(dtype=torch.float32, memory_format=torch.contiguous_format)),
                 ("torch dy bf16 CL -> f32 CF", lambda: yb.to(dtype=torch.float32, memory_format=torch.contiguous_format)),
                 ("torch y f32 CF -> bf16 CL", lambda: y32.to(dtype=torch.bfloat16, memory_format=torch.channels_last)),
                 ("torch copy y f32 (peak ref)", lambda: y32.clone())]:
    t = ev_time(fn)
    print(f"{name}: {t:.3f} ms", flush=True)
p = prob("bfloat16", "channels_last")
x32cl = precision.stored(cupy, cupy.random.standard_normal(p.x_shape, dtype=cupy.float32), p)
yf = cupy.random.standard_normal(p.y_shape, dtype=cupy.float32)
out = precision._empty_in(cupy, p.y_shape, "float32", "channels_last")
for name, fn in [("array form widen x (f32 CL -> CF)", lambda: precision.widened(cupy, x32cl)),
                 ("array form narrow y (f32 CF -> bf16 CL in f32)", lambda: precision.narrowed(cupy, yf, p.for_pass("fwd"), out))]:
    t = ev_time(fn)
    print(f"{name}: {t:.3f} ms", flush=True)
