"""convtune's own 64x64 transforms against float64 FFTs: placement of the forward operand, the
inverse's gathers (crop, strides, cyclic offsets, taps), and their argument checks."""

import numpy
import pytest

from convtune.fft import fft64


def _own_order(spec):
    """(B, 64, 33) rfft2 layout -> (B, 2112) in the kernels' frequency order (v * 64 + u)."""
    return spec.transpose(0, 2, 1).reshape(spec.shape[0], fft64.FREQS)


@pytest.mark.gpu
@pytest.mark.parametrize("shape, steps", [((7, 64, 64), (1, 1)), ((5, 9, 9), (1, 1)), ((4, 56, 60), (1, 1)),
                                          ((3, 30, 20), (2, 3)), ((2, 1, 64), (1, 1)), ((0, 8, 8), (1, 1))])
def test_forward_matches_float64(shape, steps):
    import cupy
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal(shape).astype(numpy.float32)
    grid = numpy.zeros((shape[0], 64, 64))
    grid[:, :shape[1] * steps[0]:steps[0], :shape[2] * steps[1]:steps[1]] = a
    ref = _own_order(numpy.fft.rfft2(grid))
    out = cupy.full((shape[0], fft64.FREQS), numpy.nan, dtype=cupy.complex64)
    assert fft64.rfft(cupy.asarray(a), out, steps) is out
    got = cupy.asnumpy(out)
    if shape[0]:  # an empty batch launches nothing
        assert numpy.abs(got - ref).max() <= 1e-6 * numpy.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", [((0, 1, 64), (0, 1, 64)), ((0, 1, 56), (0, 1, 56)), ((0, 1, 9), (0, 1, 3)),
                                      ((61, 2, 20), (5, 3, 15)), ((0, 1, 1), (63, 1, 64))])
def test_inverse_gathers_match_float64(geometry):
    import cupy
    rng = numpy.random.default_rng(2)
    spec = numpy.fft.rfft2(rng.standard_normal((6, 64, 64)))
    full = numpy.fft.irfft2(spec, s=(64, 64)) * 64 * 64  # unnormalised, as cuFFT's
    (o0, s0, c0), (o1, s1, c1) = geometry
    rows, cols = (numpy.arange(c0) * s0 - o0) % 64, (numpy.arange(c1) * s1 - o1) % 64
    ref = full[:, rows][:, :, cols]
    dst = cupy.full((6, c0, c1), numpy.nan, dtype=cupy.float32)
    fft64.irfft(cupy.asarray(_own_order(spec).astype(numpy.complex64)), dst, geometry)
    assert numpy.abs(cupy.asnumpy(dst) - ref).max() <= 1e-6 * numpy.abs(full).max()


def test_only_64x64_and_checked_arguments():
    assert fft64.applies((64, 64)) is None
    assert "64x64 only, not 32x32" in fft64.applies((32, 32))
    assert "not 64" in fft64.applies((64,))
    images = numpy.zeros((2, 9, 9), numpy.float32)
    with pytest.raises(ValueError, match=r"C-contiguous \(2, 2112\)"):
        fft64.rfft(images, numpy.zeros((2, 100), numpy.complex64))
    with pytest.raises(ValueError, match="do not fit"):
        fft64.rfft(images, numpy.zeros((2, fft64.FREQS), numpy.complex64), steps=(8, 1))
    with pytest.raises(ValueError, match="must be"):
        fft64.rfft(images[0], numpy.zeros((2, fft64.FREQS), numpy.complex64))
    spec = numpy.zeros((2, fft64.FREQS), numpy.complex64)
    with pytest.raises(ValueError, match=r"destination must be C-contiguous \(2, 9, 9\)"):
        fft64.irfft(spec, numpy.zeros((2, 8, 9), numpy.float32), ((0, 1, 9), (0, 1, 9)))
    with pytest.raises(ValueError, match="steps must be positive"):
        fft64.irfft(spec, numpy.zeros((2, 9, 9), numpy.float32), ((0, 0, 9), (0, 1, 9)))
