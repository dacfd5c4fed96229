"""fbfft-L2 (and fbfft-L3's PyTorch peers) in bfloat16 channels_last and float32 channels-first, GPU: convtune's own
64x64 transforms reading and writing the problem themselves. Prints the round trip with kept spectra (array form,
bfloat16 in float32 storage) with its kernels' device times (PyTorch's profiler), the own-transform plans per pass
(their timed form: 16-bit memory, as the PyTorch layer calls them), each after an L2 flush, median of 25, and
PyTorch's round trip by autograd in the same dtype and layout (cudnn.benchmark on, no TF32).

    python3 benchmarks/fft64_half_io.py
"""
import statistics, sys
import cupy, torch
from torch.profiler import profile, ProfilerActivity
from convtune.problem import ConvProblem
from convtune.roundtrip import RoundTrip, TripConfig
from convtune.strategies import get_strategy
from convtune.strategies.fft import FftConfig
from convtune.backend import get_backend
from convtune import precision

L2 = cupy.empty(64 << 20, dtype=cupy.uint8)

def ev_time(fn, reps=25, flush=True):
    fn(); torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        if flush:
            L2.fill(1)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)

LAYERS = {"fbfft-L2": dict(batch=128, in_channels=64, out_channels=128, input_size=(64, 64), kernel_size=(9, 9)),
          "fbfft-L3": dict(batch=128, in_channels=128, out_channels=128, input_size=(32, 32), kernel_size=(9, 9))}
backend = get_backend("cupy")
fft = get_strategy("fft")
for name, kw in LAYERS.items():
    for dtype, layout in (("bfloat16", "channels_last"), ("float32", "channels_first")):
        p = ConvProblem.make(dtype=dtype, layout=layout, **kw)
        g = cupy.random.default_rng(0)
        mk = lambda shape: precision.stored(cupy, g.standard_normal(shape, dtype=cupy.float32), p)
        x, w, dy = mk(p.x_shape), mk(p.w_shape), mk(p.y_shape)
        if p.input_size == (64, 64):
            trip = RoundTrip(p, TripConfig(sizes=(64, 64), packed=True, own=True), "cupy")
            go = lambda: (trip.forward(x, w), trip.backward_data(dy), trip.backward_filter(dy))
            print(f"{name} {dtype} {layout} trip own packed (array form, converted={trip.converted}): {ev_time(go):.3f} ms", flush=True)
            if dtype == "bfloat16":
                go()
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA]) as pr:
                    go(); torch.cuda.synchronize()
                for ev in sorted(pr.key_averages(), key=lambda e: -e.device_time_total)[:8]:
                    print(f"   {ev.key[:60]:60s} {ev.device_time_total / 1e3:.3f} ms x{ev.count}")
            del trip
        # per pass: the own packed executor (timed form where it has one)
        total = 0.0
        for pass_, (a, b) in (("fwd", (x, w)), ("dgrad", (dy, w)), ("wgrad", (x, dy))):
            q = p.for_pass(pass_)
            for cfg in [c for c in fft.candidates(q, backend) if c.own and not c.polyphase and not c.tiled][:2]:
                run = fft.executor(q, cfg, backend)
                timed = getattr(run, "timed", None)
                call = timed(a, b, None) if timed else (lambda run=run, a=a, b=b: run(a, b))
                t = ev_time(call)
                print(f"  {name} {dtype} {layout} {pass_} {cfg.label()}: {t:.3f} ms (timed form: {timed is not None})", flush=True)
        # PyTorch in the same dtype and layout
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False
        tdt = torch.bfloat16 if dtype == "bfloat16" else torch.float32
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        tx = torch.randn(p.x_shape, device="cuda").to(dtype=tdt, memory_format=fmt).requires_grad_()
        tw = torch.randn(p.w_shape, device="cuda").to(dtype=tdt, memory_format=fmt).requires_grad_()
        tdy = torch.randn(p.y_shape, device="cuda").to(dtype=tdt, memory_format=fmt)
        def step():
            y = torch.nn.functional.conv2d(tx, tw)
            y.backward(tdy)
        for _ in range(3):
            step()
        print(f"  {name} PyTorch {dtype} {layout} round trip (autograd): {ev_time(step):.3f} ms", flush=True)
        cupy.get_default_memory_pool().free_all_blocks(); torch.cuda.empty_cache()
