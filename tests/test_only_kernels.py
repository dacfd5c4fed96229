"""compiling.only_kernels: a block-FFT source cut down to the kernels a module needs (what NVRTC compiles)."""

import re

import numpy
import pytest

from convtune import ConvProblem
from convtune.compiling import only_kernels, pass_kernels, pass_names
from convtune.fft import planeconv, rowconv


def _kernels_of(code):
    return re.findall(r'extern "C" __global__ void(?:\s+__launch_bounds__\([^)]*\))?\s+(\w+)\(', code)


@pytest.mark.parametrize("code, names", [
    (rowconv.source("float32", 64), rowconv.NAMES + rowconv.KEPT_NAMES + (rowconv.BOTH_NAME,)),
    (planeconv.source("bfloat16", (16, 16)), planeconv.NAMES + planeconv.KEPT_NAMES + planeconv.FUSED_NAMES[:1])])
def test_only_the_named_kernels_stay(code, names):
    assert sorted(_kernels_of(code)) == sorted(names)
    for keep in (names[:1], names[1:3], names[-2:]):
        cut = only_kernels(code, keep)
        assert _kernels_of(cut) == [n for n in _kernels_of(code) if n in keep]
        assert len(cut) < len(code) and cut.count("{") == cut.count("}")
    assert only_kernels(code, names) == code
    with pytest.raises(ValueError, match="no kernel"):
        only_kernels(code, ("rowfft_nothing",))


@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_a_pass_runs_from_its_own_kernels_on_the_cpu(pass_):
    """The per-pass executor on the kernels of :func:`compiling.pass_names` alone (the emulated CPU build of the cut
    source), the others ``None``: the same result as from the whole source."""
    import cuda_cpu
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=3, groups=3, input_size=(37,), kernel_size=11,
                         padding=5, pass_=pass_)
    names = pass_names(rowconv.NAMES, pass_)
    code = rowconv.source("float32", 32)
    cut = pass_kernels(rowconv.NAMES, names, cuda_cpu.launchables(only_kernels(code, names), names))
    assert sum(k is None for k in cut) == len(rowconv.NAMES) - len(names)
    whole = cuda_cpu.launchables(code, rowconv.NAMES)
    rng = numpy.random.default_rng(0)
    a, b = (rng.standard_normal(s).astype(numpy.float32) for s in p.operand_shapes)
    results = []
    for kernels in (cut, whole):
        conv = rowconv.RowFftConv(None, p, 64, kernels=kernels)
        out = numpy.zeros(p.result_shape, numpy.float32)
        ws = numpy.zeros(max(conv.workspace, 8), numpy.uint8)
        conv.launch(a.ctypes.data, b.ctypes.data, out.ctypes.data, cuda_cpu.Stream(), ws.ctypes.data)
        results.append(out)
    assert numpy.array_equal(*results) and numpy.abs(results[0]).max() > 0
