"""Timers: objects the planner is given, so tests can pass a fake one.

``timer(fn, backend, label) -> TimingStats`` runs ``fn()`` (one execution of
a candidate, ``label`` names it) several times and reports the median and
spread per call.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class TimingStats:
    """Per-call time statistics in seconds."""

    median_s: float
    spread_s: float  # interquartile range (or max - min for fewer than 4 repeats)
    min_s: float
    repeats: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)

    @classmethod
    def from_samples(cls, samples: list[float]) -> "TimingStats":
        ordered = sorted(samples)
        if len(ordered) >= 4:
            q = statistics.quantiles(ordered, n=4)
            spread = q[2] - q[0]
        else:
            spread = ordered[-1] - ordered[0]
        return cls(median_s=statistics.median(ordered), spread_s=spread, min_s=ordered[0], repeats=len(ordered))


class CpuTimer:
    """Wall-clock timer: grows the loop count until one measurement lasts ``min_time_s``."""

    def __init__(self, repeats: int = 5, min_time_s: float = 0.02, max_loops: int = 1 << 16):
        self.repeats = repeats
        self.min_time_s = min_time_s
        self.max_loops = max_loops

    def __call__(self, fn, backend=None, label: str = "") -> TimingStats:
        fn()  # warm-up: first-call costs (FFT plans, allocations) stay out of the numbers
        loops = 1
        while True:
            elapsed = self._run(fn, loops)
            if elapsed >= self.min_time_s or loops >= self.max_loops:
                break
            loops = min(self.max_loops, loops * max(2, int(self.min_time_s / max(elapsed, 1e-9) * 1.2)))
        samples = [elapsed / loops] + [self._run(fn, loops) / loops for _ in range(self.repeats - 1)]
        return TimingStats.from_samples(samples)

    @staticmethod
    def _run(fn, loops):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        return time.perf_counter() - start

    def __repr__(self):
        return f"CpuTimer(repeats={self.repeats}, min_time_s={self.min_time_s})"


class CudaEventTimer:
    """CUDA-event timer: warm-up, L2 flush before every timed run, median of ``repeats``."""

    def __init__(self, warmup: int = 3, repeats: int = 25, flush_l2: bool = True, max_total_s: float = 1.0):
        self.warmup = warmup
        self.repeats = repeats
        self.flush_l2 = flush_l2
        self.max_total_s = max_total_s
        self._flush_buffer = None

    def _flush(self, cp):
        if self._flush_buffer is None:
            props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
            l2 = int(props.get("l2CacheSize", 64 << 20))
            self._flush_buffer = cp.empty(max(2 * l2, 64 << 20) // 4, dtype=cp.float32)
        self._flush_buffer.fill(1.0)  # a write pass over twice the L2 evicts what the last run left

    def __call__(self, fn, backend, label: str = "") -> TimingStats:
        return self.sequence([fn], backend, label)

    def sequence(self, steps, backend, label: str = "") -> TimingStats:
        """Time a sequence of dependent calls (a layer's passes) as one run: each step after its own
        L2 flush, between its own pair of events; a run's time is the sum of its steps' times.
        Timing one call is the sequence of that call alone."""
        cp = backend.xp
        t0 = time.perf_counter()
        for step in steps:
            step()
        backend.synchronize()
        if time.perf_counter() - t0 < self.max_total_s / 4:  # a slow candidate needs no further warm-up
            for _ in range(self.warmup - 1):
                for step in steps:
                    step()
        stream = cp.cuda.get_current_stream()
        events = [(cp.cuda.Event(), cp.cuda.Event()) for _ in steps]
        samples = []
        budget_start = time.perf_counter()
        for i in range(self.repeats):
            for step, (start, end) in zip(steps, events):
                if self.flush_l2:
                    self._flush(cp)
                start.record(stream)
                step()
                end.record(stream)
            events[-1][1].synchronize()
            samples.append(sum(cp.cuda.get_elapsed_time(start, end) for start, end in events) / 1e3)
            # a slow candidate still gets enough repeats for a median, not the full count
            if i >= 4 and time.perf_counter() - budget_start > self.max_total_s:
                break
        return TimingStats.from_samples(samples)

    def __repr__(self):
        return f"CudaEventTimer(warmup={self.warmup}, repeats={self.repeats}, flush_l2={self.flush_l2})"


def default_timer(backend):
    """The planner's timer: enough repeats to rank candidates (``convtune bench`` reports with more)."""
    return CudaEventTimer(repeats=10, max_total_s=0.5) if backend.name == "cupy" else CpuTimer()
