"""What a training step and a call cost the host, measured for :func:`convtune.torch.tune`'s weighing: whether a model's
steps are host-bound (:func:`step_times`), what a patched layer's call costs beyond the plain module's
(:func:`dispatch_seconds`) and what PyTorch's own convolution call costs (:func:`pytorch_host_seconds`), a plan saving
the host at most that; and what leaves a model as it was after tuning runs it (:func:`left_as_it_was`)."""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time

import torch
from torch import nn

from ..problem import ConvProblem
from ..runtime import Runtime
from ..strategies.pytorch import native_for
from . import functional
from ._autograd import eager_forward
from ._dispatch import Route, all_native, measured_once, route_for, seconds_per_call
from ._duel import duel_operands, per_call_seconds, where_pass_runs
from ._formats import tensor_layout
from .modules import Conv2d, restored_for_a_while

__all__ = ["dispatch_seconds", "step_times", "patched_step_ratios", "pytorch_host_seconds", "rng_kept",
           "left_as_it_was"]


@contextlib.contextmanager
def rng_kept():
    """PyTorch's random number generators (CPU, and CUDA where it is in use) as they were, afterwards: tuning draws
    operands and runs the model, and a user's seeded training must not notice."""
    cpu_rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.random.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


@contextlib.contextmanager
def left_as_it_was(model: nn.Module):
    """The example forward pass that finds a model's convolutions changes nothing the user can see: the buffers
    (BatchNorm's running statistics and its count of batches, spectral norm's vectors, say) and the random number
    generators (dropout, stochastic depth) are as they were before it, even where it fails. (A forward pass writes
    no parameter: copying them all would double a large model's memory.)"""
    saved = [(t, t.detach().clone()) for t in model.buffers() if t.device.type != "meta"]
    try:
        with rng_kept():
            yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


#: Calls per timed round, and rounds (the best counts), in :func:`dispatch_seconds`' measurement.
DISPATCH_CALLS, DISPATCH_ROUNDS = 200, 7
_dispatches: dict = {}


def dispatch_seconds(device) -> float:
    """How much longer a call without gradients takes on the host through a patched layer whose route runs
    PyTorch's convolution than through the plain module (the drop-in's lookup and checks, which every call of a
    patched layer pays, training calls included), measured once per device on a tiny layer; 0 where it cannot be
    measured. A forward plan that gains less than this per call is no reason to keep a layer patched."""
    return measured_once(_dispatches, device, lambda: _measure_dispatch(device), "a patched call's cost")


def _measure_dispatch(device, calls: int = DISPATCH_CALLS, rounds: int = DISPATCH_ROUNDS) -> float:
    plain = nn.Conv2d(4, 4, 3, padding=1).to(device)
    runtime = Runtime(planner_options={"strategies": ["torch"]})  # (a throwaway one: nothing looked up or stored)
    patched = Conv2d(4, 4, 3, padding=1, runtime=runtime).to(device)
    patched.load_state_dict(plain.state_dict())
    x = torch.randn(2, 4, 8, 8, device=device)
    # its route as a layer's that PyTorch's convolution won, for good: every pass PyTorch's call
    w = patched.weight
    all_native(route_for(x.shape, w.shape, (1, 1), (1, 1), (1, 1), 1, functional.resolve_math("auto", x), x.device,
                         runtime, x.dtype, tensor_layout(x, w)))
    with torch.no_grad(), torch.autocast(device.type, enabled=False):
        for _ in range(3):  # warm: the first calls' one-time work (cuDNN's benchmark on CUDA) out of the timing
            patched(x), plain(x)
        best = [float("inf")] * 2
        for _ in range(rounds):  # in turns: what drifts weighs on both alike
            for i, layer in enumerate((plain, patched)):
                best[i] = min(best[i], seconds_per_call(lambda: layer(x), device, calls))
    return max(0.0, best[1] - best[0])


#: Training steps timed, after one untimed, to say whether a model's steps are host-bound (:func:`step_times`).
HOST_STEPS = 3


def host_fingerprint() -> str:
    """The host a training step's host time was measured on: its architecture, CPU model and count (a shared plan
    cache can serve GPUs of one kind on hosts of several)."""
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    return f"{platform.machine()}|{model}|{os.cpu_count()} cpus"


def step_times(model: nn.Module, example_inputs, device, steps: int = HOST_STEPS,
               spared: dict | None = None) -> tuple[float, float]:
    """Medians over ``steps`` training steps of ``model`` on ``example_inputs`` (the forward, then the gradients of
    its parameters from the sum of its outputs, PyTorch's convolution throughout), after one untimed: the host's
    time to issue a step and the step's time, in seconds (the device synchronised before each step and after it).
    The model is left as it was: no gradient is accumulated, its buffers and the random number generators are
    restored. A model wrapped in ``DistributedDataParallel`` (or ``DataParallel``) is timed without the wrapper. Raises
    ``ValueError`` where the outputs need no gradient.

    ``spared``: patched layers' calls (route keys, :attr:`~convtune.torch.tuning.Problem.route_key`, each with its
    forward problem) whose convolutions run on cuDNN's heuristic pick (``cudnn.benchmark`` off, in the forward and the
    gradients) rather than PyTorch's algorithm search: layers where the search costs seconds and buys little
    (:func:`~convtune.torch._duel.floor_spares_search`), which a plan will run. The untimed first step would search
    them (on SLaK-T under AMP on an H200, 51 of the 59 s its search took over all its problems)."""
    step = _training_step(model, example_inputs)
    hosts, walls = [], []
    records: list = []
    functional._collect.records = records  # (PyTorch's convolution in every layer, patched or not)
    functional._collect.spare = _heuristic_calls(spared) if spared else None
    try:
        with torch.enable_grad(), left_as_it_was(_unwrapped(model)):
            for i in range(1 + steps):
                host, wall = _timed(step, device)
                records.clear()
                if i:
                    hosts.append(host)
                    walls.append(wall)
    finally:
        functional._collect.records = functional._collect.spare = None
    return statistics.median_low(hosts), statistics.median_low(walls)


