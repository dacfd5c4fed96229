"""What a CUDA graph capture records for one layer signature's route: its plans where they record, else PyTorch's
convolution (warmed outside the capture, which cuDNN needs), and what failed to record.

No plan is looked up, tuned or duelled on a capturing stream: a capture runs what eager calls of the same kind left
in the route (:func:`convtune.torch.functional._dispatch` decides which).
"""

from __future__ import annotations

import logging
import threading

import torch

from ._executors import Fallback
from ._formats import in_result_format
from ._notes import say_once

log = logging.getLogger("convtune")

_stream_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None) or torch.cuda.is_current_stream_capturing


def capturing(t) -> bool:
    """Is ``t`` a CUDA tensor whose work would be recorded into a CUDA graph (its device's current stream
    capturing: ``torch.cuda.graph``, ``make_graphed_callables``, ``torch.compile(mode="reduce-overhead")``)?"""
    return t.is_cuda and _stream_capturing()


#: Why a captured call runs PyTorch's convolution (said once per process).
CAPTURE_REASON = ("a CUDA graph records a convolution whose plans no eager call has looked up yet (plans are "
                  "not looked up, tuned or duelled on a capturing stream): PyTorch's convolution is recorded "
                  "for it; run a step or two before capturing (PyTorch's recipe warms up on a side stream) "
                  "and convtune's plans are recorded")
#: Why a plan that failed inside a capture runs PyTorch's convolution in captures from then on.
UNCAPTURED = ("its plan %s cannot be recorded in a CUDA graph (%s: %s): PyTorch's convolution is recorded "
              "for that pass; calls outside captures keep the plan")


class Captures:
    """A route's state under CUDA graph captures.

    ``native``: pass -> the PyTorch convolution captures record for it; ``failed``: passes whose plans failed
    inside a capture (PyTorch's is recorded instead from then on); ``trip_failed``: the layer's round trip is not
    recorded (PyTorch's convolution is, for the layer); ``warmed``: (pass, thread) where PyTorch's convolution ran
    outside captures (:meth:`warm`)."""

    __slots__ = ("problem", "native", "failed", "trip_failed", "warmed")

    def __init__(self, problem):
        self.problem = problem
        self.native = {}
        self.failed = set()
        self.trip_failed = False
        self.warmed = set()

    def run(self, pass_: str, executor, a, b, bias):
        """A pass's call that a CUDA graph records: its plan, resolved by an eager call before, where its
        strategy says that it records (``recordable``: kernels, cuFFT work and PyTorch's own operations do;
        CuPy refuses cuBLAS calls on a capturing stream, which rules out the im2col and GEMM-product plans);
        PyTorch's convolution where none is resolved yet, where the plan does not record, or where it failed
        inside a capture once (said once: no verdict on the plan, calls outside captures keep it). PyTorch's
        convolution for a plan that does not record ran once outside captures, in the eager calls' threads
        (:meth:`warm`: cuDNN cannot make its handle, load an engine or run its benchmark inside a capture). A
        plan's operands and workspaces come from PyTorch's allocator, whose capture pool holds them for the
        graph's replays."""
        out = None
        if executor is not None and executor.retry_at is None and executor.recordable and \
                pass_ not in self.failed:
            try:
                out = executor(a, b, bias)
            except Exception as exc:
                self.failed.add(pass_)
                say_once(f"uncaptured:{self.problem.key()}:{pass_}", "convtune: %s, %s: " + UNCAPTURED,
                         self.problem.describe(), pass_, executor.label, type(exc).__name__, exc)
        elif executor is None or executor.retry_at is not None:
            say_once("capture", "convtune: %s", CAPTURE_REASON)
        if out is None:
            out = self.pytorch(pass_)(a, b, bias)
        return in_result_format(out, a, b)

    def warm(self, pass_: str, a, b) -> None:
        """Run PyTorch's convolution for ``pass_`` on ``a`` and ``b`` once per thread, as a CUDA graph capture
        would record it instead of a plan that does not record (:meth:`run`): cuDNN makes its per-thread handle,
        loads its engines and runs its benchmark here, which it cannot do on a capturing stream (on the H100 a
        capture whose backward thread had never run cuDNN failed with
        CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED). Called on an eager call's operands, in the thread
        that runs that pass (autograd runs the backward passes in a thread of its own); a failure is only logged
        (the capture would meet it again)."""
        key = (pass_, threading.get_ident())
        if key in self.warmed:
            return
        self.warmed.add(key)
        try:
            self.pytorch(pass_)(a, b)
        except Exception as exc:
            log.debug("convtune: PyTorch's convolution for %s %s not warmed for captures: %s",
                      self.problem.describe(), pass_, exc)

    def pytorch(self, pass_: str) -> Fallback:
        """PyTorch's convolution for ``pass_`` inside a CUDA graph capture (the route's own executor stays)."""
        executor = self.native.get(pass_)
        if executor is None:
            executor = self.native[pass_] = Fallback(self.problem.for_pass(pass_), CAPTURE_REASON)
        return executor
