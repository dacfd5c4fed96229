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
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU with CuPy (run scripts/gpu-tests.sh on the device machine)")
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
def failing_timer():
    return FailingTimer()
