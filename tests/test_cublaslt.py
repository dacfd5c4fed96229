"""The cuBLASLt form of the 1x1 plans (convtune.direct.cublaslt) against a stand-in library that does the
column-major GEMMs its descriptors describe, on host memory: the descriptors, the layouts, the batch strides and the
call, and the 1x1 passes' GEMM (cublas_pointwise.gemm_args, which the cuBLAS form calls too) against the convolution's
definition. The real library's ABI is checked only on a GPU (the GPU test below)."""

import ctypes
import itertools

import numpy
import pytest
from numpy.lib.stride_tricks import as_strided

from convtune.direct import cublas_pointwise, cublaslt, replay
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
    (desc,) = [o for o in lib.objects.values() if o.get("kind") == "desc"]
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


def test_on_by_default_and_the_gemm_mapping(monkeypatch):
    monkeypatch.delenv(cublaslt.ENV, raising=False)
    assert cublaslt.enabled()
    monkeypatch.setenv(cublaslt.ENV, "0")
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
    with pytest.raises(cublaslt.CublasLtError, match="status 15; set CONVTUNE_CUBLASLT=0 to use cuBLAS"):
        cublas_pointwise._lt_build(p, None, False, lambda *a: True, None, lib=Failing(), device_id=0)


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", ["fwd", "dgrad"])
def test_cublaslt_on_the_gpu(pass_, monkeypatch):
    """The real library: the 1x1 plan's forward and backward-data through cuBLASLt against float64, called on arrays
    and by address: directly, then from the CUDA graph the second call with the same addresses captures (replayed on
    a stream of its own, the result overwritten between calls)."""
    import cupy
    from convtune.backend import get_backend
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    monkeypatch.setenv(cublaslt.ENV, "1")
    be = get_backend("cupy")
    p = ConvProblem.make(batch=4, in_channels=64, out_channels=96, input_size=(14, 14), kernel_size=1, pass_=pass_)
    a, b = random_operands(be, p, seed=1)
    run = cublas_pointwise.build(p, cupy, False)
    assert isinstance(run.launch, replay.AddressReplay)  # (the cuBLASLt form)
    out = cupy.full(p.result_shape, cupy.nan, cupy.float32)
    run(a, b, out)
    ref = get_strategy("reference").build(p, None, be)(a.astype(cupy.float64), b.astype(cupy.float64))
    assert relative_error(cupy, out, ref) <= 1e-5
    stream = cupy.cuda.Stream(non_blocking=True)
    for call in range(4):
        out.fill(cupy.nan)
        run.launch(a.data.ptr, b.data.ptr, out.data.ptr, stream)
        stream.synchronize()
        assert relative_error(cupy, out, ref) <= 1e-5, call
    assert run.launch.off is None and (run.launch.made, run.launch.replayed) == (1, 2)
    monkeypatch.setenv(cublaslt.ENV, "0")  # the switch back to cuBLAS's form
    assert not hasattr(cublas_pointwise.build(p, cupy, False), "gemm")


# -- replaying the launch from CUDA graphs (convtune.direct.replay), with stand-in streams and graphs ----------------
class _Graph:
    def __init__(self, log, key):
        self.log, self.key = log, key

    def launch(self, stream):
        self.log.append(("replay", self.key, stream))


class _SideStream:
    """A stand-in capture stream: what is launched on it between begin and end becomes a graph of those calls."""

    def __init__(self, log, fail=False):
        self.log, self.fail, self.capturing = log, fail, None

    def begin_capture(self, mode):
        assert mode == "thread-local" and self.capturing is None
        if self.fail:
            raise RuntimeError("no capture here")
        self.capturing = []

    def end_capture(self):
        calls, self.capturing = self.capturing, None
        assert len(calls) == 1
        return _Graph(self.log, calls[0])


def _replaying(fail=False):
    from convtune.direct import replay
    log = []
    side = _SideStream(log, fail)

    def launch(a, b, out, stream):
        if stream is side:
            side.capturing.append((a, b, out))
        else:
            log.append(("direct", (a, b, out), stream))
    return replay.AddressReplay(launch, "a test GEMM", side_stream=lambda: (side, "thread-local")), log


