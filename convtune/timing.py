"""Timers: objects the planner is given, so tests can pass a fake one.

``timer(fn, backend, label) -> TimingStats`` runs ``fn()`` (one execution of
a candidate, ``label`` names it) several times and reports the median and
spread per call.

Two ways the planner's timers save time (both off in an exhaustive search):

* ``stop_above=seconds``: after the first timed run, a candidate slower than that is not run again
  (its statistics are of that one run; early stopping);
* ``adaptive=True``: repeats stop once ``min_repeats`` runs agree within ``stable`` (their range,
  relative to the median, on the CPU; their interquartile range on the GPU), instead of always
  making ``repeats`` runs.
"""

from __future__ import annotations

import inspect
import statistics
import time
from dataclasses import dataclass, field


#: A training step whose host time (the time to issue it) is at least this share of its time is host-bound: the device
#: waited on the host for most of it, so faster device work shortens no step and only the host's time counts.
HOST_BOUND = 0.9


@dataclass(frozen=True)
class TimingStats:
    """Per-call time statistics in seconds."""

    median_s: float
    spread_s: float  # interquartile range (or max - min for fewer than 4 repeats)
    min_s: float
    repeats: int
    #: the samples in the order taken, where a comparison needs them (:meth:`CudaEventTimer.interleaved`)
    samples: tuple = field(default=(), repr=False, compare=False)

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "samples"}

    @classmethod
    def from_samples(cls, samples: list[float], keep: bool = False) -> "TimingStats":
        ordered = sorted(samples)
        if len(ordered) >= 4:
            q = statistics.quantiles(ordered, n=4)
            spread = q[2] - q[0]
        else:
            spread = ordered[-1] - ordered[0]
        return cls(median_s=statistics.median(ordered), spread_s=spread, min_s=ordered[0], repeats=len(ordered),
                   samples=tuple(samples) if keep else ())


class CpuTimer:
    """Wall-clock timer: grows the loop count until one measurement lasts ``min_time_s``."""

    def __init__(self, repeats: int = 5, min_time_s: float = 0.02, max_loops: int = 1 << 16, *,
                 adaptive: bool = False, min_repeats: int = 3, stable: float = 0.02):
        self.repeats = repeats
        self.min_time_s = min_time_s
        self.max_loops = max_loops
        self.adaptive, self.min_repeats, self.stable = adaptive, min_repeats, stable

    def __call__(self, fn, backend=None, label: str = "", stop_above: float | None = None) -> TimingStats:
        loops, elapsed = self._loops(fn)
        samples = [elapsed / loops]
        if stop_above is not None and samples[0] > stop_above:
            return TimingStats.from_samples(samples)
        while len(samples) < self.repeats:
            samples.append(self._run(fn, loops) / loops)
            if self.adaptive and len(samples) >= self.min_repeats and \
                    max(samples) - min(samples) <= self.stable * statistics.median(samples):
                break
        return TimingStats.from_samples(samples)

    def interleaved(self, fns, backend=None, label: str = "", repeats: int | None = None) -> list[TimingStats]:
        """Time several calls side by side: each is warmed up and given its own loop count, then every
        repeat runs each once in turn (the order rotated every repeat), so what drifts over the
        measurement weighs on all alike. One :class:`TimingStats` per call, their samples by repeat
        (``paired_ratio`` compares them repeat by repeat)."""
        loops = [self._loops(fn)[0] for fn in fns]
        return _interleave(fns, repeats or self.repeats, lambda i, fn: self._run(fn, loops[i]) / loops[i])

    def _loops(self, fn) -> tuple[int, float]:
        """``(loops, seconds)``: after a warm-up call (first-call costs, such as FFT plans and allocations, stay
        out of the numbers), the loop count whose run lasts ``min_time_s`` (at most ``max_loops``), and how
        long that run took."""
        fn()
        loops = 1
        while True:
            elapsed = self._run(fn, loops)
            if elapsed >= self.min_time_s or loops >= self.max_loops:
                return loops, elapsed
            loops = min(self.max_loops, loops * max(2, int(self.min_time_s / max(elapsed, 1e-9) * 1.2)))

    @staticmethod
    def _run(fn, loops):
        start = time.perf_counter()
        for _ in range(loops):
            fn()
        return time.perf_counter() - start

    def __repr__(self):
        return f"CpuTimer(repeats={self.repeats}, min_time_s={self.min_time_s}, adaptive={self.adaptive})"


