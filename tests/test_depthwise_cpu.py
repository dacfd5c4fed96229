"""The direct depthwise kernels' CUDA source run on the CPU (tests/cuda_cpu.py): the channels-first kernels of 1-D, 2-D
and 3-D problems (simple, tiled, window) and the channels-last ones (nhwc, nhwc-tiled, nhwc-vec), every pass, float32 and
bfloat16 read and written in place (a half-precision filter gradient's float32 sums rounded once), against the float64
reference. The executors' own launches drive them, so their grids and arguments are tested too."""

import ctypes

import numpy
import pytest

from convtune.backend import get_backend
from convtune.building import relative_error
from convtune.errors import ConvtuneError
from convtune.direct import (depthwise, depthwise3d, depthwise_nhwc, depthwise_nhwc_source, depthwise_source,
                             depthwise_staged_source, elements)
from convtune.problem import ConvProblem
from convtune.strategies import get_strategy


class _FakeCupy:
    """What the 3-D executor asks of CuPy besides its kernels: scalar types and a memset."""
    int32, int64 = numpy.int32, numpy.int64

    class cuda:
        class runtime:
            @staticmethod
            def memsetAsync(ptr, value, size, stream):
                ctypes.memset(ptr, value, size)


@pytest.fixture
def emulated(monkeypatch):
    """The 3-D kernels and the rounding kernel compiled for the CPU in place of CuPy's."""
    import cuda_cpu

    class Kernel:
        def __init__(self, launchable):
            self.kernel = launchable

    def kernel(cp, which, kernel, dilation, rows, by, dtype="float32"):
        name = depthwise3d._SOURCES[which][1]
        return Kernel(cuda_cpu.kernels(depthwise3d.source(which, kernel, dilation, rows, by, dtype), [name])[name])

    def kernel2(cp, which, kh, kw, dh=1, dw=1, rows=1, by=1, dtype="float32"):
        name = depthwise_source.SOURCES[which][1]
        return Kernel(cuda_cpu.kernels(depthwise.source(which, kh, kw, dh, dw, rows, by, dtype), [name])[name])

    def kernels_nhwc(cp, which, dtype, *sizes, **kw):
        return cuda_cpu.launchables(depthwise_nhwc.source(which, dtype, *sizes, **kw),
                                    depthwise_nhwc_source.SOURCES[which][1])

    def cast(cp, dtype):
        return cuda_cpu.kernels(elements.ELEMENT_TYPES[dtype] + depthwise_nhwc_source.CAST, ["dw_cast"])["dw_cast"]
    monkeypatch.setattr(depthwise3d, "_kernel", kernel)
    monkeypatch.setattr(depthwise, "_kernel", kernel2)
    def staged_nhwc(cp, which, *args):
        (name,) = depthwise_staged_source.SOURCES[which][1]
        return cuda_cpu.kernels(depthwise_nhwc.staged_source(which, *args), [name])[name]
    monkeypatch.setattr(depthwise_nhwc, "_kernels", kernels_nhwc)
    monkeypatch.setattr(depthwise_nhwc, "_staged_kernel", staged_nhwc)
    monkeypatch.setattr(depthwise_nhwc, "cast_kernel", cast)
    return cuda_cpu


CASES = [dict(input_size=(5, 6, 7), kernel_size=3, padding=1), dict(input_size=(6, 5, 9), kernel_size=(3, 2, 3),
                                                                  padding=(2, 0, 1), dilation=(1, 2, 1))]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_3d_depthwise_kernels_on_the_cpu(emulated, dtype, pass_, case):
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=3, groups=3, dtype=dtype, pass_=pass_, **CASES[case])
    strategy = get_strategy("depthwise")
    configs = strategy._tiled(p, depthwise3d.warps, depthwise3d.reason)
    assert configs
    rng = numpy.random.default_rng(case)
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    numpy_backend = get_backend("numpy")
    for config in configs:
        conv = depthwise3d.Depthwise3dConv(_FakeCupy, p, config.threads, 4, config.rows)
        got, a64, b64 = emulated.run_launch(conv, p, a, b)
        ref = get_strategy("reference").build(p, None, numpy_backend)(a64, b64)
        err = relative_error(numpy, got, ref)
        # float32: the kernels' sums; bfloat16: one rounding of the result (its unit roundoff 2^-8)
        assert err <= (1e-6 if dtype == "float32" else 4e-3), (config.label(), err)


