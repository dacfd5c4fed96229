"""The CUDA source of the real-row FFT kernels (:mod:`convtune.fft.rowconv`'s, and the pieces
:mod:`convtune.fft.planeconv` builds its image kernels from): the row kernels' template and the generators of a
transform's Stockham passes, twiddle tables and shared-memory pads (the device helpers before them all are
:mod:`convtune.fft.pairhelpers`'). What rows and blocks those kernels take (lengths, threads, shared memory, workspace)
and their launches are :mod:`convtune.fft.rowconv`'s."""

from __future__ import annotations

import numpy


#: The radices in the order the passes take them, each as often as it divides what is left; those of
#: :data:`OPTIONAL_RADICES` only where asked for.
RADIX_ORDER = (32, 16, 8, 4, 2, 9, 3)
OPTIONAL_RADICES = (32, 16, 9)


def radices(m: int, large=()) -> tuple[int, ...]:
    """The Stockham passes of an ``m``-point complex FFT (``m`` = 2^a 3^b): radix 16 first where ``large`` holds it,
    then 8, then 4 or 2 for what is left of the power of two, then 9 where ``large`` holds it, then 3.

    >>> radices(4096), radices(16384), radices(72), radices(36), radices(81)
    ((8, 8, 8, 8), (8, 8, 8, 8, 4), (8, 3, 3), (4, 3, 3), (3, 3, 3, 3))
    >>> radices(4096, (16,)), radices(48, (16,)), radices(81, (16, 9)), radices(72, (16, 9))
    ((16, 16, 16), (16, 3), (9, 9), (8, 9))
    >>> radices(16384, (32, 16)), radices(8192, (32, 16)), radices(4096, (32, 16))
    ((32, 32, 16), (32, 32, 8), (32, 32, 4))
    """
    out = []
    for r in RADIX_ORDER:  # (after the 8s at most one 4 or one 2 is left of the power of two)
        while (r not in OPTIONAL_RADICES or r in large) and m % r == 0:
            out.append(r)
            m //= r
    if m != 1:
        raise ValueError(f"{m} is left of the transform length: lengths are 2^a 3^b")
    return tuple(out)


