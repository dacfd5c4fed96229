"""1x1 convolutions (stride 1, unpadded, one group) as bare cuBLAS calls: im2col's GPU hot path.

There the input already is the column matrix, so a pass is GEMMs on the operands as they lie: the
forward ``Y[n] = W X[n]`` and the backward-data ``dX[n] = W^T dY[n]`` one strided-batched SGEMM each
(the weight's batch stride 0, its transpose a flag), the backward-filter ``dW = sum_n dY[n] X[n]^T``
one SGEMM per sample accumulating into the result (beta 1 after the first). Everything but the
operands' addresses is worked out when the plan is built; a call sets the handle's math mode and
makes one to ``batch`` cuBLAS calls (its ``launch`` form, for tensors' addresses, on the stream it
is given), where CuPy's ``matmul`` path (broadcasting, a contiguous
copy of the transposed weight, compute-type checks, a context manager for the math mode) spent
150-250 us of host time per pass on the H100 (uxnet3d-encoder's 1x1x1 layers).

The forward and backward-data GEMMs go through cuBLASLt where it loads (:mod:`convtune.direct.cublaslt`: the
algorithm chosen once, when the plan is built; ``CONVTUNE_CUBLASLT=0`` keeps them on cuBLAS). Their ``launch``
replays a CUDA graph per operand addresses (:mod:`convtune.direct.replay`): a cuBLAS(Lt) call costs 10 to 16 µs
of host time, a graph's launch 1.6 to 3.1. CuPy refuses cuBLAS calls while a stream captures, so the cuBLAS
form and the filter gradient's loop are launched directly.

Row-major matrices are handed to column-major cuBLAS as their transposes: ``Y^T = X^T W^T`` and so on.
"""

from __future__ import annotations

import logging
import math

from ..backend import _CUBLAS_DEFAULT_MATH, _CUBLAS_TF32_TENSOR_OP_MATH
from ..executor import Executor
from ..problem import ConvProblem
from . import cublaslt, replay

log = logging.getLogger("convtune")
_SAID: set = set()  # what cuBLASLt's absence has been logged for (once per reason)

#: cuBLAS's operations (cublas_api.h): as it lies, transposed
_N, _T = 0, 1

#: backward-filter above this batch is left to the general path (one SGEMM per sample)
MAX_WGRAD_BATCH = 32


def unsupported_reason(p: ConvProblem, backend) -> str | None:
    """Why the fast path cannot serve ``p`` on ``backend``, or ``None``."""
    if getattr(backend, "name", "") != "cupy":
        return "not the GPU backend"
    return shape_reason(p)


def shape_reason(p: ConvProblem) -> str | None:
    """Why the fast path cannot serve ``p``'s shape on any backend, or ``None``."""
    if math.prod(p.kernel_size) != 1 or any(s != 1 for s in p.stride) or any(p.padding):
        return "not a 1x1, stride-1, unpadded convolution"
    if p.groups != 1:
        return "grouped"
    if p.dtype != "float32" or p.layout != "channels_first":
        return f"{p.dtype} {p.layout} (float32 channels_first only)"
    if p.pass_ == "wgrad" and p.batch > MAX_WGRAD_BATCH:
        return f"backward-filter of batch {p.batch} (one SGEMM per sample up to {MAX_WGRAD_BATCH})"
    return None