PLANE_CASES = [dict(input_size=(9, 11), kernel_size=3, padding=1), dict(input_size=(8, 13), kernel_size=(3, 5),
                                                                      padding=(2, 1), dilation=(2, 1)),
               dict(input_size=(7, 9), kernel_size=3, padding=1, stride=2), dict(input_size=(20,), kernel_size=5,
                                                                                 padding=2),
               dict(input_size=(14, 14), kernel_size=9, padding=4)]


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case, dtype", [(0, "float32"), (0, "bfloat16"), (1, "float32"), (2, "float32"),
                                         (3, "bfloat16"), (4, "float32")])
def test_1d_and_2d_depthwise_kernels_on_the_cpu(emulated, dtype, pass_, case):
    """The first candidate of each channels-first variant (simple, tiled, window where they apply) and of each
    channels-last one (nhwc, nhwc-tiled), each on its own layout's memory."""
    from convtune.strategies.depthwise import _nhwc
    strategy = get_strategy("depthwise")
    rng = numpy.random.default_rng(case)
    numpy_backend = get_backend("numpy")
    tried = set()
    for layout in ("channels_first", "channels_last"):
        p = ConvProblem.make(batch=2, in_channels=3, out_channels=3, groups=3, dtype=dtype, pass_=pass_, layout=layout,
                             **PLANE_CASES[case])
        a, b = (rng.standard_normal(s) for s in p.operand_shapes)
        for config in strategy.candidates(p, None):
            if _nhwc(config) != (layout == "channels_last") or not strategy.reads(p, config) or \
                    config.variant in tried:
                continue  # (the others run through conversions: their kernels are tested on their own layout; one
                # configuration of each variant, each a compilation)
            if _nhwc(config):
                conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, config.threads, 4, config.rows,
                                                        tiled=config.variant == "nhwc-tiled")
            else:
                conv = depthwise.DepthwiseConv(_FakeCupy, p, config.threads, 4, config.variant, config.rows)
            got, a64, b64 = emulated.run_launch(conv, p, a, b)
            ref = get_strategy("reference").build(p, None, numpy_backend)(a64, b64)
            err = relative_error(numpy, got, ref)
            assert err <= (1e-6 if dtype == "float32" else 4e-3), (layout, config.label(), err)
            tried.add(config.variant)
    assert tried >= {"simple", "nhwc"}, tried


VEC_CASES = [dict(input_size=(9, 11), kernel_size=7, padding=3), dict(input_size=(6, 7), kernel_size=(3, 5),
                                                                    padding=(0, 4)),
             dict(input_size=(21,), kernel_size=5, padding=2)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad"])
@pytest.mark.parametrize("case", range(len(VEC_CASES)))
def test_the_vectorized_channels_last_kernel_on_the_cpu(emulated, dtype, pass_, case):
    """The vectorized channels-last kernel (nhwc-vecV), each of the strategy's configurations: V channels a thread
    (its taps in registers, or 4 x 49 of them in shared memory), channel groups past a block's threads (the last
    block's idle ones), output rows and row segments that overhang the image, padding past the kernel's reach; and
    operands one element off the vector's alignment, which the plain kernel takes instead."""
    from convtune.strategies.depthwise import _vec
    strategy = get_strategy("depthwise")
    rng = numpy.random.default_rng(case)
    channels = 136 if case == 0 else 8  # (136: 68 vectors of 2, past a block of 64 threads' channel groups)
    p = ConvProblem.make(batch=2, in_channels=channels, out_channels=channels, groups=channels, dtype=dtype,
                         pass_=pass_, layout="channels_last", **VEC_CASES[case])
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    ref = get_strategy("reference").build(p, None, get_backend("numpy"))
    bound = 1e-6 if dtype == "float32" else 4e-3
    configs = [c for c in strategy.candidates(p, None) if _vec(c)]
    assert {(_vec(c), c.threads) for c in configs} == {(4, 256), (2, 256), (2, 128), (4, 128)}
    for config in configs:
        conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, config.threads, 4, config.rows, vec=_vec(config))
        assert conv.fallback is None
        got, a64, b64 = emulated.run_launch(conv, p, a, b)
        want = ref(a64, b64)
        err = relative_error(numpy, got, want)
        assert err <= bound, (config.label(), err)
    if case == 0:  # blocks of 64 threads: the second along the channels has 4 of its 64 threads' vectors
        conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 64, 4, 4, vec=2)
        assert conv.grid[0] == 2
        got, a64, b64 = emulated.run_launch(conv, p, a, b)
        want = ref(a64, b64)
        assert relative_error(numpy, got, want) <= bound
    # one element off: the plain kernel, made on first need
    conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 256, 4, 4, vec=2)
    ma, a64 = emulated.launch_memory(a, dtype, "channels_last")
    mb, b64 = emulated.launch_memory(b, dtype, "channels_last")
    from convtune import precision
    res = precision.launch_result(numpy, p.result_shape, dtype, "channels_last")
    shifted = numpy.zeros(ma.size + 1, ma.dtype)
    shifted[1:] = ma.reshape(-1)
    conv.launch(shifted[1:].ctypes.data, mb.ctypes.data, res.ctypes.data, emulated.Stream())
    assert conv.fallback is not None
    got = precision.from_launch(numpy, res, dtype, "channels_last").astype(numpy.float64)
    want = ref(a64, b64)
    assert relative_error(numpy, got, want) <= bound


