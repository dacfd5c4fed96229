"""Counting FFT work (pure), and the calibration that turns counts into a ranking.

``count`` knows nothing about hardware: it counts floating-point operations of
the transforms and of the frequency-domain product. A calibration is data with
provenance: the per-flop slowdown of 2·3·5·7-smooth and other transform lengths
against powers of 2. ``CALIBRATION`` is the default; ``convtune calibrate``
measures one per device (:mod:`convtune.fft.calibrate`, fitted by :func:`fit`),
the plan cache stores it (:func:`store_calibration`), a runtime or a command that tunes loads what is stored
(:func:`load_calibrations`), and :func:`calibration_for` hands the device's own to
the ranking. The planner uses the model only to narrow the size candidates; the
benchmark decides.
"""

from __future__ import annotations

import logging
import math

from ..problem import ConvProblem
from .sizes import is_smooth

log = logging.getLogger("convtune")

#: Relative cost per counted flop, by kind of transform length.
#: Provenance: initial estimates from cuFFT's and pocketfft's documented behaviour
#: (radix-2 fastest, 3/5/7 radices slower, Bluestein for other primes several
#: times slower); not yet fitted on any device (the FFT-speed issue calibrates them).
CALIBRATION = {"source": "uncalibrated estimate", "pow2": 1.0, "smooth": 1.4, "other": 4.0}
KINDS = ("pow2", "smooth", "other")

#: Calibrations by device key (:meth:`convtune.backend.DeviceInfo.key`), as the plan cache stored them.
_BY_DEVICE: dict[str, dict] = {}


def check_calibration(device_key: str, calibration) -> None:
    """Raise ValueError unless ``calibration`` has a positive factor for every kind of length."""
    if not isinstance(calibration, dict):
        raise ValueError(f"calibration for {device_key} is not a mapping")
    missing = [k for k in KINDS if isinstance(calibration.get(k), bool) or not isinstance(calibration.get(k), (int, float))
               or not (math.isfinite(calibration[k]) and calibration[k] > 0)]
    if missing:
        raise ValueError(f"calibration for {device_key} lacks positive factors for {', '.join(missing)} (each a finite "
                         "number above 0)")


def register_calibration(device_key: str, calibration: dict) -> None:
    check_calibration(device_key, calibration)
    _BY_DEVICE[device_key] = dict(calibration)


def store_calibration(store, device_key: str, calibration: dict) -> None:
    """Store (replacing) a device's calibration in ``store`` (a :class:`~convtune.cache.PlanStore`) and use it
    from now on."""
    register_calibration(device_key, calibration)
    store.put_record("fft_cost", device_key, {"device": device_key, **calibration})


def stored_calibrations(store) -> dict[str, dict]:
    """The calibrations ``store`` holds, by device key (unreadable ones skipped)."""
    out = {}
    for doc in store.records("fft_cost"):
        doc = dict(doc)
        device_key = doc.pop("device", None)
        if isinstance(device_key, str):
            out[device_key] = doc
    return out


def load_calibrations(store) -> None:
    """Use every calibration ``store`` holds (where a runtime or a command that tunes starts); a malformed one
    is left out, with a warning, and its device keeps the default."""
    for device_key, calibration in stored_calibrations(store).items():
        try:
            register_calibration(device_key, calibration)
        except ValueError as exc:
            log.warning("plan store %s: %s; using the default", store, exc)


def calibration_for(device_key: str) -> dict:
    """The device's measured calibration, or the default :data:`CALIBRATION`."""
    return _BY_DEVICE.get(device_key, CALIBRATION)


def length_kind(n: int) -> str:
    return "pow2" if n & (n - 1) == 0 else "smooth" if is_smooth(n) else "other"


def fit(samples, source: str) -> dict:
    """A calibration from timed transforms: ``samples`` are ``(kind, flops, seconds)``.

    Each kind's cost is the median of its seconds per counted flop; factors are relative to
    powers of 2 (which must be measured). Kinds without samples keep the default factor, and
    the calibration says so.

    >>> fit([("pow2", 1e9, 1e-3), ("smooth", 1e9, 2e-3)], "example")["smooth"]
    2.0
    """
    per_kind = {k: sorted(s / f for kind, f, s in samples if kind == k and f > 0 and s > 0) for k in KINDS}
    if not per_kind["pow2"]:
        raise ValueError("a calibration needs timed power-of-2 transforms")

    def median(values):
        mid = len(values) // 2
        return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])

    base = median(per_kind["pow2"])
    out = {"source": source, "samples": {k: len(v) for k, v in per_kind.items()},
           "seconds_per_gflop_pow2": base * 1e9}
    defaults = [k for k in KINDS if not per_kind[k]]
    for k in KINDS:
        out[k] = median(per_kind[k]) / base if per_kind[k] else CALIBRATION[k]
    if defaults:
        out["source"] += f"; default factors for {', '.join(defaults)}"
    return out


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
    return max(calibration[length_kind(n)] for n in sizes)


def estimate(p: ConvProblem, sizes: tuple[int, ...], calibration=CALIBRATION) -> float:
    """Relative cost of a size choice (unitless; only its order matters)."""
    c = count(p, sizes)
    return c["transform"] * size_factor(sizes, calibration) + c["product"]
