"""The CUDA source template of the one-block image FFT kernels (:mod:`convtune.fft.planeconv`'s), formatted there with
the transform sizes, block shape and radices, after the real-row pieces of :mod:`convtune.fft.rowsource` (device
helpers, Stockham passes, twiddle tables). What images and blocks the kernels take and their launches are
:mod:`convtune.fft.planeconv`'s."""

PLANE_SOURCE = r"""
#define L0 {l0}
#define L1 {l1}
#define M1 (L1 / 2)
#define W (M1 + 1)
#define RS {rs}
#define T {t}
#define MINB {minb}
#define WGRAD_MINB {wgrad_minb}
#define THREE_BUFFERS {three}
#define WS_SUMS (THREE_BUFFERS ? 0 : 1)
#define ROWG {rowg}
#define COLG {colg}
#define PADI(i) ((i) + ((i) >> 3))
#define AT(r, u) ((r) * RS + PADI(u))

// i mod n for 0 <= i < 2 n (an index plus a shift below n)
__device__ __forceinline__ int wrap(int i, int n) {{ return i < n ? i : i - n; }}

{roots}
// up to ROWG complex rows of M1 points / up to COLG columns of L0 points, placed by slot(t, i)
template <bool INV, typename Slot> __device__ __forceinline__ void fft_rows(float2* buf, const int count, Slot slot) {{
    const {row_root} root;
{row_passes}
}}
template <bool INV, typename Slot> __device__ __forceinline__ void fft_cols(float2* buf, const int count, Slot slot) {{
    const {col_root} root;
{col_passes}
}}

// an (n0, n1) image (element strides s0, s1) zero-extended: rows r < n0 packed (a[r][2j] + i a[r][2j+1]), the others 0
template <typename E> __device__ __forceinline__ void load_image(float2* buf, const E* img, long long s0, long long s1,
                                                              int n0, int n1) {{
    for (int e = threadIdx.x; e < L0 * W; e += T) {{
        const int r = e / W, u = e - r * W;
        float2 v = make_float2(0.f, 0.f);
        if (r < n0 && u < M1) {{
            const E* row = img + r * s0;
            const int i = 2 * u;
            v = make_float2(i < n1 ? load(row + i * s1) : 0.f, i + 1 < n1 ? load(row + (i + 1) * s1) : 0.f);
        }}
        buf[AT(r, u)] = v;
    }}
    __syncthreads();
}}

// the loaded image's spectrum, L0 x (M1 + 1), in place (rows at or past n0 hold zeros and are not transformed)
__device__ __forceinline__ void forward_2d(float2* buf, const int n0) {{
    for (int r0 = 0; r0 < n0; r0 += ROWG)
        fft_rows<false>(buf, min(ROWG, n0 - r0), [=](int t, int i) {{ return AT(r0 + t, i); }});
    for (int g = threadIdx.x; g < n0 * (M1 / 2 + 1); g += T) {{
        const int r = g / (M1 / 2 + 1), f = g - r * (M1 / 2 + 1);
        float2 af, am;
        unpack(buf[AT(r, f)], buf[AT(r, f ? M1 - f : 0)], half_twiddle(f, M1), af, am);
        buf[AT(r, f)] = af;
        buf[AT(r, M1 - f)] = am;
    }}
    __syncthreads();
    for (int u0 = 0; u0 < W; u0 += COLG)
        fft_cols<false>(buf, min(COLG, W - u0), [=](int t, int i) {{ return AT(i, u0 + t); }});
}}

// the spectrum in buf inverted and gathered: result element (t0, t1), t0 < n0, t1 < n1 (element strides s0, s1) is
// element ((t0 + sh0) mod L0, (t1 + sh1) mod L1) of the inverse, times scale; only the rows it reads are inverted
template <typename E> __device__ __forceinline__ void inverse_store(float2* buf, E* img, long long s0, long long s1,
                                                                 int n0, int n1, int sh0, int sh1, float scale) {{
    for (int u0 = 0; u0 < W; u0 += COLG)
        fft_cols<true>(buf, min(COLG, W - u0), [=](int t, int i) {{ return AT(i, u0 + t); }});
    for (int g = threadIdx.x; g < n0 * (M1 / 2 + 1); g += T) {{
        const int t0 = g / (M1 / 2 + 1), f = g - t0 * (M1 / 2 + 1), r = wrap(t0 + sh0, L0);
        float2 pf, pm;
        pack(buf[AT(r, f)], buf[AT(r, M1 - f)], half_twiddle(f, M1), pf, pm);
        buf[AT(r, f)] = pf;
        if (f != 0 && 2 * f != M1) buf[AT(r, M1 - f)] = pm;
    }}
    __syncthreads();
    for (int r0 = 0; r0 < n0; r0 += ROWG)
        fft_rows<true>(buf, min(ROWG, n0 - r0), [=](int t, int i) {{ return AT(wrap(r0 + t + sh0, L0), i); }});
    const float* u = reinterpret_cast<const float*>(buf);
    for (int g = threadIdx.x; g < n0 * n1; g += T) {{
        const int t0 = g / n1, t1 = g - t0 * n1, r = wrap(t0 + sh0, L0), m = wrap(t1 + sh1, L1);
        store<false>(img + t0 * s0 + t1 * s1, scale * u[2 * AT(r, m >> 1) + (m & 1)]);
    }}
}}

// the spectrum of image b = (b / C, b % C) of a (element strides sN, sC, s0, s1; n0 x n1 samples): L0 x (M1 + 1)
// complex64 at out + b L0 (M1 + 1) (a filter's images: C its channels, sN 0)
template <typename E> __device__ __forceinline__ void images_spectrum(
    const E* __restrict__ a, float2* __restrict__ out, int C, long long sN, long long sC, long long s0, long long s1,
    int n0, int n1) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    load_image(buf, a + ni * sN + c * sC, s0, s1, n0, n1);
    forward_2d(buf, n0);
    float2* o = out + b * (L0 * W);
    for (int e = threadIdx.x; e < L0 * W; e += T) o[e] = buf[AT(e / W, e % W)];
}}

// kept spectra (a round trip, convtune.roundtrip): forward (CONJ) or backward-data from image b's spectrum sa and
// the filter's; backward-filter from the input's and DY's spectra, block c summing its channel's images over the
// batch
template <typename E, bool CONJ> __device__ __forceinline__ void conv_from(
    const float2* __restrict__ sa, const float2* __restrict__ ws, E* __restrict__ out, int C, long long oN,
    long long oC, long long o0, long long o1, int out0, int out1, int sh0, int sh1, float scale) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    const float2* a = sa + b * (L0 * W);
    const float2* spec = ws + (long long)c * (L0 * W);
    for (int e = threadIdx.x; e < L0 * W; e += T) {{
        float2 s = __ldg(spec + e);
        if (CONJ) s = conjf2(s);
        buf[AT(e / W, e % W)] = cmul(__ldg(a + e), s);
    }}
    __syncthreads();
    inverse_store(buf, out + ni * oN + c * oC, o0, o1, out0, out1, sh0, sh1, scale);
}}
template <typename E> __device__ __forceinline__ void wgrad_from(
    const float2* __restrict__ xs, const float2* __restrict__ dys, E* __restrict__ dw, int N, int C, long long wC,
    long long w0, long long w1, int k0, int k1, int sh0, int sh1, float scale) {{
    extern __shared__ float2 buf[];
    const int c = blockIdx.x;
    for (int e = threadIdx.x; e < L0 * W; e += T) {{
        float2 q = make_float2(0.f, 0.f);
        for (int ni = 0; ni < N; ++ni) {{
            const long long at = ((long long)ni * C + c) * (L0 * W) + e;
            q = cadd(q, cmul(conjf2(__ldg(dys + at)), __ldg(xs + at)));
        }}
        buf[AT(e / W, e % W)] = q;
    }}
    __syncthreads();
    inverse_store(buf, dw + c * wC, w0, w1, k0, k1, sh0, sh1, scale);
}}

// forward (CONJ: times conj(S)) and backward-data (times S): block b is image (b / C, b % C)
// (KEEP: the image's spectrum also written to keep + b L0 (M1 + 1), for a round trip's filter gradient)
template <typename E, bool CONJ, bool KEEP = false> __device__ __forceinline__ void conv(
    const E* __restrict__ a, const float2* __restrict__ ws, E* __restrict__ out, int C, long long aN, long long aC,
    long long a0, long long a1, long long oN, long long oC, long long o0, long long o1, int in0, int in1, int out0,
    int out1, int sh0, int sh1, float scale, float2* __restrict__ keep = nullptr) {{
    extern __shared__ float2 buf[];
    const long long b = blockIdx.x, ni = b / C;
    const int c = (int)(b - ni * C);
    load_image(buf, a + ni * aN + c * aC, a0, a1, in0, in1);
    forward_2d(buf, in0);
    const float2* spec = ws + (long long)c * (L0 * W);
    for (int e = threadIdx.x; e < L0 * W; e += T) {{
        float2 s = __ldg(spec + e);
        if (CONJ) s = conjf2(s);
        const int at = AT(e / W, e % W);
        if constexpr (KEEP) keep[b * (L0 * W) + e] = buf[at];
        buf[at] = cmul(buf[at], s);
    }}
    __syncthreads();
    inverse_store(buf, out + ni * oN + c * oC, o0, o1, out0, out1, sh0, sh1, scale);
}}

// filter gradient, first kernel: block b sums conj(DY) X over the samples of slice b % S of channel b / S (chunk
// samples a slice) into ws (L0 x (M1 + 1) per block, after WS_SUMS such images). Where three images fit the shared
// memory (THREE_BUFFERS), X's spectrum and the sums stay there beside DY's; else X's spectrum and the sums go to ws
// (its first and second image), each frequency read back by the thread that wrote it
template <typename E> __device__ __forceinline__ void wgrad_part(
    const E* __restrict__ x, const E* __restrict__ dy, float2* __restrict__ ws, int N, int C, int S, int chunk,
    long long xN, long long xC, long long x0, long long x1, long long yN, long long yC, long long y0, long long y1,
    int in0, int in1, int out0, int out1) {{
    extern __shared__ float2 buf[];
    const int b = blockIdx.x, c = b / S, first = (b - c * S) * chunk, last = min(N, first + chunk);
    float2* qs = ws + ((long long)b * (WS_SUMS + 1) + WS_SUMS) * (L0 * W);
    if constexpr (THREE_BUFFERS) {{
        float2* xbuf = buf + L0 * RS;
        float2* sums = xbuf + L0 * RS;
        for (int ni = first; ni < last; ++ni) {{
            load_image(xbuf, x + ni * xN + c * xC, x0, x1, in0, in1);
            forward_2d(xbuf, in0);
            load_image(buf, dy + ni * yN + c * yC, y0, y1, out0, out1);
            forward_2d(buf, out0);
            for (int e = threadIdx.x; e < L0 * W; e += T) {{  // (each thread reads back what it wrote)
                const int at = AT(e / W, e % W);
                float2 q = cmul(conjf2(buf[at]), xbuf[at]);
                if (ni != first) q = cadd(q, sums[at]);
                sums[at] = q;
            }}
            __syncthreads();  // (the next loads overwrite buf and xbuf)
        }}
        for (int e = threadIdx.x; e < L0 * W; e += T) qs[e] = sums[AT(e / W, e % W)];
    }} else {{
        float2* xs = qs - L0 * W;
        for (int ni = first; ni < last; ++ni) {{
            load_image(buf, x + ni * xN + c * xC, x0, x1, in0, in1);
            forward_2d(buf, in0);
            for (int e = threadIdx.x; e < L0 * W; e += T) xs[e] = buf[AT(e / W, e % W)];
            __syncthreads();  // (the next load overwrites buf)
            load_image(buf, dy + ni * yN + c * yC, y0, y1, out0, out1);
            forward_2d(buf, out0);
            for (int e = threadIdx.x; e < L0 * W; e += T) {{  // (each thread reads back what it wrote)
                float2 q = cmul(conjf2(buf[AT(e / W, e % W)]), xs[e]);
                if (ni != first) q = cadd(q, qs[e]);
                qs[e] = q;
            }}
            __syncthreads();
        }}
    }}
}}

// filter gradient, second kernel: block c adds its channel's S slices and inverts once into the (k0, k1) taps
template <typename E> __device__ __forceinline__ void wgrad_sum(
    const float2* __restrict__ ws, E* __restrict__ dw, int S, long long wC, long long w0, long long w1, int k0, int k1,
    int sh0, int sh1, float scale) {{
    extern __shared__ float2 buf[];
    const int c = blockIdx.x;
    for (int e = threadIdx.x; e < L0 * W; e += T) {{
        float2 q = make_float2(0.f, 0.f);
        for (int s = 0; s < S; ++s) q = cadd(q, __ldg(ws + ((long long)(c * S + s) * (WS_SUMS + 1) + WS_SUMS) * (L0 * W) + e));
        buf[AT(e / W, e % W)] = q;
    }}
    __syncthreads();
    inverse_store(buf, dw + c * wC, w0, w1, k0, k1, sh0, sh1, scale);
}}

// both backward passes of a round trip (fused): block b takes the samples of slice b % S of channel b / S (chunk a
// slice), each dy image transformed once: dx's image from it (times S, the inverse, the crop), and conj(DY) X (X the
// forward pass's kept spectra xs) summed over the slice into ws where wgrad_part puts its sums (each frequency read
// back by the thread that wrote it); wgrad_sum then adds a channel's slices and inverts once. dy's spectra are neither
// written nor read back
template <typename E> __device__ __forceinline__ void backward_part(
    const E* __restrict__ dy, const float2* __restrict__ spectra, const float2* __restrict__ xs, E* __restrict__ dx,
    float2* __restrict__ ws, int N, int C, int S, int chunk, long long yN, long long yC, long long y0, long long y1,
    long long xN, long long xC, long long x0, long long x1, int out0, int out1, int in0, int in1, int sh0, int sh1,
    float scale) {{
    extern __shared__ float2 buf[];
    const int b = blockIdx.x, c = b / S, first = (b - c * S) * chunk, last = min(N, first + chunk);
    float2* qs = ws + ((long long)b * (WS_SUMS + 1) + WS_SUMS) * (L0 * W);
    const float2* spec = spectra + (long long)c * (L0 * W);
    for (int ni = first; ni < last; ++ni) {{
        load_image(buf, dy + ni * yN + c * yC, y0, y1, out0, out1);
        forward_2d(buf, out0);
        const float2* xk = xs + ((long long)ni * C + c) * (L0 * W);
        for (int e = threadIdx.x; e < L0 * W; e += T) {{
            const int at = AT(e / W, e % W);
            const float2 d = buf[at];
            float2 q = cmul(conjf2(d), __ldg(xk + e));
            if (ni != first) q = cadd(q, qs[e]);
            qs[e] = q;
            buf[at] = cmul(d, __ldg(spec + e));
        }}
        __syncthreads();
        inverse_store(buf, dx + ni * xN + c * xC, x0, x1, in0, in1, sh0, sh1, scale);
        __syncthreads();  // (the next load overwrites buf)
    }}
}}

extern "C" __global__ void __launch_bounds__(T, MINB) planefft_bwd_part(const {e}* dy, const float2* spectra,
    const float2* xs, {e}* dx, float2* ws, int N, int C, int S, int chunk, long long yN, long long yC, long long y0,
    long long y1, long long xN, long long xC, long long x0, long long x1, int out0, int out1, int in0, int in1, int sh0,
    int sh1, float scale)
{{ backward_part<{e}>(dy, spectra, xs, dx, ws, N, C, S, chunk, yN, yC, y0, y1, xN, xC, x0, x1, out0, out1, in0, in1,
                     sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_spectrum(const {e}* w, float2* ws, long long sC, long long s0,
    long long s1, int k0, int k1)
{{ images_spectrum<{e}>(w, ws, gridDim.x, 0, sC, s0, s1, k0, k1); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_fwd_keep(const {e}* a, const float2* ws, {e}* out,
    float2* keep, int C, long long aN, long long aC, long long a0, long long a1, long long oN, long long oC,
    long long o0, long long o1, int in0, int in1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv<{e}, true, true>(a, ws, out, C, aN, aC, a0, a1, oN, oC, o0, o1, in0, in1, out0, out1, sh0, sh1, scale, keep); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_dgrad_keep(const {e}* a, const float2* ws, {e}* out,
    float2* keep, int C, long long aN, long long aC, long long a0, long long a1, long long oN, long long oC,
    long long o0, long long o1, int in0, int in1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv<{e}, false, true>(a, ws, out, C, aN, aC, a0, a1, oN, oC, o0, o1, in0, in1, out0, out1, sh0, sh1, scale, keep); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_images_spectrum(const {e}* a, float2* out, int C,
    long long sN, long long sC, long long s0, long long s1, int n0, int n1)
{{ images_spectrum<{e}>(a, out, C, sN, sC, s0, s1, n0, n1); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_fwd_from(const float2* sa, const float2* ws, {e}* out,
    int C, long long oN, long long oC, long long o0, long long o1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv_from<{e}, true>(sa, ws, out, C, oN, oC, o0, o1, out0, out1, sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_dgrad_from(const float2* sa, const float2* ws, {e}* out,
    int C, long long oN, long long oC, long long o0, long long o1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv_from<{e}, false>(sa, ws, out, C, oN, oC, o0, o1, out0, out1, sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_wgrad_from(const float2* xs, const float2* dys, {e}* dw,
    int N, int C, long long wC, long long w0, long long w1, int k0, int k1, int sh0, int sh1, float scale)
{{ wgrad_from<{e}>(xs, dys, dw, N, C, wC, w0, w1, k0, k1, sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_fwd(const {e}* a, const float2* ws, {e}* out, int C,
    long long aN, long long aC, long long a0, long long a1, long long oN, long long oC, long long o0, long long o1,
    int in0, int in1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv<{e}, true>(a, ws, out, C, aN, aC, a0, a1, oN, oC, o0, o1, in0, in1, out0, out1, sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_dgrad(const {e}* a, const float2* ws, {e}* out, int C,
    long long aN, long long aC, long long a0, long long a1, long long oN, long long oC, long long o0, long long o1,
    int in0, int in1, int out0, int out1, int sh0, int sh1, float scale)
{{ conv<{e}, false>(a, ws, out, C, aN, aC, a0, a1, oN, oC, o0, o1, in0, in1, out0, out1, sh0, sh1, scale); }}
extern "C" __global__ void __launch_bounds__(T, WGRAD_MINB) planefft_wgrad_part(const {e}* x, const {e}* dy, float2* ws, int N,
    int C, int S, int chunk, long long xN, long long xC, long long x0, long long x1, long long yN, long long yC,
    long long y0, long long y1, int in0, int in1, int out0, int out1)
{{ wgrad_part<{e}>(x, dy, ws, N, C, S, chunk, xN, xC, x0, x1, yN, yC, y0, y1, in0, in1, out0, out1); }}
extern "C" __global__ void __launch_bounds__(T, MINB) planefft_wgrad_sum(const float2* ws, {e}* dw, int S, long long wC,
    long long w0, long long w1, int k0, int k1, int sh0, int sh1, float scale)
{{ wgrad_sum<{e}>(ws, dw, S, wC, w0, w1, k0, k1, sh0, sh1, scale); }}
"""
