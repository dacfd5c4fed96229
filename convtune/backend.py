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

import contextlib
import functools
import importlib
import logging
import platform
from dataclasses import dataclass

from .errors import BackendError

try:  # (POSIX only)
    import resource
except ImportError:
    resource = None

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

    def free_memory_bytes(self) -> int | None:
        """Host memory this process can still take: the kernel's MemAvailable, bounded by the cgroup's
        memory limit (v2 or v1) less what the cgroup uses and by the process's own address-space limit
        (``ulimit -v``); ``None`` where none can be read."""
        return host_memory_available()

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


def host_memory_available() -> int | None:
    found = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            with open(limit_file) as fh:
                limit = fh.read().strip()
            with open(usage_file) as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < (1 << 60):  # "max", or v1's huge number: no limit
            found.append(max(int(limit) - usage, 0))
        break
    left = address_space_left()
    if left is not None:
        found.append(left)
    return min(found) if found else None


def address_space_left() -> int | None:
    """What the process's own limit on its address space (``ulimit -v``, RLIMIT_AS) still allows it to map: the
    limit less its virtual size now; ``None`` without such a limit (or where it cannot be read)."""
    if resource is None:
        return None
    try:
        soft, _hard = resource.getrlimit(resource.RLIMIT_AS)
        if soft == resource.RLIM_INFINITY or soft < 0:
            return None
        with open("/proc/self/statm") as fh:
            mapped = int(fh.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
    return max(soft - mapped, 0)


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


#: cuBLAS math modes (``cublasMath_t``) and CuPy's compute types (``cupy._core._routines_linalg``).
_CUBLAS_DEFAULT_MATH, _CUBLAS_TF32_TENSOR_OP_MATH = 0, 3
_CUPY_COMPUTE_TYPE_DEFAULT, _CUPY_COMPUTE_TYPE_TF32 = 1, 7


@contextlib.contextmanager
def gemm_precision(xp, tf32: bool):
    """Inside the block, float32 and complex64 matrix products use TF32 tensor cores only if ``tf32``.

    Strict fp32 otherwise, even when the process set ``CUPY_TF32=1``: a plan's math mode, not the
    environment, decides. On CuPy both CuPy's compute type for float32 (``matmul`` through
    ``gemmEx``) and the cuBLAS handle's math mode (the ``sgemm``/``cgemm`` routines) are set, and
    both are restored on exit. A no-op on NumPy.

    >>> import numpy as np
    >>> with gemm_precision(np, tf32=True):
    ...     (np.ones((2, 2), np.float32) @ np.ones((2, 2), np.float32))[0, 0]
    np.float32(2.0)
    """
    if getattr(xp, "__name__", "") != "cupy":
        yield
        return
    linalg, cublas, float32 = _gemm_state_modules()
    handle = xp.cuda.device.get_cublas_handle()
    previous_type = linalg.get_compute_type(float32)
    previous_mode = cublas.getMathMode(handle)
    want_type = _CUPY_COMPUTE_TYPE_TF32 if tf32 else _CUPY_COMPUTE_TYPE_DEFAULT
    want_mode = _CUBLAS_TF32_TENSOR_OP_MATH if tf32 else _CUBLAS_DEFAULT_MATH
    # (set and put back only what differs: most calls find the state they want, and each cuBLAS call is host time
    # on every pass of a cached plan)
    if previous_type != want_type:
        linalg.set_compute_type(float32, want_type)
    if previous_mode != want_mode:
        cublas.setMathMode(handle, want_mode)
    try:
        yield
    finally:
        if previous_type != want_type:
            linalg.set_compute_type(float32, previous_type)
        if previous_mode != want_mode:
            cublas.setMathMode(handle, previous_mode)


@functools.cache
def _gemm_state_modules():
    """CuPy's linalg module, its cuBLAS bindings and numpy.float32, looked up once (every plan call
    of im2col and fft enters :func:`gemm_precision`)."""
    import numpy
    return (importlib.import_module("cupy._core._routines_linalg"),
            importlib.import_module("cupy_backends.cuda.libs.cublas"), numpy.float32)


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        get_backend("cupy")
        return True
    except BackendError:
        return False
