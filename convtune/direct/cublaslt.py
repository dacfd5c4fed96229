"""cuBLASLt for the 1x1 plans' strided-batched GEMMs: the algorithm chosen once, when the plan is built, and a call
that is only ``cublasLtMatmul``.

On the H100, cuBLAS's ``sgemmStridedBatched`` took 11 to 13 µs of host time per call (through CuPy's binding, which
adds under 2 µs). That was the whole of the 1x1 plans' excess over PyTorch's convolution call, and what kept
ResNet-50's forward passes more than 10 µs above PyTorch's. cuBLASLt
takes the algorithm as an argument, so the choice happens once, and a call passes pointers through ctypes.

cuBLASLt's own call costs about what cuBLAS's does (12.7 to 19.8 µs through ctypes on the H100), so
what it buys is a call that a CUDA graph can capture, where CuPy refuses cuBLAS's: the 1x1 plans replay their
GEMMs from graphs (:mod:`convtune.direct.replay`). It is the 1x1 plans' form wherever the library loads;
``CONVTUNE_CUBLASLT=0`` keeps them on cuBLAS. The CPU tests run this module against a stand-in library that does the
column-major GEMMs the descriptors describe; the GPU tests against the real one.

Column-major, as cuBLAS: ``D = op(A) op(B)`` per batch entry, ``m x n`` results, ``k`` deep; the row-major 1x1
problems map onto it as in :mod:`convtune.direct.cublas_pointwise`.
"""

from __future__ import annotations

import ctypes
import functools
import os
import weakref

#: The switch: ``0`` keeps the 1x1 forward and backward-data plans on cuBLAS (they call cuBLASLt otherwise).
ENV = "CONVTUNE_CUBLASLT"

# cublas_api.h / library_types.h / cublasLt.h
COMPUTE_32F, COMPUTE_32F_FAST_TF32 = 68, 77
R_32F = 0
OP_N, OP_T = 0, 1
DESC_TRANSA, DESC_TRANSB = 3, 4
LAYOUT_BATCH_COUNT, LAYOUT_STRIDED_BATCH_OFFSET = 5, 6
PREF_MAX_WORKSPACE_BYTES = 1


