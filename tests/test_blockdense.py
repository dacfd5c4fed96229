"""Dense 2-D round trips on the one-block image transforms (convtune.fft.blockdense): the depthwise image kernels
(their CUDA source run on the CPU, tests/cuda_cpu.py) for the transforms and inverses, the channels mixed per frequency
by the narrow or the packed product (run on the CPU too); every pass against its definition in float64."""

import numpy
import pytest

from convtune.fft import blockdense, narrow, packedgemm, planeconv
from convtune.problem import ConvProblem


def _dense(p, x, w, dy):
    """``(y, dx, dw)`` of dense ``p`` by their definitions, float64, channels-first."""
    (n0, n1), (k0, k1), (p0, p1), (o0, o1) = p.input_size, p.kernel_size, p.padding, p.output_size
    padded = numpy.zeros(x.shape[:2] + (n0 + 2 * p0 + k0, n1 + 2 * p1 + k1))
    padded[:, :, p0:p0 + n0, p1:p1 + n1] = x
    y = numpy.zeros(p.y_shape)
    dx = numpy.zeros(padded.shape)
    dw = numpy.zeros(p.w_shape)
    for s0 in range(k0):
        for s1 in range(k1):
            window = padded[:, :, s0:s0 + o0, s1:s1 + o1]
            y += numpy.einsum("nchw,kc->nkhw", window, w[:, :, s0, s1])
            dx[:, :, s0:s0 + o0, s1:s1 + o1] += numpy.einsum("nkhw,kc->nchw", dy, w[:, :, s0, s1])
            dw[:, :, s0, s1] = numpy.einsum("nchw,nkhw->kc", window, dy)
    return y, dx[:, :, p0:p0 + n0, p1:p1 + n1], dw


@pytest.fixture
def products_on_cpu(monkeypatch):
    """The narrow and packed products' kernels compiled for the CPU (the packed one's asynchronous copies as plain
    copies, as test_packed_cpu has them)."""
    import cuda_cpu
    from test_packed_cpu import _STANDINS

    def narrow_kernel(rm, rn, threads):
        source = f"#define RM {rm}\n#define RN {rn}\n#define NT {threads}\n" + narrow._SOURCE
        return cuda_cpu.kernels(source, ["convtune_narrow_cgemm"])["convtune_narrow_cgemm"]
    monkeypatch.setattr(narrow, "_kernel", narrow_kernel)
    monkeypatch.setattr(packedgemm, "packed_gemm_kernel", lambda: cuda_cpu.kernels(
        _STANDINS + packedgemm.PACKED_GEMM_SOURCE, ["convtune_packed_cgemm"])["convtune_packed_cgemm"])


def _relative(got, ref):
    return numpy.linalg.norm(got - ref) / numpy.linalg.norm(ref)


def _kept(p, sizes=None):
    import cuda_cpu
    sizes = sizes or blockdense.size_options(p)[0]
    kernels = cuda_cpu.launchables(planeconv.source("float32", sizes), planeconv.KEPT_NAMES)
    return blockdense.DenseBlockKept(numpy, p, sizes, kernels=kernels, stream=cuda_cpu.Stream())