class CudaEventTimer:
    """CUDA-event timer: warm-up, L2 flush before every timed run, median of ``repeats``.

    The timed runs are queued ``chunk`` at a time, each between its own events, and read after one wait: the
    first run alone (early stopping reads it), then enough to reach five, then ``chunk`` at a time within the
    budget (``max_total_s``) until the runs agree (``adaptive``) or ``repeats`` are done. Queued, the GPU runs
    flush and call back to back while the host prepares the next; an event pair holds the call alone either way.
    ``chunk=1`` waits after every run."""

    #: runs before the budget or the runs' agreement may stop the timing
    MIN_RUNS = 5

    def __init__(self, warmup: int = 3, repeats: int = 25, flush_l2: bool = True, max_total_s: float = 1.0, *,
                 adaptive: bool = False, min_repeats: int = 5, stable: float = 0.01, chunk: int = 5):
        self.warmup = warmup
        self.repeats = repeats
        self.flush_l2 = flush_l2
        self.max_total_s = max_total_s
        self.adaptive, self.min_repeats, self.stable = adaptive, min_repeats, stable
        self.chunk = max(1, chunk)
        self._flush_buffer = None

    def _flush(self, cp):
        """A write pass over twice the L2, which evicts what the last run left: a memset, on the current stream
        (on an H200 36 us for 120 MiB where CuPy's ``fill`` takes 163 us, and a read after either takes as long)."""
        if self._flush_buffer is None:
            props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
            l2 = int(props.get("l2CacheSize", 64 << 20))
            self._flush_buffer = cp.empty(max(2 * l2, 64 << 20), dtype=cp.uint8)
        buffer = self._flush_buffer
        cp.cuda.runtime.memsetAsync(buffer.data.ptr, 0, buffer.nbytes, cp.cuda.get_current_stream().ptr)

    def __call__(self, fn, backend, label: str = "", stop_above: float | None = None) -> TimingStats:
        return self.sequence([fn], backend, label, stop_above)

    def sequence(self, steps, backend, label: str = "", stop_above: float | None = None) -> TimingStats:
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
        samples: list[float] = []
        budget_start = time.perf_counter()
        runs = 1  # the first run alone: early stopping reads it before any other is queued
        while runs:
            queued = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in steps] for _ in range(runs)]
            for events in queued:
                for step, (start, end) in zip(steps, events):
                    if self.flush_l2:
                        self._flush(cp)
                    start.record(stream)
                    step()
                    end.record(stream)
            queued[-1][-1][1].synchronize()
            samples.extend(sum(cp.cuda.get_elapsed_time(start, end) for start, end in events) / 1e3
                           for events in queued)
            if stop_above is not None and len(samples) == 1 and samples[0] > stop_above:
                break  # early stopping: clearly slower than the best so far
            runs = self._next_runs(samples, time.perf_counter() - budget_start)
        return TimingStats.from_samples(samples)

    def _next_runs(self, samples: list[float], elapsed: float) -> int:
        """How many runs to queue next (0: done), after ``samples`` taken in ``elapsed`` seconds."""
        n = len(samples)
        left = self.repeats - n
        if left <= 0:
            return 0
        if n < self.MIN_RUNS:
            return min(left, self.MIN_RUNS - n, self.chunk)
        if elapsed > self.max_total_s:
            return 0  # a slow candidate gets enough runs for a median, not the full count
        if self.adaptive and n >= self.min_repeats:
            stats = TimingStats.from_samples(samples)
            if stats.spread_s <= self.stable * stats.median_s:
                return 0
        affordable = int((self.max_total_s - elapsed) / (elapsed / n)) if elapsed > 0 else left
        return max(1, min(left, self.chunk, affordable))

    def interleaved(self, fns, backend, label: str = "", repeats: int | None = None) -> list[TimingStats]:
        """Time several calls side by side (a contender and its peer): each warmed up, then every repeat
        runs each once in turn, after its own L2 flush and between its own events, the order rotated
        every repeat, so clocks and whatever else drifts over the measurement weigh on all alike
        (two calls of PyTorch's timed minutes apart in one process differed by up to 8% on the H100).
        One :class:`TimingStats` per call, their samples by repeat (``paired_ratio`` compares them
        repeat by repeat); every call gets ``repeats`` runs (the timer's unless given; no early or adaptive
        stop)."""
        cp = backend.xp
        for _ in range(self.warmup):
            for fn in fns:
                fn()
        backend.synchronize()
        stream = cp.cuda.get_current_stream()
        start, end = cp.cuda.Event(), cp.cuda.Event()

        def once(i, fn):
            if self.flush_l2:
                self._flush(cp)
            start.record(stream)
            fn()
            end.record(stream)
            end.synchronize()
            return cp.cuda.get_elapsed_time(start, end) / 1e3
        return _interleave(fns, repeats or self.repeats, once)

    def __repr__(self):
        return (f"CudaEventTimer(warmup={self.warmup}, repeats={self.repeats}, flush_l2={self.flush_l2}, "
                f"adaptive={self.adaptive}, chunk={self.chunk})")


def _interleave(fns, repeats: int, once) -> list[TimingStats]:
    """``repeats`` rounds of ``once(i, fns[i])`` for every call, in turn, the order rotated by one every round
    (two calls: reversed every other round), so each call takes each place in the round equally often; per call
    the :class:`TimingStats` of its samples, kept in round order (``samples``)."""
    samples = [[] for _ in fns]
    n = len(fns)
    for r in range(repeats):
        for k in range(n):
            i = (k + r) % n
            samples[i].append(once(i, fns[i]))
    return [TimingStats.from_samples(s, keep=True) for s in samples]


def paired_ratio(peer: TimingStats, ours: TimingStats) -> TimingStats:
    """The peer's time over ours, repeat by repeat, of two :meth:`interleaved` measurements (above 1:
    ours is faster); its median is the paired comparison's result, its spread how much the pairs
    disagree. A statistic of ratios, not of seconds."""
    a, b = peer.samples, ours.samples
    if not a or len(a) != len(b):
        raise ValueError("paired_ratio takes two measurements of one interleaved() call")
    return TimingStats.from_samples([x / y for x, y in zip(a, b)])


def default_timer(backend, adaptive: bool = True):
    """The planner's timer: enough repeats to rank candidates (``convtune bench`` reports with more);
    ``adaptive``: repeats stop once the runs agree."""
    if backend.name == "cupy":
        return CudaEventTimer(repeats=10, max_total_s=0.5, adaptive=adaptive)
    return CpuTimer(adaptive=adaptive)


def takes_stop_above(timer) -> bool:
    """Does ``timer`` take the ``stop_above`` keyword (early stopping: :data:`convtune.planner.EARLY_STOP`)?"""
    try:
        params = inspect.signature(timer).parameters
    except (TypeError, ValueError):
        return False
    return "stop_above" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
