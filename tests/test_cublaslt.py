"""The opt-in cuBLASLt form of the 1x1 plans (convtune.direct.cublaslt) against a stand-in library that does the
column-major GEMMs its descriptors describe, on host memory: the descriptors, the layouts, the batch strides and the
call, and the 1x1 passes' GEMM (cublas_pointwise.gemm_args, which the cuBLAS form calls too) against the convolution's
definition. The real library's ABI is checked only on a GPU (the GPU test below)."""

import ctypes
import itertools

import numpy
import pytest
from numpy.lib.stride_tricks import as_strided

from convtune.direct import cublas_pointwise, cublaslt
from convtune.direct.reference import reference
from convtune.problem import ConvProblem


def _v(x):
    return x.value if hasattr(x, "value") else x


def _read(buf, size):
    kind = {4: ctypes.c_int32, 8: ctypes.c_int64}[size]
    return ctypes.cast(buf, ctypes.POINTER(kind))[0]


class FakeLt:
    """cuBLASLt's entry points as used, on host memory: status 0, GEMMs done with NumPy."""

    def __init__(self):
        self.objects, self.ids, self.calls = {}, itertools.count(1), []

    def _new(self, ptr, **fields):
        key = next(self.ids)
        self.objects[key] = fields
        ptr.contents.value = key
        return 0

    def cublasLtCreate(self, ptr):
        return self._new(ptr, kind="handle")

    def cublasLtMatmulDescCreate(self, ptr, compute, scale):
        return self._new(ptr, kind="desc", compute=compute, scale=scale, **{"3": 0, "4": 0})

    def cublasLtMatrixLayoutCreate(self, ptr, dtype, rows, cols, ld):
        return self._new(ptr, kind="layout", dtype=dtype, rows=rows, cols=cols, ld=ld, **{"5": 1, "6": 0})

    def cublasLtMatmulPreferenceCreate(self, ptr):
        return self._new(ptr, kind="pref")

    def _set(self, obj, attribute, buf, size):
        self.objects[_v(obj)][str(attribute)] = _read(buf, size)
        return 0
    cublasLtMatmulDescSetAttribute = cublasLtMatrixLayoutSetAttribute = cublasLtMatmulPreferenceSetAttribute = _set

    def _destroy(self, obj):
        del self.objects[_v(obj)]
        return 0
    cublasLtMatmulDescDestroy = cublasLtMatrixLayoutDestroy = cublasLtMatmulPreferenceDestroy = _destroy

    def cublasLtMatmulAlgoGetHeuristic(self, handle, desc, a, b, c, d, pref, requested, results, found):
        assert self.objects[_v(pref)]["1"] == 0  # no workspace asked
        ctypes.cast(results, ctypes.POINTER(cublaslt.HeuristicResult))[0].algo[0] = 42
        found.contents.value = 1
        return 0

    def cublasLtMatmul(self, handle, desc, alpha, a, a_l, b, b_l, beta, c, c_l, d, d_l, algo, ws, ws_size, stream):
        self.calls.append(stream)
        assert ctypes.cast(algo, ctypes.POINTER(ctypes.c_uint64))[0] == 42 and c == d and ws is None and ws_size == 0
        desc, layouts = self.objects[_v(desc)], [self.objects[_v(x)] for x in (a_l, b_l, c_l)]
        alpha, beta = (ctypes.cast(x, ctypes.POINTER(ctypes.c_float))[0] for x in (alpha, beta))
        batch = layouts[2]["5"]
        assert all(lay["5"] == batch for lay in layouts)

        def matrix(address, lay, i):
            rows, cols, ld, stride = lay["rows"], lay["cols"], lay["ld"], lay["6"]
            extent = ld * (cols - 1) + rows
            flat = numpy.ctypeslib.as_array((ctypes.c_float * extent).from_address(address + 4 * i * stride))
            return as_strided(flat, shape=(rows, cols), strides=(4, 4 * ld))  # column-major
        for i in range(batch):
            A, B, D = matrix(a, layouts[0], i), matrix(b, layouts[1], i), matrix(d, layouts[2], i)
            A = A.T if desc["3"] == cublaslt.OP_T else A
            B = B.T if desc["4"] == cublaslt.OP_T else B
            # (as cuBLAS: with beta 0, C is not read)
            D[...] = alpha * (A.astype(numpy.float64) @ B) + (beta * D if beta else 0.0)
        return 0