@pytest.mark.parametrize("product", ["narrow", "packed"])
@pytest.mark.parametrize("case", [
    dict(batch=2, in_channels=3, out_channels=4, input_size=(9, 11), kernel_size=(3, 5), padding=(1, 2)),
    dict(batch=3, in_channels=2, out_channels=5, input_size=(6, 5), kernel_size=3, padding=(4, 0)),  # past the reach
])
def test_dense_round_trip_against_float64(products_on_cpu, case, product):
    """Both products (the packed one forced here: it runs where every side has more than 16 rows or columns)."""
    p = ConvProblem.make(**case)
    kept = _kept(p)
    assert kept.product is narrow.product  # (few images and channels)
    kept._mixes = kept.mixes(narrow.product if product == "narrow" else packedgemm.product)
    rng = numpy.random.default_rng(p.batch)
    x, w, dy = (rng.standard_normal(s).astype(numpy.float32) for s in (p.x_shape, p.w_shape, p.y_shape))
    xs, ws, dys = kept.x_spectrum(x), kept.w_spectrum(w), kept.dy_spectrum(dy)
    y = kept.forward_from(xs, ws, numpy.empty(p.y_shape, numpy.float32))
    wider = numpy.zeros(p.x_shape[:-1] + (p.x_shape[-1] + 3,), numpy.float32)
    dx = kept.backward_data_from(dys, ws, wider[..., 1:-2])  # (a result that is not contiguous: through a copy)
    assert dx.base is wider and not wider[..., 0].any() and not wider[..., -2:].any()
    dw = kept.backward_filter_from([(dys, xs)], numpy.empty(p.w_shape, numpy.float32))
    want = _dense(p, *(a.astype(numpy.float64) for a in (x, w, dy)))
    for got, ref in zip((y, dx, dw), want):
        assert _relative(got, ref) <= 1e-6


def test_the_packed_product_mixes_where_no_side_is_thin(products_on_cpu):
    p = ConvProblem.make(batch=17, in_channels=17, out_channels=18, input_size=(5, 4), kernel_size=3, padding=1)
    assert _kept(p).product is packedgemm.product
    assert _kept(p.replace(batch=16)).product is narrow.product


def test_the_filter_gradients_crop_is_a_forward_pass_with_the_kernels_output():
    """The filter gradient's K x C spectra are inverted as the forward pass of one-channel images whose output has
    the kernel's size, at the layer's padding (the fewest taps that leave an input sample)."""
    same = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(64, 64), kernel_size=31, padding=15)
    crop = blockdense.crop_problem(same)
    assert crop.output_size == same.kernel_size and crop.padding == same.padding and crop.kernel_size == (1, 1)
    assert crop.batch == 12 and crop.in_channels == crop.groups == 1
    past = same.replace(kernel_size=(3, 5), padding=(4, 0))  # (padding past the kernel's reach; none)
    crop = blockdense.crop_problem(past)
    assert crop.output_size == (3, 5) and crop.kernel_size == (7, 1) and crop.input_size == (1, 5)


def test_what_the_dense_image_round_trip_takes():
    dense = ConvProblem.make(batch=8, in_channels=64, out_channels=64, input_size=(64, 64), kernel_size=31, padding=15)
    assert blockdense.unsupported_reason(dense) is None
    assert blockdense.size_options(dense) == [(128, 128), (81, 96), (96, 96)]  # (dense-k31's images)
    assert "one" in blockdense.unsupported_reason(dense.replace(groups=2))
    assert "float32 channels-first" in blockdense.unsupported_reason(dense.replace(layout="channels_last"))
    assert "stride" in blockdense.unsupported_reason(dense.replace(stride=(2, 2)))
    assert "shared memory" in blockdense.unsupported_reason(dense.replace(input_size=(256, 256), kernel_size=(35, 35),
                                                                          padding=(17, 17)))
    assert blockdense.size_options(dense.replace(groups=2)) == []
    with pytest.raises(ValueError, match="dense image FFT round trip"):
        blockdense.DenseBlockKept(numpy, dense, (80, 80))  # (80 is not 2^a 3^b)


