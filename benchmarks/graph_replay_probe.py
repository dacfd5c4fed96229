"""Device probe: can a 1x1 plan's GEMM be captured once in a CUDA graph and replayed by address, and what does a
replay cost the host? (issue 15's forward host cost: one cuBLAS call takes 11 to 13 µs of host time.)

For ResNet-50's 1x1 forward layers at batch 32 (fp32): the im2col plan's GEMM through cuBLAS (CuPy's binding) and
through cuBLASLt (convtune.direct.cublaslt) each captured on a side stream of its own (thread-local capture mode),
the graph replayed on PyTorch's stream; each replay's result against PyTorch's conv2d; host µs per call (median of
101 rounds of 50) of PyTorch's conv2d, the plan's launch, and the graph's launch.

    source scripts/gpu-env.sh; python3 benchmarks/graph_replay_probe.py
"""
from __future__ import annotations

import cupy
import torch

from convtune.problem import ConvProblem
from convtune.torch._bridge import bridge
from pointwise_host_parts import LAYERS, plan_of  # (benchmarks/: the script's own directory)
from torch_host_cpu import host_us


def main():
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    br = bridge("cuda")
    side = cupy.cuda.Stream(non_blocking=True)
    mode = cupy.cuda.runtime.streamCaptureModeThreadLocal
    for spec in LAYERS:
        p = ConvProblem.make(batch=32, kernel_size=1, pass_="fwd", **spec)
        x = torch.randn(p.operand_shapes[0], device="cuda")
        w = torch.randn(p.operand_shapes[1], device="cuda")
        ref = torch.nn.functional.conv2d(x, w)
        stream = br.launch_stream(0)
        print(f"== {p.describe()}", flush=True)
        print(f"   torch conv2d {host_us(lambda: torch.nn.functional.conv2d(x, w), calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us")
        for lt in (False, True):
            name = "cuBLASLt" if lt else "cuBLAS"
            plan = plan_of(p, cublas=not lt)
            out = torch.full(p.result_shape, float("nan"), device="cuda")
            a, b, o = x.data_ptr(), w.data_ptr(), out.data_ptr()
            launch = getattr(plan.launch, "_launch", plan.launch)  # (the direct call, not the replaying one)
            print(f"   {name} launch {host_us(lambda: launch(a, b, o, stream), calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us")
            try:
                side.begin_capture(mode)
                try:
                    launch(a, b, o, side)
                finally:
                    graph = side.end_capture()
                graph.upload(stream)
            except Exception as exc:
                print(f"   {name}: capture failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            out.fill_(float("nan"))
            torch.cuda.synchronize()
            graph.launch(stream)
            torch.cuda.synchronize()
            err = float((out - ref).norm() / ref.norm())
            print(f"   {name} graph replay: error {err:.2e} against conv2d", flush=True)
            print(f"   {name} graph.launch {host_us(lambda: graph.launch(stream), calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us")
            cache = {(a, b, o): graph}
            key = (a, b, o)
            print(f"   {name} dict lookup + graph.launch {host_us(lambda: cache[key].launch(stream), calls=50, rounds=101, sync=torch.cuda.synchronize):7.2f} us", flush=True)


if __name__ == "__main__":
    main()
