"""Transform sizes: which lengths an axis may be zero-padded to.

The circular correlation of the unpadded input (zero-extended to ``L``) with the
dilated kernel equals the padded linear one on every output position, with the
input's left padding folded into a cyclic shift of the output, as long as, per
axis, ``L >= max(n + p, kd, n + 2p - kd + 1)`` (``n`` input, ``p`` padding,
``kd`` dilated kernel). The same bound serves all three passes (see
:mod:`convtune.fft.spectral`), so no padded copy of the input is ever made.
"""

from __future__ import annotations

import itertools

from ..problem import ConvProblem

SMOOTH_PRIMES = (2, 3, 5, 7)


def is_smooth(n: int, primes=SMOOTH_PRIMES) -> bool:
    for q in primes:
        while n % q == 0:
            n //= q
    return n == 1


def next_smooth(n: int, primes=SMOOTH_PRIMES) -> int:
    """Smallest ``m >= n`` whose prime factors are all in ``primes``."""
    m = max(1, n)
    while not is_smooth(m, primes):
        m += 1
    return m


def next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def min_length(n: int, pad: int, kd: int) -> int:
    """Shortest transform length of one axis (see the module docstring)."""
    return max(n + pad, kd, n + 2 * pad - kd + 1)


def axis_candidates(minimum: int) -> tuple[int, ...]:
    """Exact, the next 2·3·5·7-smooth, the next 2·3-smooth and the next power of 2 (deduplicated)."""
    return tuple(sorted({minimum, next_smooth(minimum), next_smooth(minimum, (2, 3)), next_pow2(minimum)}))


def minimal_sizes(p: ConvProblem) -> tuple[int, ...]:
    return tuple(min_length(n, q, kd) for n, q, kd in zip(p.input_size, p.padding, p.dilated_kernel))


def check_sizes(p: ConvProblem, sizes) -> None:
    """``ValueError`` unless ``sizes`` has one transform length per axis, each at least the minimum."""
    minimal = minimal_sizes(p)
    if len(sizes) != p.rank or any(L < m for L, m in zip(sizes, minimal)):
        raise ValueError(f"transform sizes {tuple(sizes)} are below the minimum {minimal} for this problem")


def size_candidates(p: ConvProblem) -> list[tuple[int, ...]]:
    """Every per-axis combination (rectangular allowed)."""
    return [tuple(c) for c in itertools.product(*(axis_candidates(m) for m in minimal_sizes(p)))]
