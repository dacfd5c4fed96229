import os

import pytest

from convtune.backend import get_backend, gpu_available
from convtune.timing import TimingStats

_GPU = None


def has_gpu() -> bool:
    global _GPU
    if _GPU is None:
        _GPU = gpu_available()
    return _GPU


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy (scripts/gpu-tests.sh runs it on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords and not has_gpu():
            item.add_marker(skip)


@pytest.fixture(params=["numpy", pytest.param("cupy", marks=pytest.mark.gpu)])
def backend(request):
    return get_backend(request.param)


class FakeTimer:
    """Times by label prefix (first match wins), ``default`` otherwise; runs ``fn`` once, records labels."""

    def __init__(self, times=None, default=1.0):
        self.times = dict(times or {})
        self.default = default
        self.labels = []

    def __call__(self, fn, backend=None, label=""):
        fn()
        self.labels.append(label)
        t = next((v for k, v in self.times.items() if label.startswith(k)), self.default)
        return TimingStats(median_s=t, spread_s=0.0, min_s=t, repeats=1)


class FailingTimer:
    """Any use is a test failure: the cache-hit path must not time."""

    def __call__(self, fn, backend=None, label=""):
        raise AssertionError(f"timer used on a path that must not time ({label})")


@pytest.fixture
def fake_timer():
    return FakeTimer()


@pytest.fixture
def fake_default_timer(monkeypatch):
    """Every planner made without a timer (the CLI's, the runtime's) gets a fake one: quick tuning."""
    monkeypatch.setattr("convtune.planner.default_timer", lambda backend, adaptive=True: FakeTimer())


@pytest.fixture
def failing_timer():
    return FailingTimer()


@pytest.fixture(autouse=True, scope="session")
def _isolated_plan_cache(tmp_path_factory):
    """No test may touch the user's plan cache: the default runtime writes to a temporary file."""
    import os
    import convtune
    os.environ["CONVTUNE_DB"] = str(tmp_path_factory.mktemp("cache") / "default-plans.db")
    convtune.set_default_runtime(None)
    yield


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server for the session. In CI (CI=true) a missing server is a failure, not a skip."""
    import os
    from pgserver import PgServer
    try:
        server = PgServer().start()
    except (FileNotFoundError, OSError) as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL tests must run in CI: {exc}")
        pytest.skip(str(exc))
    yield server
    server.stop()


_DB_COUNTER = [0]


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def cache_url(request, tmp_path):
    """A fresh, empty plan-cache database URL: a SQLite file, or a new database on the test server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'plans.db'}"
    server = request.getfixturevalue("pg_server")
    _DB_COUNTER[0] += 1
    return server.create_database(f"convtune_test_{os.getpid()}_{_DB_COUNTER[0]}")


@pytest.fixture
def calibrations(monkeypatch):
    """An empty registry of device FFT calibrations for this test; the process's own is untouched."""
    from convtune.fft import cost
    registry = {}
    monkeypatch.setattr(cost, "_BY_DEVICE", registry)
    return registry