ROW_SOURCE = r"""
#define M {m}
#define L (2 * M)
#define T {t}
#define PADI(i) ((i) + ((i) >> {pad_shift}))

{roots}
// the first pass of a forward transform (radix R0, no twiddles) reads a real row of n samples (element stride s),
// zero-extended to L, as the complex row z[j] = a[2j] + i a[2j+1] straight from memory into its butterflies, and
// writes their results to buf: no pass through shared memory before it
template <int R0, int ITER, typename E> __device__ __forceinline__ void first_pass_from_row(float2* buf, const E* row,
                                                                                          long long s, int n) {{
    constexpr int B = M / R0;
#pragma unroll
    for (int q = 0; q < ITER; ++q) {{
        const int b = threadIdx.x + q * T;
        if (b < B) {{
            float2 v[R0];
            const E* p = row + 2LL * b * s;
#pragma unroll
            for (int r = 0; r < R0; ++r, p += 2LL * B * s) {{
                const int i = 2 * (b + r * B);
                v[r] = make_float2(i < n ? load(p) : 0.f, i + 1 < n ? load(p + s) : 0.f);
            }}
            dft<R0, false>(v);
#pragma unroll
            for (int r = 0; r < R0; ++r) buf[PADI(b * R0 + r)] = v[r];
        }}
    }}
    __syncthreads();
}}

// the last pass of an inverse transform (radix RL, after passes whose radices multiply to B = M / RL) writes its
// butterflies' results straight to the result row: element t (< n, element stride s) is element (t + shift) mod L of
// the inverse's real row, times scale. No barrier after it (buf is only read)
template <int RL, int ITER, typename E, typename Root> __device__ __forceinline__ void last_pass_to_row(
    const float2* buf, E* row, long long s, int n, int shift, float scale, Root root) {{
    constexpr int B = M / RL;
#pragma unroll
    for (int q = 0; q < ITER; ++q) {{
        const int b = threadIdx.x + q * T;
        if (b < B) {{
            float2 v[RL];
#pragma unroll
            for (int r = 0; r < RL; ++r) v[r] = buf[PADI(b + r * B)];
            butterfly<M, RL, true>(v, b, B, root);
#pragma unroll
            for (int r = 0; r < RL; ++r) {{
                int t = 2 * (b + r * B) - shift;
                if (t < 0) t += L;
                if (t < n) store<false>(row + t * s, scale * v[r].x);
                if (++t == L) t = 0;
                if (t < n) store<false>(row + t * s, scale * v[r].y);
            }}
        }}
    }}
}}

// the forward transform of a real row of n samples (element stride s; zero-extended, packed as first_pass_from_row
// reads it) into buf
template <typename E> __device__ __forceinline__ void fft_row(float2* buf, const E* row, long long s, int n) {{
    auto row_slot = [](int, int i) {{ return PADI(i); }};
    const {root_type} root;
{forward_passes}
}}

// the inverse transform of the packed row in buf, its result as last_pass_to_row writes it
template <typename E> __device__ __forceinline__ void ifft_row(float2* buf, E* row, long long s, int n, int shift,
                                                              float scale) {{
    auto row_slot = [](int, int i) {{ return PADI(i); }};
    const {root_type} root;
{inverse_passes}
}}

// frequency pairs (f, M - f) for f = 0 .. M / 2, each taken by one thread in every phase
#define FOR_PAIRS(f) for (int f = threadIdx.x; f <= M / 2; f += T)

// the spectrum of row b = (b / C, b % C) of a (element strides sN, sC, sL; n samples): M + 1 complex64 at out + b (M + 1)
// (a filter's rows: C its channels, sN 0)
template <typename E> __device__ __forceinline__ void rows_spectrum(const E* __restrict__ a, float2* __restrict__ out,
                                                                   int C, long long sN, long long sC, long long sL,
                                                                   int n) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    fft_row(buf, a + ni * sN + c * sC, sL, n);
    float2* o = out + b * (M + 1);
    FOR_PAIRS(f) {{
        float2 af, am;
        unpack(buf[PADI(f)], buf[PADI(f ? M - f : 0)], half_twiddle(f, M), af, am);
        o[f] = af;
        o[M - f] = am;
    }}
}}

// the packed row of the inverse of frequencies q(f), q(M - f) (f = 0 .. M / 2) into buf, then the inverse and the
// result row's n elements (element stride s; the cyclic shift, times scale)
template <typename E, typename Q> __device__ __forceinline__ void inverse_row(float2* buf, E* row, long long s, int n,
                                                                             int shift, float scale, Q q) {{
    FOR_PAIRS(f) {{
        float2 qf, qm, pf, pm;
        q(f, qf, qm);
        pack(qf, qm, half_twiddle(f, M), pf, pm);
        buf[PADI(f)] = pf;
        if (f != 0 && 2 * f != M) buf[PADI(M - f)] = pm;
    }}
    __syncthreads();
    ifft_row(buf, row, s, n, shift, scale);
}}

// kept spectra (a round trip, convtune.roundtrip): forward (CONJ) or backward-data from row b's spectrum sa and the
// filter's; backward-filter from the input's and DY's spectra, block c summing its channel's rows over the batch
template <typename E, bool CONJ> __device__ __forceinline__ void conv_from(
    const float2* __restrict__ sa, const float2* __restrict__ ws, E* __restrict__ out, int C, long long oN, long long oC,
    long long oL, int n_out, int shift, float scale) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    const float2* a = sa + b * (M + 1);
    const float2* w = ws + (long long)c * (M + 1);
    inverse_row(buf, out + ni * oN + c * oC, oL, n_out, shift, scale, [=](int f, float2& qf, float2& qm) {{
        float2 sf = __ldg(w + f), sm = __ldg(w + (M - f));
        if (CONJ) {{ sf = conjf2(sf); sm = conjf2(sm); }}
        qf = cmul(__ldg(a + f), sf);
        qm = cmul(__ldg(a + (M - f)), sm);
    }});
}}
template <typename E> __device__ __forceinline__ void wgrad_from(
    const float2* __restrict__ xs, const float2* __restrict__ dys, E* __restrict__ dw, int N, int C, long long wC,
    long long wK, int K, int shift, float scale) {{
    extern __shared__ float2 buf[];
    const int c = blockIdx.x;
    inverse_row(buf, dw + c * wC, wK, K, shift, scale, [=](int f, float2& qf, float2& qm) {{
        qf = qm = make_float2(0.f, 0.f);
        for (int ni = 0; ni < N; ++ni) {{
            const long long r = ((long long)ni * C + c) * (M + 1);
            qf = cadd(qf, cmul(conjf2(__ldg(dys + r + f)), __ldg(xs + r + f)));
            qm = cadd(qm, cmul(conjf2(__ldg(dys + r + (M - f))), __ldg(xs + r + (M - f))));
        }}
    }});
}}

// forward (CONJ: times conj(W)) and backward-data (times W): block b is row (b / C, b % C) (KEEP: its spectrum also
// written to keep + b (M + 1), for a round trip's filter gradient)
template <typename E, bool CONJ, bool KEEP = false> __device__ __forceinline__ void conv(
    const E* __restrict__ a, const float2* __restrict__ ws, E* __restrict__ out, int C, long long aN, long long aC,
    long long aL, long long oN, long long oC, long long oL, int n_in, int n_out, int shift, float scale,
    float2* __restrict__ keep = nullptr) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    fft_row(buf, a + ni * aN + c * aC, aL, n_in);
    const float2* spec = ws + (long long)c * (M + 1);
    FOR_PAIRS(f) {{
        const int g = f ? M - f : 0;
        const float2 tw = half_twiddle(f, M);
        float2 af, am, pf, pm;
        unpack(buf[PADI(f)], buf[PADI(g)], tw, af, am);
        if constexpr (KEEP) {{ keep[b * (M + 1) + f] = af; keep[b * (M + 1) + (M - f)] = am; }}
        float2 sf = __ldg(spec + f), sm = __ldg(spec + (M - f));
        if (CONJ) {{ sf = conjf2(sf); sm = conjf2(sm); }}
        pack(cmul(af, sf), cmul(am, sm), tw, pf, pm);
        buf[PADI(f)] = pf;
        if (f != 0 && 2 * f != M) buf[PADI(g)] = pm;
    }}
    __syncthreads();
    ifft_row(buf, out + ni * oN + c * oC, oL, n_out, shift, scale);
}}

// backward-filter: block c sums conj(DY) X over the batch. A thread takes the same frequency pairs in every phase
// (f = threadIdx.x + q T). Where its pairs' sums fit its registers (NPAIRS <= 9: rows of up to 16384 samples) it keeps
// them there, and the input row's transform stays in a second shared buffer while DY's is made; else the input
// spectrum and the sums go to ws (per channel: the input row's spectrum, then the sums, M + 1 each)
constexpr int NPAIRS = M / 2 / T + 1;
constexpr bool PAIRS_IN_REGISTERS = NPAIRS <= {max_register_pairs};
template <typename E> __device__ __forceinline__ void wgrad(
    const E* __restrict__ x, const E* __restrict__ dy, E* __restrict__ dw, float2* __restrict__ ws, int N, int C,
    long long xN, long long xC, long long xL, long long yN, long long yC, long long yL, long long wC, long long wK,
    int n_in, int n_out, int K, int shift, float scale) {{
    extern __shared__ float2 buf[];
    const int c = blockIdx.x;
    float2* xs = ws + (long long)c * 2 * (M + 1);
    float2* qs = xs + (M + 1);
    float2 qr[PAIRS_IN_REGISTERS ? NPAIRS : 1][2];
    for (int ni = 0; ni < N; ++ni) {{
        if constexpr (PAIRS_IN_REGISTERS) {{
            float2* xbuf = buf + PADI(M);
            fft_row(xbuf, x + ni * xN + c * xC, xL, n_in);
            fft_row(buf, dy + ni * yN + c * yC, yL, n_out);
#pragma unroll
            for (int q = 0; q < NPAIRS; ++q) {{
                const int f = threadIdx.x + q * T;
                if (f <= M / 2) {{
                    const int g = f ? M - f : 0;
                    const float2 tw = half_twiddle(f, M);
                    float2 df, dm, xf, xm;
                    unpack(xbuf[PADI(f)], xbuf[PADI(g)], tw, xf, xm);
                    unpack(buf[PADI(f)], buf[PADI(g)], tw, df, dm);
                    float2 qf = cmul(conjf2(df), xf), qm = cmul(conjf2(dm), xm);
                    if (ni) {{ qf = cadd(qf, qr[q][0]); qm = cadd(qm, qr[q][1]); }}
                    qr[q][0] = qf; qr[q][1] = qm;
                }}
            }}
            __syncthreads();  // (the next loads overwrite both buffers)
        }} else {{
            fft_row(buf, x + ni * xN + c * xC, xL, n_in);
            FOR_PAIRS(f) {{
                float2 af, am;
                unpack(buf[PADI(f)], buf[PADI(f ? M - f : 0)], half_twiddle(f, M), af, am);
                xs[f] = af; xs[M - f] = am;
            }}
            __syncthreads();  // (the next load overwrites buf)
            fft_row(buf, dy + ni * yN + c * yC, yL, n_out);
            FOR_PAIRS(f) {{  // (each thread reads back what it wrote)
                float2 df, dm;
                unpack(buf[PADI(f)], buf[PADI(f ? M - f : 0)], half_twiddle(f, M), df, dm);
                float2 qf = cmul(conjf2(df), xs[f]), qm = cmul(conjf2(dm), xs[M - f]);
                if (ni) {{ qf = cadd(qf, qs[f]); qm = cadd(qm, qs[M - f]); }}
                qs[f] = qf; qs[M - f] = qm;
            }}
            __syncthreads();
        }}
    }}
#pragma unroll
    for (int q = 0; q < NPAIRS; ++q) {{
        const int f = threadIdx.x + q * T;
        if (f <= M / 2) {{
            float2 pf, pm;
            if constexpr (PAIRS_IN_REGISTERS) pack(qr[q][0], qr[q][1], half_twiddle(f, M), pf, pm);
            else pack(qs[f], qs[M - f], half_twiddle(f, M), pf, pm);
            buf[PADI(f)] = pf;
            if (f != 0 && 2 * f != M) buf[PADI(M - f)] = pm;
        }}
    }}
    __syncthreads();
    ifft_row(buf, dw + c * wC, wK, K, shift, scale);
}}

// both backward passes in one kernel (a round trip's, from the forward pass's kept spectra xs): block c takes channel
// c's rows of dy sample by sample, each transformed once: dx's row from it (times W, the inverse, the crop), and
// conj(DY) X summed over the batch in shared memory beside the row (M + 1 sums; a thread reads back only the pairs it
// wrote: no barrier); then dw's row, the sums' inverse. dy's spectra are neither written nor read back. (Sums in
// registers took 128 registers a thread at 4096 points, one block an SM: benchmarks/kernel_registers.py.)
template <typename E> __device__ __forceinline__ void backward_both(
    const E* __restrict__ dy, const float2* __restrict__ ws, const float2* __restrict__ xs, E* __restrict__ dx,
    E* __restrict__ dw, int N, int C, long long yN, long long yC, long long yL, long long xN, long long xC,
    long long xL, long long wC, long long wK, int n_dy, int n_dx, int K, int shift_d, int shift_w, float scale) {{
    extern __shared__ float2 buf[];
    float2* qs = buf + PADI(M);
    const int c = blockIdx.x;
    const float2* spec = ws + (long long)c * (M + 1);
    for (int ni = 0; ni < N; ++ni) {{
        fft_row(buf, dy + ni * yN + c * yC, yL, n_dy);
        const float2* xk = xs + ((long long)ni * C + c) * (M + 1);
        FOR_PAIRS(f) {{
            const int g = f ? M - f : 0;
            const float2 tw = half_twiddle(f, M);
            float2 df, dm, pf, pm;
            unpack(buf[PADI(f)], buf[PADI(g)], tw, df, dm);
            float2 qf = cmul(conjf2(df), __ldg(xk + f)), qm = cmul(conjf2(dm), __ldg(xk + (M - f)));
            if (ni) {{ qf = cadd(qf, qs[f]); qm = cadd(qm, qs[M - f]); }}
            qs[f] = qf; qs[M - f] = qm;
            pack(cmul(df, __ldg(spec + f)), cmul(dm, __ldg(spec + (M - f))), tw, pf, pm);
            buf[PADI(f)] = pf;
            if (f != 0 && 2 * f != M) buf[PADI(g)] = pm;
        }}
        __syncthreads();
        ifft_row(buf, dx + ni * xN + c * xC, xL, n_dx, shift_d, scale);
        __syncthreads();  // (the next row's load overwrites buf)
    }}
    FOR_PAIRS(f) {{
        float2 pf, pm;
        pack(qs[f], qs[M - f], half_twiddle(f, M), pf, pm);
        buf[PADI(f)] = pf;
        if (f != 0 && 2 * f != M) buf[PADI(M - f)] = pm;
    }}
    __syncthreads();
    ifft_row(buf, dw + c * wC, wK, K, shift_w, scale);
}}

extern "C" __global__ void __launch_bounds__(T, {both_min_blocks}) rowfft_bwd_both(const {e}* dy, const float2* ws, const float2* xs,
    {e}* dx, {e}* dw, int N, int C, long long yN, long long yC, long long yL, long long xN, long long xC, long long xL,
    long long wC, long long wK, int n_dy, int n_dx, int K, int shift_d, int shift_w, float scale)
{{ backward_both<{e}>(dy, ws, xs, dx, dw, N, C, yN, yC, yL, xN, xC, xL, wC, wK, n_dy, n_dx, K, shift_d, shift_w,
                     scale); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_spectrum(const {e}* w, float2* ws, long long sC, long long sK, int K)
{{ rows_spectrum<{e}>(w, ws, gridDim.x, 0, sC, sK, K); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_fwd_keep(const {e}* a, const float2* ws, {e}* out, float2* keep,
    int C, long long aN, long long aC, long long aL, long long oN, long long oC, long long oL, int n_in, int n_out,
    int shift, float scale)
{{ conv<{e}, true, true>(a, ws, out, C, aN, aC, aL, oN, oC, oL, n_in, n_out, shift, scale, keep); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_dgrad_keep(const {e}* a, const float2* ws, {e}* out, float2* keep,
    int C, long long aN, long long aC, long long aL, long long oN, long long oC, long long oL, int n_in, int n_out,
    int shift, float scale)
{{ conv<{e}, false, true>(a, ws, out, C, aN, aC, aL, oN, oC, oL, n_in, n_out, shift, scale, keep); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_rows_spectrum(const {e}* a, float2* out, int C, long long sN,
    long long sC, long long sL, int n)
{{ rows_spectrum<{e}>(a, out, C, sN, sC, sL, n); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_fwd_from(const float2* sa, const float2* ws, {e}* out, int C,
    long long oN, long long oC, long long oL, int n_out, int shift, float scale)
{{ conv_from<{e}, true>(sa, ws, out, C, oN, oC, oL, n_out, shift, scale); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_dgrad_from(const float2* sa, const float2* ws, {e}* out, int C,
    long long oN, long long oC, long long oL, int n_out, int shift, float scale)
{{ conv_from<{e}, false>(sa, ws, out, C, oN, oC, oL, n_out, shift, scale); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_wgrad_from(const float2* xs, const float2* dys, {e}* dw, int N,
    int C, long long wC, long long wK, int K, int shift, float scale)
{{ wgrad_from<{e}>(xs, dys, dw, N, C, wC, wK, K, shift, scale); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_fwd(const {e}* a, const float2* ws, {e}* out, int C, long long aN,
    long long aC, long long aL, long long oN, long long oC, long long oL, int n_in, int n_out, int shift, float scale)
{{ conv<{e}, true>(a, ws, out, C, aN, aC, aL, oN, oC, oL, n_in, n_out, shift, scale); }}
extern "C" __global__ void __launch_bounds__(T) rowfft_dgrad(const {e}* a, const float2* ws, {e}* out, int C,
    long long aN, long long aC, long long aL, long long oN, long long oC, long long oL, int n_in, int n_out, int shift,
    float scale)
{{ conv<{e}, false>(a, ws, out, C, aN, aC, aL, oN, oC, oL, n_in, n_out, shift, scale); }}
extern "C" __global__ void __launch_bounds__(T, {wgrad_min_blocks}) rowfft_wgrad(const {e}* x, const {e}* dy, {e}* dw, float2* ws, int N,
    int C, long long xN, long long xC, long long xL, long long yN, long long yC, long long yL, long long wC,
    long long wK, int n_in, int n_out, int K, int shift, float scale)
{{ wgrad<{e}>(x, dy, dw, ws, N, C, xN, xC, xL, yN, yC, yL, wC, wK, n_in, n_out, K, shift, scale); }}
"""


