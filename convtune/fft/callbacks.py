"""cuFFT JIT callbacks and the zero-extension kernel of the frequency-major FFT path.

``fused`` plans place an operand inside the forward transform with a load callback that reads the unextended
operand, and write only the wanted outputs (crop, strided outputs, filter taps) from the inverse with a store
callback; without callbacks, zero-extension is one kernel (:data:`EMBED_SOURCE`) that writes each element once.
"""

from __future__ import annotations

import functools
import logging

log = logging.getLogger("convtune")

EMBED_SOURCE = r"""
__device__ __forceinline__ void convtune_embed_row(const float* __restrict__ src, float* __restrict__ dst,
                                                   long long row, int L0, int L1, int n0, int n1, int s0, int s1,
                                                   int c, int c_end, int step) {
    // elements c, c + step, ... < c_end of output row (image b, row r); no per-element index division on
    // the common s1 == 1 path
    long long b = row / L0;
    int r = (int)(row - b * L0);
    float* out = dst + row * L1;
    if (r % s0 != 0 || r / s0 >= n0) {
        for (; c < c_end; c += step) out[c] = 0.0f;
        return;
    }
    const float* in = src + (b * n0 + r / s0) * n1;
    if (s1 == 1) {
        for (; c < c_end; c += step) out[c] = c < n1 ? in[c] : 0.0f;
    } else {
        for (; c < c_end; c += step) {
            int q = c / s1;
            out[c] = (c == q * s1 && q < n1) ? in[q] : 0.0f;
        }
    }
}

extern "C" __global__ void convtune_fft_embed(const float* __restrict__ src, float* __restrict__ dst,
                                              long long rows, int L0, int L1, int n0, int n1, int s0, int s1,
                                              int row_shift) {
    // short rows (spectral_kernels.row_launch): 2^row_shift threads per row, as many rows as fit in the block
    const int per_row = 1 << row_shift;
    long long row = (long long)blockIdx.x * (blockDim.x >> row_shift) + (threadIdx.x >> row_shift);
    if (row >= rows) return;
    convtune_embed_row(src, dst, row, L0, L1, n0, n1, s0, s1, threadIdx.x & (per_row - 1), L1, per_row);
}

extern "C" __global__ void convtune_fft_embed_long(const float* __restrict__ src, float* __restrict__ dst,
                                                   long long rows, int L0, int L1, int n0, int n1, int s0, int s1,
                                                   int seg_len) {
    // long rows: a block per segment of seg_len elements of a row, all its threads on it
    unsigned int segs = (L1 + seg_len - 1) / seg_len, seg = blockIdx.x % segs;
    long long row = blockIdx.x / segs;
    if (row >= rows) return;
    int c = seg * seg_len + threadIdx.x;
    convtune_embed_row(src, dst, row, L0, L1, n0, n1, s0, s1, c, min(L1, (int)(seg + 1) * seg_len), blockDim.x);
}
"""
EMBED_THREADS = 256

def load_callback(name: str, L, n, steps) -> str:
    """cuFFT load callback of the fused forward transform, any rank: element ``offset`` of the zero-extended
    (B, *L) operand, read from the unextended (B, *n) one (sample k of an axis at k * step, zero elsewhere)."""
    at = _unravel(L)
    keep = " && ".join(f"i{j} % {s} == 0 && i{j} / {s} < {m}" for j, (s, m) in enumerate(zip(steps, n)))
    return f"""#include <cufftXt.h>
__device__ cufftReal {name}(void* dataIn, unsigned long long offset, void* info, void* shared) {{
{at}
    if ({keep})
        return ((const float*)dataIn)[{_ravel("b", [f"i{j} / {s}" for j, s in enumerate(steps)], n)}];
    return 0.0f;
}}
"""


def store_callback(name: str, L, geometry) -> str:
    """cuFFT store callback of the fused inverse transform, any rank: element ``offset`` of the (B, *L) result
    lands at output position q of an axis when (index + offset_axis) mod L == q * step, q < count; the output's
    address is the device word ``info`` points to (the plan's own output is scratch)."""
    at = _unravel(L)
    shift = "\n".join(f"    int t{j} = (i{j} + {o}) % {size};" for j, ((o, _, _), size) in enumerate(zip(geometry, L)))
    keep = " && ".join(f"t{j} % {s} == 0 && t{j} / {s} < {c}" for j, (_, s, c) in enumerate(geometry))
    index = _ravel("b", [f"t{j} / {s}" for j, (_, s, _) in enumerate(geometry)], [c for _, _, c in geometry])
    return f"""#include <cufftXt.h>
__device__ void {name}(void* dataOut, unsigned long long offset, cufftReal element, void* info, void* shared) {{
{at}
{shift}
    if ({keep})
        (*(float**)info)[{index}] = element;
}}
"""


