"""Device probe: where a 1x1 cuBLAS plan's host time goes when the PyTorch layer calls it by address
(issue 15's inference forward: 12 of ResNet-50's routes keep such plans, +13 to +34 µs over PyTorch's call).

Times, per call (median of many short rounds of back-to-back calls, synchronised between rounds: a round of
50 calls stays far below the launch queue's depth, so the clock sees the host's work, not the GPU's), each piece of
:class:`convtune.torch._dispatch.ArrayPlan`'s by-address call of ResNet-50's 1x1 layers' forward plans
(im2col's bare cuBLAS GEMM), against PyTorch's ``conv2d`` (cuDNN benchmark on, no TF32) on the same tensors.
A first form timed rounds of 2000 calls: those filled the launch queue and measured the GPU's time instead.
The rows marked cuBLASLt run the same plan built with ``CONVTUNE_CUBLASLT=1`` (convtune.direct.cublaslt).

    source scripts/gpu-env.sh; python3 benchmarks/pointwise_host_parts.py
"""

from __future__ import annotations

import os

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


def main() -> None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # fp32 against the fp32 plan
    be = get_backend("cupy")
    br = bridge("cuda")
    from cupy_backends.cuda.libs import cublas
    import cupy
    for spec in LAYERS:
        p = ConvProblem.make(batch=32, kernel_size=1, pass_="fwd", **spec)
        plan = build_from_config(p, "im2col", Im2colConfig(chunk=p.batch), be, "measured")
        ap = ArrayPlan(plan, br, p)
        x = torch.randn(p.operand_shapes[0], device="cuda")
        w = torch.randn(p.operand_shapes[1], device="cuda")
        out = torch.empty(p.result_shape, device="cuda")
        stream = br.launch_stream(0)
        launch = plan.launch
        handle = cupy.cuda.device.get_cublas_handle()
        # the same plan built with cuBLASLt (convtune.direct.cublaslt, opt-in): its host time, and its result
        os.environ[cublaslt.ENV] = "1"
        try:
            lt_plan = build_from_config(p, "im2col", Im2colConfig(chunk=p.batch), be, "measured")
        finally:
            del os.environ[cublaslt.ENV]
        lt_ap = ArrayPlan(lt_plan, br, p)
        err = float((lt_ap(x, w) - torch.nn.functional.conv2d(x, w)).norm() / torch.nn.functional.conv2d(x, w).norm())
        print(f"   cuBLASLt plan's error against PyTorch's conv2d: {err:.2e} (its launch: {lt_plan.launch.__qualname__})")
        rows = {
            "torch conv2d": lambda: torch.nn.functional.conv2d(x, w),
            "ArrayPlan call (no bias)": lambda: ap(x, w),
            "ArrayPlan call, cuBLASLt (no bias)": lambda: lt_ap(x, w),
            "  plan.launch(addresses), cuBLASLt": lambda: lt_plan.launch(x.data_ptr(), w.data_ptr(), out.data_ptr(),
                                                                          stream),
            "  launch_stream": lambda: br.launch_stream(0),
            "  torch.empty(result)": lambda: torch.empty(p.result_shape, device=x.device),
            "  _dense_as checks (is_contiguous x2)": lambda: (x.is_contiguous(), w.is_contiguous()),
            "  plan.launch(addresses)": lambda: launch(x.data_ptr(), w.data_ptr(), out.data_ptr(), stream),
            "    data_ptr x3": lambda: (x.data_ptr(), w.data_ptr(), out.data_ptr()),
            "    current_stream + use + use back": lambda: (cupy.cuda.get_current_stream(), stream.use(),
                                                           cupy.cuda.Stream.null.use()),
            "    get_cublas_handle": cupy.cuda.device.get_cublas_handle,
            "    getMathMode + getPointerMode": lambda: (cublas.getMathMode(handle), cublas.getPointerMode(handle)),
            "    cublas.setStream": lambda: cublas.setStream(handle, stream.ptr),
        }
        print(f"== {p.describe()}")
        for name, fn in rows.items():
            print(f"   {name:42s} {host_us(fn, calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us")


if __name__ == "__main__":
    main()
