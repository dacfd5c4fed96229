"""Array backends: NumPy on the CPU, CuPy on the GPU.

The backend is chosen once, at the public entry point, and passed down. CuPy is
imported lazily, so convtune imports on a machine without CUDA.

Examples
--------
>>> import numpy as np
>>> backend_for(np.zeros(3)).name
'numpy'
"""

from __future__ import annotations

import functools
import importlib
import logging
import platform
from dataclasses import dataclass

from .errors import BackendError

log = logging.getLogger("convtune")

BACKENDS = ("numpy", "cupy")


@dataclass(frozen=True)
class DeviceInfo:
    """What a plan's timing depends on, as separate fields (see :meth:`key`)."""

    backend: str
    model: str
    compute_capability: str = ""
    sm_count: int = 0
    memory_bytes: int = 0
    driver: str = ""
    cuda_runtime: str = ""
    cufft: str = ""
    cublas: str = ""
    cudnn: str = ""
    numpy: str = ""
    cupy: str = ""

    def key(self) -> str:
        """Readable device key; every field that changes timings or results is in it."""
        if self.backend == "numpy":
            return f"cpu:{self.model}:numpy{self.numpy}"
        return (f"gpu:{self.model}:cc{self.compute_capability}:sm{self.sm_count}:drv{self.driver}:"
                f"cuda{self.cuda_runtime}:cufft{self.cufft}:cublas{self.cublas}:cudnn{self.cudnn or '-'}:"
                f"cupy{self.cupy}")

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class Backend:
    """Base of the two array backends; ``xp`` is the array module."""

    name = ""

    @property
    def xp(self):
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait until queued device work is done (a no-op on the CPU)."""

    def to_host(self, array):
        return array

    def asarray(self, array, dtype=None):
        return self.xp.asarray(array, dtype=dtype)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, MemoryError)

    def free_memory_bytes(self) -> int | None:
        return None

    def device_info(self) -> DeviceInfo:
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.name}>"


class NumpyBackend(Backend):
    name = "numpy"

    @property
    def xp(self):
        import numpy
        return numpy

    @functools.cache
    def device_info(self) -> DeviceInfo:
        import numpy
        model = platform.processor() or platform.machine() or "cpu"
        return DeviceInfo(backend="numpy", model=model.replace(":", "_"), numpy=numpy.__version__)


class CupyBackend(Backend):
    name = "cupy"

    def __init__(self):
        try:
            self._cp = importlib.import_module("cupy")
            self._cp.cuda.runtime.getDeviceCount()
        except Exception as exc:  # ImportError, CUDARuntimeError (no driver / no device)
            raise BackendError(
                f"the CuPy backend is unavailable ({type(exc).__name__}: {exc}); install CuPy for your "
                "CUDA version (pip install 'convtune[cuda13]' or 'convtune[cuda12]') on a machine with an "
                "NVIDIA GPU, or use NumPy arrays") from exc

    @property
    def xp(self):
        return self._cp

    def synchronize(self) -> None:
        self._cp.cuda.get_current_stream().synchronize()

    def to_host(self, array):
        return self._cp.asnumpy(array)

    def is_out_of_memory(self, exc: BaseException) -> bool:
        return isinstance(exc, (MemoryError, self._cp.cuda.memory.OutOfMemoryError)) or \
            "CUFFT_ALLOC_FAILED" in str(exc) or "OUT_OF_MEMORY" in str(exc).upper()

    def free_memory_bytes(self) -> int | None:
        free, _total = self._cp.cuda.runtime.memGetInfo()
        pool = self._cp.get_default_memory_pool()
        return int(free + pool.free_bytes())

    @functools.cache
    def device_info(self) -> DeviceInfo:
        cp = self._cp
        rt = cp.cuda.runtime
        dev = cp.cuda.Device()
        props = rt.getDeviceProperties(dev.id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])

        def version(getter):
            try:
                return str(getter())
            except Exception:  # a library that is missing or fails to load leaves its field empty
                return ""

        return DeviceInfo(
            backend="cupy", model=name.replace(":", "_"),
            compute_capability=f"{props['major']}.{props['minor']}",
            sm_count=int(props["multiProcessorCount"]), memory_bytes=int(props["totalGlobalMem"]),
            driver=version(rt.driverGetVersion), cuda_runtime=version(rt.runtimeGetVersion),
            cufft=version(lambda: importlib.import_module("cupy.cuda.cufft").getVersion()),
            cublas=version(lambda: importlib.import_module("cupy_backends.cuda.libs.cublas").getVersion(
                cp.cuda.device.get_cublas_handle())),
            cudnn=_cudnn_version(), numpy=importlib.import_module("numpy").__version__, cupy=cp.__version__)


def _cudnn_version() -> str:
    try:
        cudnn = importlib.import_module("cudnn")
        return str(cudnn.backend_version())
    except Exception:  # the cuDNN frontend is optional
        return ""


@functools.cache
def get_backend(name: str) -> Backend:
    """Return the backend called ``name`` (``'numpy'`` or ``'cupy'``)."""
    if name == "numpy":
        return NumpyBackend()
    if name == "cupy":
        return CupyBackend()
    raise ValueError(f"unknown backend {name!r}; acceptable backends: {', '.join(BACKENDS)}")


def backend_for(*arrays) -> Backend:
    """The backend of the given arrays; they must all live on the same one."""
    names = {("cupy" if type(a).__module__.startswith("cupy") else "numpy") for a in arrays}
    if len(names) != 1:
        raise ValueError("all arrays must be of one kind: all NumPy or all CuPy; "
                         "move them with cupy.asarray / cupy.asnumpy first")
    return get_backend(names.pop())


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        get_backend("cupy")
        return True
    except BackendError:
        return False
