"""What a route runs for one pass: PyTorch's own convolution (:class:`Native`, or :class:`Fallback` where convtune
cannot run the call) or a plan of another strategy (:class:`ArrayPlan`: the tensors' memory handed to the plan's
by-address launch, or zero-copy array views through the bridge)."""

from __future__ import annotations


import torch

from ..problem import ConvProblem
from ..strategies import get_strategy
from ..strategies.pytorch import native_for
from ._formats import CONTIGUOUS, NLC, channels_last_format, dense, dense_as, layout_format

class Native:
    """PyTorch's convolution, the plan's winner (or, as :class:`Fallback`, the way out). ``flags``: the
    ``(benchmark, tf32)`` cuDNN settings ``fn`` holds during its calls (``None``: the process's), as
    the maker of ``fn`` says (:meth:`convtune.strategies.pytorch.TorchStrategy.native`)."""

    __slots__ = ("fn", "label", "retry_at", "flags")

    def __init__(self, fn, label: str, flags: tuple = (None, None)):
        self.fn, self.label, self.flags = fn, label, flags
        self.retry_at = None  # when to look the plan up again (for want of a tuned plan), or never

    def __call__(self, a, b, bias=None):
        return self.fn(dense(a), dense(b), bias)


class Fallback(Native):
    """PyTorch's convolution with the process's own cuDNN settings, where convtune cannot run."""

    __slots__ = ("reason",)

    def __init__(self, problem: ConvProblem, reason: str):
        super().__init__(native_for(problem), "pytorch (fallback)")
        self.reason = reason


class ArrayPlan:
    """A convtune plan of another strategy, on zero-copy array views of the tensors (bfloat16 ones
    converted to float32 and back: :mod:`convtune.precision`, except where a by-address form reads
    bfloat16 itself: the channels-last depthwise kernels).

    On CUDA, a plan whose executor has a by-address form (``launch``: the depthwise kernels, the 1x1
    cuBLAS calls; see :meth:`Strategy.build <convtune.strategies.base.Strategy.build>`) is called on the
    tensors' addresses and PyTorch's current stream instead, without array views or the bridge's
    switching. Where the plan runs its strategy's float32 channels-first executor between conversions
    (:func:`convtune.precision.bounded`: a channels_last or half-precision problem), PyTorch makes those
    conversions (one copy per operand, one for the result) and the executor's by-address form runs between."""

    __slots__ = ("plan", "bridge", "shape", "bias_shape", "label", "retry_at", "storage", "channels_last",
                 "launch", "launch_dtype", "launch_format", "launch_workspace", "duel", "recordable", "float32_run",
                 "result_format", "bits")

    def __init__(self, plan, bridge_, problem: ConvProblem):
        self.plan, self.bridge, self.shape = plan, bridge_, problem.result_shape
        self.bias_shape = (1, -1) + (1,) * problem.rank
        self.label = plan.label
        self.retry_at = None
        self.storage = torch.float16 if problem.dtype == "float16" else torch.float32
        self.channels_last = channels_last_format(problem.rank + 2) if problem.layout == "channels_last" else None
        self.launch = self.launch_dtype = self.launch_format = None
        self.launch_workspace = 0
        self.duel = None  # a won duel: (its seconds per call, PyTorch's, PyTorch's executor) (see Route.settle)
        # can a CUDA graph record its work (Route.run)? (a plan whose strategy is not registered here: no)
        try:
            self.recordable = get_strategy(plan.strategy).recordable(problem, plan.config)
        except Exception:
            self.recordable = False
        executor = plan.run
        if bridge_.device_type == "cuda":
            native, converted = plan.launch, executor.float32.launch if executor.float32 is not None else None
            # (a launch reads bfloat16 tensors where it says so; else bfloat16, stored as float32, is converted)
            if native is not None and (problem.dtype != "bfloat16" or executor.launch_reads_bfloat16):
                self.launch, self.launch_dtype, self.launch_format = native, getattr(torch, problem.dtype), \
                    self.channels_last or (NLC if problem.layout == "channels_last" else CONTIGUOUS)
                self.launch_workspace = executor.launch_workspace
            elif converted is not None:
                self.launch, self.launch_dtype, self.launch_format = converted, torch.float32, CONTIGUOUS
        # a plan between conversions without a by-address form: PyTorch converts (one pass per operand, from the
        # tensors' own dtype and layout, and one for the result), the float32 channels-first executor runs on
        # views of float32 tensors (on the H100 the array form's conversions took fbfft-L2's bfloat16 channels_last
        # forward from 1.01 ms, its float32 plan's time, to 3.53: transposing float32 copies, and the rounding
        # as four integer passes over the result)
        self.float32_run = executor.float32.run if self.launch is None and executor.float32 is not None else None
        self.result_format = layout_format(problem)
        # an executor that reads and writes bfloat16 as its 16 bits (convtune's own FFT transforms) gets the tensors'
        # memory as it is, not float32 copies
        self.bits = (bridge_.device_type == "cuda" and problem.dtype == "bfloat16" and self.launch is None
                     and self.float32_run is None and executor.reads_bfloat16_bits)

    def _operand(self, t):
        t = t.contiguous(memory_format=self.channels_last) if self.channels_last else t.contiguous()
        return t if t.dtype == self.storage else t.to(self.storage)

    def __call__(self, a, b, bias=None):
        dtype = a.dtype
        stream = None if self.launch is None else self.bridge.launch_stream(a.device.index)
        if stream is not None:
            out = self._by_address(a, b, stream)
        elif self.float32_run is not None:
            a, b = dense_as(a, torch.float32, CONTIGUOUS), dense_as(b, torch.float32, CONTIGUOUS)
            out = torch.empty(self.shape, dtype=torch.float32, device=a.device)
            br = self.bridge
            br.call(a.device.index, self.float32_run, br.array(a), br.array(b), br.array(out))
        else:
            if self.bits:
                fmt = self.channels_last or CONTIGUOUS
                a, b = dense_as(a, torch.bfloat16, fmt), dense_as(b, torch.bfloat16, fmt)
            else:
                a, b = self._operand(a), self._operand(b)
            out = torch.empty(self.shape, dtype=torch.bfloat16 if self.bits else self.storage, device=a.device,
                              memory_format=self.channels_last or CONTIGUOUS)
            br = self.bridge
            br.call(a.device.index, self.plan, br.array(a), br.array(b), br.array(out))
        if dtype != out.dtype:  # (rounded and laid out in one pass)
            out = out.to(dtype=dtype, memory_format=self.result_format)
        if bias is not None:
            out += bias.view(self.bias_shape)
        return out

    def _by_address(self, a, b, stream):
        """The result (in the launch's dtype and layout: :meth:`Route.run` puts it in the operands') of the
        plan's ``launch`` on dense copies of the operands where they are not dense in its dtype and layout."""
        dtype, fmt = self.launch_dtype, self.launch_format
        a, b = dense_as(a, dtype, fmt), dense_as(b, dtype, fmt)
        if fmt is NLC:
            n, c, length = self.shape
            out = torch.empty((n, length, c), dtype=dtype, device=a.device).transpose(1, 2)
        else:
            out = torch.empty(self.shape, dtype=dtype, device=a.device, memory_format=fmt)
        if self.launch_workspace:  # from PyTorch's caching allocator, on its stream, like every allocation here
            workspace = torch.empty((self.launch_workspace,), dtype=torch.uint8, device=a.device)
            self.launch(a.data_ptr(), b.data_ptr(), out.data_ptr(), stream, workspace.data_ptr())
        else:
            self.launch(a.data_ptr(), b.data_ptr(), out.data_ptr(), stream)
        return out
