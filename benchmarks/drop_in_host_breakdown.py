"""Where the drop-in's host time per call goes: a patched convolution's training forward against
PyTorch's own, and each check it makes on the way, timed alone (host µs per call, median of rounds).

A small layer (the device work is short, so the host's issue time is what is measured; the queue is
drained between rounds), every pass resolved to PyTorch's own convolution (a runtime whose only
strategy is ``torch``), so the difference to PyTorch's call is the drop-in's own host work.

    python3 benchmarks/drop_in_host_breakdown.py [--device cuda] [--calls 2000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import torch
import torch.nn.functional as F

import convtune
import convtune.torch as ct
from convtune.torch import _dispatch, functional
from torch_host_cpu import host_us  # (benchmarks/: the script's own directory)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    rt = convtune.Runtime(store=convtune.MemoryPlanStore(), planner_options={"strategies": ["torch"]})
    layer = ct.Conv2d(8, 8, 3, padding=1, runtime=rt).to(device)
    x = torch.randn(2, 8, 8, 8, device=device, requires_grad=True)
    w, b = layer.weight, layer.bias
    for _ in range(3):  # resolved, settled: every pass PyTorch's
        layer(x).sum().backward()
    sync()
    (route,) = rt.layer_memo("torch").values()
    plain = torch.nn.Conv2d(8, 8, 3, padding=1).to(device)
    geom = functional.geometry(2, layer.kernel_size, layer.stride, layer.padding, layer.dilation, layer.padding_mode)
    items = [
        ("PyTorch F.conv2d (training forward)", lambda: F.conv2d(x, w, b, 1, 1)),
        ("PyTorch nn.Conv2d module call", lambda: plain(x)),
        ("patched layer (training forward)", lambda: layer(x)),
        ("  its _conv_forward", lambda: layer._conv_forward(x, w, b)),
        ("  functional.run", lambda: functional.run(x, w, b, geom, 1, "auto", rt, layer)),
        ("  functional._dispatch", lambda: functional._dispatch(x, w, b, geom, 1, "fp32", rt, layer)),
        ("  functional._pytorch", lambda: functional._pytorch(x, w, b, geom, 1)),
        ("  geometry(...)", lambda: functional.geometry(2, layer.kernel_size, layer.stride, layer.padding,
                                                        layer.dilation, layer.padding_mode)),
        ("  capturing(x)", lambda: _dispatch.capturing(x)),
        ("  x.device", lambda: x.device),
        ("  tensor_layout(x, w)", lambda: _dispatch.tensor_layout(x, w)),
        ("  route_for(...)", lambda: _dispatch.route_for(x.shape, w.shape, (1, 1), (1, 1), (1, 1), 1, "fp32", x.device,
                                                        rt, x.dtype, "channels_first")),
        ("  _flags_as_measured", lambda: functional._flags_as_measured(x, "fp32")),
        ("  resolve_math('auto')", lambda: functional.resolve_math("auto", x)),
        ("  autocast(x, w, b)", lambda: functional.autocast(x, w, b)),
        ("  torch.compiler.is_compiling()", torch.compiler.is_compiling),
        ("  _unsupported(...)", lambda: functional._unsupported(x, w, b, 2, False)),
        ("  torch.is_grad_enabled()", torch.is_grad_enabled),
    ]
    print(f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}; "
          f"route {route.labels()}")
    for name, fn in items:
        print(f"{name:40s} {host_us(fn, args.calls, args.rounds, sync):8.2f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