STAGED_CASES = [dict(input_size=(9, 11), kernel_size=7, padding=3), dict(input_size=(6, 7), kernel_size=(3, 5),
                                                                       padding=(0, 4)),
                dict(input_size=(5, 37), kernel_size=3, padding=1),
                dict(input_size=(11, 36), kernel_size=(3, 5), padding=(1, 2), stride=2),
                dict(input_size=(12, 9), kernel_size=5, padding=2, stride=(2, 1))]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", range(len(STAGED_CASES)))
def test_the_staged_channels_last_kernels_on_the_cpu(emulated, dtype, pass_, case):
    """The staged channels-last kernels (``staged=P``: P channel pairs a block, their tiles copied into shared memory
    by 16-byte loads), every pass: tiles whose rows and column segments overhang the image (4 rows of 9, three
    segments of 13 columns for 37), padding past the kernel's reach, strides of 2 (backward-data's by phases: the
    outputs' rows and columns of every phase, tiles of 3 rows starting on either row phase), two blocks along the
    channels, blocks that loop over several tiles (a filter gradient's sums added across them), narrower segments
    (``segw``) and two tiles' buffers (``pipe``: here, as on devices before compute capability 8.0, copied without
    ``cp.async``, the buffers' indexing and barriers checked); and operands one element off 16 bytes, which the plain
    kernel takes instead."""
    rng = numpy.random.default_rng(case)
    p = ConvProblem.make(batch=2, in_channels=16, out_channels=16, groups=16, dtype=dtype, pass_=pass_,
                         layout="channels_last", **STAGED_CASES[case])
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    ref = get_strategy("reference").build(p, None, get_backend("numpy"))
    bound = 1e-6 if dtype == "float32" else 4e-3
    for pairs, rows, per_sm, segw, pipe in ((4, 4, 1, 16, False), (8, 16, 4, 16, False), (4, 4, 1, 8, True),
                                            (8, 3, 1, 5, True)):
        assert depthwise_nhwc.staged_reason(p, pairs, rows, segw, pipe) is None
        conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 1, rows, staged=pairs, blocks_per_sm=per_sm,
                                                segw=segw, pipe=pipe)
        assert conv.grid[0] == 16 // (2 * pairs)
        got, a64, b64 = emulated.run_launch(conv, p, a, b)
        err = relative_error(numpy, got, ref(a64, b64))
        assert err <= bound, (pairs, rows, segw, pipe, err)
        assert conv.fallback is None
    # one element off 16 bytes: the plain kernel, made on first need
    ma, a64 = emulated.launch_memory(a, dtype, "channels_last")
    mb, b64 = emulated.launch_memory(b, dtype, "channels_last")
    from convtune import precision
    res = precision.launch_result(numpy, p.result_shape, dtype, "channels_last")
    res[...] = 0
    shifted = numpy.zeros(ma.size + 1, ma.dtype)
    shifted[1:] = ma.reshape(-1)
    ws = numpy.zeros(max(1, conv.workspace), numpy.uint8)
    conv.launch(shifted[1:].ctypes.data, mb.ctypes.data, res.ctypes.data, emulated.Stream(), ws.ctypes.data)
    assert conv.fallback is not None
    got = precision.from_launch(numpy, res, dtype, "channels_last").astype(numpy.float64)
    assert relative_error(numpy, got, ref(a64, b64)) <= bound


