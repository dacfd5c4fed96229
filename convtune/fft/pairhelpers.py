"""Device code that the real-row transforms (:mod:`convtune.fft.rowsource`) and the image transforms
(:mod:`convtune.fft.planesource`) share, whatever their lengths: the helpers every one of their kernel sources starts
with."""

from __future__ import annotations

from .fft64 import DEVICE_HELPERS

#: Device code of the real-row transforms that does not depend on the row length: 2- and 4-point DFTs beside
#: :data:`convtune.fft.fft64.DEVICE_HELPERS`' 8-point one, the half-length twiddle, and the unpacking (``unpack``) and
#: packing (``pack``) of a frequency pair (``rowmodel._unpack``, ``rowmodel._pack``). Shared with :mod:`convtune.fft.planeconv`.
PAIR_HELPERS = r"""
template <bool INV> __device__ __forceinline__ void dft2(float2* a) {
    const float2 b = a[1];
    a[1] = csub(a[0], b);
    a[0] = cadd(a[0], b);
}
template <bool INV> __device__ __forceinline__ void dft4(float2* a) {
    const float2 b0 = cadd(a[0], a[2]), b1 = csub(a[0], a[2]), b2 = cadd(a[1], a[3]), b3 = rot<INV>(csub(a[1], a[3]));
    a[0] = cadd(b0, b2); a[1] = cadd(b1, b3); a[2] = csub(b0, b2); a[3] = csub(b1, b3);
}
template <bool INV> __device__ __forceinline__ void dft3(float2* a) {
    const float h = 0.86602540378443865f;  // sqrt(3) / 2
    const float2 s = cadd(a[1], a[2]), r = rot<INV>(csub(a[1], a[2]));
    const float2 t = make_float2(a[0].x - 0.5f * s.x, a[0].y - 0.5f * s.y);
    a[0] = cadd(a[0], s);
    a[1] = make_float2(t.x + h * r.x, t.y + h * r.y);
    a[2] = make_float2(t.x - h * r.x, t.y - h * r.y);
}
// in-place 16-point DFT as 4 x 4: DFTs of the 4 strided quarters, twiddles exp(-+2 pi i n1 k2 / 16), DFTs across
template <bool INV> __device__ __forceinline__ void dft16(float2* a) {
    constexpr float C[10] = {1.f, 0.9238795f, 0.70710677f, 0.38268343f, 0.f, -0.38268343f, -0.70710677f,
                             -0.9238795f, -1.f, -0.9238795f};
    constexpr float S[10] = {0.f, 0.38268343f, 0.70710677f, 0.9238795f, 1.f, 0.9238795f, 0.70710677f, 0.38268343f,
                             0.f, -0.38268343f};
    float2 y[4][4];
#pragma unroll
    for (int n1 = 0; n1 < 4; ++n1) {
        float2 t[4] = {a[n1], a[n1 + 4], a[n1 + 8], a[n1 + 12]};
        dft4<INV>(t);
#pragma unroll
        for (int k2 = 0; k2 < 4; ++k2) {
            const int j = n1 * k2;
            y[n1][k2] = j == 0 ? t[k2] : j == 4 ? rot<INV>(t[k2])
                                       : cmul(t[k2], make_float2(C[j], INV ? S[j] : -S[j]));
        }
    }
#pragma unroll
    for (int k2 = 0; k2 < 4; ++k2) {
        float2 t[4] = {y[0][k2], y[1][k2], y[2][k2], y[3][k2]};
        dft4<INV>(t);
#pragma unroll
        for (int k1 = 0; k1 < 4; ++k1) a[4 * k1 + k2] = t[k1];
    }
}
// in-place 9-point DFT as 3 x 3, the same way
template <bool INV> __device__ __forceinline__ void dft9(float2* a) {
    constexpr float C[5] = {1.f, 0.76604444f, 0.17364818f, -0.5f, -0.9396926f};
    constexpr float S[5] = {0.f, 0.64278764f, 0.9848077f, 0.8660254f, 0.34202015f};
    float2 y[3][3];
#pragma unroll
    for (int n1 = 0; n1 < 3; ++n1) {
        float2 t[3] = {a[n1], a[n1 + 3], a[n1 + 6]};
        dft3<INV>(t);
#pragma unroll
        for (int k2 = 0; k2 < 3; ++k2) {
            const int j = n1 * k2;
            y[n1][k2] = j == 0 ? t[k2] : cmul(t[k2], make_float2(C[j], INV ? S[j] : -S[j]));
        }
    }
#pragma unroll
    for (int k2 = 0; k2 < 3; ++k2) {
        float2 t[3] = {y[0][k2], y[1][k2], y[2][k2]};
        dft3<INV>(t);
#pragma unroll
        for (int k1 = 0; k1 < 3; ++k1) a[3 * k1 + k2] = t[k1];
    }
}
// in-place 32-point DFT as 2 x 16: DFTs of the even and the odd points, the odd ones' times exp(-+2 pi i k / 32), and
// their sums and differences
template <bool INV> __device__ __forceinline__ void dft32(float2* a) {
    constexpr float C[16] = {1.f, 0.98078528f, 0.92387953f, 0.83146961f, 0.70710678f, 0.55557023f, 0.38268343f,
                             0.19509032f, 0.f, -0.19509032f, -0.38268343f, -0.55557023f, -0.70710678f, -0.83146961f,
                             -0.92387953f, -0.98078528f};
    float2 e[16], o[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) { e[i] = a[2 * i]; o[i] = a[2 * i + 1]; }
    dft16<INV>(e);
    dft16<INV>(o);
#pragma unroll
    for (int k = 0; k < 16; ++k) {
        // exp(-+2 pi i k / 32) = C[k] -+ i sin(2 pi k / 32), sin(2 pi k / 32) = C[8 - k] (k <= 8) or C[k - 8]
        const float s = k <= 8 ? C[8 - k] : C[k - 8];
        const float2 t = k == 0 ? o[0] : k == 8 ? rot<INV>(o[8]) : cmul(o[k], make_float2(C[k], INV ? s : -s));
        a[k] = cadd(e[k], t);
        a[k + 16] = csub(e[k], t);
    }
}
template <int R, bool INV> __device__ __forceinline__ void dft(float2* a) {
    if constexpr (R == 32) dft32<INV>(a);
    else if constexpr (R == 16) dft16<INV>(a);
    else if constexpr (R == 9) dft9<INV>(a);
    else if constexpr (R == 8) dft8<INV>(a);
    else if constexpr (R == 4) dft4<INV>(a);
    else if constexpr (R == 3) dft3<INV>(a);
    else dft2<INV>(a);
}

// the twiddle exp(-2 pi i j / N) of an N-point transform: a generated RootTableN reads it from a float32 table
// (roots_source); ChainRoots has none (sincospif computes it). A butterfly takes one and makes its powers by products
struct ChainRoots { static constexpr bool TABLE = false; };

// butterfly k of a pass (radix R, Ns the product of the radices before it) on its R points v: the twiddles w^r,
// w = exp(-+2 pi i k / (Ns R)) (read from root's table where it has one: one load; a load per power cost more than
// sincospif, as lanes read roots r k apart, many cache lines an instruction), then the R-point DFT
template <int N, int R, bool INV, typename Root>
__device__ __forceinline__ void butterfly(float2* v, const int k, const int Ns, Root root) {
    if (Ns > 1) {
        float2 w;
        if constexpr (Root::TABLE) {
            w = root(k * (N / (Ns * R)));
            if (INV) w = conjf2(w);
        } else {
            // (k through an empty asm: in a loop over rows, as rowfft_wgrad's, the compiler hoisted every
            // butterfly's sincospif out of it and kept the twiddles, spilling 1784 bytes a thread at 16384
            // points and 1024 threads; 736 so, benchmarks/kernel_registers.py)
            int kk = k;
            asm volatile("" : "+r"(kk));
            float s, c;
            sincospif((INV ? 2.0f : -2.0f) * (float)kk / (float)(Ns * R), &s, &c);
            w = make_float2(c, s);
        }
        float2 wr = w;
#pragma unroll
        for (int r = 1; r < R; ++r) { v[r] = cmul(v[r], wr); wr = cmul(wr, w); }
    }
    dft<R, INV>(v);
}

// one Stockham pass (radix R: 2, 3, 4, 8, 9, 16 or 32; Ns the product of the radices before it, a constant where inlined) over `count` transforms of N points each,
// point i of transform t at buf[slot(t, i)], by TT threads: each reads up to ITER butterflies (count * N / R <=
// ITER * TT), then all write, so the one buffer is source and destination (autosort: natural order at the end)
template <int N, int R, bool INV, int TT, int ITER, typename Slot, typename Root>
__device__ __forceinline__ void stockham_pass(float2* buf, const int count, const int Ns, Slot slot, Root root) {
    constexpr int B = N / R;
    const int total = count * B;
    float2 v[ITER][R];
#pragma unroll
    for (int q = 0; q < ITER; ++q) {
        const int g = threadIdx.x + q * TT;
        if (g < total) {
            const int t = g / B, b = g - t * B, k = b % Ns;
#pragma unroll
            for (int r = 0; r < R; ++r) v[q][r] = buf[slot(t, b + r * B)];
            butterfly<N, R, INV>(v[q], k, Ns, root);
        }
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < ITER; ++q) {
        const int g = threadIdx.x + q * TT;
        if (g < total) {
            const int t = g / B, b = g - t * B, k = b % Ns, d = (b - k) * R + k;
#pragma unroll
            for (int r = 0; r < R; ++r) buf[slot(t, d + r * Ns)] = v[q][r];
        }
    }
    __syncthreads();
}

// exp(-i pi f / m): the half-length twiddle of frequency f of a real row packed into m complex points
__device__ __forceinline__ float2 half_twiddle(int f, int m) {
    float s, c;
    sincospif(-(float)f / (float)m, &s, &c);
    return make_float2(c, s);
}

// the real spectrum's frequencies f and M - f from the packed row's Z[f] and Z[(M - f) mod M]
__device__ __forceinline__ void unpack(float2 zf, float2 zm, float2 tw, float2& af, float2& am) {
    const float2 e = make_float2(0.5f * (zf.x + zm.x), 0.5f * (zf.y - zm.y));
    const float2 o = make_float2(0.5f * (zf.y + zm.y), 0.5f * (zm.x - zf.x));  // -i (zf - conj(zm)) / 2
    const float2 t = cmul(tw, o);
    af = cadd(e, t);
    am = conjf2(csub(e, t));
}

// the inverse's packed row at f and M - f from the spectrum's Y[f] and Y[M - f]
__device__ __forceinline__ void pack(float2 yf, float2 ym, float2 tw, float2& pf, float2& pm) {
    const float2 s = cadd(yf, conjf2(ym)), d = csub(yf, conjf2(ym));
    const float2 a = cmul(conjf2(tw), d), b = cmul(tw, conjf2(d));
    pf = make_float2(s.x - a.y, s.y + a.x);   // s + i a
    pm = make_float2(s.x - b.y, -s.y + b.x);  // conj(s) + i b
}

"""


def device_helpers() -> str:
    """:data:`convtune.fft.fft64.DEVICE_HELPERS` and :data:`PAIR_HELPERS`: what every real-row kernel source starts with."""
    return DEVICE_HELPERS + PAIR_HELPERS
