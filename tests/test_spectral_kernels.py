"""The FFT's row kernels: the zero-extension before a forward transform (``convtune_fft_embed``) and the
gather of a result from the circular one (``convtune_spec_gather``), their launch layout (rows of any length,
long ones split into segments) and their results against NumPy."""

import numpy
import pytest

from convtune.fft.spectral_kernels import LONG_ROW, SEGMENT, row_launch


def _covered(rows, length, threads=256):
    """Every (row, element) the kernels' thread mapping visits under ``row_launch``, with repeats (the
    kernels' index arithmetic, in Python)."""
    (blocks,), shift, seg_len = row_launch(rows, length, threads)
    seen = []
    for block in range(blocks):
        for t in range(threads):
            if seg_len > 0:
                segs = -(-length // seg_len)
                row, seg = block // segs, block % segs
                c, end, step = seg * seg_len + t, min(length, (seg + 1) * seg_len), threads
            else:
                row = block * (threads >> shift) + (t >> shift)
                c, end, step = t & ((1 << shift) - 1), length, 1 << shift
            if row >= rows:
                continue
            seen += [(row, q) for q in range(c, end, step)]
    return seen


@pytest.mark.parametrize("rows, length", [(0, 5), (0, SEGMENT), (1, 1), (5, 3), (7, 33), (3, 200), (9, LONG_ROW - 1), (2, LONG_ROW),
                                          (3, SEGMENT), (2, SEGMENT + 1), (3, 3 * SEGMENT + 17)])
def test_row_launch_visits_every_element_once(rows, length):
    seen = _covered(rows, length, threads=256)
    assert sorted(seen) == [(r, q) for r in range(rows) for q in range(length)]


def test_row_launch_gives_long_rows_blocks_of_their_own():
    """A 16k-long 1-D layer's 512 rows: a block per 2048 elements of a row (4096 blocks), where one warp per
    row made 16k threads in all."""
    (blocks,), _shift, seg_len = row_launch(512, 32768)
    assert seg_len == SEGMENT and blocks == 512 * 32768 // SEGMENT
    (blocks,), shift, seg_len = row_launch(1000, 72)
    assert seg_len == 0 and 1 << shift == 32 and blocks == -(-1000 // 8)


def _embedded(a, sizes, steps):
    """NumPy: (B, *n) placed at sample spacing ``steps`` in zeros of (B, *sizes)."""
    out = numpy.zeros(a.shape[:1] + tuple(sizes), dtype=numpy.float32)
    out[(slice(None),) + tuple(slice(0, n * s, s) for n, s in zip(a.shape[1:], steps))] = a
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("shape, sizes, steps", [
    ((3, 16384), (32768,), (1,)), ((4, 5000), (8192,), (1,)), ((2, 3000), (8192,), (2,)), ((5, 700), (1500,), (1,)),
    ((6, 9, 9), (16, 16), (1, 1)), ((3, 20, 30), (72, 72), (2, 2)), ((2, 40, 1100), (81, 2300), (1, 2)),
    ((4, 3, 5), (4, 6), (1, 1))])
def test_embedding_matches_numpy(shape, sizes, steps):
    import cupy
    from convtune.fft.arrayops import CupyOps
    a = numpy.random.default_rng(3).standard_normal(shape).astype(numpy.float32)
    got = CupyOps(cupy, sizes, packed=True).embed(cupy.asarray(a), steps)
    numpy.testing.assert_array_equal(cupy.asnumpy(got), _embedded(a, sizes, steps))


def _gathered(full, geometry):
    """NumPy: out[b, q...] = full[b, (q * step - offset) mod L ...] per axis."""
    index = [(numpy.arange(c) * s - o) % L for (o, s, c), L in zip(geometry, full.shape[1:])]
    return full[(slice(None),) + tuple(numpy.ix_(*index))]


@pytest.mark.gpu
@pytest.mark.parametrize("sizes, geometry", [
    ((32768,), ((16383, 1, 32767),)),  # a full 16k-long convolution's output
    ((8192,), ((0, 1, 4096),)), ((8192,), ((4095, 1, 8191),)), ((9000,), ((-7, 3, 2900),)),
    ((1500,), ((20000, 1, 1400),)),  # an offset of many periods
    ((72, 72), ((15, 1, 56), (15, 1, 56))), ((64, 64), ((61, 2, 20), (5, 3, 15))), ((16, 2300), ((3, 1, 9), (1200, 1, 2300))),
    ((8, 8), ((0, 1, 1), (-9, 5, 7)))])
def test_gather_matches_numpy(sizes, geometry):
    import cupy
    from convtune.fft.spectral_kernels import Kernels
    full = numpy.random.default_rng(4).standard_normal((3,) + sizes).astype(numpy.float32)
    out = cupy.full((3,) + tuple(c for _o, _s, c in geometry), numpy.nan, dtype=cupy.float32)
    assert Kernels(cupy, sizes).gather(cupy.asarray(full), out, geometry)
    numpy.testing.assert_array_equal(cupy.asnumpy(out), _gathered(full, geometry))
