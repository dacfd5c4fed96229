"""fft64 rfft/irfft (bfloat16 bits) variants: launch bounds and a stride-1 fast path (fbfft-L2's x and y)."""
import statistics, numpy, cupy
from convtune.fft import fft64 as F

L2 = cupy.empty(64 << 20, dtype=cupy.uint8)
def ev(fn, reps=30):
    fn(); cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        L2.fill(1)
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(); fn(); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e))
    return statistics.median(ts)

SRC = F._SOURCE
fast = (SRC.replace("const bool okc = c % s1 == 0 && c / s1 < n1;", "const bool okc = s1 == 1 ? c < n1 : (c % s1 == 0 && c / s1 < n1);")
           .replace("const long long at = (c / s1) * sW;", "const long long at = (long long)(s1 == 1 ? c : c / s1) * sW;")
           .replace("if (t1 % s1 != 0 || t1 / s1 >= c1) continue;\n        const long long at = (t1 / s1) * sW;",
                    "const int q1 = s1 == 1 ? t1 : t1 / s1;\n        if ((s1 != 1 && t1 % s1 != 0) || q1 >= c1) continue;\n        const long long at = (long long)q1 * sW;"))
assert fast.count("s1 == 1") == 3, fast.count("s1 == 1")
variants = {"as is": SRC, "fast s1": fast}
for minb in (3, 4, 6):
    variants[f"fast s1, bounds (256,{minb})"] = fast.replace("__launch_bounds__(256) \\\nNAME", f"__launch_bounds__(256, {minb}) \\\nNAME")
g = cupy.random.default_rng(0)
x = (g.standard_normal((128, 64, 64, 64), dtype=cupy.float32).view(cupy.uint32) >> 16).astype(cupy.uint16)
spec_x = cupy.empty((128 * 64, F.FREQS), cupy.complex64)
y = cupy.empty((128, 128, 56, 56), cupy.uint16)
spec_y = cupy.empty((128 * 128, F.FREQS), cupy.complex64)
spec_y[...] = 1.0 + 0.5j
tw = F._twiddles(0)
i32, i64 = numpy.int32, numpy.int64
ref_x = ref_y = None
for name, src in variants.items():
    kr = cupy.RawKernel(src, "convtune_rfft64_b16", options=("--std=c++17",))
    ki = cupy.RawKernel(src, "convtune_irfft64_b16", options=("--std=c++17",))
    run_r = lambda: kr((128 * 64,), (256,), (x, spec_x, tw, i32(64), i64(64 * 4096), i64(4096), i64(64), i64(1), i32(64), i32(64), i32(1), i32(1)))
    run_i = lambda: ki((128 * 128,), (256,), (spec_y, y, tw, i32(128), i64(128 * 3136), i64(3136), i64(56), i64(1), i32(0), i32(1), i32(56), i32(0), i32(1), i32(56)))
    tr, ti = ev(run_r), ev(run_i)
    run_r(); run_i(); cupy.cuda.Device().synchronize()
    if ref_x is None:
        ref_x, ref_y = spec_x.copy(), y.copy()
    same = bool((spec_x == ref_x).all()) and bool((y == ref_y).all())
    mb_r = (x.nbytes + spec_x.nbytes) / 1e6; mb_i = (spec_y.nbytes + y.nbytes) / 1e6
    print(f"{name}: rfft {tr:.3f} ms ({mb_r / tr / 1e3:.2f} TB/s, {kr.attributes['num_regs']} regs), irfft {ti:.3f} ms "
          f"({mb_i / ti / 1e3:.2f} TB/s, {ki.attributes['num_regs']} regs); same results {same}", flush=True)
