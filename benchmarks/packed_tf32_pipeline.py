"""A variant of the packed layout's TF32 product (convtune.fft.freqmajor's ``convtune_packed_cgemm_tf32``, double-
buffered, one block per work item) with its loads STAGES - 1 steps ahead of its products through a block's whole
sequence of (work item, k step), persistent or not, against convtune's kernel, GPU (the 29th session's, which
found every variant slower, as the 22nd had; the variant's source is here, not in convtune):

1. fbfft-L2's three products alone: each variant's device time after an L2 flush (median of 30), the bytes it must
   move at that time, its registers and spills, and its relative error against a float64 product on three
   frequencies; every variant (STAGES, KT) with one block per work item and with one block per SM (persistent).
2. fbfft-L2's bfloat16 channels_last round trip with kept spectra in tf32 math
   (`fft-trip[sizes=64x64,packed,own,tf32]`, on 16-bit memory as the drop-in hands it over) with convtune's kernel
   and with several variants, timed whole in turns (rounds of 10, median), PyTorch bfloat16 channels_last's autograd
   round trip (cudnn.benchmark on) timed first in the same process.

    source scripts/gpu-env.sh; python3 benchmarks/packed_tf32_pipeline.py
"""
import functools, statistics
import numpy, cupy, torch
from convtune.fft import freqmajor as fm


# The TF32 product with a deeper pipeline (the variant measured here; not in convtune): each block loops over
# (tile, 4 frequencies) work items, `blockIdx.x`, `blockIdx.x + gridDim.x`, ..., and its loads run STAGES - 1 steps of
# KT reductions ahead of its products through the whole sequence of (work item, k step), the next item's first steps
# included, so the block's memory traffic does not stop at the end of a tile nor while its results are written
# (those go through a shared-memory slice of their own). Launched with one block per work item it is
# freqmajor's kernel with STAGES buffers; with one block per SM it is persistent.
def pgt_smem(stages: int, kt: int) -> int:
    """Dynamic shared memory of the pipelined TF32 product: ``stages`` buffers of both operands' ``kt`` rows, then
    the 16-row slice of results the epilogue writes through."""
    return (stages * 2 * kt * _PGT_ROW + 16 * fm._PG_TILE * fm._PG_FREQS) * 8


