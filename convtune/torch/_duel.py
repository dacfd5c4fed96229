"""A plan's duel with PyTorch's own convolution in the layer: random operands of the pass, both timed per call with
the host's work included (and on the device alone, for steps in CUDA graphs), and the key of the verdict in the plan
store (see :class:`~convtune.torch._dispatch.Route`)."""

from __future__ import annotations

import logging
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import torch

from ..direct import replay
from ..problem import ConvProblem
from ..roundtrip import VERSION as TRIP_VERSION
from ..strategies import get_strategy
from ..strategies.pytorch import SEARCH_GAIN, native_for, search_gain
from ._formats import DTYPES, channels_last_format

log = logging.getLogger("convtune")

#: Device types where a plan of another strategy duels PyTorch's convolution before a route takes it
#: (on the CPU the planner's wall-clock timing already counts the host's work).
DUEL_DEVICE_TYPES = {"cuda"}
#: Calls per timed round at least, the wall time a round should last at least (more calls where the
#: layer is quick, so the synchronisation at its end weighs little), and rounds per contender, taken in
#: turn (the best round counts), in a duel.
DUEL_CALLS, DUEL_ROUND_S, DUEL_ROUNDS = 5, 2e-3, 5
#: How much faster per call a plan must be than PyTorch's convolution to win a duel: a tie goes to
#: PyTorch, whose host work in a training step is less than the plan's (on the H100, ResNet-50 with every
#: duel decided by any margin trained at 0.94x PyTorch: ten plans won by a few percent, within the duel's noise).
DUEL_MARGIN = 0.05
#: A duel whose first two rounds find one contender this many times faster than the other ends there
#: (the best of two: one hiccup does not decide it): no noise reverses a gap that wide, and the rounds
#: of a slow layer cost most.
DUEL_CLEAR = 1.5
#: A duel of a problem of this many floating-point operations or more first puts a floor under PyTorch's time
#: (:func:`search_floor`) and runs PyTorch's algorithm search only where that floor does not already lose to the plan:
#: the search times every algorithm, and on a large layer that costs seconds (36 s of an H200's time for SLaK-T's
#: 51x51 backward-data pass in bfloat16, at batch 16 about 10**11 operations); below it the search costs little.
DUEL_FLOOR_FLOPS = 10**9
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}
#: The duel's own method, part of every stored verdict's key: a verdict measured by another method is measured
#: again (2: cuDNN plans and the 1x1 GEMMs launched from CUDA graphs per operand addresses, which took most of their
#: host cost away; verdicts stored before kept that cost; 3: each contender's host time per call is kept beside its
#: wall time, for training steps that are host-bound; 4: and its time on the device alone, for steps in CUDA graphs).
DUEL_METHOD = 4
#: Rounds of a contender's timing on the device alone (:func:`device_seconds`), the best counting.
DEVICE_ROUNDS = 2


def floor_spares_search(problem: ConvProblem) -> bool:
    """Is ``problem`` (any pass of a layer's) one where PyTorch's algorithm search costs much and is expected to buy
    little: a layer of :data:`DUEL_FLOOR_FLOPS` or more (where the duels put a floor under PyTorch's call first) whose
    class of problems bounds the search's gain below the general bound
    (:func:`~convtune.strategies.pytorch.search_gain`: the large depthwise kernels in half precision)? Its duels are
    the likeliest to be decided by the floor, without the search, and a tune-ahead's weighing of PyTorch's steps runs
    its layers on cuDNN's heuristic pick rather than search them (:func:`convtune.torch._host.step_times`)."""
    return problem.flops() >= DUEL_FLOOR_FLOPS and search_gain(problem) < SEARCH_GAIN


class Duel(NamedTuple):
    """A duel that a plan won against PyTorch's convolution (a tuple: seconds per call in the layer of the plan and
    of PyTorch's, PyTorch's executor, then the host's time per call to issue each, ``None`` where not measured,
    whether PyTorch's seconds are a floor under its time, not a measure (:func:`search_floor`), and each one's time
    per call on the device alone, ``None`` where not measured)."""

    plan_s: float
    native_s: float
    native: object
    plan_host_s: float | None = None
    native_host_s: float | None = None
    bound: bool = False
    plan_device_s: float | None = None
    native_device_s: float | None = None

    def gain(self, host_bound: bool = False, graphed: bool = False) -> float:
        """Seconds per call the plan saves: in the layer (the host's work and the device's together); in a step
        that is host-bound (where the device's time is hidden behind the host's), the host's time alone; in a step
        that runs as a CUDA graph (``graphed``: no host work in it), the device's time alone (each where measured)."""
        if graphed and self.plan_device_s is not None and self.native_device_s is not None:
            return self.native_device_s - self.plan_device_s
        if self._by_host(host_bound):
            return self.native_host_s - self.plan_host_s
        return self.native_s - self.plan_s

    def gain_at_least(self, host_bound: bool = False) -> bool:
        """Is :meth:`gain` only a floor under what the plan saves? So where PyTorch's time in the layer is a floor
        (the search not run) and the gain is counted in it: the search's pick may be up to
        :func:`~convtune.strategies.pytorch.search_gain` times faster than the heuristic pick, or no faster, so a
        small gain by the floor is no reason to hand the layer back."""
        return self.bound and not self._by_host(host_bound)

    def _by_host(self, host_bound: bool) -> bool:
        return host_bound and self.plan_host_s is not None and self.native_host_s is not None