@pytest.mark.skipif(not __import__("os").environ.get("CONVTUNE_ASAN"), reason="CONVTUNE_ASAN=1 runs it (slow)")
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", range(len(STAGED_CASES)))
def test_the_staged_kernels_under_address_sanitizer(pass_, case):
    """The staged kernels' launches on buffers of exactly the operands', result's and shared memory's sizes
    (float32, each configuration of the strategy's, single and double-buffered): no read or write outside them."""
    import math
    import cuda_cpu
    from convtune.strategies.depthwise import NHWC_STAGED_CONFIGS
    p = ConvProblem.make(batch=2, in_channels=16, out_channels=16, groups=16, dtype="float32", pass_=pass_,
                         layout="channels_last", **STAGED_CASES[case])
    which = depthwise_nhwc.staged_which(p)
    buffers = {16: ("a", math.prod(p.operand_shapes[0])), 32: ("b", math.prod(p.operand_shapes[1])),
               48: ("out", math.prod(p.result_shape))}
    for pairs, rows, _segw, pipe, kib in NHWC_STAGED_CONFIGS:
        if depthwise_nhwc.staged_reason(p, pairs, rows, pipe=pipe, smem=kib * 1024) is not None:
            continue
        (kernel,), calls = cuda_cpu.recorders(depthwise_staged_source.SOURCES[which][1])
        tile = depthwise_nhwc.staged_tile(p, pairs, rows, pipe=pipe, smem=kib * 1024)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(depthwise_nhwc, "_staged_kernel", lambda *args: kernel)
            conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 2, rows, staged=pairs, blocks_per_sm=1, pipe=pipe,
                                                    smem=kib * 1024)
        conv.cp = _NoMemset
        conv.launch(16, 32, 48, cuda_cpu.Stream())
        H, W, OH, OW, KH, KW, SH, SW = depthwise_nhwc.dims(p)[:8]
        source = depthwise_nhwc.staged_source(which, "float32", KH, KW, pairs, tile.s, tile.segw, tile.th,
                                              int(which == "fwd-staged" and pass_ == "dgrad"), int(pipe), SH, SW)
        run = cuda_cpu.sanitized_calls(source, buffers, calls)
        assert run.returncode == 0, (pairs, rows, pipe, run.stderr[-3000:])


class _NoMemset(_FakeCupy):
    """The stand-in CuPy of a launch on stand-in addresses: its memset does nothing."""
    class cuda:
        class runtime:
            @staticmethod
            def memsetAsync(ptr, value, size, stream):
                pass


def test_the_staged_kernels_say_why_not():
    """What the staged kernels do not take, each with its reason."""
    def make(**kw):
        args = dict(batch=2, in_channels=16, out_channels=16, groups=16, input_size=(8, 8), kernel_size=3,
                    padding=1, dtype="bfloat16", layout="channels_last")
        return ConvProblem.make(**{**args, **kw})
    assert depthwise_nhwc.staged_reason(make(stride=2, pass_="dgrad"), 4, 8) is None
    assert "strides up to 2" in depthwise_nhwc.staged_reason(make(stride=3), 4, 8)
    assert "dilation" in depthwise_nhwc.staged_reason(make(dilation=2, padding=2), 4, 8)
    assert depthwise_nhwc.staged_reason(make(stride=2), 4, 8) is None
    assert depthwise_nhwc.staged_reason(make(stride=(1, 2), pass_="wgrad"), 4, 8) is None
    assert "16-byte" in depthwise_nhwc.staged_reason(make(), 2, 8)  # (2 pairs of bfloat16: 8 bytes)
    assert depthwise_nhwc.staged_reason(make(dtype="float32"), 2, 8) is None
    assert "multiple" in depthwise_nhwc.staged_reason(make(in_channels=24, out_channels=24, groups=24), 8, 8)
    assert "2-D" in depthwise_nhwc.staged_reason(make(input_size=(64,)), 4, 8)
    assert "channels-last" in depthwise_nhwc.staged_reason(make(layout="channels_first"), 4, 8)


