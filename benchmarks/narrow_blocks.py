"""The narrow product's blocks, timed: each pass's product of a layer at the block :func:`convtune.fft.narrow.block`
gives it, at the block earlier versions gave it (``narrow._block_before``) and at other blocks, on the packed layout's
spectra (random values), each checked against the first.

The three products of a layer with ``n`` images, ``C`` input and ``K`` output channels at one transform size: the
forward pass's (images x K, reducing over C), backward-data's (images x C, reducing over K) and the filter
gradient's (K x C, reducing over the images). Each is timed with the bench timer (L2 flushed, median), with the bytes
it must move at least and the bandwidth that makes.

    python3 benchmarks/narrow_blocks.py [--layers dense-k31,rgb-b32] [--blocks 8x8x32,4x4x32] [-o blocks.json]
"""

from __future__ import annotations

import argparse
import json

import numpy

#: name -> (images, input channels, output channels, transform size)
LAYERS = {
    "dense-k31": (8, 64, 64, (80, 80)),
    "dense-k27-p96-c48": (8, 48, 48, (112, 112)),
    "dense-k25-p128-c32": (8, 32, 32, (140, 144)),
    "dense-k35-p256-c16": (4, 16, 16, (280, 288)),
    "dense-b16-c64": (16, 64, 64, (80, 80)),
    "dense-b12-c40": (12, 40, 40, (96, 96)),
    "rgb-b32": (32, 3, 64, (240, 240)),
    "c16-b64": (64, 16, 96, (64, 64)),
}
#: the other blocks timed (RM, RN, threads per block)
BLOCKS = [(8, 8, 32), (8, 4, 32), (4, 8, 32), (4, 4, 32), (8, 4, 128), (4, 8, 128), (8, 8, 128)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default=",".join(LAYERS))
    ap.add_argument("--blocks", help="the other blocks, RMxRNxTHREADS comma-separated (default: BLOCKS)")
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("-o", "--output")
    args = ap.parse_args(argv)
    import cupy

    from convtune.backend import get_backend
    from convtune.fft import narrow
    from convtune.fft.arrayops import CupyOps
    from convtune.timing import CudaEventTimer
    be = get_backend("cupy")
    timer = CudaEventTimer(warmup=3, repeats=args.repeats)
    others = [tuple(int(v) for v in b.split("x")) for b in args.blocks.split(",")] if args.blocks else BLOCKS
    rows = []
    for name in args.layers.split(","):
        n, C, K, sizes = LAYERS[name]
        ops = CupyOps(cupy, sizes, packed=True, narrow=True)
        rng = cupy.random.RandomState(0)

        def spectrum(*shape):
            s = ops.empty_spectrum(*shape)
            s[...] = (rng.standard_normal(s.shape) + 1j * rng.standard_normal(s.shape)).astype(numpy.complex64)
            return s
        xs, ws, ys = spectrum(n, C), spectrum(K, C), spectrum(n, K)
        # (pass, A, op A, B, op B, result's rows and columns)
        products = [("fwd", xs, "N", ws, "C", (n, K)), ("dgrad", ys, "N", ws, "N", (n, C)),
                    ("wgrad", ys, "C", xs, "N", (K, C))]
        print(f"== {name}: {n} images, {C} -> {K} channels, {'x'.join(map(str, sizes))} transforms "
              f"({ops.F} frequencies)", flush=True)
        for pass_, a, op_a, b, op_b, shape in products:
            out = ops.empty_spectrum(*shape)
            chosen = {}

            def run(blocks):
                ops.narrow_blocks = blocks
                ops.gemm(a, op_a, b, op_b, out, 0.5)
            m, cols = shape
            current, before = narrow.block(m, cols), narrow._block_before(m, cols)
            blocks = list(dict.fromkeys([current, before] + [(min(r, m), min(c, cols), t) for r, c, t in others]))
            run(current)
            reference = out.copy()
            scale = float(cupy.abs(reference).max())
            k = a.shape[1] if op_a == "C" else a.shape[2]
            nbytes = 8 * ops.F * (a.shape[1] * a.shape[2] + b.shape[1] * b.shape[2] + m * cols)
            for blk in blocks:
                out[...] = 0
                run(blk)
                error = float(cupy.abs(out - reference).max()) / scale
                us = timer(lambda: run(blk), be).median_s * 1e6  # noqa: B023
                chosen["x".join(map(str, blk))] = {"us": us, "error": error}
            cur = chosen["x".join(map(str, current))]["us"]
            best = min(chosen.items(), key=lambda kv: kv[1]["us"])
            print(f"   {pass_:5s} {m}x{cols} reducing {k}: now {'x'.join(map(str, current))} {cur:7.1f} us "
                  f"({nbytes / cur / 1e3:.0f} GB/s), before {'x'.join(map(str, before))} "
                  f"{chosen['x'.join(map(str, before))]['us']:7.1f} us, best {best[0]} {best[1]['us']:7.1f} us",
                  flush=True)
            rows.append({"layer": name, "pass": pass_, "m": m, "n": cols, "k": k, "frequencies": ops.F,
                         "now": "x".join(map(str, current)), "before": "x".join(map(str, before)),
                         "bytes": nbytes, "blocks": chosen})
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
