"""FFT plans (strategies=["fft"], fresh in-memory cache) of dense-k31 and fbfft-L2 through the PyTorch layer's
executor (ArrayPlan), float32 channels-first against bfloat16 channels_last, ms per pass (CUDA events, L2
flushed), with PyTorch's forward beside, and a profile of fbfft-L2's bfloat16 forward. GPU only:
    source scripts/gpu-env.sh; python3 benchmarks/half_fft_layer.py
(18th session: the conversions around a float32 plan cost more than the plan, BENCHMARKS.md's half-precision
section.)"""
import torch
from convtune.backend import get_backend
from convtune.runtime import Runtime
from convtune.timing import CudaEventTimer
from convtune.torch._dispatch import ArrayPlan, layer_problem
from convtune.torch._bridge import bridge
be = get_backend("cupy"); timer = CudaEventTimer(repeats=25)
torch.backends.cudnn.benchmark = True
layers = {"dense-k31": ((8, 64, 64, 64), (64, 64, 31, 31), 15), "fbfft-L2": ((128, 64, 64, 64), (128, 64, 9, 9), 0)}
rt = Runtime(planner_options={"strategies": ["fft"], "time_budget_s": 30})
for name, (xs, ws, pad) in layers.items():
    for dtype, layout in ((torch.float32, "channels_first"), (torch.bfloat16, "channels_last")):
        fwd = layer_problem(xs, ws, (1, 1), (pad, pad), (1, 1), 1, "fp32", dtype, layout)
        for pass_ in ("fwd", "dgrad", "wgrad"):
            p = fwd.for_pass(pass_)
            plan = rt.plan_for(p, be)
            ex = ArrayPlan(plan, bridge("cuda"), p)
            mf = torch.channels_last if layout == "channels_last" else torch.contiguous_format
            sh = p.operand_shapes
            a = torch.randn(sh[0], device="cuda").to(dtype=dtype).contiguous(memory_format=mf)
            b = torch.randn(sh[1], device="cuda").to(dtype=dtype).contiguous(memory_format=mf)
            st = timer(lambda: ex(a, b), be, "ct")
            wt = torch.randn(ws, device="cuda", dtype=dtype).contiguous(memory_format=mf)
            tt = timer(lambda: torch.nn.functional.conv2d(a, wt, None, 1, pad), be, "t") if pass_ == "fwd" else None
            print(f"{name} {str(dtype)[6:]} {layout} {pass_}: {plan.label} layer {st.median_s*1e3:.3f} ms" + (f" torch fwd {tt.median_s*1e3:.3f}" if tt else ""), flush=True)
            if dtype == torch.bfloat16 and pass_ == "fwd" and name == "fbfft-L2":
                from torch.profiler import profile, ProfilerActivity
                for _ in range(3): ex(a, b)
                torch.cuda.synchronize()
                with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                    for _ in range(5): ex(a, b)
                    torch.cuda.synchronize()
                print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=70))