#: Transform lengths up to this many points read each butterfly's first twiddle from a table (:func:`roots_source`;
#: 32 KiB of float2 for hyena-long-dw's 4096-point rows) instead of computing it by sincospif, whose integer and
#: float work the first profile found in every butterfly (the row kernels were issue-bound, their integer pipe the
#: busiest). Longer transforms keep sincospif.
MAX_TABLE = 8192


def root_type(n: int) -> str:
    """The C++ type giving an ``n``-point transform's twiddles: ``RootTable<n>``'s table or ``ChainRoots``."""
    return f"RootTable{n}" if n <= MAX_TABLE else "ChainRoots"


def roots_source(n: int) -> str:
    """C++ for :func:`root_type` ``(n)``: a table of exp(-2 pi i j / n), j < n, rounded to float32 from float64, and
    the functor that reads it through the read-only cache (empty for ``ChainRoots``)."""
    if n > MAX_TABLE:
        return ""
    w = numpy.exp(-2j * numpy.pi * numpy.arange(n) / n).astype(numpy.complex64)
    text = lambda x: numpy.format_float_scientific(x, unique=True, trim="0") + "f"  # noqa: E731 (shortest float32)
    values = ",".join(f"{{{text(z.real)},{text(z.imag)}}}" for z in w)
    return (f"__device__ const float2 ROOTS{n}[{n}] = {{{values}}};\n"
            f"struct RootTable{n} {{ static constexpr bool TABLE = true;\n"
            f"    __device__ __forceinline__ float2 operator()(int j) const {{ return __ldg(ROOTS{n} + j); }} }};\n")


