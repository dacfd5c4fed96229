"""Overlap-save tiling: the tile bookkeeping against float64 (with the direct reference inside the
tiles, so only the tiling is under test), its limits, and its place among the FFT candidates."""

import numpy
import pytest

from convtune import ConvProblem
from convtune.direct.reference import reference
from convtune.fft import overlap
from convtune.planner import random_operands, relative_error
from convtune.problem import PASSES
from convtune.strategies import get_strategy
from cases import problem

SHAPES = {
    # uneven last tiles, padding and dilation per axis
    "2d-dense": dict(batch=2, in_channels=3, out_channels=4, input_size=(40, 37), kernel_size=(5, 3), padding=(2, 1),
                     dilation=(1, 2)),
    # 1-D, groups
    "1d-groups": dict(batch=2, in_channels=4, out_channels=6, input_size=(53,), kernel_size=7, padding=3, groups=2),
    # 1x1: tiles with no overlap (the overlap-add's tails are empty)
    "2d-1x1": dict(batch=1, in_channels=2, out_channels=3, input_size=(30, 31), kernel_size=1),
    # one axis in one tile, the other in many
    "2d-one-tile-axis": dict(batch=2, in_channels=2, out_channels=2, input_size=(9, 60), kernel_size=3, padding=1),
}


def _reference_inner(q):
    """An executor of the tiled problem that is the float64 direct reference."""
    def run(a, b, out):
        out[...] = reference(numpy, q, a, b)
        return out
    return run


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("tile", [16, 32])
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("chunk", [1, 1 << 30])  # one image's tiles at a time (the filter gradient sums), or all
def test_tiles_reassemble_the_whole_convolution(shape, tile, pass_, chunk):
    p = ConvProblem.make(**SHAPES[shape], pass_=pass_)
    conv = overlap.TiledConv(numpy, p, (tile,) * p.rank, _reference_inner, chunk)
    rng = numpy.random.default_rng(3)
    a, b = (rng.standard_normal(s) for s in p.operand_shapes)
    out = numpy.full(p.result_shape, numpy.nan)
    assert conv(a, b, out) is out
    ref = reference(numpy, p, a, b)
    assert numpy.abs(out - ref).max() <= 1e-12 * numpy.abs(ref).max()


def test_tiling_geometry():
    p = ConvProblem.make(batch=2, in_channels=8, out_channels=8, input_size=(200, 70), kernel_size=5, padding=2)
    tiling = overlap.Tiling(p, (32, 32))
    assert tiling.step == (28, 28)  # whole outputs per tile: 32 - 5 + 1
    assert tiling.counts == (8, 3)  # ceil(200 / 28), ceil(70 / 28)
    assert tiling.inner.batch == 2 * 24 and tiling.inner.input_size == (32, 32) and tiling.inner.padding == (0, 0)
    assert all(g >= n + 2 * q for g, n, q in zip(tiling.grid, p.input_size, p.padding))
    assert overlap.workspace_bytes(p, (32, 32), 1 << 30, 1000) > 1000 + 4 * 48 * 8 * 32 * 32
    assert overlap.chunk_images(tiling, 30) == 1 and overlap.chunk_images(tiling, 1 << 30) == 2
    # a chunk of one image's tiles holds half the tiles of two
    assert overlap.workspace_bytes(p, (32, 32), 24, 0) < overlap.workspace_bytes(p, (32, 32), 48, 0)


def test_tiles_must_hold_twice_the_kernel():
    p = ConvProblem.make(batch=1, in_channels=1, out_channels=1, input_size=(100, 100), kernel_size=(9, 3))
    with pytest.raises(ValueError, match="axis 0: a tile of 16 is shorter than 2e - 1 = 17"):
        overlap.Tiling(p, (16, 16))
    with pytest.raises(ValueError, match="1 entries, the problem 2 axes"):
        overlap.Tiling(p, (32,))
    assert overlap.tile_lengths(p)[0] == 32
    strided = p.replace(stride=(2, 2))
    assert "stride-1" in overlap.applies(strided) and overlap.tile_lengths(strided) == []


def test_tile_lengths_need_two_tiles():
    small = ConvProblem.make(batch=1, in_channels=1, out_channels=1, input_size=(20,), kernel_size=3)
    assert overlap.tile_lengths(small) == [16]  # 32 holds the whole input in one tile


def test_fft_candidates_tile_large_inputs_only(backend):
    """The tilings the cost model keeps: at most two tile lengths, for the problem and for a strided
    problem's polyphase form; none where the kernel is large against the input."""
    fft = get_strategy("fft")
    tiled = [c for c in fft.candidates(problem("2d-depthwise-7x7"), backend) if c.tiled]
    assert {c.sizes for c in tiled} == {(16, 16), (32, 32)}
    phased = [c for c in fft.candidates(problem("2d-tiles-stride"), backend) if c.tiled]
    assert phased and all(c.polyphase for c in phased)
    assert not [c for c in fft.candidates(problem("2d-large-kernel"), backend) if c.tiled]


def test_fft_rejects_tiles_too_short_for_the_kernel(backend):
    from convtune.strategies.fft import FftConfig
    p = problem("2d-large-kernel")
    with pytest.raises(ValueError, match="shorter than 2e - 1 = 17"):
        get_strategy("fft").build(p, FftConfig(sizes=(16, 16), product="gemm", tiled=True), backend)


@pytest.mark.gpu
@pytest.mark.parametrize("pass_", PASSES)
def test_tiles_on_own_transforms(pass_):
    """64x64 tiles run on convtune's own transforms (the registry cases' inputs are too small for them):
    every tiled candidate against float64."""
    from convtune.backend import get_backend
    backend = get_backend("cupy")
    xp = backend.xp
    p = ConvProblem.make(batch=2, in_channels=4, out_channels=8, input_size=(150, 130), kernel_size=9, padding=4,
                         pass_=pass_)
    fft = get_strategy("fft")
    tiled = [c for c in fft.candidates(p, backend) if c.tiled]
    assert any(c.own and c.sizes == (64, 64) for c in tiled)
    a, b = random_operands(backend, p, seed=5)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    for config in tiled:
        assert relative_error(xp, fft.build(p, config, backend)(a, b), ref) <= 1e-5, config.label()


@pytest.mark.parametrize("pass_", PASSES)
@pytest.mark.parametrize("product", ["gemm", "fgemm"])
def test_fft_tiles_one_image_at_a_time(backend, product, pass_):
    """A chunk of one image's tiles: the executors of each chunk, and the filter gradient summed over them."""
    from convtune.strategies.fft import FftConfig
    p = problem("2d-tiles", pass_)
    xp = backend.xp
    a, b = random_operands(backend, p, seed=9)
    ref = get_strategy("reference").build(p, None, backend)(a.astype(xp.float64), b.astype(xp.float64))
    config = FftConfig(sizes=(16, 16), product=product, chunk=1, tiled=True)
    out = xp.full(p.result_shape, xp.nan, dtype=xp.float32)
    get_strategy("fft").build(p, config, backend)(a, b, out)
    assert relative_error(xp, out, ref) <= 1e-5
