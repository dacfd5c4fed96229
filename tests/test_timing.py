"""The CUDA-event timer's bookkeeping, on the CPU: a fake CuPy whose events read a fake clock."""

import types

import pytest

from convtune import CudaEventTimer


class _FakeCuda:
    """Just what the timer touches: a clock that the timed steps advance, events that read it, and a
    flush buffer whose fills are counted in the order they happen."""

    def __init__(self):
        self.now_ms = 0.0
        self.log = []
        cuda = self

        class Event:
            def record(self, stream=None):
                self.at = cuda.now_ms

            def synchronize(self):
                pass

        class Buffer:
            def fill(self, value):  # a flush takes time too, which must stay out of the measurement
                cuda.now_ms += 100.0
                cuda.log.append("flush")

        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: None, Device=lambda: types.SimpleNamespace(id=0),
            get_elapsed_time=lambda a, b: b.at - a.at,
            runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"l2CacheSize": 50 << 20}))
        self.float32 = "float32"
        self.empty = lambda n, dtype=None: Buffer()

    def step(self, name, ms):
        def run():
            self.now_ms += ms
            self.log.append(name)
        return run


@pytest.fixture
def fake():
    cp = _FakeCuda()
    return cp, types.SimpleNamespace(xp=cp, synchronize=lambda: None)


def test_one_call_is_warmed_up_flushed_and_timed(fake):
    cp, backend = fake
    stats = CudaEventTimer(warmup=3, repeats=5)(cp.step("f", 2.0), backend)
    assert stats.repeats == 5 and stats.median_s == pytest.approx(2e-3) and stats.spread_s == 0
    assert cp.log == ["f"] * 3 + ["flush", "f"] * 5  # warm-up untimed, a flush before every timed run


def test_a_sequence_flushes_before_each_step_and_sums_them(fake):
    cp, backend = fake
    stats = CudaEventTimer(warmup=2, repeats=4).sequence([cp.step("a", 1.0), cp.step("b", 0.5)], backend)
    assert stats.repeats == 4 and stats.median_s == pytest.approx(1.5e-3)
    assert cp.log == ["a", "b"] * 2 + ["flush", "a", "flush", "b"] * 4
