"""The packed layout's product kernels (convtune.fft.packedgemm: the float32 one and the TF32 tensor-core one) with
their CUDA source run on the CPU (tests/cuda_cpu.py), against float64 products: every op pair the passes use,
partial tiles of rows, columns, the reduction and the frequencies, and accumulation. The CPU has no asynchronous copies nor tensor cores, so the test stands in for them: a copy done at once (what
cp.async's result is once waited for) and m16n8k8's sum over a warp's fragments in its documented register layout,
on TF32-rounded operands. The GPU tests (test_narrow.py) run the real instructions; these guard the indexing and the
double buffer's synchronisation in CI."""

import numpy
import pytest

from convtune.fft import packedgemm as fm

# stand-ins for the instructions the CPU lacks (cuda_cpu's prelude gives linear_thread and the per-warp barriers)
_STANDINS = r"""
#define CONVTUNE_CPU_STANDINS
static inline void convtune_cp8(float2* dst, const float2* src, bool ok) { *dst = ok ? *src : make_float2(0.f, 0.f); }
static inline void convtune_cp_commit() {}
template <int N> static inline void convtune_cp_wait() {}
static inline unsigned convtune_tf32(float v) {  // round to nearest (ties away) at 10 mantissa bits, as cvt.rna
    unsigned u = __float_as_uint(v);
    if ((u & 0x7f800000u) != 0x7f800000u) u += 0x1000u;
    return u & 0xffffe000u;
}
static float g_fragments[32][32][6];  // per warp and lane: a0..a3, b0, b1
static inline void convtune_mma_tf32(float* c, const unsigned* a, const unsigned* b) {
    // D = A B + C, A 16 x 8 (lane 4g + t holds (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)), B 8 x 8 (lane 4g + t
    // holds (t, g), (t + 4, g)), C and D 16 x 8 (lane 4g + t holds (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1))
    const int me = linear_thread(), lane = me & 31, w = me >> 5;
    for (int q = 0; q < 4; ++q) g_fragments[w][lane][q] = __uint_as_float(a[q]);
    g_fragments[w][lane][4] = __uint_as_float(b[0]);
    g_fragments[w][lane][5] = __uint_as_float(b[1]);
    g_warps[w]->arrive_and_wait();
    const int g = lane >> 2, t = lane & 3;
    float d[4];
    for (int q = 0; q < 4; ++q) {
        const int row = g + (q >> 1) * 8, col = 2 * t + (q & 1);
        float s = 0.f;
        for (int k = 0; k < 8; ++k)
            s += g_fragments[w][(row & 7) * 4 + (k & 3)][(row >> 3) + 2 * (k >> 2)]
                 * g_fragments[w][col * 4 + (k & 3)][4 + (k >> 2)];
        d[q] = c[q] + s;
    }
    g_warps[w]->arrive_and_wait();
    for (int q = 0; q < 4; ++q) c[q] = d[q];
}
"""

# (label, source, kernel name, dynamic shared memory, TF32?)
_KERNELS = {
    "float32": (fm.PACKED_GEMM_SOURCE, "convtune_packed_cgemm", 0, False),
    "tf32": (fm.PACKED_TF32_SOURCE, "convtune_packed_cgemm_tf32", fm.PGT_SMEM, True),
}


def _launch(label, a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate):
    """Through the packed product's own launch (packedgemm.gemm: grid, threads, arguments), its kernels compiled
    for the CPU."""
    import cuda_cpu
    getters = {}
    for which, (source, name, _smem, _tf32) in _KERNELS.items():
        getters[which] = lambda source=source, name=name: cuda_cpu.kernels(_STANDINS + source, [name])[name]
    saved = fm.packed_gemm_kernel, fm.packed_tf32_kernel
    fm.packed_gemm_kernel, fm.packed_tf32_kernel = getters["float32"], getters["tf32"]
    try:
        fm.gemm(a, b, c, m, n, k, F, strides, conj_a, conj_b, alpha, accumulate, tf32=_KERNELS[label][3])
    finally:
        fm.packed_gemm_kernel, fm.packed_tf32_kernel = saved


def _case(ops, mnk, F, seed):
    """Packed operands (rows, cols, F) of op(a) (m x k) and op(b) (k x n), their strides in rows of F as the
    dispatch hands them (row and column strides of op(a), then op(b)), and the float64 product per frequency."""
    m, n, k = mnk
    rng = numpy.random.default_rng(seed)

    def packed(rows, cols):
        return (rng.standard_normal((rows, cols, F)) + 1j * rng.standard_normal((rows, cols, F))).astype(numpy.complex64)
    a = packed(*((m, k) if ops[0] == "N" else (k, m)))
    b = packed(*((k, n) if ops[1] == "N" else (n, k)))
    s_am, s_ak = (k, 1) if ops[0] == "N" else (1, m)
    s_bk, s_bn = (n, 1) if ops[1] == "N" else (1, k)
    op = {"N": lambda x: x, "C": lambda x: numpy.conj(x.transpose(1, 0, 2))}
    pa, pb = op[ops[0]](a.astype(numpy.complex128)), op[ops[1]](b.astype(numpy.complex128))
    product = numpy.einsum("ikf,kjf->ijf", pa, pb)
    return a, b, (s_am, s_ak, s_bk, s_bn), product


@pytest.mark.parametrize("label", list(_KERNELS))
@pytest.mark.parametrize("ops, mnk, F, accumulate", [
    (("N", "C"), (37, 70, 21), 7, False),  # partial tiles everywhere, two column tiles
    (("N", "N"), (70, 5, 9), 6, True),     # two row tiles, a reduction shorter than a step
    (("C", "N"), (20, 33, 40), 9, False),  # a conjugated first operand, several steps of the reduction
])
def test_packed_kernels_against_float64(label, ops, mnk, F, accumulate):
    m, n, k = mnk
    a, b, strides, product = _case(ops, mnk, F, 3)
    rng = numpy.random.default_rng(4)
    before = (rng.standard_normal((m, n, F)) + 1j * rng.standard_normal((m, n, F))).astype(numpy.complex64)
    c = before.copy()
    _launch(label, a, b, c, m, n, k, F, strides + (n, 1), ops[0] == "C", ops[1] == "C", 0.5, accumulate)
    want = 0.5 * product + (before if accumulate else 0)
    err = numpy.linalg.norm(c - want) / numpy.linalg.norm(0.5 * product)
    tf32 = _KERNELS[label][3]
    assert err <= (1e-3 if tf32 else 1e-6), err
    if tf32:
        assert err >= 1e-6, err  # (the stand-in rounds to TF32: this is not a float32 product)