def test_dense_block_round_trip_through_roundtrip(monkeypatch, products_on_cpu):
    """RoundTrip with the block product on a dense layer: its stateful passes and the drop-in's stateless
    kept_forward / kept_backward, against float64 (the kernels run on the CPU)."""
    from test_roundtrip import _emulated_block_kernels

    from convtune.backend import get_backend
    from convtune.roundtrip import RoundTrip, TripConfig
    _emulated_block_kernels(monkeypatch)
    p = ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 11), kernel_size=(3, 5),
                         padding=(1, 2))
    trip = RoundTrip(p, TripConfig(sizes=blockdense.size_options(p)[0], product="block"), get_backend("numpy"))
    assert isinstance(trip._ex, blockdense.DenseBlockKept) and not trip.converted
    rng = numpy.random.default_rng(1)
    x, w, dy = (rng.standard_normal(s).astype(numpy.float32) for s in (p.x_shape, p.w_shape, p.y_shape))
    refs = _dense(p, *(a.astype(numpy.float64) for a in (x, w, dy)))
    for got, ref in zip(trip(x, w, dy), refs):
        assert _relative(got, ref) <= 1e-6
    y, spectra = trip.kept_forward(x, w)
    for got, ref in zip((y, *trip.kept_backward(spectra, dy)), refs):
        assert _relative(got, ref) <= 1e-6
    with pytest.raises(ValueError, match="no fused backward passes"):
        RoundTrip(p, TripConfig(sizes=blockdense.size_options(p)[0], product="block", fused=True),
                  get_backend("numpy"))


class _Gpu:
    """A backend as block_trip_configs sees it: CuPy's, on a device of compute capability ``cc``."""
    name = "cupy"

    def __init__(self, cc):
        self.cc = cc

    def device_info(self):
        from types import SimpleNamespace
        return SimpleNamespace(compute_capability=self.cc)


def test_dense_block_trips_are_candidates_of_float32_dense_layers_on_the_gpu():
    from convtune.backend import get_backend
    from convtune.roundtrip import block_trip_configs, trip_candidates
    dense = ConvProblem.make(batch=8, in_channels=64, out_channels=64, input_size=(64, 64), kernel_size=31, padding=15)
    configs = block_trip_configs(dense, _Gpu("9.0"))
    assert [c.label() for c in configs] == ["fft-trip[sizes=128x128,block]", "fft-trip[sizes=81x96,block]",
                                            "fft-trip[sizes=96x96,block]"]
    assert block_trip_configs(dense, get_backend("numpy")) == []  # (the GPU's kernels)
    assert block_trip_configs(dense.replace(dtype="bfloat16"), _Gpu("9.0")) == []
    assert block_trip_configs(dense.replace(stride=(2, 2)), _Gpu("9.0")) == []
    wide = dense.replace(batch=32)  # (no thin side: the packed product, compute capability 8.0 or newer)
    assert block_trip_configs(wide, _Gpu("9.0")) and not block_trip_configs(wide, _Gpu("7.5"))
    assert not [c for c in trip_candidates(dense, get_backend("numpy")) if c.product == "block"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", [
    dict(batch=2, in_channels=8, out_channels=12, input_size=(64, 64), kernel_size=31, padding=15),  # narrow
    dict(batch=17, in_channels=17, out_channels=18, input_size=(32, 32), kernel_size=9, padding=4),  # packed
])
def test_dense_block_trips_match_float64_on_the_gpu(case):
    """Every dense block round trip of a layer (each transform size of its images), all three passes against float64
    on the GPU, through the round trip and its stateless form."""
    from convtune.backend import get_backend
    from convtune.roundtrip import (RoundTrip, block_trip_configs, round_trip_operands, round_trip_references)
    backend = get_backend("cupy")
    p = ConvProblem.make(**case)
    x, w, dy = round_trip_operands(backend, p, seed=3)
    refs = round_trip_references(backend, p, x, w, dy)
    configs = block_trip_configs(p, backend)
    assert configs and all(c.product == "block" and not c.fused for c in configs)
    for config in configs:
        trip = RoundTrip(p, config, backend)
        assert isinstance(trip._ex, blockdense.DenseBlockKept) and trip.recordable
        for got in (trip(x, w, dy), (lambda y, s: (y, *trip.kept_backward(s, dy)))(*trip.kept_forward(x, w))):
            errors = [float(backend.xp.linalg.norm(a - r) / backend.xp.linalg.norm(r)) for a, r in zip(got, refs)]
            assert max(errors) <= 1e-5, (config.label(), errors)
