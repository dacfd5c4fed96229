"""Round trips with kept spectra: a layer's three passes share their FFTs.

A layer runs forward, then (in either order) backward-data and backward-filter. Through the
frequency-major FFT executor (:mod:`convtune.fft.freqmajor`) at one transform size for all three:

=================  ===================================  ======================
pass               transforms                           keeps
=================  ===================================  ======================
forward            ``x``, ``w``; inverse of ``y``        spectra of x and w
backward-data      ``dy`` (or kept); inverse of ``dx``   spectrum of dy
backward-filter    ``dy`` (or kept); inverse of ``dw``   (x's spectrum reused)
=================  ===================================  ======================

(depthwise and few-channel grouped layers, whose groups the frequency-major GEMMs cannot take, run
the same split through :class:`convtune.fft.spectral.SpectralKept` with the ``pointwise`` product)
so six of the nine transforms of three separate FFT plans remain, at the price of holding the
three spectra (:func:`held_bytes`) from the forward pass until both backward passes have run.
Whether that pays is measured: :func:`tune_round_trip` times round trips of a few transform
sizes, each pass after an L2 flush, checks all three results against float64, and compares the
fastest with the sum of the three per-pass winners. The verdict (a :class:`TripDecision`) is
stored next to the per-pass plans, and a layer with ``keep_spectra='auto'`` follows it.

A half-precision or channels_last layer's trip with convtune's own transforms (``own``) reads and writes the
layer's dtype and layout itself (:mod:`convtune.fft.fft64`; bfloat16 also as its 16 bits, as the PyTorch layer hands
it). Any other trip of such a layer runs the round trip of its float32 channels-first problem between conversions
(as :func:`convtune.precision.bounded` runs a per-pass plan): its operands widened, its results rounded to the dtype
and laid out; the PyTorch layer has PyTorch make those conversions. The verdict weighs either, conversions included,
against the layer's own per-pass winners (cuDNN's and PyTorch's half-precision passes among them).

A kept weight spectrum is the weight as it was in the forward pass (as with saved tensors in
autograd): change the weight between forward and backward and the backward passes do not see it.

The executor (:class:`RoundTrip`) is in :mod:`convtune.roundtrip.trip`; its tuning, verdict
(:class:`TripDecision`) and record in a plan store are in :mod:`convtune.roundtrip.tuning`.
"""

from .trip import (VERSION, CHANGES, stale, DEFAULT_KEEP_LIMIT, KEEP_SIZES, PAYS_FACTOR, TripConfig, block_trip_configs,
                   held_bytes, unsupported_reason, pointwise_applies, RoundTrip)
from .tuning import (TripDecision, trip_key, load_trip, save_trip, trip_candidates, timed_steps, time_round_trip,
                     round_trip_operands, round_trip_references, compile_block_trips, block_size_rule,
                     tune_round_trip)

__all__ = ["VERSION", "CHANGES", "stale", "DEFAULT_KEEP_LIMIT", "KEEP_SIZES", "PAYS_FACTOR", "TripConfig",
           "block_trip_configs", "held_bytes", "unsupported_reason", "pointwise_applies", "RoundTrip", "TripDecision",
           "trip_key", "load_trip", "save_trip", "trip_candidates", "timed_steps", "time_round_trip",
           "round_trip_operands", "round_trip_references", "compile_block_trips", "block_size_rule",
           "tune_round_trip"]
