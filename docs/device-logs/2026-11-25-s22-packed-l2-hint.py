"""Does an L2 prefetch hint on the packed kernels' cp.async help? (fbfft-L2 products, H100)"""
import statistics, numpy, cupy
from convtune.fft import freqmajor as fm

L2 = cupy.empty(64 << 20, dtype=cupy.uint8)
def ev(fn, reps=30):
    fn(); cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        L2.fill(1)
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(); fn(); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e))
    return statistics.median(ts)

OLD = "cp.async.ca.shared.global [%0], [%1], 8, %2;"
assert OLD in fm._PACKED_COMMON
def build(src, name, hint, smem=None):
    code = src.replace(OLD, f"cp.async.ca.shared.global{hint} [%0], [%1], 8, %2;")
    k = cupy.RawKernel(code, name, options=("--std=c++17",))
    if smem:
        k.max_dynamic_shared_size_bytes = smem
    return k

rng = cupy.random.default_rng(0)
def spec(rows, cols, F):
    return (rng.standard_normal((rows, cols, F), dtype=cupy.float32)
            + 1j * rng.standard_normal((rows, cols, F), dtype=cupy.float32)).astype(cupy.complex64)
i32, i64 = numpy.int32, numpy.int64
Bn, Cc, Kc, F = 128, 64, 128, 2112
X, W, DY = spec(Bn, Cc, F), spec(Kc, Cc, F), spec(Bn, Kc, F)
cases = {"fwd": (X, W, Bn, Kc, Cc, (Cc, 1, 1, Cc), 0, 1, Kc),
         "dgrad": (DY, W, Bn, Cc, Kc, (Kc, 1, Cc, 1), 0, 0, Cc),
         "wgrad": (DY, X, Kc, Cc, Bn, (1, Kc, Cc, 1), 1, 0, Cc)}
for hint in ["", ".L2::64B", ".L2::128B", ".L2::256B"]:
    kf = build(fm._PACKED_GEMM_SOURCE, "convtune_packed_cgemm", hint)
    kt = build(fm._PACKED_TF32_SOURCE, "convtune_packed_cgemm_tf32", hint, fm._PGT_SMEM)
    row = []
    for pass_, (A, B, M, N, K, (sAm, sAk, sBk, sBn), ca, cb, cc) in cases.items():
        grid = ((((M + 63) // 64) * ((N + 63) // 64)) * ((F + 3) // 4),)
        C = cupy.zeros((M, N, F), cupy.complex64)
        args = (A, B, C, i32(M), i32(N), i32(K), i32(F), i64(sAm), i64(sAk), i64(sBk), i64(sBn), i64(cc), i64(1),
                i32(ca), i32(cb), numpy.float32(0.5), i32(0))
        tf = ev(lambda: kf(grid, (256,), args))
        ref = C.copy()
        tt = ev(lambda: kt(grid, (256,), args, shared_mem=fm._PGT_SMEM))
        err = float(cupy.linalg.norm(C - ref) / cupy.linalg.norm(ref))
        row.append(f"{pass_} fp32 {tf:.3f} tf32 {tt:.3f} (tf32 vs fp32 {err:.1e})")
    print(f"hint '{hint or 'none'}': " + "; ".join(row), flush=True)
# the device-wide fetch granularity limit instead (cudaLimitMaxL2FetchGranularity = 0x05)
for gran in (32, 64, 128):
    cupy.cuda.runtime.deviceSetLimit(0x05, gran)
    kf = build(fm._PACKED_GEMM_SOURCE, "convtune_packed_cgemm", "")
    kt = build(fm._PACKED_TF32_SOURCE, "convtune_packed_cgemm_tf32", "", fm._PGT_SMEM)
    A, B, M, N, K, (sAm, sAk, sBk, sBn), ca, cb, cc = cases["fwd"]
    grid = ((((M + 63) // 64) * ((N + 63) // 64)) * ((F + 3) // 4),)
    C = cupy.zeros((M, N, F), cupy.complex64)
    args = (A, B, C, i32(M), i32(N), i32(K), i32(F), i64(sAm), i64(sAk), i64(sBk), i64(sBn), i64(cc), i64(1),
            i32(ca), i32(cb), numpy.float32(0.5), i32(0))
    print(f"limit {gran} (read back {cupy.cuda.runtime.deviceGetLimit(0x05)}): fwd fp32 {ev(lambda: kf(grid, (256,), args)):.3f} "
          f"tf32 {ev(lambda: kt(grid, (256,), args, shared_mem=fm._PGT_SMEM)):.3f}", flush=True)
