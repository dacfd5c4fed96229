"""convtune.compiling: kernel factories made once across threads, builds run at once."""

import threading
import time

from convtune.backend import get_backend
from convtune.compiling import CompileAhead, build_concurrently, compiled_once


def test_a_key_is_made_once_while_other_threads_wait_for_it():
    made = []

    @compiled_once
    def slow(n, scale=1):
        made.append((n, scale))
        time.sleep(0.05)
        return n * scale
    results = []
    threads = [threading.Thread(target=lambda: results.append(slow(4, scale=2))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [8] * 6 and made == [(4, 2)]
    assert slow(4) == 4 and made == [(4, 2), (4, 1)]
    slow.cache_clear()
    assert slow(4, scale=2) == 8 and len(made) == 3


def test_builds_run_at_once_and_failures_are_counted_not_raised(monkeypatch):
    monkeypatch.setattr("convtune.compiling.threads", lambda: 4)
    running, peak, lock = [0], [0], threading.Lock()

    def build():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    def broken():
        raise RuntimeError("no kernel")
    assert build_concurrently([build] * 4 + [broken], get_backend("numpy")) == 1
    assert peak[0] >= 2
    monkeypatch.setattr("convtune.compiling.threads", lambda: 1)  # one core: nothing to gain, nothing run
    assert build_concurrently([broken, broken], get_backend("numpy")) == 0


def _wait_for(condition, seconds=10.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)
    return condition()


def test_compile_ahead_prepares_on_a_thread_of_its_own_the_items_not_yet_reached(monkeypatch):
    monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
    done, caller = [], threading.current_thread().name
    ahead = CompileAhead(lambda item: done.append((item, threading.current_thread().name)), range(5))
    ahead.reached(2)  # the caller's searches have prepared items 0 to 2 themselves
    with ahead:
        assert _wait_for(lambda: ahead.prepared == 2)
    assert [item for item, _t in done] == [3, 4] and all(t not in (caller, "MainThread") for _i, t in done)
    assert ahead.seconds >= 0


def test_compile_ahead_stops_before_its_next_item_and_a_failure_costs_only_its_own(monkeypatch):
    monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
    started, release, done = threading.Event(), threading.Event(), []

    def prepare(item):
        if item == 1:
            raise RuntimeError("no kernel for this one")
        if item == 3:
            started.set()
            release.wait(10)
        done.append(item)
    ahead = CompileAhead(prepare, range(6)).start()
    assert started.wait(10)
    closing = threading.Thread(target=ahead.close)
    closing.start()
    time.sleep(0.05)  # (close has asked the thread to stop; it is still in item 3)
    release.set()
    closing.join(10)
    assert not closing.is_alive() and done == [0, 2, 3] and ahead.prepared == 3


def test_compile_ahead_starts_nothing_for_one_item_or_on_one_core(monkeypatch):
    calls = []
    monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
    with CompileAhead(calls.append, ["only"]) as ahead:
        pass
    monkeypatch.setattr("convtune.compiling.threads", lambda: 1)
    with CompileAhead(calls.append, ["a", "b"]) as ahead:
        pass
    assert calls == [] and ahead.prepared == 0


def test_compile_ahead_runs_every_items_builds_on_one_pool_without_waiting_for_an_item_to_finish(monkeypatch):
    """The builds ``prepare`` returns go to one pool: a slow build of one item does not hold back the next item's
    builds (they had run one item after another); closing drops the builds not yet started, and a build that raises
    costs only itself."""
    monkeypatch.setattr("convtune.compiling.threads", lambda: 2)
    release, ran, lock = threading.Event(), [], threading.Lock()

    def build(name, slow=False, broken=False):
        def run():
            if slow:
                release.wait(10)
            if broken:
                raise RuntimeError("no kernel")
            with lock:
                ran.append(name)
        return run
    builds = {0: [build("0a", slow=True)], 1: [build("1a"), build("1b", broken=True), build("1c")], 2: None,
              3: [build("3a")]}
    ahead = CompileAhead(builds.get, range(4)).start()
    assert _wait_for(lambda: {"1a", "1c", "3a"} <= set(ran))  # (one thread holds 0a; the other ran the rest)
    assert "0a" not in ran and ahead.prepared == 4
    release.set()
    ahead.close()
    assert sorted(ran) == ["0a", "1a", "1c", "3a"] and ahead.built == 5

    release.clear()
    ran.clear()
    many = {0: [build("slow", slow=True), build("slow", slow=True)] + [build(f"b{i}") for i in range(50)], 1: []}
    ahead = CompileAhead(many.get, range(2)).start()
    assert _wait_for(lambda: ahead.prepared == 2)
    closing = threading.Thread(target=ahead.close)
    closing.start()
    time.sleep(0.05)
    release.set()
    closing.join(10)
    assert not closing.is_alive() and ran == ["slow", "slow"]  # (both threads held; the 50 behind them dropped)


def test_the_fft_strategy_compiles_its_own_kernels_ahead_and_in_its_builds_on_the_gpu_only(monkeypatch):
    """The one-pass 64x64 transforms and the packed product are compiled by the strategy's kernel builds (the
    compile-ahead's) and by its build, never in a candidate's first run, which the search reads as its time."""
    from convtune import ConvProblem
    from convtune.fft import fft64, packedgemm
    from convtune.strategies import get_strategy
    from convtune.strategies.fft import FftConfig

    class Gpu:
        name = "cupy"
    fft = get_strategy("fft")
    p = ConvProblem.make(batch=8, in_channels=64, out_channels=64, input_size=(56, 56), kernel_size=3, padding=1)
    own = FftConfig(sizes=(64, 64), product="fgemm", chunk=8, packed=True, own=True)
    tf32 = FftConfig(sizes=(64, 64), product="fgemm", chunk=8, packed=True, tf32=True)
    library = FftConfig(sizes=(64, 64), product="fgemm", chunk=8)
    assert fft.kernel_builds(p, [own, tf32, library, own], Gpu()) == [fft64.compile_kernels,
                                                                      packedgemm.packed_gemm_kernel,
                                                                      packedgemm.packed_tf32_kernel]
    assert fft.kernel_builds(p, [library], Gpu()) == []
    assert fft.kernel_builds(p, [own], get_backend("numpy")) == []
    compiled = []
    monkeypatch.setattr(fft64, "compile_kernels", lambda: compiled.append("own"))
    monkeypatch.setattr(packedgemm, "packed_gemm_kernel", lambda: compiled.append("packed"))
    monkeypatch.setattr(type(fft), "_executor", staticmethod(lambda xp, q, config: None))

    class Backend(Gpu):
        xp = None
    fft.build(p, own, Backend())
    assert compiled == ["own", "packed"]


def test_resident_blocks_asks_the_driver_only_of_a_device_function(monkeypatch):
    """The occupancy of a launchable kernel is the driver's answer; a stand-in kernel (no device function), or a
    machine without the driver, gets 0, which the launches read as "not known"."""
    from convtune import compiling
    assert compiling.resident_blocks(object(), 256, 0) == 0
    asked = []

    class Driver:
        @staticmethod
        def cuOccupancyMaxActiveBlocksPerMultiprocessor(out, func, threads, shared):
            asked.append((func.value, threads.value, shared.value))
            out._obj.value = 3
            return 0

    class Kernel:
        ptr = 1234
    monkeypatch.setattr(compiling, "_driver", lambda: Driver)
    assert compiling.resident_blocks(Kernel(), 224, 40960) == 3
    assert asked == [(1234, 224, 40960)]
    monkeypatch.setattr(compiling, "_driver", lambda: None)
    assert compiling.resident_blocks(Kernel(), 224, 40960) == 0