def test_a_launch_is_replayed_from_its_addresses_graph_from_the_second_call():
    """The first call with some addresses goes direct, the second captures them (on the side stream, not the caller's)
    and replays the graph on the caller's stream, later ones only replay; other addresses get graphs of their own."""
    run, log = _replaying()
    for stream in ("s1", "s1", "s2", "s1"):
        run(1, 2, 3, stream)
    run(4, 2, 5, "s1")
    run(4, 2, 5, "s1")
    assert log == [("direct", (1, 2, 3), "s1"), ("replay", (1, 2, 3), "s1"), ("replay", (1, 2, 3), "s2"),
                   ("replay", (1, 2, 3), "s1"), ("direct", (4, 2, 5), "s1"), ("replay", (4, 2, 5), "s1")]
    assert (run.made, run.replayed, run.off) == (2, 2, None)


def test_graphs_and_remembered_addresses_are_bounded(monkeypatch):
    from convtune.direct import replay
    monkeypatch.setattr(replay, "GRAPHS", 3)
    monkeypatch.setattr(replay, "SEEN", 2)
    run, log = _replaying()
    for key in range(5):  # each seen twice: five graphs made, the oldest two dropped
        run(key, 0, 0, "s")
        run(key, 0, 0, "s")
    assert list(run._graphs) == [(2, 0, 0), (3, 0, 0), (4, 0, 0)]
    log.clear()
    run(0, 0, 0, "s")  # its graph was dropped: direct again, remembered
    assert log == [("direct", (0, 0, 0), "s")]
    for key in (10, 11, 12):
        run(key, 0, 0, "s")
    assert list(run._seen) == [(11, 0, 0), (12, 0, 0)]


def test_replay_switches_off_where_addresses_keep_changing(monkeypatch, caplog):
    """Graphs made far more often than replayed: replay is switched off (said once), every call goes direct."""
    import logging
    from convtune.direct import replay
    monkeypatch.setattr(replay, "CHURN_GRAPHS", 4)
    run, log = _replaying()
    with caplog.at_level(logging.INFO, logger="convtune"):
        for key in range(8):
            run(key, 0, 0, "s")
            run(key, 0, 0, "s")
    assert run.off is not None and "keep changing" in run.off and not run._graphs
    assert [r.getMessage() for r in caplog.records if "CUDA graphs" in r.getMessage()] == [
        "convtune: a test GEMM is launched directly from now on, not replayed from CUDA graphs: " + run.off]
    log.clear()
    run(7, 0, 0, "s")
    run(7, 0, 0, "s")
    assert log == [("direct", (7, 0, 0), "s")] * 2


def test_a_failed_capture_goes_direct_and_switches_replay_off(caplog):
    import logging
    run, log = _replaying(fail=True)
    with caplog.at_level(logging.INFO, logger="convtune"):
        for _ in range(3):
            run(1, 2, 3, "s")
    assert log == [("direct", (1, 2, 3), "s")] * 3
    assert "no capture here" in run.off and sum("CUDA graphs" in r.getMessage() for r in caplog.records) == 1


def test_the_1x1_plans_launch_replays_through_cublaslt():
    """The cuBLASLt plan's ``launch`` is the replaying one: on the stand-in library the first call runs the GEMM, the
    second captures it on the side stream (the stand-in runs it there too: right results from the GEMM as captured)
    and launches the graph on the caller's stream, as the third does. What a graph's replay computes on the GPU is
    the GPU test's (test_cublaslt_on_the_gpu)."""
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(5, 5), kernel_size=1)
    lib = FakeLt()
    captured = []

    class Side(_Stream):
        def begin_capture(self, mode):
            captured.append("begin")

        def end_capture(self):
            captured.append("end")
            return _Graph(captured, "gemm")
    run = cublas_pointwise._lt_build(p, None, False, lambda *a: True, None, lib=lib, device_id=0,
                                     side_stream=lambda: (Side(), "mode"))
    rng = numpy.random.default_rng(1)
    a, b = (rng.standard_normal(s).astype(numpy.float32) for s in p.operand_shapes)
    out = numpy.full(p.result_shape, numpy.nan, numpy.float32)
    ref = reference(numpy, p, a.astype(numpy.float64), b.astype(numpy.float64))
    mine = _Stream()
    for call in range(3):
        out[...] = numpy.nan
        run.launch(a.ctypes.data, b.ctypes.data, out.ctypes.data, mine)
        if call < 2:
            assert numpy.abs(out - ref).max() <= 1e-5 * numpy.abs(ref).max()
    assert captured == ["begin", "end", ("replay", "gemm", mine), ("replay", "gemm", mine)] and len(lib.calls) == 2