_PGT_ROW = fm._PG_TILE * fm._PG_FREQS + (fm._PG_TILE // 8) * fm._PG_FREQS + 1  # float2 of one k row of an operand's buffer

_PACKED_TF32_PIPELINED_SOURCE = fm._PACKED_COMMON + r"""
#define SROWS_T (MT * FT + (MT / 8) * FT + 1)  // +1: a fragment's 4 k rows fall in different banks
#define STAGE_ELEMS (2 * KT * SROWS_T)         // float2 of one stage: A's KT rows, then B's
extern "C" __global__ void __launch_bounds__(256, 1)
convtune_packed_cgemm_tf32_pipelined(const float2* __restrict__ A, const float2* __restrict__ B,
                                     float2* __restrict__ C, int M, int N, int K, int F, long long sAm,
                                     long long sAk, long long sBk, long long sBn, long long sCm, long long sCn,
                                     int conjA, int conjB, float alpha, int accumulate)
{
    extern __shared__ float2 smem[];
    float2* cs = smem + STAGES * STAGE_ELEMS;  // the epilogue's slice: 16 rows x 64 columns x 4 frequencies
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int fw = warp >> 1, nh = warp & 1;  // the warp's frequency and half of the 64 columns
    const int mtiles = (M + MT - 1) / MT, tiles = mtiles * ((N + MT - 1) / MT);
    const int items = tiles * ((F + FT - 1) / FT), ksteps = (K + KT - 1) / KT;
    const float sa = conjA ? -1.f : 1.f, sb = conjB ? -1.f : 1.f;
    const int lf = tid & 3, lr = (tid >> 2) & 63;
    // the loads' place in this block's sequence of (work item, k step), which runs ahead of the products'
    int lw = blockIdx.x, lk = 0;
    auto issue_next = [&](int slot) {
        if (lw < items) {
            const int tile = lw % tiles, f = (lw / tiles) * FT + lf;
            const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT, k0 = lk * KT;
            float2* as = smem + slot * STAGE_ELEMS;
            float2* bs = as + KT * SROWS_T;
            const bool okm = f < F && m0 + lr < M, okn = f < F && n0 + lr < N;
#pragma unroll
            for (int j = 0; j < KT; ++j) {
                const int kk = k0 + j;
                const bool oka = okm && kk < K, okb = okn && kk < K;
                convtune_cp8(&as[j * SROWS_T + SIDX(lr, lf)],
                    oka ? A + ((long long)(m0 + lr) * sAm + (long long)kk * sAk) * F + f : A, oka);
                convtune_cp8(&bs[j * SROWS_T + SIDX(lr, lf)],
                    okb ? B + ((long long)kk * sBk + (long long)(n0 + lr) * sBn) * F + f : B, okb);
            }
            if (++lk == ksteps) { lk = 0; lw += gridDim.x; }
        }
        convtune_cp_commit();  // one group a step, empty past the end: the count stays exact
    };
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) issue_next(s);
    int slot = 0;
    for (int w = blockIdx.x; w < items; w += gridDim.x) {
        const int tile = w % tiles, f0 = (w / tiles) * FT;
        const int m0 = (tile % mtiles) * MT, n0 = (tile / mtiles) * MT;
        float re[4][4][4], im[4][4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) { re[i][j][q] = 0.f; im[i][j][q] = 0.f; }
        for (int ks = 0; ks < ksteps; ++ks) {
            // this step's group has landed once at most STAGES - 2 newer ones are pending; the barrier also says
            // that every warp is done with the buffer the next load overwrites (the one of the step before)
            convtune_cp_wait<STAGES - 2>();
            __syncthreads();
            issue_next(slot == 0 ? STAGES - 1 : slot - 1);
            const float2* a_s = smem + slot * STAGE_ELEMS;
            const float2* b_s = a_s + KT * SROWS_T;
#pragma unroll
            for (int kc = 0; kc < KT; kc += 8) {
                unsigned ar[4][4], ai[4][4], br[4][2], bi[4][2], nbi[4][2];
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int r = i * 16 + g;
                    const float2* a0 = a_s + (kc + t) * SROWS_T;
                    const float2* a4 = a0 + 4 * SROWS_T;
                    const float2 v0 = a0[SIDX(r, fw)], v1 = a0[SIDX(r + 8, fw)];
                    const float2 v2 = a4[SIDX(r, fw)], v3 = a4[SIDX(r + 8, fw)];
                    ar[i][0] = convtune_tf32(v0.x); ar[i][1] = convtune_tf32(v1.x);
                    ar[i][2] = convtune_tf32(v2.x); ar[i][3] = convtune_tf32(v3.x);
                    ai[i][0] = convtune_tf32(sa * v0.y); ai[i][1] = convtune_tf32(sa * v1.y);
                    ai[i][2] = convtune_tf32(sa * v2.y); ai[i][3] = convtune_tf32(sa * v3.y);
                }
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int n = nh * 32 + j * 8 + g;
                    const float2 w0 = b_s[(kc + t) * SROWS_T + SIDX(n, fw)];
                    const float2 w1 = b_s[(kc + t + 4) * SROWS_T + SIDX(n, fw)];
                    br[j][0] = convtune_tf32(w0.x); br[j][1] = convtune_tf32(w1.x);
                    bi[j][0] = convtune_tf32(sb * w0.y); bi[j][1] = convtune_tf32(sb * w1.y);
                    nbi[j][0] = convtune_tf32(-sb * w0.y); nbi[j][1] = convtune_tf32(-sb * w1.y);
                }
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) {
                        convtune_mma_tf32(re[i][j], ar[i], br[j]);
                        convtune_mma_tf32(re[i][j], ai[i], nbi[j]);
                        convtune_mma_tf32(im[i][j], ar[i], bi[j]);
                        convtune_mma_tf32(im[i][j], ai[i], br[j]);
                    }
            }
            slot = slot == STAGES - 1 ? 0 : slot + 1;
        }
        // the results through the slice, 16 rows at a time, so that 4 adjacent threads write the 4 frequencies of
        // one output (a whole 32-byte sector); the next item's loads are in flight meanwhile
#pragma unroll
        for (int i = 0; i < 4; ++i) {
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    const int row = g + (q >> 1) * 8, col = nh * 32 + j * 8 + 2 * t + (q & 1);
                    cs[(row * 64 + col) * FT + fw] = make_float2(alpha * re[i][j][q], alpha * im[i][j][q]);
                }
            __syncthreads();
#pragma unroll 4
            for (int s = 0; s < 16; ++s) {
                const int e = tid + 256 * s, f = f0 + (e & 3), col = (e >> 2) & 63, row = e >> 8;
                const int m = m0 + i * 16 + row, n = n0 + col;
                if (m < M && n < N && f < F) {
                    float2* out = C + ((long long)m * sCm + (long long)n * sCn) * F + f;
                    float2 v = cs[e];
                    if (accumulate) { v.x += out->x; v.y += out->y; }
                    *out = v;
                }
            }
            __syncthreads();
        }
    }
    convtune_cp_wait<0>();
}
"""


@functools.lru_cache(maxsize=None)
def pipelined_kernel(stages: int, kt: int):
    kernel = cupy.RawKernel(f"#define STAGES {stages}\n#define KT {kt}\n" + _PACKED_TF32_PIPELINED_SOURCE,
                            "convtune_packed_cgemm_tf32_pipelined", options=("--std=c++17",))
    kernel.max_dynamic_shared_size_bytes = pgt_smem(stages, kt)
    return kernel


@functools.lru_cache(maxsize=None)
def sm_count():
    return cupy.cuda.Device().attributes["MultiProcessorCount"]


L2 = cupy.empty(64 << 20, dtype=cupy.uint8)


def ev(fn, reps=30):
    fn(); cupy.cuda.Device().synchronize()
    ts = []
    for _ in range(reps):
        L2.fill(1)
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record(); fn(); e.record(); e.synchronize(); ts.append(cupy.cuda.get_elapsed_time(s, e))
    return statistics.median(ts)


# -- PyTorch's round trip first (before convtune allocates anything) -------------------------------------------------
torch.backends.cudnn.benchmark = True
x = torch.randn(128, 64, 64, 64, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
w = (0.05 * torch.randn(128, 64, 9, 9, device="cuda")).to(torch.bfloat16).contiguous(memory_format=torch.channels_last).requires_grad_()
dy = torch.randn(128, 128, 56, 56, device="cuda").to(torch.bfloat16).contiguous(memory_format=torch.channels_last)


def peer():
    y = torch.nn.functional.conv2d(x, w); y.backward(dy)
peer_ms = ev(peer, 20)
print(f"PyTorch bf16 channels_last round trip: {peer_ms:.3f} ms", flush=True)
del x, w, dy
torch.cuda.empty_cache()

# -- 1. the products alone --------------------------------------------------------------------------------------------
VARIANTS = [(2, 8), (3, 8), (4, 8), (5, 8), (2, 16)]
old = fm._packed_tf32_kernel()
rng = cupy.random.default_rng(0)


def spec(rows, cols, F):
    return (rng.standard_normal((rows, cols, F), dtype=cupy.float32)
            + 1j * rng.standard_normal((rows, cols, F), dtype=cupy.float32)).astype(cupy.complex64)


i32, i64 = numpy.int32, numpy.int64
sms = sm_count()
Bn, Cc, Kc, F = 128, 64, 128, 2112
X, W, DY = spec(Bn, Cc, F), spec(Kc, Cc, F), spec(Bn, Kc, F)
cases = {
    "fwd": (X, W, Bn, Kc, Cc, (Cc, 1, 1, Cc), 0, 1, Kc),
    "dgrad": (DY, W, Bn, Cc, Kc, (Kc, 1, Cc, 1), 0, 0, Cc),
    "wgrad": (DY, X, Kc, Cc, Bn, (1, Kc, Cc, 1), 1, 0, Cc),
}
for pass_, (A, B, M, N, K, (sAm, sAk, sBk, sBn), ca, cb, cc) in cases.items():
    items = ((M + 63) // 64) * ((N + 63) // 64) * ((F + 3) // 4)
    mb = (M * K + K * N + M * N) * F * 8 / 1e6
    A64, B64 = cupy.asnumpy(A).astype(numpy.complex128), cupy.asnumpy(B).astype(numpy.complex128)

    def mat(arr, rows, cols, sr, sc, conj):
        m = arr.reshape(-1, F)[numpy.arange(rows)[:, None] * sr + numpy.arange(cols)[None, :] * sc]
        return numpy.conj(m) if conj else m
    Am, Bm = mat(A64, M, K, sAm, sAk, ca), mat(B64, K, N, sBk, sBn, cb)
    runs = {"convtune": (old, items, fm._PGT_SMEM)}
    for stages, kt in VARIANTS:
        kern = pipelined_kernel(stages, kt)
        runs[f"{stages}x{kt} per item"] = (kern, items, pgt_smem(stages, kt))
        runs[f"{stages}x{kt} persistent"] = (kern, min(items, sms), pgt_smem(stages, kt))
    for label, (kern, blocks, smem) in runs.items():
        C = cupy.full((M, N, F), numpy.nan, cupy.complex64)
        args = (A, B, C, i32(M), i32(N), i32(K), i32(F), i64(sAm), i64(sAk), i64(sBk), i64(sBn), i64(cc), i64(1),
                i32(ca), i32(cb), numpy.float32(0.5), i32(0))
        try:
            t = ev(lambda: kern((blocks,), (256,), args, shared_mem=smem))
        except Exception as e:  # (a variant that does not fit says so and the others go on)
            print(f"fbfft-L2 {pass_} {label}: failed: {e}", flush=True)
            continue
        err = 0.0
        for f in (0, F // 3, F - 1):
            ref = 0.5 * Am[:, :, f] @ Bm[:, :, f]
            err = max(err, numpy.linalg.norm(cupy.asnumpy(C[:, :, f]) - ref) / numpy.linalg.norm(ref))
        at = kern.attributes
        print(f"fbfft-L2 {pass_} {label}: {t:.4f} ms, {mb / t:.0f} GB/s of {mb:.0f} MB, err {err:.1e}, "
              f"nan {int(cupy.isnan(C.view(cupy.float32)).sum())}, regs {at['num_regs']}, "
              f"spill {at['local_size_bytes']} B, grid {blocks}", flush=True)
del X, W, DY
cupy.get_default_memory_pool().free_all_blocks()

# -- 2. the whole round trip -------------------------------------------------------------------------------------------
from convtune.problem import ConvProblem
from convtune.roundtrip import RoundTrip, TripConfig
from convtune import precision

p = ConvProblem.make(batch=128, in_channels=64, out_channels=128, input_size=(64, 64), kernel_size=(9, 9),
                     dtype="bfloat16", layout="channels_last", math="tf32")
trip = RoundTrip(p, TripConfig(sizes=(64, 64), packed=True, own=True, tf32=True), "cupy")
g = cupy.random.default_rng(0)
mk = lambda shape: precision.bits_of(cupy, precision.stored(cupy, g.standard_normal(shape, dtype=cupy.float32), p), p.layout)
xb, wb, dyb = mk(p.x_shape), mk(p.w_shape), mk(p.y_shape)
outs = {}
kernel_of_convtune = fm._packed_tf32_kernel


def use(config):
    """Dispatch the trip's products to ``config``: "convtune" (freqmajor's kernel, one block per item) or
    (STAGES, KT, persistent) of the variant."""
    if config == "convtune":
        fm._packed_tf32_kernel = kernel_of_convtune
        return
    stages, kt, persistent = config
    kern, smem = pipelined_kernel(stages, kt), pgt_smem(stages, kt)

    def launch(grid, block, args, shared_mem):
        kern((min(grid[0], sm_count()) if persistent else grid[0],), block, args, shared_mem=smem)
    fm._packed_tf32_kernel = lambda: launch


def go():
    y, dx, dw = outs["y"], outs["dx"], outs["dw"]
    trip.forward(xb, wb, y); trip.backward_data(dyb, dx); trip.backward_filter(dyb, dw)


configs = ["convtune", (2, 8, False), (3, 8, True), (4, 8, True), (5, 8, True), (2, 16, True), (4, 8, False)]
results = {str(c): [] for c in configs}
reference = None
for c in configs:  # every config's results against convtune's kernel's (the same products, so within TF32's rounding)
    use(c)
    outs.update(y=precision.empty_bits(cupy, p.y_shape, p.layout), dx=precision.empty_bits(cupy, p.x_shape, p.layout),
                dw=precision.empty_bits(cupy, p.w_shape, p.layout))
    go(); cupy.cuda.Device().synchronize()
    got = [(cupy.ascontiguousarray(outs[k]).astype(cupy.uint32) << 16).view(cupy.float32) for k in ("y", "dx", "dw")]
    if reference is None:
        reference = got
    diff = max(float(cupy.abs(a - b).max() / cupy.abs(b).max()) for a, b in zip(got, reference))
    print(f"trip {c}: largest difference from convtune's kernel's results {diff:.1e}", flush=True)
for _ in range(3):
    for c in configs:
        use(c)
        results[str(c)].append(ev(go, 10))
print(f"\nfbfft-L2 bf16 channels_last tf32 round trip (PyTorch {peer_ms:.3f} ms), medians of 3 rounds of 10:")
for c in configs:
    t = statistics.median(results[str(c)])
    print(f"  {str(c):18s} {t:.3f} ms  ({peer_ms / t:.2f}x PyTorch)  rounds {['%.3f' % v for v in results[str(c)]]}")