def _unravel(L) -> str:
    """C lines splitting a callback's ``offset`` into the batch index ``b`` and per-axis indices i0, i1, ..."""
    lines = [f"    const unsigned long long image = {' * '.join(f'(unsigned long long){v}' for v in L)};",
             "    unsigned long long b = offset / image;",
             "    int pos = (int)(offset - b * image);"]
    for j in range(len(L) - 1, 0, -1):
        lines.append(f"    int i{j} = pos % {L[j]}; pos /= {L[j]};")
    lines.append("    int i0 = pos;")
    return "\n".join(lines)


def _ravel(batch: str, index, extents) -> str:
    """C expression of the flat position of (batch, *index) in a C-contiguous (B, *extents) array."""
    expr = batch
    for i, e in zip(index, extents):
        expr = f"({expr}) * {e} + {i}"
    return expr


#: cuFFT's JIT (LTO) callbacks arrived in cuFFT 11.3.3 (CUDA 12.8).
MIN_CALLBACK_CUFFT = 11303


@functools.lru_cache(maxsize=None)
def callbacks_unavailable_reason() -> str | None:
    """Why cuFFT JIT callbacks cannot be used here, or None."""
    try:
        import cupy
        from cupy.cuda import cufft
        version = cufft.getVersion()
    except Exception as exc:  # no CuPy or no cuFFT: the reason is the message
        return f"cuFFT unavailable ({type(exc).__name__}: {exc})"
    if version < MIN_CALLBACK_CUFFT:
        return f"cuFFT {version} is older than {MIN_CALLBACK_CUFFT} (CUDA 12.8), the first with JIT callbacks"
    if not hasattr(cupy.fft.config, "set_cufft_callbacks"):
        return "this CuPy has no cuFFT callback support"
    try:
        set_jit_callback()
    except OSError as exc:
        return str(exc)
    return None


@functools.lru_cache(maxsize=None)
def set_jit_callback():
    """``cufftXtSetJITCallback`` and ``cufftDestroy`` of the cuFFT library CuPy's own calls go to, through ctypes.

    A process can map two copies of cuFFT (CuPy's, and PyTorch's from its own wheel, or the one
    ``cuda.pathfinder`` loads by path); a handle made by one is an invalid plan to the other
    (``cufftXtSetJITCallback`` then fails with cufftResult 1). The symbols are therefore looked up
    through CuPy's cuFFT binding module: the dynamic linker searches that module's own dependencies,
    which are the copy that makes CuPy's handles (``cufftCreate``, ``PlanNd``). No handle is probed:
    cuFFT handles are small integers, and another copy may hold a live plan with the same number."""
    import ctypes

    from cupy.cuda import cufft
    cufft.getVersion()  # makes CuPy load the library
    try:
        binding = ctypes.CDLL(cufft.__file__)
    except OSError as exc:
        raise OSError(f"cannot open CuPy's cuFFT binding {cufft.__file__}: {exc}") from None
    if getattr(binding, "cufftCreate", None) is None:
        raise OSError(f"CuPy's cuFFT binding {cufft.__file__} does not link cuFFT: no cufftCreate among its "
                      "dependencies")
    fn = next((getattr(binding, s) for s in ("cufftXtSetJITCallback_12_7", "cufftXtSetJITCallback")
               if getattr(binding, s, None) is not None), None)
    if fn is None:
        raise OSError(f"no cufftXtSetJITCallback in the cuFFT library CuPy links ({_library_of(binding.cufftCreate)})")
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                   ctypes.POINTER(ctypes.c_void_p)]
    fn.restype = ctypes.c_int
    destroy = binding.cufftDestroy
    destroy.argtypes, destroy.restype = [ctypes.c_int], ctypes.c_int
    log.debug("cuFFT callbacks through %s", _library_of(fn))
    return fn, destroy


def _library_of(fn) -> str:
    """The path of the shared library that defines the ctypes function ``fn`` (``dladdr``), or ``?``."""
    import ctypes

    class DlInfo(ctypes.Structure):
        _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p), ("sname", ctypes.c_char_p),
                    ("saddr", ctypes.c_void_p)]

    info = DlInfo()
    for libname in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(libname).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes, dladdr.restype = [ctypes.c_void_p, ctypes.POINTER(DlInfo)], ctypes.c_int
        if dladdr(ctypes.cast(fn, ctypes.c_void_p), ctypes.byref(info)) and info.fname:
            return info.fname.decode(errors="replace")
    return "?"


def callbacks_available() -> bool:
    return callbacks_unavailable_reason() is None


@functools.lru_cache(maxsize=None)
def embed_kernel(long_rows: bool = False):
    """The embedding kernel for short rows, or (``long_rows``) for rows split into segments (see row_launch)."""
    import cupy
    return cupy.RawKernel(EMBED_SOURCE, "convtune_fft_embed_long" if long_rows else "convtune_fft_embed")