def _heuristic_calls(spared: dict):
    """What :func:`step_times` runs a recorded call of a patched layer with (``functional._collect.spare``): the
    convolution on cuDNN's heuristic pick where the call's route key is in ``spared`` (a route of PyTorch's own passes,
    ``cudnn.benchmark`` off: both gradients in one call, as PyTorch's autograd computes them), else nothing (``None``)."""
    routes: dict = {}

    def spare(owner, x, weight, bias, geom, groups, math):
        runtime = getattr(owner, "convtune_runtime", False)
        if runtime is False:
            return None  # (a functional call, not a patched layer's)
        key = functional.route_key(x, weight, geom, groups, math, runtime)
        problem = spared.get(key)
        if problem is None:
            return None
        route = routes.get(key)
        if route is None:
            route = routes[key] = all_native(Route(problem, None, x.device), benchmark=False,
                                             tf32=problem.math == "tf32")
        return eager_forward(x, weight, bias, route)
    return spare


def _unwrapped(model: nn.Module) -> nn.Module:
    """``model`` less a ``DistributedDataParallel`` (or ``DataParallel``) wrapper: gradients taken outside a backward
    would leave DDP's reducer waiting for them."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


def _training_step(model: nn.Module, example_inputs):
    """One training step of ``model`` on ``example_inputs`` as a function: the forward, then the gradients of its
    parameters from the sum of its outputs (taken, not accumulated). Raises ``ValueError`` where they need none."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    model = _unwrapped(model)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model's outputs need no gradient: none of its parameters needs one")

    def step() -> None:
        loss = _summed(model(*inputs))
        if loss is None:
            raise ValueError("the model's outputs need no gradient")
        torch.autograd.grad(loss, params, allow_unused=True)
    return step


def _timed(step, device) -> tuple[float, float]:
    """The host's time to issue ``step()`` and its whole time (the device synchronised before and after), seconds."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    start = time.perf_counter()
    step()
    issued = time.perf_counter()
    sync()
    return issued - start, time.perf_counter() - start


#: The whole-step check of the layers left patched (:func:`patched_step_ratios`): rounds, untimed steps per turn
#: (a by-address launch captures its graph at the second call with the same operands: the turn's timed steps run as
#: training's steady steps do) and timed steps per turn (the fastest counts).
CHECK_ROUNDS, CHECK_UNTIMED, CHECK_TIMED = 5, 2, 2
#: The check ends after two rounds that both found the patched step this many times faster or slower: no noise reverses
#: a gap that wide, and the rounds of a long step cost most.
CHECK_CLEAR = 1.5


def patched_step_ratios(model: nn.Module, example_inputs, device, patched, rounds: int = CHECK_ROUNDS,
                        timed=None) -> list[float]:
    """Training steps of ``model`` as it stands (the convtune modules ``patched`` running their routes) against the
    same steps with those modules given back to PyTorch, in turns, their order alternating round by round: each
    round's fastest patched step over its fastest handed-back one (two rounds only, where both are clear by
    :data:`CHECK_CLEAR`). The model is left as it was (no gradient
    accumulated, its buffers and the random number generators restored, the modules patched). ``timed(step, device)``
    (tests) replaces :func:`_timed`. Raises ``ValueError`` where the outputs need no gradient."""
    timed = timed or _timed
    step = _training_step(model, example_inputs)
    ratios = []
    with torch.enable_grad(), left_as_it_was(_unwrapped(model)):
        for r in range(rounds):
            best = {}
            for handed_back in ((False, True) if r % 2 == 0 else (True, False)):
                with restored_for_a_while(patched) if handed_back else contextlib.nullcontext():
                    for _ in range(CHECK_UNTIMED):
                        timed(step, device)
                    best[handed_back] = min(timed(step, device)[1] for _ in range(CHECK_TIMED))
            ratios.append(best[False] / best[True] if best[True] > 0 else 1.0)
            if r == 1 and (max(ratios) * CHECK_CLEAR <= 1.0 or min(ratios) >= CHECK_CLEAR):
                break
    return ratios


def _summed(out):
    """The sum of every floating-point tensor in ``out`` (tensors, and tuples, lists and dicts of them) that needs a
    gradient, as one float32 scalar; ``None`` where none does."""
    if isinstance(out, torch.Tensor):
        return out.float().sum() if out.requires_grad and out.is_floating_point() else None
    parts = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else ()
    total = None
    for part in parts:
        s = _summed(part)
        if s is not None:
            total = s if total is None else total + s
    return total


def pytorch_host_seconds(problem: ConvProblem, device) -> float:
    """The host's time per call of PyTorch's convolution for ``problem``'s pass (cuDNN's benchmark on, as a duel runs
    it), on random operands of the pass: what a plan of that pass can save the host at most."""
    fn = native_for(problem, benchmark=True, tf32=problem.math == "tf32")
    a, b = duel_operands(problem, device)
    hosts: list = []

    def measure():
        with torch.no_grad(), torch.autocast(device.type, enabled=False):
            per_call_seconds([lambda x, y: fn(x, y, None)], a, b, device, hosts=hosts)
    where_pass_runs(problem.pass_, measure, device)  # (on the thread that runs the pass, as a duel)
    return hosts[0]
