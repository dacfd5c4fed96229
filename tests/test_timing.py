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
                cuda.log.append("wait")

        def memset(ptr, value, nbytes, stream):  # a flush takes time too, which must stay out of the measurement
            assert nbytes >= 2 * (50 << 20)
            cuda.now_ms += 100.0
            cuda.log.append("flush")

        self.cuda = types.SimpleNamespace(
            Event=Event, get_current_stream=lambda: types.SimpleNamespace(ptr=0),
            Device=lambda: types.SimpleNamespace(id=0), get_elapsed_time=lambda a, b: b.at - a.at,
            runtime=types.SimpleNamespace(getDeviceProperties=lambda i: {"l2CacheSize": 50 << 20},
                                          memsetAsync=memset))
        self.float32, self.uint8 = "float32", "uint8"
        self.empty = lambda n, dtype=None: types.SimpleNamespace(data=types.SimpleNamespace(ptr=1), nbytes=n)

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
    # warm-up untimed, a flush before every timed run; the first run read alone, the next four queued together
    assert cp.log == ["f"] * 3 + ["flush", "f", "wait"] + ["flush", "f"] * 4 + ["wait"]


def test_runs_are_queued_in_chunks_and_read_after_one_wait(fake):
    cp, backend = fake
    assert CudaEventTimer(warmup=1, repeats=12)(cp.step("f", 2.0), backend).repeats == 12
    assert cp.log.count("wait") == 4  # the first run; four more (five runs before any stop); then 5 and 2
    cp.log.clear()
    assert CudaEventTimer(warmup=1, repeats=12, chunk=1)(cp.step("f", 2.0), backend).repeats == 12
    assert cp.log.count("wait") == 12


def test_a_slow_call_gets_five_runs_once_over_the_budget(fake):
    """The budget (``max_total_s``) stops the timing once five runs are read, and never queues runs beyond it."""
    import time
    cp, backend = fake

    def slow():  # (host time: what the budget counts)
        time.sleep(0.03)
        cp.now_ms += 30.0
    stats = CudaEventTimer(warmup=1, repeats=25, max_total_s=0.1)(slow, backend)
    assert stats.repeats == 5 and stats.median_s == pytest.approx(0.03)


def test_a_sequence_flushes_before_each_step_and_sums_them(fake):
    cp, backend = fake
    stats = CudaEventTimer(warmup=2, repeats=4).sequence([cp.step("a", 1.0), cp.step("b", 0.5)], backend)
    assert stats.repeats == 4 and stats.median_s == pytest.approx(1.5e-3)
    timed = [step for step in cp.log[4:] if step != "wait"]
    assert cp.log[:4] == ["a", "b"] * 2 and timed == ["flush", "a", "flush", "b"] * 4


def test_interleaved_calls_take_turns_each_flushed_and_pair_up(fake):
    from convtune.timing import paired_ratio
    cp, backend = fake
    peer, ours = CudaEventTimer(warmup=2, repeats=4).interleaved([cp.step("p", 2.0), cp.step("o", 1.0)], backend)
    # warm-up of both, then every repeat runs each after its own flush, the order reversed every other repeat
    assert [s for s in cp.log if s != "wait"] == ["p", "o"] * 2 + ["flush", "p", "flush", "o", "flush", "o", "flush",
                                                                  "p"] * 2
    assert peer.samples == (2e-3,) * 4 and ours.samples == (1e-3,) * 4 and ours.repeats == 4
    ratio = paired_ratio(peer, ours)
    assert ratio.median_s == pytest.approx(2.0) and ratio.repeats == 4
    assert "samples" not in peer.as_dict()
    with pytest.raises(ValueError, match="interleaved"):
        paired_ratio(CudaEventTimer(warmup=0, repeats=3)(cp.step("x", 1.0), backend), ours)


def test_three_interleaved_calls_take_every_place_in_turn(fake):
    cp, backend = fake
    a, b, c = CudaEventTimer(warmup=1, repeats=3).interleaved([cp.step("a", 1.0), cp.step("b", 2.0),
                                                               cp.step("c", 3.0)], backend)
    timed = [step for step in cp.log[3:] if step not in ("flush", "wait")]
    assert timed == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # the order rotated by one every repeat
    assert (a.samples, b.samples, c.samples) == ((1e-3,) * 3, (2e-3,) * 3, (3e-3,) * 3)


def test_paired_ratio_is_taken_repeat_by_repeat():
    from convtune.timing import TimingStats, paired_ratio
    # a drift that slows both sides alike leaves every pair's ratio at 2
    peer = TimingStats.from_samples([2.0, 4.0, 8.0], keep=True)
    ours = TimingStats.from_samples([1.0, 2.0, 4.0], keep=True)
    assert paired_ratio(peer, ours).median_s == 2.0 and paired_ratio(peer, ours).spread_s == 0.0
