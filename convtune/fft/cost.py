"""Counting FFT work (pure), and the calibration that turns counts into a ranking.

``count`` knows nothing about hardware: it counts floating-point operations of
the transforms and of the frequency-domain product. ``CALIBRATION`` is data with
provenance: the per-size slowdown of non-power-of-2 transforms. The planner uses
the model only to narrow the size candidates; the benchmark decides.
"""

from __future__ import annotations

import math

from ..problem import ConvProblem
from .sizes import is_smooth

#: Relative cost per counted flop, by kind of transform length.
#: Provenance: initial estimates from cuFFT's and pocketfft's documented behaviour
#: (radix-2 fastest, 3/5/7 radices slower, Bluestein for other primes several
#: times slower); not yet fitted on any device (the FFT-speed issue calibrates them).
CALIBRATION = {"source": "uncalibrated estimate", "pow2": 1.0, "smooth": 1.4, "other": 4.0}


def transform_flops(sizes: tuple[int, ...]) -> float:
    """~2.5 L log2 L flops for a real transform of total length L."""
    total = math.prod(sizes)
    return 2.5 * total * math.log2(max(total, 2))


def spectrum_elems(sizes: tuple[int, ...]) -> int:
    return math.prod(sizes[:-1]) * (sizes[-1] // 2 + 1)


def count(p: ConvProblem, sizes: tuple[int, ...]) -> dict:
    """Flops of one pass at transform sizes ``sizes``: transforms and product, separately."""
    # every pass transforms both batch operands and the weight (or its gradient) once
    n_transforms = p.batch * (p.in_channels + p.out_channels) + p.out_channels * p.in_per_group
    product = 8 * spectrum_elems(sizes) * p.batch * p.groups * p.in_per_group * p.out_per_group
    return {"transform": n_transforms * transform_flops(sizes), "product": float(product)}


def size_factor(sizes: tuple[int, ...], calibration=CALIBRATION) -> float:
    kinds = ["pow2" if n & (n - 1) == 0 else "smooth" if is_smooth(n) else "other" for n in sizes]
    return max(calibration[k] for k in kinds)


def estimate(p: ConvProblem, sizes: tuple[int, ...], calibration=CALIBRATION) -> float:
    """Relative cost of a size choice (unitless; only its order matters)."""
    c = count(p, sizes)
    return c["transform"] * size_factor(sizes, calibration) + c["product"]