class _Stream:
    ptr = 1234


@pytest.mark.parametrize("pass_", ["fwd", "dgrad"])
@pytest.mark.parametrize("tf32", [False, True])
def test_the_1x1_gemm_through_cublaslt_is_the_convolution(pass_, tf32):
    p = ConvProblem.make(batch=3, in_channels=5, out_channels=4, input_size=(6, 7), kernel_size=1, pass_=pass_,
                         math="tf32" if tf32 else "fp32")
    lib = FakeLt()
    run = cublas_pointwise._lt_build(p, None, tf32, lambda *a: True, None, lib=lib, device_id=0)
    desc = lib.objects[run.gemm.desc.value]
    assert desc["compute"] == (cublaslt.COMPUTE_32F_FAST_TF32 if tf32 else cublaslt.COMPUTE_32F)
    rng = numpy.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(numpy.float32) for s in p.operand_shapes)
    out = numpy.full(p.result_shape, numpy.nan, numpy.float32)
    run.launch(a.ctypes.data, b.ctypes.data, out.ctypes.data, _Stream())
    ref = reference(numpy, p, a.astype(numpy.float64), b.astype(numpy.float64))
    assert numpy.abs(out - ref).max() <= 1e-5 * numpy.abs(ref).max()
    assert lib.calls == [1234]  # on the stream given
    handles = len([o for o in lib.objects.values() if o["kind"] == "handle"])
    del run
    import gc
    gc.collect()
    assert [o["kind"] for o in lib.objects.values()] == ["handle"] * handles  # descriptors released


def test_opt_in_and_the_gemm_mapping(monkeypatch):
    monkeypatch.delenv(cublaslt.ENV, raising=False)
    assert not cublaslt.enabled()
    monkeypatch.setenv(cublaslt.ENV, "1")
    assert cublaslt.enabled()
    p = ConvProblem.make(batch=2, in_channels=8, out_channels=16, input_size=(5, 5), kernel_size=1)
    g = cublas_pointwise.gemm_args(p)
    assert (g["m"], g["n"], g["k"], g["stride_b"], g["batch"]) == (25, 16, 8, 0, 2)
    g = cublas_pointwise.gemm_args(p.for_pass("dgrad"))
    assert (g["transb"], g["m"], g["n"], g["k"], g["stride_a"]) == (cublaslt.OP_T, 25, 8, 16, 16 * 25)


def test_a_failing_status_says_how_to_go_back():
    class Failing(FakeLt):
        def cublasLtMatmulAlgoGetHeuristic(self, *args):
            return 15  # CUBLAS_STATUS_NOT_SUPPORTED
    p = ConvProblem.make(batch=2, in_channels=8, out_channels=16, input_size=(5, 5), kernel_size=1)
    with pytest.raises(cublaslt.CublasLtError, match="status 15; unset CONVTUNE_CUBLASLT"):
        cublas_pointwise._lt_build(p, None, False, lambda *a: True, None, lib=Failing(), device_id=0)


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "dgrad"])
def test_cublaslt_on_the_gpu(pass_, monkeypatch):
    """The real library: the 1x1 plan's forward and backward-data through cuBLASLt against float64."""
    import cupy
    from convtune.backend import get_backend
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    monkeypatch.setenv(cublaslt.ENV, "1")
    be = get_backend("cupy")
    p = ConvProblem.make(batch=4, in_channels=64, out_channels=96, input_size=(14, 14), kernel_size=1, pass_=pass_)
    a, b = random_operands(be, p, seed=1)
    run = cublas_pointwise.build(p, cupy, False)
    assert hasattr(run, "gemm")
    out = cupy.full(p.result_shape, cupy.nan, cupy.float32)
    run(a, b, out)
    ref = get_strategy("reference").build(p, None, be)(a.astype(cupy.float64), b.astype(cupy.float64))
    assert relative_error(cupy, out, ref) <= 1e-5
