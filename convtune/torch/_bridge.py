"""Tensors as convtune's arrays, without copies; convtune's GPU work on PyTorch's stream and memory.

* CPU tensors are NumPy arrays (``Tensor.numpy()`` shares the memory).
* CUDA tensors are CuPy arrays over the same memory (``cupy.cuda.UnownedMemory`` owned by the
  tensor). While convtune serves a PyTorch op (:meth:`CudaBridge.call`), CuPy's current device
  and stream are PyTorch's current ones, and every CuPy allocation (outputs, workspaces, cuFFT
  work areas, contiguous copies) comes from PyTorch's caching allocator: one stream, one memory
  pool, and ``torch.cuda.max_memory_allocated()`` counts convtune's memory too. Memory made
  during a call and kept after it (cuFFT plans' work areas, built plans' workspaces) stays in
  PyTorch's pool, allocated on the stream that was current then.
* Plans whose executors only launch work on the operands (a ``launch`` form: the depthwise
  kernels, the 1x1 cuBLAS calls) skip :meth:`CudaBridge.call` and the array views altogether: they
  run on the tensors' addresses and on PyTorch's current stream (:meth:`CudaBridge.launch_stream`),
  allocating nothing (:class:`~convtune.torch._dispatch.ArrayPlan`).
"""

from __future__ import annotations

import functools
import importlib

import torch

from ..backend import get_backend
from ..errors import BackendError
from ..strategies.pytorch import cupy_viewer


class CpuBridge:
    """CPU tensors as NumPy arrays."""

    device_type = "cpu"

    def __init__(self):
        self.backend = get_backend("numpy")

    @staticmethod
    def array(t):
        """A NumPy view of a dense float32 or float16 CPU tensor (strides kept)."""
        return t.detach().numpy()

    @staticmethod
    def call(index, fn, *args):
        return fn(*args)


class CudaBridge:
    """CUDA tensors as CuPy arrays; :meth:`call` runs convtune on PyTorch's stream and allocator."""

    device_type = "cuda"

    def __init__(self):
        self.backend = get_backend("cupy")  # raises BackendError without CuPy or a GPU
        cp = self.cp = self.backend.xp
        memory = importlib.import_module("cupy.cuda.memory")
        self._get_allocator = getattr(memory, "_get_thread_local_allocator", None)
        self._set_allocator = getattr(memory, "_set_thread_local_allocator", None)
        self._unowned, self._pointer = cp.cuda.UnownedMemory, cp.cuda.MemoryPointer
        #: A CuPy view of a dense (contiguous or channels_last) float32 or float16 CUDA tensor, strides kept;
        #: the tensor owns the memory.
        self.array = cupy_viewer(cp)
        self._get_device, self._set_device = cp.cuda.runtime.getDevice, cp.cuda.runtime.setDevice
        self._raw_stream = torch._C._cuda_getCurrentRawStream
        self._streams: dict[tuple[int, int], object] = {}
        self._torch_devices: dict[int, torch.device] = {}

    def _stream(self, index: int, ptr: int):
        stream = self._streams.get((index, ptr))
        if stream is None:
            cp = self.cp
            stream = cp.cuda.Stream.null if ptr == 0 else cp.cuda.ExternalStream(ptr, index)
            self._streams[(index, ptr)] = stream
        return stream

    def launch_stream(self, index: int):
        """PyTorch's current stream of device ``index`` as a CuPy stream, where ``index`` is the current
        device (a plan's ``launch`` runs there without :meth:`call`'s switching); else ``None``."""
        if self._get_device() != index:
            return None
        return self._stream(index, self._raw_stream(index))

    def _malloc(self, size: int):
        """CuPy's allocator while convtune serves PyTorch: a block of PyTorch's caching allocator on
        the current stream, held by a uint8 tensor that the CuPy memory keeps alive."""
        index = self._get_device()
        device = self._torch_devices.get(index)
        if device is None:
            device = self._torch_devices[index] = torch.device("cuda", index)
        block = torch.empty((max(size, 1),), dtype=torch.uint8, device=device)
        return self._pointer(self._unowned(block.data_ptr(), size, block, index), 0)

    def call(self, index: int, fn, *args):
        """``fn(*args)`` with CuPy on device ``index``, PyTorch's current stream of that device, and
        PyTorch's allocator; the previous device, stream and allocator are restored after."""
        previous_device = self._get_device()
        if previous_device != index:
            self._set_device(index)
        previous_stream = self.cp.cuda.get_current_stream()
        self._stream(index, self._raw_stream(index)).use()
        try:
            if self._set_allocator is None:  # a CuPy without the thread-local setter: its context manager
                with self.cp.cuda.using_allocator(self._malloc):
                    return fn(*args)
            previous_allocator = self._get_allocator()
            self._set_allocator(self._malloc)
            try:
                return fn(*args)
            finally:
                self._set_allocator(previous_allocator)
        finally:
            previous_stream.use()
            if previous_device != index:
                self._set_device(previous_device)


@functools.cache
def bridge(device_type: str):
    """The bridge for a tensor device type (``'cpu'`` or ``'cuda'``); raises
    :class:`~convtune.errors.BackendError` where convtune cannot run that device's tensors."""
    if device_type == "cpu":
        return CpuBridge()
    if device_type == "cuda":
        try:
            return CudaBridge()
        except BackendError as exc:
            raise BackendError(f"CUDA tensors run on convtune's CuPy backend, which is unavailable here: {exc}") \
                from exc
    raise BackendError(f"convtune runs CPU and CUDA tensors, not {device_type!r} ones")