def test_the_staged_tiles_and_grids(monkeypatch):
    """A staged tile takes as few rows as cover the plane in as many tiles as its largest fitting one would (28 rows
    asked to take 16 a tile: two of 14; 56 in 8s: 8; 14 in 8s: two of 7); a filter gradient's grid holds the blocks
    that the driver says fit a multiprocessor at once (here 4 of the heuristic's 12), each with as many tiles."""
    def make(side, pass_="fwd"):
        return ConvProblem.make(batch=32, in_channels=384, out_channels=384, groups=384, input_size=(side, side),
                                kernel_size=7, padding=3, dtype="bfloat16", layout="channels_last", pass_=pass_)
    assert [depthwise_nhwc.staged_tile(make(side), 4, rows).th for side, rows in ((28, 16), (56, 8), (14, 8), (7, 8))] \
        == [14, 8, 7, 7]
    p = make(14, "wgrad")
    tile = depthwise_nhwc.staged_tile(p, 16, 8, pipe=True)
    assert (tile.th, tile.threads) == (7, 112)
    seen = []

    def resident(kernel, threads, shared):
        seen.append((threads, shared))
        return 4
    monkeypatch.setattr(depthwise_nhwc, "_staged_kernel", lambda *args: object())
    monkeypatch.setattr(depthwise_nhwc, "cast_kernel", lambda *args: object())
    monkeypatch.setattr(depthwise_nhwc, "resident_blocks", resident)
    conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 132, 8, staged=16, pipe=True)
    # 64 tiles of 12 channel groups; 4 x 132 blocks at once: 44 a group, so 2 tiles each, 32 blocks
    assert seen == [(112, tile.shared)] and conv.grid == (12, 32)
    monkeypatch.setattr(depthwise_nhwc, "resident_blocks", lambda *args: 0)  # (the driver cannot say: as before)
    assert depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 132, 8, staged=16, pipe=True).grid == (12, 64)
    fwd = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, make(14), 0, 132, 8, staged=16, pipe=True)
    assert fwd.grid == (12, 64)  # (the forward's grid: the heuristic's)


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_a_staged_tile_over_48_kib(emulated, monkeypatch, pass_):
    """A double-buffered float32 tile of 8 pairs on a 40x40 plane with a 7x7 kernel: in 48 KiB a block it takes one
    row (the filter gradient's, none), in 100 KiB 8 (the launch opting in to more, through the driver: here a stand-in that records the ask); the
    kernels' result within float32's bound either way."""
    p = ConvProblem.make(batch=2, in_channels=16, out_channels=16, groups=16, input_size=(40, 40), kernel_size=7,
                         padding=3, dtype="float32", pass_=pass_, layout="channels_last")
    rng = numpy.random.default_rng(1)
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    ref = get_strategy("reference").build(p, None, get_backend("numpy"))
    small, big = (depthwise_nhwc.staged_tile(p, 8, 16, pipe=True, smem=kib * 1024) for kib in (48, 100))
    assert big.shared > 48 * 1024 and big.th > (small.th if small else 0)  # (the filter gradient's: none in 48 KiB)
    wide = ConvProblem.make(batch=2, in_channels=64, out_channels=64, groups=64, input_size=(40, 40), kernel_size=7,
                            padding=3, dtype="float32", pass_=pass_, layout="channels_last")
    assert "100 KiB" in depthwise_nhwc.staged_reason(wide, 32, 16, pipe=True, smem=100 * 1024)
    asked = []

    def allow(kernel, shared):
        asked.append(shared)
        return True
    monkeypatch.setattr(depthwise_nhwc, "allow_shared", allow)
    for kib in (48, 100) if small else (100,):
        conv = depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 2, 16, staged=8, blocks_per_sm=1, pipe=True,
                                                smem=kib * 1024)
        got, a64, b64 = emulated.run_launch(conv, p, a, b)
        assert relative_error(numpy, got, ref(a64, b64)) <= 1e-6, kib
    assert asked == [big.shared]
    monkeypatch.setattr(depthwise_nhwc, "allow_shared", lambda kernel, shared: False)
    with pytest.raises(ConvtuneError, match="48 KiB"):
        depthwise_nhwc.NhwcDepthwiseConv(_FakeCupy, p, 0, 2, 16, staged=8, pipe=True, smem=100 * 1024)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_3d_depthwise_kernels_in_half_precision_on_the_gpu(dtype, pass_, case):
    import cuda_cpu
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=3, groups=3, dtype=dtype, pass_=pass_, **CASES[case])
    errors = cuda_cpu.gpu_errors("depthwise", p, seed=case)
    assert all(err <= p.tolerance for err in errors.values()), f"{errors} on {p.describe()}"


def test_the_staged_variants_name_their_configuration():
    """A staged configuration's variant names its channel pairs, columns a thread other than 16, double buffers and
    shared memory other than 48 KiB; one that names none of these the strategy does not read as a plain kernel, it
    says so."""
    from convtune.strategies.depthwise import DepthwiseConfig, _staged, staged_variant
    k48 = 48 * 1024
    for variant, want in (("nhwc-st8", (8, 16, False, k48)), ("nhwc-st4p", (4, 16, True, k48)),
                          ("nhwc-st16w8", (16, 8, False, k48)), ("nhwc-st32w7p", (32, 7, True, k48)),
                          ("nhwc-st8pm100", (8, 16, True, 100 * 1024)), ("nhwc-vec4", (0, 16, False, k48)),
                          ("tiled", (0, 16, False, k48))):
        assert _staged(DepthwiseConfig(variant=variant)) == want
        if want[0]:
            assert staged_variant(*want) == variant
    with pytest.raises(ValueError, match="staged"):
        _staged(DepthwiseConfig(variant="nhwc-stx"))
