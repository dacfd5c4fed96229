"""Measuring the FFT cost model's calibration on one device.

Times batched real-to-complex transforms of power-of-2, 2·3·5·7-smooth and other
(prime) lengths, 1-D and 2-D, each batch holding about the same number of
elements, with the backend's timer; :func:`convtune.fft.cost.fit` turns the times
into per-kind factors. ``convtune calibrate`` runs it and stores the result in the
plan cache, which hands it to the ranking of transform sizes on that device.

Examples
--------
>>> from convtune.backend import get_backend
>>> from convtune.timing import CpuTimer
>>> c = calibrate(get_backend("numpy"), CpuTimer(min_time_s=0.001), elements=1 << 12)
>>> sorted(k for k in ("pow2", "smooth", "other") if c[k] > 0)
['other', 'pow2', 'smooth']
"""

from __future__ import annotations

import datetime
import math

from . import cost

#: Transform shapes timed per kind of length: the kind is that of the slowest axis, so each 2-D
#: shape has both axes of its kind. Primes stand for "other" (cuFFT and pocketfft use Bluestein).
SHAPES = {
    "pow2": ((256,), (1024,), (4096,), (32, 32), (64, 64)),
    "smooth": ((240,), (1000,), (4200,), (30, 30), (80, 80)),
    "other": ((251,), (1021,), (4099,), (31, 31), (67, 67)),
}


def measure(backend, timer, elements: int = 1 << 24):
    """``[(kind, shape, flops, seconds), ...]`` for every shape of :data:`SHAPES`."""
    xp = backend.xp
    rng = xp.random.default_rng(0)
    rows = []
    for kind, shapes in SHAPES.items():
        for shape in shapes:
            batch = max(1, elements // math.prod(shape))
            a = rng.standard_normal((batch,) + shape, dtype=xp.float32)  # never time on zeros
            axes = tuple(range(1, 1 + len(shape)))
            stats = timer(lambda a=a, axes=axes: xp.fft.rfftn(a, axes=axes), backend)
            rows.append((kind, shape, batch * cost.transform_flops(shape), stats.median_s))
    return rows


def calibrate(backend, timer, elements: int = 1 << 24) -> dict:
    """Measure and fit; the result names the device, the date and the amount measured."""
    rows = measure(backend, timer, elements)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    source = (f"measured by convtune calibrate on {backend.device_info().key()} on {stamp}: "
              f"{len(rows)} batched R2C transforms of about {elements} elements each")
    result = cost.fit([(kind, flops, seconds) for kind, _shape, flops, seconds in rows], source)
    result["measurements"] = [{"kind": k, "shape": list(s), "gflop": f / 1e9, "seconds": t} for k, s, f, t in rows]
    return result
