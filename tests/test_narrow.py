"""The packed layout's product kernels on the GPU against NumPy: the register-blocked one for few channels (its
blocks, its place among the FFT candidates) and the TF32 tensor-core one (tf32 mode)."""

import numpy
import pytest

from convtune.fft import narrow
from convtune.strategies import get_strategy
from cases import problem


def test_blocks_of_a_thread_and_threads_per_block():
    T, W = narrow.THREADS, narrow.WARP
    # few columns: up to 8 x 8 (8 x 4 for fewer than 8 rows), one warp per block of threads
    assert narrow.block(128, 3) == (8, 3, W)  # backward-data of an RGB layer: all 3 input channels per thread
    assert narrow.block(128, 12) == (8, 8, W)
    assert narrow.block(4, 16) == (4, 4, W)
    assert narrow.block(2, 2) == (2, 2, W)
    # at most 8 rows against a wide side: the rows whole, at most 32 accumulators, 128 threads
    assert narrow.block(3, 96) == (3, 8, T)  # backward-filter with the thin side as rows
    assert narrow.block(8, 64) == (8, 4, T)  # a forward pass at batch 8: the images are the thin side
    # both sides wide (a forward pass whose reduction is the thin side, a small batch's filter gradient) or 9 to 16
    # rows against a wide side: 8 x 8 blocks, one warp per block of threads
    assert narrow.block(128, 96) == narrow.block(64, 64) == narrow.block(16, 64) == narrow.WIDE_BLOCK == (8, 8, W)


def test_applies_to_few_channels_on_either_side_or_few_images():
    assert narrow.unsupported_reason(3, 96) is None and narrow.unsupported_reason(512, 16) is None
    assert "at most 16" in narrow.unsupported_reason(17, 64)
    assert narrow.unsupported_reason(64, 64, batch=8) is None  # (a dense layer at batch 8: images x channels)
    assert "and a batch of 17: the narrow product is for at most 16" in narrow.unsupported_reason(64, 64, batch=17)
    assert narrow.unsupported_reason(3, 96, batch=64) is None


def test_narrow_is_a_gpu_candidate_for_few_channels(backend):
    fft = get_strategy("fft")
    thin = [c for c in fft.candidates(problem("2d-odd"), backend) if c.narrow]
    assert (len(thin) > 0) == (backend.name == "cupy")
    assert all(c.packed and c.product == "fgemm" for c in thin)
    wide = problem("2d-odd").replace(in_channels=32, out_channels=32, batch=17)
    assert not [c for c in fft.candidates(wide, backend) if c.narrow]
    few_images = wide.replace(batch=16)  # (many channels on both sides, few images: the thin side of the products)
    assert bool([c for c in fft.candidates(few_images, backend) if c.narrow]) == (backend.name == "cupy")


def test_a_stored_fft_plan_or_trip_decision_is_measured_again_where_the_narrow_product_became_a_candidate():
    from convtune.roundtrip import trip
    from convtune.strategies import fft
    dense = problem("2d-odd").replace(in_channels=32, out_channels=32, batch=8)
    for changed in (fft.FftStrategy.changes[13], trip.CHANGES[18]):
        assert changed(dense) and not changed(dense.replace(batch=17))
    assert trip.stale(17, dense) and not trip.CHANGES[18](dense.replace(batch=17))
    # the new blocks: an RGB layer's (and 2d-odd's) take them; 3 rows against 96 columns as before
    rgb = problem("2d-odd").replace(in_channels=3, out_channels=64, batch=32)
    assert narrow.blocks_changed(3, 64, 32) and fft.FftStrategy.changes[13](rgb) and trip.CHANGES[18](rgb)
    assert narrow.blocks_changed(3, 5, 2) and trip.CHANGES[18](problem("2d-odd"))
    assert narrow.block(3, 96) == narrow._block_before(3, 96) and narrow.block(2, 1) != narrow._block_before(2, 1)
    assert not narrow.blocks_changed(64, 64, 17)  # (the narrow product does not apply)


def test_narrow_needs_the_packed_layout(backend):
    from convtune.strategies.fft import FftConfig
    with pytest.raises(ValueError, match="packed layout"):
        get_strategy("fft").build(problem("2d-odd"), FftConfig(sizes=(9, 10), product="fgemm", narrow=True), backend)


def _packed_case(xp, ops, mnk, F, seed):
    """Operands of a packed product as the passes hand them over: (F, rows, cols) frequency-major views of
    (rows, cols + 2, F) arrays, a column slice as the groups take; ``c`` such a view of a (m, n, F) array holding
    random values. Returns ``(a, b, c, product, before)``: ``product`` = 0.5 op(a) op(b) and ``before`` = c, both
    float64 on the host."""
    m, n, k = mnk
    rng = numpy.random.default_rng(seed)

    def packed(rows, cols):
        host = (rng.standard_normal((rows, cols + 2, F)) + 1j * rng.standard_normal((rows, cols + 2, F)))
        host = host.astype(numpy.complex64)
        return host, xp.asarray(host).transpose(2, 0, 1)[:, :, 1:cols + 1]

    def op(host, code):
        mats = host[:, 1:-1, :].transpose(2, 0, 1).astype(numpy.complex128)
        return mats if code == "N" else numpy.conj(mats.transpose(0, 2, 1))
    op_a, op_b = ops
    a_host, a = packed(*((m, k) if op_a == "N" else (k, m)))
    b_host, b = packed(*((k, n) if op_b == "N" else (n, k)))
    c = xp.asarray(rng.standard_normal((m, n, F)).astype(numpy.complex64)).transpose(2, 0, 1)
    before = numpy.asarray(c.get() if hasattr(c, "get") else c).astype(numpy.complex128)
    return a, b, c, 0.5 * op(a_host, op_a) @ op(b_host, op_b), before


