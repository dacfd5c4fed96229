"""What a plan runs: the one declared contract between a strategy, the planner and the drop-in.

A strategy's :meth:`~convtune.strategies.Strategy.build` makes an :class:`Executor` (or a bare
``run(a, b, out=None)``, which :func:`as_executor` wraps); the planner verifies and times it, a
:class:`~convtune.plan.Plan` calls it, and the PyTorch layer reads its by-address form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True, eq=False)
class Executor:
    """One configuration's executor for one problem.

    Attributes
    ----------
    run : callable
        ``run(a, b, out=None) -> result``: the pass on the problem's two operands (arrays of the backend, in the
        problem's dtype storage and layout; see :mod:`convtune.problem`), into ``out`` where given.
    launch : callable, optional
        The same work by device address: ``launch(a, b, out, stream[, workspace])`` on C-contiguous operands and
        result of the problem's dtype, on ``stream`` (a CuPy stream of the current device), allocating nothing.
        The PyTorch bridge calls it on tensors' memory instead of making array views.
    launch_reads_bfloat16 : bool
        ``launch`` reads bfloat16 memory itself (16-bit numbers), not the float32 storage of
        :mod:`convtune.precision`.
    launch_workspace : int
        Bytes of device memory ``launch`` needs; the caller passes a block of that size as a fifth argument.
    timed : callable, optional
        ``timed(a, b, out) -> go``: a call of no arguments that runs the work the runtime's calls run, on copies
        of ``a`` and ``b`` prepared once (where the array calls do work the runtime's do not: packing bfloat16
        values to 16 bits, converting between dtypes). The planner times ``go`` instead of ``run``.
    float32 : Executor, optional
        Where this executor is a float32 channels-first executor between conversions, that executor: a caller
        that makes the conversions itself (the PyTorch bridge) runs it directly.
    reads_bfloat16_bits : bool
        ``run`` also takes bfloat16 operands as their 16 bits (int16 or uint16 arrays, what the PyTorch layer
        hands over).
    """

    run: Callable
    launch: Callable | None = None
    launch_reads_bfloat16: bool = False
    launch_workspace: int = 0
    timed: Callable | None = None
    float32: Executor | None = None
    reads_bfloat16_bits: bool = False

    def __call__(self, a, b, out=None):
        return self.run(a, b, out)


def as_executor(built) -> Executor:
    """``built`` (a strategy's :meth:`~convtune.strategies.Strategy.build`) as an :class:`Executor`."""
    return built if isinstance(built, Executor) else Executor(run=built)