class HeuristicResult(ctypes.Structure):
    """``cublasLtMatmulHeuristicResult_t``."""
    _fields_ = [("algo", ctypes.c_uint64 * 8), ("workspaceSize", ctypes.c_size_t), ("state", ctypes.c_int),
                ("wavesCount", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


class CublasLtError(RuntimeError):
    pass


_P = ctypes.c_void_p
_SIGNATURES = {
    "cublasLtCreate": [ctypes.POINTER(_P)],
    "cublasLtMatmulDescCreate": [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_int],
    "cublasLtMatmulDescSetAttribute": [_P, ctypes.c_int, _P, ctypes.c_size_t],
    "cublasLtMatmulDescDestroy": [_P],
    "cublasLtMatrixLayoutCreate": [ctypes.POINTER(_P), ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64,
                                   ctypes.c_int64],
    "cublasLtMatrixLayoutSetAttribute": [_P, ctypes.c_int, _P, ctypes.c_size_t],
    "cublasLtMatrixLayoutDestroy": [_P],
    "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(_P)],
    "cublasLtMatmulPreferenceSetAttribute": [_P, ctypes.c_int, _P, ctypes.c_size_t],
    "cublasLtMatmulPreferenceDestroy": [_P],
    "cublasLtMatmulAlgoGetHeuristic": [_P, _P, _P, _P, _P, _P, _P, ctypes.c_int, _P, ctypes.POINTER(ctypes.c_int)],
    "cublasLtMatmul": [_P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, _P, ctypes.c_size_t, _P],
}


def _loaded_path() -> str | None:
    """The path of the cuBLASLt library this process has loaded already (cuBLAS loads it), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rstrip().split(" ")[-1]
                if "libcublasLt.so" in os.path.basename(path):
                    return path
    except OSError:
        return None
    return None


def _pathfinder_path() -> str | None:
    """Where the ``cuda-pathfinder`` package (beside CuPy 14) finds cuBLASLt, if it is installed and does."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
        return getattr(load_nvidia_dynamic_lib("cublasLt"), "abs_path", None)
    except Exception:  # not installed, or no such library: the other ways are tried
        return None


@functools.lru_cache(maxsize=None)
def library():
    """The cuBLASLt library, its functions' signatures set: the one cuBLAS loaded (CuPy's cuBLAS handle is made
    first, which loads it), else where ``cuda-pathfinder`` finds it, else by name."""
    try:
        import cupy
        cupy.cuda.device.get_cublas_handle()
    except Exception:  # no GPU (the CPU tests pass a stand-in library instead)
        pass
    candidates = [p for p in (_loaded_path(), _pathfinder_path()) if p] + ["libcublasLt.so.13", "libcublasLt.so.12",
                                                                           "libcublasLt.so"]
    errors = []
    for name in candidates:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError as exc:
            errors.append(f"{name}: {exc}")
    else:
        raise CublasLtError("cuBLASLt not found (" + "; ".join(errors) + ")")
    for fn, args in _SIGNATURES.items():
        f = getattr(lib, fn)
        f.argtypes, f.restype = args, ctypes.c_int
    return lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed with cuBLAS status {status}; set {ENV}=0 to use cuBLAS")


_HANDLES: dict = {}


def handle(lib, device_id: int):
    """One cuBLASLt handle per device (made on first use, kept for the process)."""
    key = (id(lib), device_id)
    if key not in _HANDLES:
        h = _P()
        _check(lib.cublasLtCreate(ctypes.pointer(h)), "cublasLtCreate")
        _HANDLES[key] = h
    return _HANDLES[key]


def _set(setter, obj, attribute: int, value) -> None:
    _check(setter(obj, attribute, ctypes.cast(ctypes.pointer(value), _P), ctypes.sizeof(value)), setter.__name__)


class StridedBatchedGemm:
    """``batch`` float32 GEMMs ``D = op(A) op(B)`` (column-major; ``op`` per ``transa``/``transb``), entry ``i`` of
    each operand at ``stride`` elements after entry ``i - 1`` (0: the same matrix for every entry), its algorithm
    chosen once (no workspace). ``tf32``: TF32 tensor cores allowed. Call it with the operands' and result's device
    addresses and a stream's handle."""

    def __init__(self, lib, lt_handle, transa: int, transb: int, m: int, n: int, k: int, lda: int, stride_a: int,
                 ldb: int, stride_b: int, ldc: int, stride_c: int, batch: int, tf32: bool = False):
        self.lib, self.handle = lib, lt_handle
        made = []  # (destroyer, object): released when this is collected
        self.desc = _P()
        _check(lib.cublasLtMatmulDescCreate(ctypes.pointer(self.desc), COMPUTE_32F_FAST_TF32 if tf32 else COMPUTE_32F,
                                            R_32F), "cublasLtMatmulDescCreate")
        made.append((lib.cublasLtMatmulDescDestroy, self.desc))
        _set(lib.cublasLtMatmulDescSetAttribute, self.desc, DESC_TRANSA, ctypes.c_int32(transa))
        _set(lib.cublasLtMatmulDescSetAttribute, self.desc, DESC_TRANSB, ctypes.c_int32(transb))

        def layout(rows, cols, ld, stride):
            lay = _P()
            _check(lib.cublasLtMatrixLayoutCreate(ctypes.pointer(lay), R_32F, rows, cols, ld),
                   "cublasLtMatrixLayoutCreate")
            made.append((lib.cublasLtMatrixLayoutDestroy, lay))
            _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_BATCH_COUNT, ctypes.c_int32(batch))
            _set(lib.cublasLtMatrixLayoutSetAttribute, lay, LAYOUT_STRIDED_BATCH_OFFSET, ctypes.c_int64(stride))
            return lay
        self.a_layout = layout(*((m, k) if transa == OP_N else (k, m)), lda, stride_a)
        self.b_layout = layout(*((k, n) if transb == OP_N else (n, k)), ldb, stride_b)
        self.c_layout = layout(m, n, ldc, stride_c)
        pref = _P()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.pointer(pref)), "cublasLtMatmulPreferenceCreate")
        made.append((lib.cublasLtMatmulPreferenceDestroy, pref))
        _set(lib.cublasLtMatmulPreferenceSetAttribute, pref, PREF_MAX_WORKSPACE_BYTES, ctypes.c_uint64(0))
        self.results = (HeuristicResult * 1)()
        found = ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(lt_handle, self.desc, self.a_layout, self.b_layout, self.c_layout,
                                                  self.c_layout, pref, 1, ctypes.cast(self.results, _P),
                                                  ctypes.pointer(found)), "cublasLtMatmulAlgoGetHeuristic")
        if found.value < 1:
            raise CublasLtError("cuBLASLt offers no algorithm for this GEMM")
        self.scalars = (ctypes.c_float * 2)(1.0, 0.0)  # alpha, beta (host pointers)
        alpha, beta = ctypes.addressof(self.scalars), ctypes.addressof(self.scalars) + 4
        algo = ctypes.addressof(self.results)  # (the algorithm is the result's first field)
        # every argument but the operands, the result and the stream, fixed once
        self._head = (lt_handle, self.desc, alpha)
        self._layouts = (self.a_layout, self.b_layout, beta)
        self._tail = (self.c_layout, algo, None, 0)
        self._matmul = lib.cublasLtMatmul
        self._finalizer = weakref.finalize(self, _release, made)

    def __call__(self, a: int, b: int, d: int, stream: int) -> None:
        head, (a_l, b_l, beta), (c_l, algo, ws, ws_size) = self._head, self._layouts, self._tail
        status = self._matmul(*head, a, a_l, b, b_l, beta, d, c_l, d, c_l, algo, ws, ws_size, stream)
        if status:
            _check(status, "cublasLtMatmul")


def _release(made) -> None:
    for destroy, obj in reversed(made):
        try:
            destroy(obj)
        except Exception:  # at exit the library may be gone
            pass
