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


def inverse_case(geometry, images: int):
    """Random spectra of ``images`` images (float64, rfft2's layout), the unnormalised full inverse, and what the
    inverse's gather of ``geometry`` must give."""
    rng = numpy.random.default_rng(2)
    spec = numpy.fft.rfft2(rng.standard_normal((images, 64, 64)))
    full = numpy.fft.irfft2(spec, s=(64, 64)) * 64 * 64  # unnormalised, as cuFFT's
    (o0, s0, c0), (o1, s1, c1) = geometry
    rows, cols = (numpy.arange(c0) * s0 - o0) % 64, (numpy.arange(c1) * s1 - o1) % 64
    return spec, full, full[:, rows][:, :, cols]


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", [((0, 1, 64), (0, 1, 64)), ((0, 1, 56), (0, 1, 56)), ((0, 1, 9), (0, 1, 3)),
                                      ((61, 2, 20), (5, 3, 15)), ((0, 1, 1), (63, 1, 64))])
def test_inverse_gathers_match_float64(geometry):
    import cupy
    spec, full, ref = inverse_case(geometry, 6)
    (_o0, _s0, c0), (_o1, _s1, c1) = geometry
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
    with pytest.raises(ValueError, match="float32, float16, or bfloat16 as 16-bit integers, not float64"):
        fft64.rfft(images.astype(numpy.float64), numpy.zeros((2, fft64.FREQS), numpy.complex64))
    spec = numpy.zeros((2, fft64.FREQS), numpy.complex64)
    with pytest.raises(ValueError, match=r"destination must hold 2 images of 9x9"):
        fft64.irfft(spec, numpy.zeros((2, 8, 9), numpy.float32), ((0, 1, 9), (0, 1, 9)))
    with pytest.raises(ValueError, match="steps must be positive"):
        fft64.irfft(spec, numpy.zeros((2, 9, 9), numpy.float32), ((0, 0, 9), (0, 1, 9)))


# -- operands as they lie: any strides, half precision (the FFT strategy's half-precision and channels_last plans) ----
def _as_element(cupy, a, element):
    """A float32 NumPy array as the kernels' element type on the GPU, and the float64 values it holds."""
    from convtune import precision
    if element == "float32":
        return cupy.asarray(a), a.astype(numpy.float64)
    if element == "float16":
        h = a.astype(numpy.float16)
        return cupy.asarray(h), h.astype(numpy.float64)
    rounded = precision.round_to(numpy, a, "bfloat16")  # bfloat16: its 16 bits as uint16
    return cupy.asarray((rounded.view(numpy.uint32) >> 16).astype(numpy.uint16)), rounded.astype(numpy.float64)


def _channels_last(cupy, a):
    """A 4-D CuPy array of the same values with channels-last memory (N, H, W, C)."""
    return cupy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_forward_reads_any_dtype_and_strides(element, layout):
    """The images of an (N, C, n0, n1) operand as they lie (channels_last strides, float16, bfloat16's bits, a
    batch slice): the spectra of the values they hold, against float64."""
    import cupy
    rng = numpy.random.default_rng(3)
    a = rng.standard_normal((4, 5, 9, 11)).astype(numpy.float32)
    arr, exact = _as_element(cupy, a, element)
    if layout == "channels_last":
        arr = _channels_last(cupy, arr)
    arr, exact = arr[1:3], exact[1:3]  # a slice: the images start at an offset
    steps = (2, 3)
    grid = numpy.zeros((2, 5, 64, 64))
    grid[:, :, :9 * 2:2, :11 * 3:3] = exact
    ref = _own_order(numpy.fft.rfft2(grid).reshape(10, 64, 33))
    out = cupy.full((10, fft64.FREQS), numpy.nan, dtype=cupy.complex64)
    fft64.rfft(arr, out, steps)
    assert numpy.abs(cupy.asnumpy(out) - ref).max() <= 1e-6 * numpy.abs(ref).max()


