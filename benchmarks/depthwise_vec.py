"""The channels-last depthwise kernels' configurations, swept: for each layer and pass, every combination of the
vectorized kernel's channels per thread (V), threads per block, outputs per thread along a row (R) and blocks per
multiprocessor, and of the staged kernels' channel pairs a block, rows a tile, columns a thread (``--segw``),
single or double buffers (``--pipe``), KiB of shared memory a block at most (``--smem``; over 48, a tile that needs
more opts in) and blocks per multiprocessor (``--blocks``), each
checked against float64 and timed with the bench timer (L2 flushed, median), beside PyTorch's call of the same pass
(cuDNN's benchmark on, same dtype and layout) and the ``nhwc-tiled`` kernel. The vectorized kernel's configurations
that the strategy offers (``convtune.strategies.depthwise.NHWC_VEC``) are marked. The vectorized kernel runs the
forward and backward-data passes, the staged ones every pass (``--passes wgrad``: the filter gradient's).

    python3 benchmarks/depthwise_vec.py [--layers convnext-dw7-s1,dw3-56-c96] [--passes fwd] [--dtype bfloat16]
        [--kernels vec|staged|both] [--tiles all|strategy] [--segw 16] [--pipe 0,1] [--smem 48,100]
        [--blocks 1,2,4,8] [-o sweep.json]

The staged kernels' configurations are compiled in parallel threads before any is timed.

The layers are those of ``benchmarks/depthwise_half.yaml`` (ConvNeXt-T's 7x7 depthwise layers at batch 32, 3x3 and
5x5 ones) and MobileNetV3-Large's strided depthwise layers (``mbv3-*-s2``).
"""

from __future__ import annotations

import argparse
import itertools
import json
from concurrent.futures import ThreadPoolExecutor

#: name -> (batch, channels, plane side, kernel side[, stride])
LAYERS = {
    "convnext-dw7-s1": (32, 96, 56, 7),
    "convnext-dw7-s2": (32, 192, 28, 7),
    "convnext-dw7-s3": (32, 384, 14, 7),
    "convnext-dw7-s4": (32, 768, 7, 7),
    "dw3-56-c96": (32, 96, 56, 3),
    "dw3-28-c192": (32, 192, 28, 3),
    "dw5-14-c384": (32, 384, 14, 5),
    "mbv3-dw3-112-c64-s2": (32, 64, 112, 3, 2),
    "mbv3-dw5-56-c72-s2": (32, 72, 56, 5, 2),
    "mbv3-dw3-28-c240-s2": (32, 240, 28, 3, 2),
    "mbv3-dw5-14-c672-s2": (32, 672, 14, 5, 2),
}
#: the axes swept
VECTORS, THREADS, ROWS, BLOCKS_PER_SM = (2, 4, 8), (64, 128, 256), (2, 4), (1, 2, 4, 8, 16)
#: the staged kernels' axes: channel pairs a block, output rows a tile (at most); the defaults of --blocks (blocks per
#: multiprocessor at most), --segw (columns a thread at most) and --pipe (1: two tiles' buffers, copies in flight)
PAIRS, TILE_ROWS, STAGED_BLOCKS, SEGWS, PIPES, SMEMS = (4, 8, 16, 32), (8, 16), "1,2,4,8", "16", "0", "48"
#: relative error (max-norm) past which a configuration is reported wrong, not timed
BOUND = 1e-2


