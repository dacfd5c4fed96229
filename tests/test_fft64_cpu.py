"""convtune's own 64x64 transforms (convtune.fft.fft64) with their CUDA source run on the CPU (tests/cuda_cpu.py):
the forward's placement of the operand and the inverse's gathers against float64 FFTs, float32 and bfloat16 (as its
16 bits), through the module's own functions (``rfft``, ``irfft``). The GPU tests (test_fft64.py) run the same on the
device; these guard the source in CI."""

from types import SimpleNamespace

import numpy
import pytest

from convtune import precision
from convtune.fft import fft64
from test_fft64 import _own_order, inverse_case


class _OnDevice(numpy.ndarray):
    """A NumPy array with the ``device.id`` the module's functions read from CuPy arrays."""
    device = SimpleNamespace(id=0)


def _on_device(a):
    return numpy.ascontiguousarray(a).view(_OnDevice)


@pytest.fixture
def emulated(monkeypatch):
    import cuda_cpu
    names = ["convtune_rfft64_f32", "convtune_rfft64_b16", "convtune_irfft64_f32", "convtune_irfft64_f32r",
             "convtune_irfft64_b16"]
    found = cuda_cpu.kernels(fft64._SOURCE, names)
    k = numpy.arange(fft64.SIZE)
    twiddles = _on_device(numpy.exp(-2j * numpy.pi * k / fft64.SIZE).astype(numpy.complex64))
    monkeypatch.setattr(fft64, "_kernel", lambda name: found[name])
    monkeypatch.setattr(fft64, "_twiddles", lambda device_id: twiddles)
    return found


def _as_element(a, element):
    if element == "float32":
        return _on_device(a), a.astype(numpy.float64)
    rounded = precision.round_to(numpy, a, "bfloat16")  # bfloat16: its 16 bits as uint16
    return _on_device((rounded.view(numpy.uint32) >> 16).astype(numpy.uint16)), rounded.astype(numpy.float64)


@pytest.mark.parametrize("element", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape, steps", [((3, 64, 64), (1, 1)), ((2, 9, 9), (1, 1)), ((2, 30, 20), (2, 3))])
def test_forward_on_the_cpu(emulated, element, shape, steps):
    rng = numpy.random.default_rng(1)
    src, values = _as_element(rng.standard_normal(shape).astype(numpy.float32), element)
    grid = numpy.zeros((shape[0], 64, 64))
    grid[:, :shape[1] * steps[0]:steps[0], :shape[2] * steps[1]:steps[1]] = values
    ref = _own_order(numpy.fft.rfft2(grid))
    out = _on_device(numpy.full((shape[0], fft64.FREQS), numpy.nan, dtype=numpy.complex64))
    fft64.rfft(src, out, steps)
    assert numpy.abs(out - ref).max() <= 1e-6 * numpy.abs(ref).max()


@pytest.mark.parametrize("element", ["float32", "bfloat16"])
@pytest.mark.parametrize("geometry", [((0, 1, 64), (0, 1, 64)), ((0, 1, 9), (0, 1, 3)), ((61, 2, 20), (5, 3, 15))])
def test_inverse_gathers_on_the_cpu(emulated, element, geometry):
    spec, full, ref = inverse_case(geometry, 2)
    (_o0, _s0, c0), (_o1, _s1, c1) = geometry
    kind = numpy.float32 if element == "float32" else numpy.uint16
    dst = _on_device(numpy.zeros((2, c0, c1), dtype=kind))
    fft64.irfft(_on_device(_own_order(spec).astype(numpy.complex64)), dst, geometry)
    got = dst.astype(numpy.float64) if element == "float32" else \
        (dst.astype(numpy.uint32) << 16).view(numpy.float32).astype(numpy.float64)
    bound = 1e-6 if element == "float32" else 2 ** -8  # (bfloat16: one rounding of each result)
    assert numpy.abs(got - ref).max() <= bound * numpy.abs(full).max()