@pytest.mark.gpu
@pytest.mark.parametrize("element", ["float32", "float32 bfloat16 values", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["channels_first", "channels_last"])
def test_inverse_writes_any_dtype_and_strides_rounded_to_nearest(element, layout):
    """The gathered inverse written into an (N, C, c0, c1) destination as it lies, in its dtype: float32, float32
    holding bfloat16 values, float16, bfloat16's bits; each element the float64 result rounded as
    :mod:`convtune.precision` rounds (to nearest, ties to even)."""
    import cupy
    from convtune import precision
    rng = numpy.random.default_rng(4)
    spec = numpy.fft.rfft2(rng.standard_normal((6, 64, 64)))
    full = numpy.fft.irfft2(spec, s=(64, 64)) * 64 * 64
    geometry = ((61, 2, 20), (5, 3, 15))
    (o0, s0, c0), (o1, s1, c1) = geometry
    rows, cols = (numpy.arange(c0) * s0 - o0) % 64, (numpy.arange(c1) * s1 - o1) % 64
    ref = full[:, rows][:, :, cols].reshape(2, 3, c0, c1)
    dtype = {"float16": cupy.float16, "bfloat16": cupy.uint16}.get(element, cupy.float32)
    dst = cupy.zeros((2, 3, c0, c1), dtype=dtype)
    if layout == "channels_last":
        dst = _channels_last(cupy, dst)
    fft64.irfft(cupy.asarray(_own_order(spec).astype(numpy.complex64)), dst, geometry,
                round_bfloat16=element == "float32 bfloat16 values")
    got = cupy.asnumpy(dst)
    if element == "bfloat16":
        got = (got.astype(numpy.uint32) << 16).view(numpy.float32)
    scale = numpy.abs(full).max()
    if element == "float32":
        assert numpy.abs(got - ref).max() <= 1e-6 * scale
        return
    half = "float16" if element == "float16" else "bfloat16"
    # the kernel rounds its float32 result; rounding the float64 one may differ where the two straddle a tie
    expected = precision.round_to(numpy, ref.astype(numpy.float32), half).astype(numpy.float64)
    ulp = precision.UNIT_ROUNDOFF[half] * 2 * numpy.abs(ref)
    assert (numpy.abs(got - expected) <= ulp + 1e-6 * scale).all()
    assert numpy.mean(got == expected) > 0.99
    assert precision.layout_of(dst) == layout


def _fft64_problem(dtype, layout, pass_):
    from convtune import ConvProblem
    return ConvProblem.make(batch=3, in_channels=5, out_channels=6, input_size=(56, 58), kernel_size=(9, 5),
                            padding=(0, 1), dtype=dtype, layout=layout, pass_=pass_)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout", [("bfloat16", "channels_last"), ("float16", "channels_last"),
                                           ("bfloat16", "channels_first"), ("float32", "channels_last")])
@pytest.mark.parametrize("pass_", ["fwd", "dgrad", "wgrad"])
def test_own_transform_plans_run_half_and_channels_last_without_conversions(dtype, layout, pass_):
    """The FFT strategy's own-transform candidates of a half-precision or channels_last problem read and write it
    themselves (no float32 executor between conversions): within the dtype's bound against float64, in the layout;
    a bfloat16 plan gives the same result on the 16 bits of its operands (what the PyTorch layer hands it and what
    the planner times)."""
    import cupy
    from convtune import precision
    from convtune.backend import get_backend
    from convtune.planner import random_operands, relative_error
    from convtune.strategies import get_strategy
    backend = get_backend("cupy")
    p = _fft64_problem(dtype, layout, pass_)
    fft = get_strategy("fft")
    own = [c for c in fft.candidates(p, backend) if fft.reads_as_it_lies(c)]
    assert own, "no own-transform candidate at 64x64"
    a, b = random_operands(backend, p, 5)
    ref = get_strategy("reference").build(p.in_float32().replace(layout="channels_first"), None, backend)(
        cupy.ascontiguousarray(a, dtype=cupy.float64), cupy.ascontiguousarray(b, dtype=cupy.float64))
    for config in own:
        run = fft.executor(p, config, backend)
        assert run.float32 is None, config.label()
        out = precision.empty_result(cupy, p, fill=cupy.nan)
        run(a, b, out)
        assert precision.layout_of(out) == layout or min(p.result_shape[1:]) == 1
        err = relative_error(cupy, out, ref)
        assert err <= p.tolerance, f"{config.label()}: error {err:.3g} on {p.describe()}"
        if dtype == "bfloat16":
            bits = run.timed(a, b, None)()
            assert run.reads_bfloat16_bits and bits.dtype == cupy.uint16
            widened = (bits.astype(cupy.uint32) << 16).view(cupy.float32)
            assert cupy.array_equal(widened, out), config.label()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, layout", [("bfloat16", "channels_last"), ("float16", "channels_first")])