def duel_operands(problem: ConvProblem, device):
    """Random operands of a pass in its dtype and layout (never zeros: some kernels skip them)."""
    fmt = channels_last_format(problem.rank + 2) if problem.layout == "channels_last" else None
    gen = torch.Generator(device=device).manual_seed(0)
    operands = []
    for shape in problem.operand_shapes:
        t = torch.randn(shape, generator=gen, device=device, dtype=TORCH_DTYPES[problem.dtype])
        operands.append(t.contiguous(memory_format=fmt) if fmt is not None and t.dim() == problem.rank + 2 else t)
    return operands


def pytorch_versions() -> str:
    """PyTorch's and cuDNN's versions (the other contender's host and device costs follow them)."""
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return f"torch{torch.__version__}+cudnn{cudnn}"


def duel_conditions(strategy: str) -> str:
    """What a duel's verdict depends on besides the device, the problem and the plan: PyTorch's and cuDNN's versions,
    the version of the plan's strategy (``strategy``), whether by-address launches replay from CUDA graphs
    (``CONVTUNE_REPLAY``) and the duel's own method (:data:`DUEL_METHOD`). A verdict stored under other conditions
    is measured again."""
    return _conditions(get_strategy(strategy).version_tag())


def trip_duel_conditions() -> str:
    """What a round trip's duel with a layer's per-pass plans depends on besides the device, the problem and the trip:
    PyTorch's and cuDNN's versions, the round trips' version (:data:`convtune.roundtrip.VERSION`), replay on or off
    and the duel's method (the per-pass plans' own conditions are their duels'). A verdict stored under other
    conditions is measured again."""
    return _conditions(f"trip{TRIP_VERSION}")


def _conditions(version: str) -> str:
    """PyTorch's and cuDNN's versions, ``version`` (what the contender's own code is), replay on or off, the method."""
    replays = "off" if os.environ.get(replay.ENV) == "0" else "on"
    return f"{pytorch_versions()}|{version}|replay-{replays}|duel{DUEL_METHOD}"


def duel_key(device_key: str, problem: ConvProblem, plan_label: str, conditions: str) -> str:
    """The key of a duel's record in a plan store: what its verdict depends on (``conditions``:
    :func:`duel_conditions`)."""
    return f"{device_key}|{problem.key()}|{plan_label}|{conditions}"


