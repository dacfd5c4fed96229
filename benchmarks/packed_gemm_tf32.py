"""The packed layout's complex GEMM on TF32 tensor cores (mma.sync m16n8k8, convtune.fft.freqmajor's tf32 form)
against the float32 packed kernel, GPU: fbfft-L2's three products and an odd-sized case; relative error against a
float64 product on three frequencies, device time after an L2 flush (median of 30).

    python3 benchmarks/packed_gemm_tf32.py
"""
import statistics, numpy, cupy
from convtune.fft import freqmajor as fm

k = fm._packed_tf32_kernel()
SMEM = fm._PGT_SMEM

L2 = cupy.empty(64 << 20, dtype=cupy.uint8)
def ev(fn, reps=30):
    fn(); cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        L2.fill(1)
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(); fn(); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e))
    return statistics.median(ts)

rng = cupy.random.default_rng(0)
def spec(rows, cols, F):
    return (rng.standard_normal((rows, cols, F), dtype=cupy.float32)
            + 1j * rng.standard_normal((rows, cols, F), dtype=cupy.float32)).astype(cupy.complex64)

base = fm._packed_gemm_kernel()
i32, i64 = numpy.int32, numpy.int64
for label, (Bn, Cc, Kc, F) in {"fbfft-L2": (128, 64, 128, 2112), "odd": (37, 21, 45, 203)}.items():
    X, W, DY = spec(Bn, Cc, F), spec(Kc, Cc, F), spec(Bn, Kc, F)
    cases = {
        "fwd":   (X, W, Bn, Kc, Cc, (Cc, 1, 1, Cc), 0, 1, Kc),
        "dgrad": (DY, W, Bn, Cc, Kc, (Kc, 1, Cc, 1), 0, 0, Cc),
        "wgrad": (DY, X, Kc, Cc, Bn, (1, Kc, Cc, 1), 1, 0, Cc),
    }
    for pass_, (A, B, M, N, K, (sAm, sAk, sBk, sBn), ca, cb, cc) in cases.items():
        tiles = ((M + 63) // 64) * ((N + 63) // 64)
        grid = (tiles * ((F + 3) // 4),)
        args = lambda C: (A, B, C, i32(M), i32(N), i32(K), i32(F), i64(sAm), i64(sAk), i64(sBk), i64(sBn), i64(cc), i64(1),
                          i32(ca), i32(cb), numpy.float32(0.5), i32(0))
        C0, C1 = cupy.zeros((M, N, F), cupy.complex64), cupy.full((M, N, F), numpy.nan, cupy.complex64)
        run0 = lambda: base(grid, (256,), args(C0))
        run1 = lambda: k(grid, (256,), args(C1), shared_mem=SMEM)
        t0, t1 = ev(run0), ev(run1)
        # float64 reference on a few frequencies
        fs = [0, F // 3, F - 1]
        A64 = cupy.asnumpy(A).astype(numpy.complex128); B64 = cupy.asnumpy(B).astype(numpy.complex128)
        def mat(arr, rows, cols, sr, sc, conj):  # (rows x cols) per frequency from the packed memory
            flat = arr.reshape(-1, F)
            idx = numpy.arange(rows)[:, None] * sr + numpy.arange(cols)[None, :] * sc
            m = flat[idx]  # rows x cols x F
            return numpy.conj(m) if conj else m
        Am, Bm = mat(A64, M, K, sAm, sAk, ca), mat(B64, K, N, sBk, sBn, cb)
        err0 = err1 = 0.0
        for f in fs:
            ref = 0.5 * Am[:, :, f] @ Bm[:, :, f]
            g0, g1 = cupy.asnumpy(C0[:, :, f]), cupy.asnumpy(C1[:, :, f])
            err0 = max(err0, numpy.linalg.norm(g0 - ref) / numpy.linalg.norm(ref))
            err1 = max(err1, numpy.linalg.norm(g1 - ref) / numpy.linalg.norm(ref))
        print(f"{label} {pass_}: fp32 packed {t0:.3f} ms (err {err0:.1e}); tf32 mma {t1:.3f} ms (err {err1:.1e}) "
              f"nan {int(cupy.isnan(C1.view(cupy.float32)).sum())}", flush=True)
