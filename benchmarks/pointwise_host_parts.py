"""Device probe: a 1x1 plan's host time per call when the PyTorch layer calls it by address, and its GEMM's device
time, in its three forms (issue 15's forward host cost: 12 of ResNet-50's routes keep such plans).

1. Host µs per call (median of 101 rounds of 50 back-to-back calls, synchronised between rounds: a round stays far
   below the launch queue's depth, so the clock sees the host's work, not the GPU's) on ResNet-50's 1x1 forward
   layers at batch 32: PyTorch's ``conv2d`` (cuDNN benchmark on, no TF32); :class:`convtune.torch._dispatch.ArrayPlan`'s
   call of the im2col plan built with ``CONVTUNE_CUBLASLT=0`` (cuBLAS through CuPy) and by default (cuBLASLt,
   launched from a CUDA graph per operand addresses: convtune.direct.replay); their launches alone; and pieces
   of the call. A first form timed rounds of 2000 calls: those filled the launch queue and measured the GPU.
2. Device time (CUDA events after an L2 flush, median of 50) of every 1x1 stride-1 forward and backward-data GEMM of
   ResNet-50 at batch 32: the cuBLAS form against cuBLASLt's algorithm (chosen once, no workspace), each checked
   against PyTorch.

    source scripts/gpu-env.sh; python3 benchmarks/pointwise_host_parts.py
"""

from __future__ import annotations

import os
import statistics

import cupy
import torch

from convtune.backend import get_backend
from convtune.direct import cublaslt
from convtune.planner import build_from_config
from convtune.problem import ConvProblem
from convtune.strategies.im2col import Im2colConfig
from convtune.torch._bridge import bridge
from convtune.torch._dispatch import ArrayPlan
from torch_host_cpu import host_us  # (benchmarks/: the script's own directory)

LAYERS = [dict(in_channels=64, out_channels=64, input_size=(56, 56)),
          dict(in_channels=256, out_channels=64, input_size=(56, 56)),
          dict(in_channels=1024, out_channels=256, input_size=(14, 14)),
          dict(in_channels=512, out_channels=2048, input_size=(7, 7))]
#: ResNet-50's 1x1 stride-1 convolutions (torchvision: the stride is on the 3x3), (in, out, size)
RESNET50_1X1 = [(64, 64, 56), (64, 256, 56), (256, 64, 56), (256, 128, 56), (128, 512, 28), (512, 128, 28),
                (512, 256, 28), (256, 1024, 14), (1024, 256, 14), (1024, 512, 14), (512, 2048, 7), (2048, 512, 7)]


def plan_of(p, cublas: bool):
    """The im2col plan of ``p``: with ``cublas``, built with CONVTUNE_CUBLASLT=0; else by default."""
    before = os.environ.get(cublaslt.ENV)
    os.environ[cublaslt.ENV] = "0" if cublas else "1"
    try:
        return build_from_config(p, "im2col", Im2colConfig(chunk=p.batch), get_backend("cupy"), "measured")
    finally:
        if before is None:
            del os.environ[cublaslt.ENV]
        else:
            os.environ[cublaslt.ENV] = before


def host_rows(br) -> None:
    for spec in LAYERS:
        p = ConvProblem.make(batch=32, kernel_size=1, pass_="fwd", **spec)
        plans = {"cuBLAS": plan_of(p, True), "default": plan_of(p, False)}
        x = torch.randn(p.operand_shapes[0], device="cuda")
        w = torch.randn(p.operand_shapes[1], device="cuda")
        out = torch.empty(p.result_shape, device="cuda")
        ref = torch.nn.functional.conv2d(x, w)
        stream = br.launch_stream(0)
        calls = {name: ArrayPlan(plan, br, p) for name, plan in plans.items()}
        for name, call in calls.items():
            for _ in range(3):  # (the third call with these addresses replays)
                err = float((call(x, w) - ref).norm() / ref.norm())
            print(f"   {name} plan's ArrayPlan call: error {err:.2e} against conv2d", flush=True)
        launches = {name: plan.launch for name, plan in plans.items()}
        direct = getattr(plans["default"].launch, "_launch", None)  # (the replaying launch's direct call)
        rows = {
            "torch conv2d": lambda: torch.nn.functional.conv2d(x, w),
            "ArrayPlan call, cuBLAS": lambda: calls["cuBLAS"](x, w),
            "ArrayPlan call, default (cuBLASLt replayed)": lambda: calls["default"](x, w),
            "  plan.launch(addresses), cuBLAS": lambda: launches["cuBLAS"](x.data_ptr(), w.data_ptr(), out.data_ptr(),
                                                                         stream),
            "  plan.launch(addresses), default": lambda: launches["default"](x.data_ptr(), w.data_ptr(),
                                                                          out.data_ptr(), stream),
            "  launch_stream": lambda: br.launch_stream(0),
            "  torch.empty(result)": lambda: torch.empty(p.result_shape, device=x.device),
            "  data_ptr x3": lambda: (x.data_ptr(), w.data_ptr(), out.data_ptr()),
        }
        if direct is not None:
            rows["  cuBLASLt's call alone (direct)"] = lambda: direct(x.data_ptr(), w.data_ptr(), out.data_ptr(),
                                                                       stream)
        print(f"== {p.describe()}")
        for name, fn in rows.items():
            print(f"   {name:46s} {host_us(fn, calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us", flush=True)
        replay = plans["default"].launch
        print(f"   (the default launch: {type(replay).__name__}, graphs made {getattr(replay, 'made', '-')}, "
              f"replays {getattr(replay, 'replayed', '-')}, off: {getattr(replay, 'off', '-')})", flush=True)


def device_ms(fn, flush, reps=50) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.fill_(1)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def device_rows() -> None:
    flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    ratios = []
    print("\n1x1 GEMMs' device time, ms (cuBLAS / cuBLASLt, cuBLASLt over cuBLAS), batch 32:")
    for ci, co, size in RESNET50_1X1:
        for pass_ in ("fwd", "dgrad"):
            p = ConvProblem.make(batch=32, in_channels=ci, out_channels=co, input_size=(size, size), kernel_size=1,
                                 pass_=pass_)
            a = cupy.random.standard_normal(p.operand_shapes[0], dtype=cupy.float32)
            b = cupy.random.standard_normal(p.operand_shapes[1], dtype=cupy.float32)
            ref = None
            times = []
            for cublas in (True, False):
                run = plan_of(p, cublas)
                out = cupy.full(p.result_shape, cupy.nan, cupy.float32)
                run(a, b, out)
                if ref is None:
                    ref = out.copy()
                diff = float(cupy.abs(out - ref).max() / cupy.abs(ref).max())
                times.append(device_ms(lambda: run(a, b, out), flush))
            ratios.append(times[1] / times[0])
            print(f"   {p.describe():70s} {times[0]:.4f} / {times[1]:.4f}  {times[1] / times[0]:.3f}x  "
                  f"(results differ by {diff:.1e})", flush=True)
    print(f"   cuBLASLt over cuBLAS: median {statistics.median(ratios):.3f}x, range {min(ratios):.3f}x to "
          f"{max(ratios):.3f}x")


def main() -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # fp32 against the fp32 plan
    host_rows(bridge("cuda"))
    device_rows()


if __name__ == "__main__":
    main()