def ints(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``."""
    return tuple(int(v) for v in text.split(","))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--passes", default="fwd,dgrad")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--kernels", default="both", choices=["vec", "staged", "both"],
                    help="which kernel's configurations to sweep (the vectorized, the staged, both)")
    ap.add_argument("--tiles", default="all", choices=["all", "strategy"],
                    help="the staged kernels' pairs and rows: every combination of PAIRS and TILE_ROWS, or the "
                         "strategy's (NHWC_STAGED)")
    ap.add_argument("--blocks", default=STAGED_BLOCKS, help="the staged kernels' blocks per multiprocessor")
    ap.add_argument("--segw", default=SEGWS, help="the staged kernels' columns a thread (at most)")
    ap.add_argument("--pipe", default=PIPES, help="the staged kernels' buffers: 0 one, 1 two (copies in flight)")
    ap.add_argument("--smem", default=SMEMS,
                    help="the staged kernels' KiB of shared memory a block at most (over 48: those whose tile needs "
                         "more, opted in)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    import cupy
    import torch

    from convtune.backend import get_backend
    from convtune.direct import depthwise_nhwc
    from convtune.problem import ConvProblem
    from convtune.strategies.depthwise import NHWC_STAGED, NHWC_VEC
    from convtune.timing import CudaEventTimer
    be = get_backend("cupy")
    timer = CudaEventTimer(warmup=3, repeats=args.repeats)
    torch.backends.cudnn.benchmark = True
    sm_count = torch.cuda.get_device_properties(0).multi_processor_count
    dtype = getattr(torch, args.dtype)
    cl = torch.channels_last
    stream = cupy.cuda.get_current_stream()
    tiles = NHWC_STAGED if args.tiles == "strategy" else tuple(itertools.product(PAIRS, TILE_ROWS))
    staged_axes = tuple(itertools.product(tiles, ints(args.blocks), ints(args.segw), ints(args.pipe),
                                          (kib * 1024 for kib in ints(args.smem))))
    rows = []
    for name in args.layers.split(","):
        n, C, side, k, stride = (*LAYERS[name], 1)[:5]
        pad = k // 2
        out_side = (side + 2 * pad - k) // stride + 1
        x = torch.randn(n, C, side, side, device="cuda").to(dtype).contiguous(memory_format=cl)
        w = torch.randn(C, 1, k, k, device="cuda").to(dtype)
        dy = torch.randn(n, C, out_side, out_side, device="cuda").to(dtype).contiguous(memory_format=cl)
        geometry = ((stride, stride), (pad, pad), (1, 1), False, (0, 0), C)
        conv = dict(stride=stride, padding=pad, groups=C)

        def pytorch(mask, a=x, b=w, g=dy):
            return torch.ops.aten.convolution_backward(g, a, b, None, *geometry, mask)
        # each pass: (its operands a, b, its result's shape and format, PyTorch's call, the float64 reference)
        d = {t: t.double() for t in (x, w, dy)}
        passes = {
            "fwd": (x, w, dy.shape, cl, lambda: torch.nn.functional.conv2d(x, w, **conv),
                    torch.nn.functional.conv2d(d[x], d[w], **conv)),
            "dgrad": (dy, w, x.shape, cl, lambda: pytorch([True, False, False]),
                      torch.nn.grad.conv2d_input(x.shape, d[w], d[dy], **conv)),
            "wgrad": (x, dy, w.shape, torch.contiguous_format, lambda: pytorch([False, True, False]),
                      torch.nn.grad.conv2d_weight(d[x], w.shape, d[dy], **conv)),
        }
        for pass_ in args.passes.split(","):
            a, b, shape, fmt, native, want = passes[pass_]
            p = ConvProblem.make(batch=n, in_channels=C, out_channels=C, groups=C, input_size=(side, side),
                                 kernel_size=k, padding=pad, stride=stride, dtype=args.dtype, layout="channels_last",
                                 pass_=pass_)
            out = torch.empty(shape, device="cuda", dtype=dtype).contiguous(memory_format=fmt)
            scale = float(want.abs().max())
            torch_us = timer(native, be).median_s * 1e6
            results = {}

            def measure(label, conv):
                ws = torch.empty(max(1, conv.workspace), device="cuda", dtype=torch.uint8)

                def run():
                    conv.launch(a.data_ptr(), b.data_ptr(), out.data_ptr(), stream, ws.data_ptr())
                out.zero_()
                run()
                torch.cuda.synchronize()
                error = float((out.double() - want).abs().max()) / scale
                us = timer(run, be).median_s * 1e6 if error <= BOUND else None
                results[label] = {"us": us, "error": error}
            if depthwise_nhwc.tiled_reason(p, 4) is None:
                measure("nhwc-tiled r4", depthwise_nhwc.NhwcDepthwiseConv(cupy, p, 256, sm_count, 4, tiled=True))
            else:  # (strided: the plain kernel, the strategy's r4)
                measure("nhwc r4", depthwise_nhwc.NhwcDepthwiseConv(cupy, p, 256, sm_count, 4))
            staged = {}
            for (pairs, th), per_sm, segw, pipe, smem in staged_axes:
                if args.kernels in ("staged", "both") and depthwise_nhwc.staged_reason(p, pairs, th, segw, pipe,
                                                                                       smem) is None:
                    tile = depthwise_nhwc.staged_tile(p, pairs, th, segw, pipe, smem)
                    if not depthwise_nhwc.opts_in_for(tile, smem):
                        continue  # (the same tile as in 48 KiB)
                    label = (f"staged p{pairs} th{tile.th} w{tile.segw} b{per_sm}" + (" pipe" if pipe else "")
                             + (f" {tile.shared // 1024}K" if tile.shared > depthwise_nhwc.SMEM_LIMIT else ""))
                    staged.setdefault(label, (th, pairs, per_sm, segw, bool(pipe), smem))

            def build(config, p=p):
                th, pairs, per_sm, segw, pipe, smem = config
                return depthwise_nhwc.NhwcDepthwiseConv(cupy, p, 0, sm_count, th, staged=pairs, blocks_per_sm=per_sm,
                                                        segw=segw, pipe=pipe, smem=smem)
            with ThreadPoolExecutor(16) as pool:  # (NVRTC's compiles, in parallel)
                built = dict(zip(staged, pool.map(build, staged.values())))
            for label, conv in built.items():
                measure(label, conv)
            for v, threads, r, per_sm in itertools.product(VECTORS, THREADS, ROWS, BLOCKS_PER_SM):
                if args.kernels == "staged" or depthwise_nhwc.vec_reason(p, v) is not None:
                    continue
                label = f"vec{v} t{threads} r{r} b{per_sm}" + (" *" if (v, threads) in NHWC_VEC and r == 4 and
                                                                   per_sm == depthwise_nhwc.VEC_BLOCKS_PER_SM else "")
                measure(label, depthwise_nhwc.NhwcDepthwiseConv(cupy, p, threads, sm_count, r, vec=v,
                                                                 blocks_per_sm=per_sm))
            timed = {label: r for label, r in results.items() if r["us"] is not None}
            wrong = sorted(label for label, r in results.items() if r["us"] is None)
            ranked = sorted(timed.items(), key=lambda kv: kv[1]["us"])
            print(f"== {name} {pass_} ({args.dtype} channels_last, batch {n}, {C} x {side}x{side}, {k}x{k}, stride "
                  f"{stride}): "
                  f"PyTorch {torch_us:.1f} us" + (f"; WRONG: {', '.join(wrong)}" if wrong else ""), flush=True)
            for label, r in ranked[:6] + [kv for kv in ranked[6:] if kv[0].endswith("*") or kv[0].startswith("nhwc")]:
                print(f"   {label:24s} {r['us']:8.1f} us  {torch_us / r['us']:5.2f}x PyTorch's speed  "
                      f"error {r['error']:.1e}", flush=True)
            rows.append({"layer": name, "pass": pass_, "dtype": args.dtype, "torch_us": torch_us,
                         "configs": results})
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