def test_own_transform_round_trip_reads_and_writes_the_layer_itself(dtype, layout):
    """A half-precision round trip with convtune's own transforms runs without conversions: its three results
    within the dtype's bound, in the layer's storage and layout."""
    import cupy
    from convtune import precision
    from convtune.backend import get_backend
    from convtune.roundtrip import RoundTrip, TripConfig, round_trip_operands, round_trip_references
    from convtune.planner import relative_error
    backend = get_backend("cupy")
    p = _fft64_problem(dtype, layout, "fwd")
    x, w, dy = round_trip_operands(backend, p)
    refs = round_trip_references(backend, p, x, w, dy)
    for config in (TripConfig(sizes=(64, 64), packed=True, own=True), TripConfig(sizes=(64, 64), own=True)):
        trip = RoundTrip(p, config, backend)
        assert not trip.converted
        results = trip(x, w, dy)
        for result, ref, pass_ in zip(results, refs, ("fwd", "dgrad", "wgrad")):
            q = p.for_pass(pass_)
            assert str(result.dtype) == precision.STORAGE[dtype]
            assert precision.layout_of(result) == layout or min(result.shape[1:]) == 1
            assert relative_error(cupy, result, ref) <= q.tolerance, (config.label(), pass_)


def test_dense_channels_last_is_read_from_the_strides():
    a = numpy.zeros((2, 3, 5, 7), numpy.float32)
    cl = numpy.ascontiguousarray(a.transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)
    assert fft64.dense_channels_last(cl) and not fft64.dense_channels_last(a)
    assert fft64.dense_channels_last(cl[1:]) and not fft64.dense_channels_last(cl[:, 1:])  # (a channel slice: not dense)
    assert not fft64.dense_channels_last(numpy.zeros((2, 1, 5, 7), numpy.float32))  # one channel: channels-first
    assert not fft64.dense_channels_last(numpy.zeros((2, 5, 7), numpy.float32))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "uint16"])
@pytest.mark.parametrize("shape", [(2, 3, 33, 35), (1, 64, 8, 8), (3, 40, 1, 37), (2, 130, 10, 14), (3, 66, 66, 1),
                                   (2, 4, 2, 2)])
def test_channels_last_transposes_match_numpy(dtype, shape):
    """The tiled transposes between dense channels_last and channels-first memory, odd sizes and both element
    sizes: the same values, in the other order (16-bit elements with even channels and pixels go in pairs, partial
    64 x 64 tiles included)."""
    import cupy
    rng = numpy.random.default_rng(6)
    a = (rng.standard_normal(shape) * 1000).astype(dtype)
    cl = _channels_last(cupy, cupy.asarray(a))
    assert fft64.dense_channels_last(cl) or shape[2] * shape[3] == 1
    first = fft64.channels_first_copy(cl)
    assert first.flags.c_contiguous and (cupy.asnumpy(first) == a).all()
    back = _channels_last(cupy, cupy.zeros(shape, dtype=dtype))
    fft64.channels_last_into(first, back)
    assert (cupy.asnumpy(back) == a).all() and back.strides == cl.strides


class _Memory:
    """What ``fft64._transpose`` reads of an array: its element size and device address."""

    def __init__(self, itemsize, ptr):
        self.itemsize = itemsize
        self.data = type("Data", (), {"ptr": ptr})()