def butterflies_a_thread(n: int, r: int, count: int, threads_: int) -> int:
    """The butterflies each of ``threads_`` threads takes in a radix-``r`` pass over ``count`` ``n``-point transforms
    (a ``stockham_pass``'s ITER)."""
    return -(-count * (n // r) // threads_)


def stockham_calls(n: int, count: int, threads_: int, slot: str, count_expr: str | None = None,
                   root: str = "root", large=(), inv: str = "INV", passes: slice = slice(None)) -> str:
    """The ``stockham_pass`` calls of an ``n``-point FFT of up to ``count`` transforms (``count_expr``: the runtime
    count, default ``count``) by ``threads_`` threads, points placed by the lambda named ``slot``, twiddles from the
    functor named ``root`` (of :func:`root_type` ``(n)``), the radices of ``large`` (:func:`radices`) where they
    divide it; the direction ``inv`` (a C++ expression), and of the passes those of ``passes`` (a slice)."""
    steps, ns = [], 1
    for r in radices(n, large):
        steps.append((r, ns))
        ns *= r
    return "\n".join(f"    stockham_pass<{n}, {r}, {inv}, {threads_}, {butterflies_a_thread(n, r, count, threads_)}>"
                     f"(buf, {count_expr or count}, {ns}, {slot}, {root});" for r, ns in steps[passes])


def pad_shift(m: int, large=()) -> int:
    """Shared memory has a pad after every ``2 ** pad_shift(m, large)`` points of a row (:data:`PADI` in the source):
    as many as the first pass's radix (8, 16 or 32), whose butterflies write their points ``radix`` apart, so that a
    half-warp's writes fall on 16 distinct pairs of banks (radix 32's writes into a pad after every 8 points hit 4
    pairs, a 4-way conflict); 8 for smaller radices. :func:`convtune.fft.rowconv.smem_bytes` counts a pad every 8
    points, the most this gives."""
    first = radices(m, large)[0]
    return {16: 4, 32: 5}.get(first, 3)


def row_passes(m: int, threads_: int, large=()) -> tuple[str, str]:
    """The forward and the inverse transform's passes of an ``m``-point row by ``threads_`` threads (radices
    :func:`radices` ``(m, large)``): the forward's first pass reads the row (``first_pass_from_row``), the inverse's
    last writes the result (``last_pass_to_row``), and the passes between are ``stockham_pass`` calls."""
    rs = radices(m, large)
    first = f"    first_pass_from_row<{rs[0]}, {butterflies_a_thread(m, rs[0], 1, threads_)}>(buf, row, s, n);"
    last = (f"    last_pass_to_row<{rs[-1]}, {butterflies_a_thread(m, rs[-1], 1, threads_)}>(buf, row, s, n, shift, "
            f"scale, root);")
    forward = [first, stockham_calls(m, 1, threads_, "row_slot", large=large, inv="false", passes=slice(1, None))]
    inverse = [stockham_calls(m, 1, threads_, "row_slot", large=large, inv="true", passes=slice(None, -1)), last]
    return "\n".join(filter(None, forward)), "\n".join(filter(None, inverse))