@pytest.mark.parametrize("ops", [("N", "C"), ("N", "N"), ("C", "N")])
def test_the_packed_cases_are_views_and_their_product_is_the_ops(ops):
    """The GPU tests' operands (on NumPy here): frequency-major views of the sizes the ops ask, and the float64
    product of the ops they name."""
    a, b, c, product, before = _packed_case(numpy, ops, (5, 4, 3), 7, 0)
    assert a.shape == ((7, 5, 3) if ops[0] == "N" else (7, 3, 5)) and b.shape == ((7, 3, 4) if ops[1] == "N" else (7, 4, 3))
    assert not a.flags.c_contiguous and c.shape == (7, 5, 4) and before.shape == (7, 5, 4)
    op = {"N": lambda x: x, "C": lambda x: numpy.conj(x.transpose(0, 2, 1))}
    expected = 0.5 * op[ops[0]](a.astype(numpy.complex128)) @ op[ops[1]](b.astype(numpy.complex128))
    assert numpy.allclose(product, expected)


@pytest.mark.gpu
@pytest.mark.parametrize("ops", [("N", "C"), ("N", "N"), ("C", "N")])
@pytest.mark.parametrize("mnk", [(37, 3, 20), (5, 40, 3), (130, 12, 7), (3, 17, 50), (8, 64, 64), (64, 48, 8),
                                 (12, 40, 20), (70, 45, 3)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_narrow_gemm_on_packed_views(ops, mnk, accumulate):
    """(F, rows, cols) views of (rows, cols, F) arrays, a column slice as the groups take, every op pair the
    passes use, with and without accumulation: against NumPy."""
    import cupy
    from convtune.fft.arrayops import CupyOps
    F = 300
    a, b, c, product, before = _packed_case(cupy, ops, mnk, F, 1)
    want = product + (before if accumulate else 0)
    # through the packed product's own dispatch (its row strides), with the narrow kernel
    gemm = CupyOps(cupy, (2 * (F - 1),), packed=True, narrow=True)
    assert gemm.F == F
    gemm.gemm(a, ops[0], b, ops[1], c, 0.5, beta=1.0 if accumulate else 0.0)
    got = cupy.asnumpy(c)
    assert numpy.abs(got - want).max() <= 1e-5 * numpy.abs(want).max()


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [(8, 8, 32), (8, 3, 32), (4, 4, 128), (1, 5, 64), (3, 8, 32)])
@pytest.mark.parametrize("mnk", [(37, 3, 20), (12, 40, 7)])
def test_narrow_gemm_at_blocks_other_than_its_own(blocks, mnk):
    """The blocks benchmarks/narrow_blocks.py times (any RM x RN and threads per block; edges in both directions),
    through CupyOps.narrow_blocks: against NumPy, with accumulation."""
    import cupy
    from convtune.fft.arrayops import CupyOps
    F = 300
    a, b, c, product, before = _packed_case(cupy, ("N", "C"), mnk, F, 2)
    gemm = CupyOps(cupy, (2 * (F - 1),), packed=True, narrow=True)
    gemm.narrow_blocks = blocks
    gemm.gemm(a, "N", b, "C", c, 0.5, beta=1.0)
    want = product + before
    assert numpy.abs(cupy.asnumpy(c) - want).max() <= 1e-5 * numpy.abs(want).max()


@pytest.mark.gpu
@pytest.mark.parametrize("ops", [("N", "C"), ("N", "N"), ("C", "N")])
@pytest.mark.parametrize("mnk", [(37, 3, 20), (130, 70, 9), (64, 64, 64), (3, 17, 50)])
@pytest.mark.parametrize("accumulate", [False, True])
def test_tf32_packed_gemm_on_packed_views(ops, mnk, accumulate):
    """The packed product on TF32 tensor cores (the tf32 mode's form): (F, rows, cols) views of (rows, cols, F)
    arrays, a column slice, every op pair the passes use, odd sizes (partial tiles of rows, columns, the reduction
    and the frequencies), with and without accumulation: within TF32's bound of NumPy's float64 product; the
    narrow product has no TF32 form."""
    import cupy
    from convtune.fft.arrayops import CupyOps
    F = 301
    a, b, c, product, before = _packed_case(cupy, ops, mnk, F, 2)
    want = product + (before if accumulate else 0)
    gemm = CupyOps(cupy, (2 * (F - 1),), packed=True, tf32=True)
    assert gemm.tf32 and gemm.F == F
    gemm.gemm(a, ops[0], b, ops[1], c, 0.5, beta=1.0 if accumulate else 0.0)
    got = cupy.asnumpy(c)
    assert not numpy.isnan(got).any()
    err = numpy.linalg.norm(got - want) / numpy.linalg.norm(product)
    assert err <= 1e-3, err
    assert err >= 1e-6  # (TF32's rounding shows: this is not the float32 kernel)
    with pytest.raises(ValueError, match="no TF32 form"):
        CupyOps(cupy, (2 * (F - 1),), packed=True, narrow=True, tf32=True)
