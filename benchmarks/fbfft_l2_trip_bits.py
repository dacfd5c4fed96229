"""fbfft-L2's bfloat16 channels_last round trip with kept spectra in tf32 math (`fft-trip[sizes=64x64,packed,own,tf32]`)
on 16-bit memory, as the drop-in hands it over, timed whole (CUDA events after an L2 flush, median of 20) beside
PyTorch bfloat16 channels_last's autograd round trip (cudnn.benchmark on, timed first), then per-kernel device time
from PyTorch's profiler (3 trips). GPU:

    source scripts/gpu-env.sh; python3 benchmarks/fbfft_l2_trip_bits.py
"""
import statistics
import cupy, torch
from torch.profiler import profile, ProfilerActivity
from convtune.problem import ConvProblem
from convtune.roundtrip import RoundTrip, TripConfig
from convtune import precision

def ev_time(fn, reps=20):
    fn(); torch.cuda.synchronize()
    ts = []
    flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    for _ in range(reps):
        flush.fill_(1)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); e.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)

torch.backends.cudnn.benchmark = True
x = torch.randn(128, 64, 64, 64, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
w = (0.05 * torch.randn(128, 64, 9, 9, device="cuda")).to(torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
dy = torch.randn(128, 128, 56, 56, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)
def peer():
    y = torch.nn.functional.conv2d(x, w); y.backward(dy)
print(f"PyTorch bf16 CL round trip: {ev_time(peer):.3f} ms", flush=True)
del x, w, dy
torch.cuda.empty_cache()

p = ConvProblem.make(batch=128, in_channels=64, out_channels=128, input_size=(64, 64), kernel_size=(9, 9),
                     dtype="bfloat16", layout="channels_last", math="tf32")
cfg = TripConfig(sizes=(64, 64), packed=True, own=True, tf32=True)
trip = RoundTrip(p, cfg, "cupy")
g = cupy.random.default_rng(0)
mk = lambda shape: precision.bits_of(cupy, precision.stored(cupy, g.standard_normal(shape, dtype=cupy.float32), p), p.layout)
x, w, dy = mk(p.x_shape), mk(p.w_shape), mk(p.y_shape)
y, dx, dw = (precision.empty_bits(cupy, s, p.layout) for s in (p.y_shape, p.x_shape, p.w_shape))
def go():
    trip.forward(x, w, y); trip.backward_data(dy, dx); trip.backward_filter(dy, dw)
print(f"{cfg.label()} on 16-bit memory: round trip {ev_time(go):.3f} ms", flush=True)
go(); torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as pr:
    for _ in range(3):
        go()
    torch.cuda.synchronize()
print(pr.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=60))