def search_floor(problem: ConvProblem, a, b, device, runs: int = 3) -> tuple[float, float]:
    """A floor under the seconds per call of PyTorch's convolution with its algorithm search (``cudnn.benchmark``) on
    ``problem``'s operands ``a`` and ``b``, and the host's seconds to issue such a call: cuDNN's heuristic pick (the
    benchmark off), the medians of ``runs`` runs after a first one, its time on the device (CUDA events) over the
    largest gain the search has been seen to make over that pick on such problems
    (:func:`~convtune.strategies.pytorch.search_gain`, as the planner's floor:
    :meth:`~convtune.strategies.pytorch.TorchStrategy.lower_bound`) and its host time (the search's pick is called the
    same way, through the same plan cache). The pick runs on a thread of its own: PyTorch keeps the plan a shape first
    got in a cache per thread, the benchmark on or off, so a pick made on the caller's thread would stand in for its
    later search there."""
    pick = native_for(problem, benchmark=False, tf32=problem.math == "tf32")

    def medians() -> tuple[float, float]:
        with torch.cuda.device(device):
            torch.cuda.synchronize()  # (the operands were made on the caller's stream)
            pick(a, b)
            times, hosts = [], []
            for _ in range(runs):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                issued = time.perf_counter()
                pick(a, b)
                hosts.append(time.perf_counter() - issued)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            return sorted(times)[runs // 2], sorted(hosts)[runs // 2]
    with ThreadPoolExecutor(1, thread_name_prefix="convtune-duel-pick") as thread:
        device_s, host_s = thread.submit(medians).result()
    return device_s / search_gain(problem), host_s


class _Backward(torch.autograd.Function):
    """An identity whose backward runs ``work`` (:func:`where_pass_runs`)."""

    @staticmethod
    def forward(ctx, x, work, out):
        ctx.work, ctx.out = work, out
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        try:
            ctx.out.append(ctx.work())
        except BaseException as exc:  # (raised again on the caller's thread, as it was)
            ctx.out.append(exc)
        return grad, None, None


def where_pass_runs(pass_: str, work, device):
    """``work()``'s result, run on the thread where a training step runs ``pass_``: a gradient's on the autograd
    engine's, inside a backward (its worker thread for ``device`` on CUDA), the forward pass's on the caller's. PyTorch
    keeps the cuDNN plan a shape first got in a cache per thread: a pass timed on the thread that runs it in training
    finds what that thread searched before (PyTorch's own steps, the weighing of the host's share) and leaves what it
    searches to the steps that follow, rather than searching on a thread of its own (36 s of an H200's time, once
    more, for SLaK-T's 51x51 backward-data pass in bfloat16)."""
    if pass_ == "fwd":
        return work()
    out: list = []
    with torch.enable_grad():
        x = torch.zeros((), device=device, requires_grad=True)
        _Backward.apply(x, work, out).backward()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def per_call_seconds(contenders, a, b, device, hosts: list | None = None, devices: list | None = None) -> list[float]:
    """Each contender's wall time per call, issued back to back and synchronised per round (the host's
    work and the device's together, as a training step sees them), best of :data:`DUEL_ROUNDS` (of
    two, where those are clear by :data:`DUEL_CLEAR`). ``hosts``, a list, gets each contender's host time per
    call: the time to issue a round's calls, before its synchronisation (best of the rounds too); ``devices``, a
    list, each one's time per call on the device alone (:func:`device_seconds`; on CUDA only, else left empty)."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for fn in contenders:  # warm: cuDNN's benchmark, first-call allocations, lazy builds
        fn(a, b), fn(a, b)
    sync()
    start = time.perf_counter()
    for fn in contenders:
        fn(a, b)
    sync()
    calls = max(DUEL_CALLS, min(200, math.ceil(DUEL_ROUND_S * len(contenders) / (time.perf_counter() - start))))
    best = [float("inf")] * len(contenders)
    host = [float("inf")] * len(contenders)
    for round_ in range(DUEL_ROUNDS):
        for i, fn in enumerate(contenders):
            start = time.perf_counter()
            for _ in range(calls):
                fn(a, b)
            issued = time.perf_counter()
            sync()
            best[i] = min(best[i], (time.perf_counter() - start) / calls)
            host[i] = min(host[i], (issued - start) / calls)
        if round_ == 1 and max(best) >= DUEL_CLEAR * min(best):
            break
    if hosts is not None:
        hosts[:] = host
    if devices is not None and device.type == "cuda":
        try:
            with torch.cuda.device(device):
                devices[:] = device_seconds(contenders, a, b, device, calls, host)
        except Exception as exc:  # (the duel stands on its times in the layer: steps in graphs weigh those)
            log.debug("convtune: the duel's times on the device alone not measured: %s: %s", type(exc).__name__, exc)
            devices[:] = []
    return best


def device_seconds(contenders, a, b, device, calls: int, hosts) -> list[float]:
    """Each contender's time per call on the device alone, as a step replayed from a CUDA graph sees it: ``calls``
    calls issued while the device waits on a spin kernel long enough for the host to issue them all (``hosts``: each
    one's host time per call), timed by CUDA events from the spin's end, so that no call waits on the host; best of
    :data:`DEVICE_ROUNDS`. A contender that waits on the device itself is timed with its waits (never less than its
    device time)."""
    rate = spin_rate(device)
    best = [float("inf")] * len(contenders)
    for _ in range(DEVICE_ROUNDS):
        for i, fn in enumerate(contenders):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(int(rate * (2 * hosts[i] * calls + 1e-4)))
            start.record()
            for _ in range(calls):
                fn(a, b)
            end.record()
            end.synchronize()
            best[i] = min(best[i], start.elapsed_time(end) * 1e-3 / calls)
    return best


_spin_rates: dict = {}


def spin_rate(device) -> float:
    """Cycles per second of ``torch.cuda._sleep``'s spin on ``device`` (measured once: its clock)."""
    rate = _spin_rates.get(device)
    if rate is None:
        cycles, times = 2_000_000, []
        for _ in range(3):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        rate = _spin_rates[device] = cycles / max(min(times[1:]), 1e-6)  # (the first: the kernel's loading)
    return rate
