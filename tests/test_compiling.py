"""convtune.compiling: kernel factories made once across threads, builds run at once."""

import threading
import time

from convtune.backend import get_backend
from convtune.compiling import build_concurrently, compiled_once


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