def test_the_environment_switches_replay_off(monkeypatch):
    from convtune.direct import replay
    monkeypatch.setenv(replay.ENV, "0")
    run, log = _replaying()
    for _ in range(3):
        run(1, 2, 3, "s")
    assert log == [("direct", (1, 2, 3), "s")] * 3 and run.off == "CONVTUNE_REPLAY=0" and run.made == 0


def test_a_call_on_a_capturing_stream_is_never_captured_here():
    """The caller's stream capturing (a CUDA graph of the caller's): the call goes direct, recorded in that capture,
    with no capture of our own begun; once it stops capturing, replay resumes."""
    class Capturing:
        capturing = True

        def is_capturing(self):
            return self.capturing
    run, log = _replaying()
    s = Capturing()
    for _ in range(3):
        run(1, 2, 3, s)
    assert log == [("direct", (1, 2, 3), s)] * 3 and run.made == 0 and run.off is None
    s.capturing = False
    run(1, 2, 3, s)
    assert log[-1] == ("replay", (1, 2, 3), s) and run.made == 1


class _Memory:
    """A stand-in array module: ``empty`` hands out blocks at made-up addresses and counts them."""

    def __init__(self):
        self.blocks = []
        self.uint8 = "uint8"

    def empty(self, nbytes, dtype):
        from types import SimpleNamespace
        block = SimpleNamespace(nbytes=nbytes, data=SimpleNamespace(ptr=1000 + 100 * len(self.blocks)))
        self.blocks.append(block)
        return block


def test_a_launch_owning_its_workspace_passes_one_block_to_every_call_and_capture():
    """``replay.owning``: a launch that takes a workspace as a fifth argument becomes a four-argument replayed launch
    that holds its own block, allocated once, when it is made (no call allocates: a first call may come inside a
    caller's capture), and passed to the direct call, the capture and so every replay; a launch that needs none
    holds nothing."""
    from convtune.direct import replay
    log, memory = [], _Memory()
    side = _SideStream(log)

    def launch(a, b, out, stream, workspace):
        if stream is side:
            side.capturing.append((a, b, out, workspace))
        else:
            log.append(("direct", (a, b, out, workspace), stream))
    run = replay.owning(launch, 96, memory, "a test launch", side_stream=lambda: (side, "thread-local"))
    (block,) = memory.blocks
    for _ in range(3):
        run(1, 2, 3, "s")
    run(4, 5, 6, "s")
    assert block.nbytes == 96 and run.holds is block and len(memory.blocks) == 1
    assert log == [("direct", (1, 2, 3, 1000), "s"), ("replay", (1, 2, 3, 1000), "s"), ("replay", (1, 2, 3, 1000), "s"),
                   ("direct", (4, 5, 6, 1000), "s")]
    none = replay.owning(lambda a, b, out, stream: log.append(("bare", (a, b, out), stream)), 0, memory, "bare")
    none(7, 8, 9, "s")
    assert none.holds is None and log[-1] == ("bare", (7, 8, 9), "s") and len(memory.blocks) == 1


def test_the_graphs_made_and_replayed_are_counted_over_the_launches_alive():
    """replay.counts() sums every live launch's graphs made and replays: a benchmark reads it around its steps."""
    import gc
    from convtune.direct import replay
    made, replayed, _seconds = replay.counts()
    first, _ = _replaying()
    second, _ = _replaying()
    for run in (first, second, first):
        run(1, 2, 3, "s")
        run(1, 2, 3, "s")
    assert replay.counts()[:2] == (made + 2, replayed + 2)  # first: one graph, two replays; second: one graph
    assert first.capture_s > 0 and second.capture_s > 0
    del second
    gc.collect()
    assert replay.counts()[:2] == (made + 1, replayed + 2)  # (a plan dropped takes its counts with it)