def build(p: ConvProblem, xp, tf32: bool):
    """``run(a, b, out)`` for ``p`` (see :func:`unsupported_reason`): ``out``, or ``None`` without doing
    anything where an operand is not a C-contiguous float32 array (the caller then takes its general path)."""
    import numpy
    from cupy_backends.cuda.libs import cublas
    get_handle = xp.cuda.device.get_cublas_handle
    gemm_batched, gemm = cublas.sgemmStridedBatched, cublas.sgemm
    get_mode, set_mode = cublas.getMathMode, cublas.setMathMode
    get_pointer_mode, set_pointer_mode, host_pointers = cublas.getPointerMode, cublas.setPointerMode, 0
    want = _CUBLAS_TF32_TENSOR_OP_MATH if tf32 else _CUBLAS_DEFAULT_MATH
    scalars = numpy.array([1.0, 0.0], dtype=numpy.float32)  # host pointers: alpha 1, beta 0 (see run)
    one, zero = scalars.ctypes.data, scalars.ctypes.data + 4
    N, Ci, Co, P = p.batch, p.in_channels, p.out_channels, math.prod(p.output_size)
    float32 = xp.float32

    def ready(*arrays) -> bool:
        return all(a.dtype == float32 and a.flags.c_contiguous for a in arrays)

    current_stream = xp.cuda.get_current_stream

    def with_mode(call):
        def apply(handle, a, b, out, _scalars=scalars):  # (the closure keeps alpha's and beta's memory alive)
            mode, pointers = get_mode(handle), get_pointer_mode(handle)
            if mode != want:
                set_mode(handle, want)
            if pointers != host_pointers:  # alpha and beta are host scalars
                set_pointer_mode(handle, host_pointers)
            try:
                call(handle, a, b, out)
            finally:
                if mode != want:
                    set_mode(handle, mode)
                if pointers != host_pointers:
                    set_pointer_mode(handle, pointers)

        def run(a, b, out):
            if not ready(a, b, out):
                return None
            apply(get_handle(), a.data.ptr, b.data.ptr, out.data.ptr)
            return out

        def launch(a: int, b: int, out: int, stream) -> None:
            """By address on ``stream`` (see :meth:`Strategy.build <convtune.strategies.base.Strategy.build>`).
            CuPy's cuBLAS wrappers set the handle's stream to CuPy's current one at every call, so ``stream``
            is made current for the call and the previous one put back."""
            previous = current_stream()
            stream.use()
            try:
                apply(get_handle(), a, b, out)
            finally:
                previous.use()

        return Executor(run, launch=launch)

    if p.pass_ in ("fwd", "dgrad") and cublaslt.enabled():  # the cuBLASLt form (convtune.direct.cublaslt)
        try:
            return _lt_build(p, xp, tf32, ready, current_stream)
        except cublaslt.CublasLtError as exc:  # cuBLAS's form instead, said once per reason
            if str(exc) not in _SAID:
                _SAID.add(str(exc))
                log.info("convtune: 1x1 plans call cuBLAS, not cuBLASLt: %s", exc)
    if p.pass_ in ("fwd", "dgrad"):  # one strided-batched SGEMM (gemm_args)
        g = gemm_args(p)
        ta, tb, m, n, k, lda, sa, ldb, sb, ldc, sc, batch = (g[f] for f in _GEMM_FIELDS)

        def call(h, a, b, out):
            gemm_batched(h, ta, tb, m, n, k, one, a, lda, sa, b, ldb, sb, zero, out, ldc, sc, batch)
    else:  # dW^T (Ci x Co) = sum_n X[n] (Ci x P) dY[n]^T (P x Co); a = x, b = dy
        def call(h, x, dy, dw):
            for n in range(N):
                gemm(h, _T, _N, Ci, Co, P, one, x + n * Ci * P * 4, P, dy + n * Co * P * 4, P,
                     zero if n == 0 else one, dw, Ci)
    return with_mode(call)


_GEMM_FIELDS = ("transa", "transb", "m", "n", "k", "lda", "stride_a", "ldb", "stride_b", "ldc", "stride_c", "batch")


def gemm_args(p: ConvProblem) -> dict:
    """The forward's or backward-data's strided-batched GEMM, column-major (cuBLAS's ``sgemmStridedBatched``
    arguments; :class:`~convtune.direct.cublaslt.StridedBatchedGemm`'s)."""
    N, Ci, Co, P = p.batch, p.in_channels, p.out_channels, math.prod(p.output_size)
    if p.pass_ == "fwd":  # Y^T (P x Co) = X^T (P x Ci) W^T (Ci x Co): a = x per sample, b = w shared
        return dict(transa=_N, transb=_N, m=P, n=Co, k=Ci, lda=P, stride_a=Ci * P, ldb=Ci, stride_b=0, ldc=P,
                    stride_c=Co * P, batch=N)
    # dX^T (P x Ci) = dY^T (P x Co) W (Co x Ci): a = dy per sample, b = w read transposed
    return dict(transa=_N, transb=_T, m=P, n=Ci, k=Co, lda=P, stride_a=Co * P, ldb=Ci, stride_b=0, ldc=P,
                stride_c=Ci * P, batch=N)


def _lt_build(p: ConvProblem, xp, tf32: bool, ready, current_stream, lib=None, device_id=None,
              side_stream=None):
    """:func:`build`'s executor through cuBLASLt: the GEMM's algorithm chosen here, once; its ``launch`` replayed
    from CUDA graphs per operand addresses (``side_stream``: :class:`~convtune.direct.replay.AddressReplay`'s, for
    tests)."""
    lib = lib or cublaslt.library()
    device_id = xp.cuda.Device().id if device_id is None else device_id
    gemm = cublaslt.StridedBatchedGemm(lib, cublaslt.handle(lib, device_id), tf32=tf32, **gemm_args(p))

    def run(a, b, out):
        if not ready(a, b, out):
            return None
        gemm(a.data.ptr, b.data.ptr, out.data.ptr, current_stream().ptr)
        return out

    def direct(a: int, b: int, out: int, stream) -> None:
        gemm(a, b, out, stream.ptr)
    return Executor(run, launch=replay.AddressReplay(direct, f"the 1x1 {p.pass_} GEMM of {p.describe()}", side_stream))
