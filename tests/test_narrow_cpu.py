"""The narrow product (convtune.fft.narrow) with its CUDA source run on the CPU (tests/cuda_cpu.py) through its own
dispatch, ``narrow.gemm``: every block :func:`~convtune.fft.narrow.block` gives (few columns, a few rows against a
wide side, both sides wide) and blocks given explicitly, every op pair the passes use, partial blocks and frequency
blocks, accumulation; against float64 products. The GPU tests (test_narrow.py) run it on the device; these guard
its indexing and its launch (grid, threads per block) in CI."""

import numpy
import pytest

from convtune.fft import narrow
from test_packed_cpu import _case


@pytest.fixture
def on_cpu(monkeypatch):
    """narrow.gemm launching the kernel compiled for the CPU, with the block's defines it would compile on CUDA."""
    import cuda_cpu

    def kernel(rm, rn, threads):
        source = f"#define RM {rm}\n#define RN {rn}\n#define NT {threads}\n" + narrow._SOURCE
        return cuda_cpu.kernels(source, ["convtune_narrow_cgemm"])["convtune_narrow_cgemm"]
    monkeypatch.setattr(narrow, "_kernel", kernel)


@pytest.mark.parametrize("ops, mnk, F, accumulate, blocks", [
    (("N", "C"), (6, 20, 5), 37, False, None),     # a few rows against a wide side: rows whole, 128 threads
    (("N", "N"), (19, 11, 7), 40, True, None),     # few columns: 8 x 8 blocks on one warp, partial in both
    (("C", "N"), (18, 17, 4), 33, False, None),    # both sides wide (a filter gradient): 8 x 8 on one warp
    (("N", "N"), (12, 40, 9), 65, True, None),     # 9 to 16 rows against a wide side
    (("N", "C"), (5, 9, 3), 70, False, (3, 2, 64)),  # blocks given: partial rows, columns and frequencies
    (("C", "N"), (9, 3, 6), 31, True, (4, 8, 32)),   # blocks wider than the result
])
def test_narrow_gemm_against_float64(on_cpu, ops, mnk, F, accumulate, blocks):
    m, n, k = mnk
    a, b, strides, product = _case(ops, mnk, F, 5)
    rng = numpy.random.default_rng(6)
    before = (rng.standard_normal((m, n, F)) + 1j * rng.standard_normal((m, n, F))).astype(numpy.complex64)
    c = before.copy()
    narrow.gemm(a, b, c, m, n, k, F, strides + (n, 1), ops[0] == "C", ops[1] == "C", 0.5, accumulate, blocks)
    want = 0.5 * product + (before if accumulate else 0)
    assert numpy.linalg.norm(c - want) / numpy.linalg.norm(0.5 * product) <= 1e-6
