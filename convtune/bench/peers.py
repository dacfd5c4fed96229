"""Peers that convtune is compared with, in the same process, on the same arrays.

* ``torch-fp32``: PyTorch with ``cudnn.benchmark = True`` and TF32 off (on the CPU: PyTorch's CPU
  convolution);
* ``torch-tf32``: the same with TF32 allowed (GPU only);

(both in the problem's dtype and layout: for a bfloat16 channels_last problem, PyTorch's bfloat16
channels_last convolution, whose accumulation TF32 does not change);
* ``torch-fp32-ref``: for half-precision problems, PyTorch in float32 on the same (rounded) operands
  and layout: what the half precision saves, for reference;
* ``torch-fft``: the FFT convolution a PyTorch user writes by hand (:mod:`convtune.bench.torchfft`),
  for FFT-class layers (stride 1, kernels of 7 or more per axis), on the GPU and on the CPU;
* ``cudnn-best``: the fastest single cuDNN engine (engine id + knobs) for the
  problem in its math mode: a search of its own over the cuDNN strategy's
  candidates only (float64 check first, as for any candidate), then the winner
  is timed like every other contestant. Its record names the engine.

A peer that cannot run here says why (:func:`available_peers`).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..planner import Planner
from ..problem import ConvProblem
from ..strategies.pytorch import native_pass
from . import torchfft

PEERS = ("torch-fp32", "torch-tf32", "torch-fp32-ref", "torch-fft", "cudnn-best")
#: Seconds the cudnn-best peer may spend timing one problem's engines (the search, not the bench).
CUDNN_SEARCH_BUDGET_S = 2.0


@dataclass(frozen=True)
class Peer:
    name: str
    #: ``make(problem, a, b) -> fn`` where ``fn()`` computes the pass into a fresh tensor/array (a
    #: :class:`Chosen` where the peer chose among plans of its own, e.g. a cuDNN engine)
    make: Callable | None
    absent_reason: str = ""


def _torch_for(backend):
    """``(torch, None)``, or ``(None, why)`` where PyTorch cannot run this backend's arrays."""
    try:
        torch = importlib.import_module("torch")
    except ImportError:
        return None, "PyTorch is not installed"
    if backend.name == "cupy" and not torch.cuda.is_available():
        return None, "PyTorch sees no CUDA device"
    return torch, None


def _torch_peer(name: str, tf32: bool, backend, reference: bool = False) -> Peer:
    torch, absent = _torch_for(backend)
    if torch is None:
        return Peer(name, None, absent)
    if backend.name != "cupy" and tf32:
        return Peer(name, None, "TF32 is a GPU mode")

    def make(problem: ConvProblem, a, b):
        if reference and problem.dtype == "float32":
            raise NotApplicable("a float32 problem: torch-fp32 is its PyTorch peer")
        # PyTorch's own computation of the pass, as its autograd runs it in training (the backward passes
        # through convolution_backward with the input's memory format: torch.nn.grad.conv2d_input hands it
        # a broadcast input, which for a channels-last depthwise layer makes PyTorch run the pass through
        # channels-first copies, 3x its time in training for ConvNeXt-T's 7x7 layers in bfloat16 on the H100)
        compute = native_pass(problem.pass_, problem.x_shape, problem.w_shape, problem.stride, problem.padding,
                              problem.dilation, problem.groups)
        ta, tb = torch.from_dlpack(a), torch.from_dlpack(b)  # zero-copy views of the arrays
        if reference:  # the same rounded values in float32, the same layout
            ta, tb = ta.float(), tb.float()
        elif problem.dtype == "bfloat16":  # stored in float32 (convtune.precision): PyTorch runs it in bfloat16
            ta, tb = ta.to(torch.bfloat16), tb.to(torch.bfloat16)

        def run():
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.allow_tf32 = tf32
            torch.backends.cuda.matmul.allow_tf32 = tf32
            return compute(ta, tb)
        return run
    return Peer(name, make)


def _cudnn_peer(backend) -> Peer:
    try:
        importlib.import_module("cudnn")
    except Exception:  # any import failure means the optional frontend is unusable here
        return Peer("cudnn-best", None, "the cuDNN frontend (nvidia-cudnn-frontend) is not installed")

    def make(problem: ConvProblem, a, b):
        planner = Planner(backend, strategies=["cudnn"], time_budget_s=CUDNN_SEARCH_BUDGET_S)
        plan = planner.plan(problem)  # raises TuningError (reported as the peer's failure) if no engine runs

        return Chosen(lambda: plan(a, b), plan.label)
    return Peer("cudnn-best", make)


def _torch_fft_peer(backend) -> Peer:
    torch, absent = _torch_for(backend)
    if torch is None:
        return Peer(torchfft.NAME, None, absent)

    def make(problem: ConvProblem, a, b):
        reason = torchfft.unsupported_reason(problem)
        if reason is not None:
            raise NotApplicable(reason)
        return torchfft.make_pass(torch, problem, a, b)
    return Peer(torchfft.NAME, make)


@dataclass(frozen=True)
class Chosen:
    """A peer's call that runs a plan the peer chose (``label`` says which)."""

    fn: Callable
    label: str

    def __call__(self):
        return self.fn()


class NotApplicable(Exception):
    """A peer that does not apply to a layer (recorded as such, not as a failure)."""


def available_peers(backend) -> list[Peer]:
    """Every peer, with ``make=None`` and a reason where it cannot run on this backend."""
    peers = [_torch_peer("torch-fp32", False, backend), _torch_peer("torch-tf32", True, backend),
             _torch_peer("torch-fp32-ref", False, backend, reference=True), _torch_fft_peer(backend)]
    if backend.name != "cupy":
        return peers + [Peer("cudnn-best", None, "no GPU: cuDNN needs CUDA")]
    return peers + [_cudnn_peer(backend)]


def as_cupy(result, xp):
    """A peer's result (a torch tensor) as an array of the backend, for the error check (bfloat16,
    which the array modules lack, as float32: exactly)."""
    if not hasattr(result, "detach"):
        return result
    result = result.detach()
    if str(result.dtype) == "torch.bfloat16":
        result = result.float()
    return xp.from_dlpack(result)