@pytest.mark.parametrize("itemsize, r, s, ptrs, kernel, grid", [
    (2, 4096, 64, (256, 512), "convtune_transpose16_quads", (1, 64, 3)),  # fbfft-L2's x: 4 at a time, 64 x 64 tiles
    (2, 3136, 128, (256, 512), "convtune_transpose16_quads", (2, 49, 3)),  # its dy
    (2, 4096, 64, (260, 512), "convtune_transpose16_pairs", (1, 64, 3)),  # a source 4 bytes past 8: pairs
    (2, 4096, 64, (256, 516), "convtune_transpose16_pairs", (1, 64, 3)),  # the same for the destination
    (2, 3136, 130, (256, 512), "convtune_transpose16_pairs", (3, 49, 3)),  # s even, not a multiple of 4: pairs
    (2, 3138, 128, (256, 512), "convtune_transpose16_pairs", (2, 50, 3)),  # the same for r
    (2, 81, 64, (256, 512), "convtune_transpose16", (2, 3, 3)),  # odd r (a 9x9 filter's taps): element by element
    (2, 64, 33, (256, 512), "convtune_transpose16", (2, 2, 3)),  # odd s
    (2, 64, 64, (258, 512), "convtune_transpose16", (2, 2, 3)),  # a source 2 bytes past a word: no 32-bit access
    (2, 64, 64, (256, 514), "convtune_transpose16", (2, 2, 3)),  # the same for the destination
    (4, 64, 64, (256, 512), "convtune_transpose32", (2, 2, 3)),  # float32: 32 x 32 tiles
])
def test_transpose_takes_the_pair_kernel_only_where_pairs_are_whole_words(monkeypatch, itemsize, r, s, ptrs, kernel,
                                                                          grid):
    """Which transposing kernel and grid a (3, r, s) operand gets: 16-bit elements four at a time as 8-byte words
    where both extents are multiples of 4 and both arrays start on an 8-byte boundary, else in pairs as 32-bit words
    where both extents are even and both arrays start on a 4-byte boundary (on the GPU:
    test_channels_last_transposes_..., on the CPU: test_transposing_kernels_source_on_the_cpu)."""
    launched = []
    monkeypatch.setattr(fft64, "_kernel", lambda name: lambda g, block, args: launched.append((name, g, block)))
    fft64._transpose(_Memory(itemsize, ptrs[0]), _Memory(itemsize, ptrs[1]), r, s, 3)
    assert [(name, g) for name, g, _ in launched] == [(kernel, grid)]
    assert launched[0][2] == ((256,) if kernel.endswith(("pairs", "quads")) else (32, 8))


@pytest.mark.parametrize("itemsize, kernel, rows", [
    (2, "convtune_transpose16_quads", 64), (2, "convtune_transpose16_pairs", 64),
    (2, "convtune_transpose16", 32), (4, "convtune_transpose32", 32)])
@pytest.mark.parametrize("n, r, s", [(2, 256, 64), (3, 196, 128), (2, 128, 196), (1, 8, 260), (2, 4, 4), (1, 68, 72)])
def test_transposing_kernels_source_on_the_cpu(itemsize, kernel, rows, n, r, s):
    """Each transposing kernel's CUDA source, run on the CPU (tests/cuda_cpu.py) over (n, r, s) operands of extents
    that are multiples of 4 (what the quads kernels take; every kernel takes them), partial tiles included: the same
    values in the other order."""
    import cuda_cpu
    (launch,) = cuda_cpu.launchables(fft64.TRANSPOSE_SOURCE, (kernel,))
    dtype = numpy.uint16 if itemsize == 2 else numpy.uint32
    a = numpy.random.default_rng(r * s).integers(0, numpy.iinfo(dtype).max, size=(n, r, s), dtype=dtype)
    out = numpy.zeros((n, s, r), dtype)
    cols = 32 if rows == 32 else 64
    launch(((s + cols - 1) // cols, (r + rows - 1) // rows, n), (256,) if rows != 32 else (32, 8),
           (a, out, numpy.int32(r), numpy.int32(s)), 0, None)
    assert (out == a.transpose(0, 2, 1)).all()
