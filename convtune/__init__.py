"""convtune: convolution auto-tuning engine and cached plan service.

Three layers: a shape-only :class:`ConvProblem`, the :class:`Planner` that
verifies and times candidates and returns a :class:`Decision`, and the
immutable :class:`Plan` that executes. :func:`conv` and the layer objects
dispatch through a plan lookup (see :mod:`convtune.runtime`).
"""

from ._version import __version__
from .errors import BackendError, CacheError, ConvtuneError, NetworkError, TuningError, UnsupportedProblem
from .layers import Conv1d, Conv2d
from .plan import CandidateOutcome, Decision, Plan
from .planner import Planner
from .problem import ConvProblem
from .arrayapi import conv, conv_backward_data, conv_backward_filter
from .runtime import MemoryPlanStore, Runtime, default_runtime, set_default_runtime, tune, use_cache
from .timing import CpuTimer, CudaEventTimer, TimingStats

# No NullHandler: where the application configures no logging, Python's last-resort handler shows
# convtune's warnings (a tuning stall, a fallback, a read-only cache) on stderr, and nothing below WARNING.

__all__ = ["ConvProblem", "Planner", "Plan", "Decision", "CandidateOutcome", "TimingStats", "CpuTimer",
           "CudaEventTimer", "Runtime", "MemoryPlanStore", "conv", "conv_backward_data", "conv_backward_filter",
           "tune", "use_cache", "default_runtime", "set_default_runtime", "Conv1d", "Conv2d", "ConvtuneError", "UnsupportedProblem",
           "TuningError", "BackendError", "CacheError", "NetworkError", "__version__"]
