"""Tune ahead: a model's convolution problems, collected from one forward pass and tuned before training.

:func:`collect` runs the model once on example inputs (gradients on, as in training, so that it
knows which gradients each layer needs: the first layer's input needs none) with every
convolution computed by PyTorch, and records what convtune would dispatch: the patched modules
through their own code path, plain ``nn.Conv1d``/``nn.Conv2d``/``nn.Conv3d`` modules through a forward hook
that goes the same way. :func:`tune` then looks every problem up in the runtime's plan cache and
tunes what is missing, with progress, so that the first training step finds only cache hits. It
then makes the routes of the patched layers (in the runtime each was patched with) and resolves
each pass: the plans are built, and on CUDA each plan of another strategy runs its duel against
PyTorch's convolution (or finds its stored verdict), so that the first step does none of that either.
Last, a patched layer whose every call of the example run settled on PyTorch's own convolution (every pass
it needs, its calls without gradients too, under the cuDNN flags in force) is handed back to PyTorch: its
module gets its own class back (:func:`~convtune.torch.unpatch` of that one module), so its calls pay no
drop-in at all, not even the lookup (on ResNet-50 under AMP, where PyTorch's convolution wins every pass,
that lookup was the whole difference between the two). So is a layer whose training calls settled on PyTorch's
convolution while its forward's plan kept the calls without gradients, where that plan gains less per call than
a patched layer's call costs the host (:func:`dispatch_seconds`): every call pays that, training calls included.
``hand_back=False`` keeps them patched: a layer handed back runs PyTorch's convolution for shapes the example run did
not show as well.

On CUDA, before that, :func:`tune` times a few training steps of the model on the example (forward and gradients,
PyTorch's convolution throughout) to learn whether its steps are *host-bound*: the host's time to issue a step at least
:data:`~convtune.timing.HOST_BOUND` of the step's time, the device waiting on the host (small and mid-sized models
under AMP, on a fast GPU). There a plan's faster device work shortens no step, and the host's time is all that counts:
each route weighs what its plans' duels gained in host time alone (:meth:`~convtune.torch._dispatch.Route.weigh_host`),
and so does the hand-back. ``host_bound=False`` weighs device and host together as each duel measured them (the steps
run in CUDA graphs, ``torch.compile(mode="reduce-overhead")``, where the host is out of the step); ``True`` takes the
steps as host-bound without timing them.

Under ``torch.distributed`` the ranks split the work: each starts ``rank/world`` of the way into the
list and takes a lease in the plan cache on each problem it tunes (:mod:`convtune.worklist`), so a
problem another rank holds is left to it and its plan read from the cache at the end. With one
cache file (or PostgreSQL database) that every rank reaches, N ranks tune about N times faster.

Examples
--------
>>> import torch, convtune, convtune.torch as ct
>>> model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Conv2d(4, 4, 3))
>>> report = ct.tune(model, torch.randn(2, 3, 12, 12), runtime=convtune.Runtime(miss_policy="heuristic"), progress=False)
>>> [(p.pass_, names) for p, names in report.problems][:3]
[('fwd', ['0']), ('wgrad', ['0']), ('fwd', ['1'])]
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..problem import PASSES, ConvProblem
from ..runtime import Runtime, _Held, default_runtime
from ..timing import HOST_BOUND
from ..worklist import rotated
from . import _dispatch, functional
from ._bridge import bridge
from ._dispatch import all_native, layer_problem, measured_once, route_for, seconds_per_call
from ._executors import Native
from ._formats import tensor_layout
from .modules import _CONVS, Conv2d, _Convtune, restore

log = logging.getLogger("convtune")

__all__ = ["collect", "tune", "TuneReport", "Problem"]


@dataclass(frozen=True)
class Problem:
    """One convolution call of a model: the layer's forward problem, where it runs, which passes it needs."""

    problem: ConvProblem
    device: torch.device
    passes: tuple[str, ...]
    name: str
    keep_spectra: bool | str = False  # the module's keep_spectra (patched modules; False for plain ones)
    route_key: tuple | None = None  # patched modules: their route's arguments (see :func:`route_for`), runtime last


def _qualified_names(model: nn.Module) -> dict[int, str]:
    return {id(m): name for name, m in model.named_modules()}


@contextlib.contextmanager
def _rng_kept():
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
def _left_as_it_was(model: nn.Module):
    """The example forward pass that finds a model's convolutions changes nothing the user can see: the buffers
    (BatchNorm's running statistics and its count of batches, spectral norm's vectors, say) and the random number
    generators (dropout, stochastic depth) are as they were before it, even where it fails. (A forward pass writes
    no parameter: copying them all would double a large model's memory.)"""
    saved = [(t, t.detach().clone()) for t in model.buffers() if t.device.type != "meta"]
    try:
        with _rng_kept():
            yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)


def collect(model: nn.Module, example_inputs, math: str = "auto", device_check: bool = True) -> list[Problem]:
    """Every convolution call of one forward pass of ``model`` on ``example_inputs`` (a tensor or a
    tuple of positional arguments), as convtune would dispatch it, in call order; calls PyTorch
    would run anyway are left out (``device_check=False``: whatever the device, e.g. ``meta``)."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    names = _qualified_names(model)
    records: list = []
    hooks = []

    def plain_hook(module, args):
        # a plain convolution module: record what its patched form would dispatch
        geom = functional.geometry(len(module.kernel_size), module.kernel_size, module.stride, module.padding,
                                   module.dilation, module.padding_mode)
        x = args[0]
        if x.dim() == geom.rank + 1:
            x = x.unsqueeze(0)
        if geom.pre_pad is not None:
            x = torch.nn.functional.pad(x, geom.pre_pad,
                                        mode="constant" if geom.pad_mode == "zeros" else geom.pad_mode)
        x, weight, _ = functional.autocast(x, module.weight, None)  # what autocast hands the convolution
        records.append((module, x, weight, geom, module.groups, functional.resolve_math(math, x)))

    for module in model.modules():
        if isinstance(module, _CONVS) and not isinstance(module, _Convtune):
            hooks.append(module.register_forward_pre_hook(plain_hook))
    functional._collect.records = records
    try:
        with torch.enable_grad(), _left_as_it_was(model):
            model(*inputs)
    finally:
        functional._collect.records = None
        for hook in hooks:
            hook.remove()
    found = []
    for owner, x, weight, geom, groups, math_mode in records:
        if functional._unsupported(x, weight, None, geom.rank, False, device_check) is not None:
            continue  # PyTorch runs it: nothing to tune
        try:
            problem = layer_problem(tuple(x.shape), tuple(weight.shape), geom.stride, geom.padding, geom.dilation,
                                    groups, math_mode, x.dtype, tensor_layout(x, weight))
        except ValueError:
            continue
        passes = ("fwd",) + (("dgrad",) if x.requires_grad else ()) + (("wgrad",) if weight.requires_grad else ())
        route_key = (tuple(x.shape), tuple(weight.shape), geom.stride, geom.padding, geom.dilation, groups, math_mode,
                     x.device, x.dtype, tensor_layout(x, weight), owner.convtune_runtime) \
            if isinstance(owner, _Convtune) else None
        found.append(Problem(problem, x.device, passes, names.get(id(owner), "?"),
                             getattr(owner, "convtune_keep_spectra", False), route_key))
    return found


@dataclass
class TuneReport:
    """What :func:`tune` did: every problem with the layers that share it, and how each was found."""

    problems: list[tuple[ConvProblem, list[str]]] = field(default_factory=list)
    tuned: int = 0
    cached: int = 0
    failed: list[tuple[ConvProblem, str]] = field(default_factory=list)
    seconds: float = 0.0
    elsewhere: int = 0  # tuned meanwhile by another process on the cache (another rank)
    trips: list[tuple[ConvProblem, str]] = field(default_factory=list)  # layers with kept spectra: each verdict
    routes: int = 0  # patched layers' routes made and resolved ahead (plans built, duels run)
    handed_back: list[str] = field(default_factory=list)  # patched layers unpatched: PyTorch's convolution throughout
    #: whether the model's training steps are host-bound (see the module docstring; None: not asked, off CUDA), and
    #: the medians that said so (seconds: the host's time to issue a step, and the step's), where timed
    host_bound: bool | None = None
    step_host_s: float | None = None
    step_s: float | None = None

    def __str__(self):
        others = f"{self.elsewhere} by other processes, " if self.elsewhere else ""
        trips = f", {len(self.trips)} round-trip verdicts" if self.trips else ""
        routes = f", {self.routes} layer routes resolved" if self.routes else ""
        back = f", {len(self.handed_back)} layers handed back to PyTorch" if self.handed_back else ""
        bound = ""
        if self.host_bound is not None:
            timed = (f" (host {self.step_host_s * 1e3:.1f} ms of a {self.step_s * 1e3:.1f} ms step)"
                     if self.step_s else "")
            bound = f", steps {'host-bound' if self.host_bound else 'not host-bound'}{timed}"
        text = (f"{len(self.problems)} problems: {self.tuned} tuned, {self.cached} from the plan cache, {others}"
                f"{len(self.failed)} failed{trips}{routes}{back}{bound}, in {self.seconds:.1f} s")
        return text + "".join(f"\n  FAILED {p.describe()}: {reason}" for p, reason in self.failed)


class _Progress:
    """Progress on stderr: a bar that redraws on a terminal, a line per tenth elsewhere."""

    def __init__(self, total: int, stream=None):
        self.total, self.stream = total, stream or sys.stderr
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.shown = -1

    def __call__(self, done: int, label: str) -> None:
        if self.tty:
            filled = int(30 * done / max(self.total, 1))
            self.stream.write(f"\rconvtune: tuning [{'#' * filled}{'.' * (30 - filled)}] {done}/{self.total} "
                              f"{label[:60]:60s}")
            if done == self.total:
                self.stream.write("\n")
        else:
            tenth = 10 * done // max(self.total, 1)
            if tenth > self.shown or done == self.total:
                self.shown = tenth
                self.stream.write(f"convtune: tuning {done}/{self.total} {label}\n")
        self.stream.flush()


def _distributed() -> tuple[int, int]:
    """This process's rank and the world size under ``torch.distributed`` (``(0, 1)`` outside it)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _route(key: tuple):
    """The route a patched layer's calls of ``key`` (:attr:`Problem.route_key`) find: in its runtime."""
    return route_for(*key[:8], key[10] or default_runtime(), *key[8:10])


def _pytorch_throughout(route, passes: tuple[str, ...], keep) -> bool:
    """Does a patched layer's call needing ``passes`` run PyTorch's own convolution, as the plain module would,
    in every form (in training, as its autograd runs it; without gradients), or gain less without gradients than a
    patched layer's call costs the host (:func:`dispatch_seconds`)? Its route's passes resolved."""
    if route.device.type == "cuda" and not functional.cudnn_flags_as_measured(route.problem.math):
        return False  # the patched layer runs PyTorch's convolution with the flags its verdicts were measured with
    need_dx, need_dw = "dgrad" in passes, "wgrad" in passes
    if need_dx or need_dw:
        if keep and need_dx and need_dw and route.trips.get(keep) is not None:
            return False  # a round trip with kept spectra runs the layer
        if not route.native_for_grads(need_dx, need_dw):  # (settled first: it may keep a plan for inference)
            return False
        if route.host_bound:  # every call of a patched layer costs the host, in host-bound training steps too: a
            return True  # forward plan kept for calls without gradients is no reason to stay patched there
    infer = route.fwd_infer or route.fwd_exec  # what a call without gradients runs
    if isinstance(infer, Native):
        return infer.retry_at is None  # (Fallback is a Native)
    # a forward plan that won its duel by less than what the patched layer costs every call, training calls included,
    # gains nothing even where no gradients are taken (in a host-bound step: by less host time)
    duel = getattr(infer, "duel", None)
    return duel is not None and duel.gain(route.host_bound) <= dispatch_seconds(route.device)


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


def step_times(model: nn.Module, example_inputs, device, steps: int = HOST_STEPS) -> tuple[float, float]:
    """Medians over ``steps`` training steps of ``model`` on ``example_inputs`` (the forward, then the gradients of
    its parameters from the sum of its outputs, PyTorch's convolution throughout), after one untimed: the host's
    time to issue a step and the step's time, in seconds (the device synchronised before each step and after it).
    The model is left as it was: no gradient is accumulated, its buffers and the random number generators are
    restored. A model wrapped in ``DistributedDataParallel`` (or ``DataParallel``) is timed without the wrapper. Raises
    ``ValueError`` where the outputs need no gradient."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        model = model.module  # (gradients taken outside a backward would leave DDP's reducer waiting for them)
    params = [p for p in model.parameters() if p.requires_grad]
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    hosts, walls = [], []
    records: list = []
    functional._collect.records = records  # (PyTorch's convolution in every layer, patched or not)
    try:
        with torch.enable_grad(), _left_as_it_was(model):
            for i in range(1 + steps):
                sync()
                start = time.perf_counter()
                loss = _summed(model(*inputs))
                if loss is None or not params:
                    raise ValueError("the model's outputs need no gradient")
                grads = torch.autograd.grad(loss, params, allow_unused=True)
                issued = time.perf_counter()
                sync()
                done = time.perf_counter()
                records.clear()
                del loss, grads
                if i:
                    hosts.append(issued - start)
                    walls.append(done - start)
    finally:
        functional._collect.records = None
    hosts.sort()
    walls.sort()
    return hosts[len(hosts) // 2], walls[len(walls) // 2]


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


def _weigh_host(report: TuneReport, model, example_inputs, device, host_bound: bool | None) -> bool:
    """Whether the model's training steps are host-bound: ``host_bound`` where given, else timed
    (:func:`step_times`); recorded in ``report``. Not where the steps cannot be timed (said at debug level)."""
    if host_bound is None:
        try:
            report.step_host_s, report.step_s = step_times(model, example_inputs, device)
        except Exception as exc:
            log.debug("convtune.torch.tune: training steps not timed (%s: %s); weighing device and host together",
                      type(exc).__name__, exc)
            report.host_bound = False
            return False
        host_bound = report.step_host_s >= HOST_BOUND * report.step_s
    report.host_bound = bool(host_bound)
    return report.host_bound


def tune(model: nn.Module, example_inputs, passes=PASSES, *, math: str = "auto", runtime: Runtime | None = None,
         progress: bool | Callable[[int, int, str], None] = True, hand_back: bool = True,
         host_bound: bool | None = None) -> TuneReport:
    """Tune every convolution problem of ``model`` (see :func:`collect`) that the plan cache lacks.

    Parameters
    ----------
    model : nn.Module
        Patched or not: plain ``nn.Conv1d``/``nn.Conv2d``/``nn.Conv3d`` modules are tuned as :func:`patch` would run them.
    example_inputs : Tensor or tuple
        Inputs of the shape training uses (plans are per shape, batch size included).
    passes : sequence of 'fwd', 'dgrad', 'wgrad'
        Passes to tune, where a layer needs them (no input gradient for a layer whose input needs none).
    math : {'auto', 'fp32', 'tf32'}
        For plain modules; patched ones use their own setting.
    runtime : Runtime, optional
        Defaults to :func:`convtune.default_runtime` (the persistent plan cache).
    progress : bool or callable
        ``True``: a progress bar on stderr; a callable gets ``(done, total, label)``.
    hand_back : bool
        Unpatch the patched layers whose every call runs PyTorch's own convolution (see the module
        docstring): :attr:`TuneReport.handed_back`.
    host_bound : bool, optional
        Whether the training steps are host-bound, where a plan's gains count in host time alone (see the module
        docstring). ``None`` (the default) times a few training steps on CUDA to find out; pass ``False`` where the
        steps will run in CUDA graphs (``torch.compile(mode="reduce-overhead")``, a captured step).

    Patched layers with ``keep_spectra`` get their round-trip verdicts too (after the per-pass plans they
    are measured against), where all three passes are tuned: :attr:`TuneReport.trips`.

    The model is left as it was found: tuning runs it once on the example, but its buffers (BatchNorm's running
    statistics, say) and PyTorch's random number generators are restored afterwards.
    """
    with _rng_kept():
        return _tune(model, example_inputs, passes, math=math, runtime=runtime, progress=progress,
                     hand_back=hand_back, host_bound=host_bound)


def _tune(model, example_inputs, passes, *, math, runtime, progress, hand_back, host_bound) -> TuneReport:
    started = time.perf_counter()
    rt = runtime or default_runtime()
    wanted = tuple(p for p in PASSES if p in set(passes))
    unknown = set(passes) - set(PASSES)
    if unknown:
        raise ValueError(f"unknown pass(es) {', '.join(sorted(unknown))}; acceptable: {', '.join(PASSES)}")
    # the problems, each once (several layers share shapes), on the device they run on
    distinct: dict[tuple, tuple[ConvProblem, torch.device, list[str]]] = {}
    #: layers with kept spectra: their round trips (and whether only where a pass transforms: all 'auto')
    kept: dict[tuple, tuple[ConvProblem, torch.device, str, bool]] = {}
    routes: dict[tuple, tuple[tuple[str, ...], str, object]] = {}  # patched layers: passes, name, keep_spectra
    layer_calls: dict[str, list] = {}  # a patched layer's name -> its calls: (route key, passes, keep_spectra)
    for item in collect(model, example_inputs, math):
        if item.route_key is not None:
            layer_calls.setdefault(item.name, []).append((item.route_key, item.passes, item.keep_spectra))
            needed = tuple(p for p in item.passes if p in wanted)
            known, _, keep = routes.get(item.route_key, ((), item.name, False))
            keep = keep or (item.keep_spectra if len(item.passes) == 3 else False)
            routes[item.route_key] = (tuple(p for p in PASSES if p in needed or p in known), item.name, keep)
        if item.keep_spectra and len(item.passes) == 3 and set(wanted) == set(PASSES):
            key = (item.problem.key(), str(item.device))
            auto = item.keep_spectra == "auto" and kept.get(key, (None, None, None, True))[3]
            kept[key] = (item.problem, item.device, kept[key][2] if key in kept else item.name, auto)
        for pass_ in item.passes:
            if pass_ in wanted:
                p = item.problem.for_pass(pass_)
                distinct.setdefault((p.key(), str(item.device)), (p, item.device, []))[2].append(item.name)
    report = TuneReport(problems=[(p, names) for p, _d, names in distinct.values()])
    rank, world = _distributed()
    items = rotated(list(distinct.values()), rank, world)
    show = _Progress(len(items)) if progress is True else progress or None

    def shown(done, label):
        if show is not None:
            show(done, label) if isinstance(show, _Progress) else show(done, len(items), label)

    def settle(problem, device, wait):
        try:
            br = bridge(device.type)
            before = rt.tuned
            with rt._lock:
                decision = br.call(device.index, rt.decision_for, problem, br.backend, True, wait)
            if isinstance(decision, _Held):
                return False
            if decision is None:
                report.failed.append((problem, f"not in the plan cache, and the runtime's miss policy is "
                                               f"{rt.miss_policy!r}, not 'tune'"))
            elif rt.tuned > before:
                report.tuned += 1
            elif wait:
                report.elsewhere += 1
            else:
                report.cached += 1
        except Exception as exc:  # recorded; those layers fall back to PyTorch when they run
            report.failed.append((problem, f"{type(exc).__name__}: {exc}"))
            log.warning("convtune.torch.tune: %s: %s", problem.describe(), exc)
        return True

    held = []
    for done, (problem, device, names) in enumerate(items):
        shown(done, f"{names[0]} {problem.pass_}")
        if not settle(problem, device, wait=False):
            held.append((problem, device))  # another rank is tuning it: its plan is read at the end
    if held:
        log.info("convtune.torch.tune: waiting for %d problem(s) other processes are tuning", len(held))
    for problem, device in held:
        settle(problem, device, wait=True)
    for problem, device, name, auto in kept.values():  # (after the per-pass plans: each verdict is weighed on them)
        shown(len(items), f"{name} round trip")
        try:
            br = bridge(device.type)
            with rt._lock:
                decision = br.call(device.index, rt.round_trip_for, problem, br.backend, False, auto)
            report.trips.append((problem, decision.describe() if decision is not None else
                                 f"no verdict: the runtime's miss policy is {rt.miss_policy!r}, not 'tune'"))
        except Exception as exc:  # recorded; the layer runs its per-pass plans
            report.trips.append((problem, f"failed: {type(exc).__name__}: {exc}"))
            log.warning("convtune.torch.tune: the round trip of %s: %s", problem.describe(), exc)
    for key, (route_passes, name, keep) in routes.items():  # the first step's one-time work, done here
        shown(len(items), f"{name} route")
        route = _route(key)  # the route the layer's calls will find: in the runtime it was patched with
        for pass_ in route_passes:
            if getattr(route, f"{pass_}_exec") is None:
                route.resolve(pass_)  # (never raises: what cannot run falls back, said once)
        if keep and len(route_passes) == len(PASSES):
            route.trips.resolve(keep)  # its round trip built (or None: the per-pass plans, the reason said once)
        report.routes += 1
    # where plans duel PyTorch's convolution (CUDA): are the steps host-bound? (after the duels, so the timed steps find
    # PyTorch's own choices made; before any weighing)
    duelled = [key for key in routes if key[7].type in _dispatch.DUEL_DEVICE_TYPES]  # (a route key's 8th: the device)
    if duelled:
        shown(len(items), "timing training steps")
        weigh = _weigh_host(report, model, example_inputs, duelled[0][7], host_bound)
        for key in duelled:
            _route(key).weigh_host(weigh)
    if hand_back:
        _hand_back(model, layer_calls, wanted, report)
    shown(len(items), "done")
    if torch.cuda.is_available() and any(d.type == "cuda" for _p, d, _n in distinct.values()):
        torch.cuda.empty_cache()  # what tuning held goes back to the device before training starts
    report.seconds = time.perf_counter() - started
    log.info("convtune.torch.tune: %s", report)
    return report


def _hand_back(model: nn.Module, layer_calls: dict, wanted: tuple[str, ...], report: TuneReport) -> None:
    """Unpatch the patched layers whose every call runs PyTorch's convolution throughout (its passes all
    tuned here); their names go to ``report.handed_back``."""
    modules = dict(model.named_modules())
    for name, calls in layer_calls.items():
        module = modules.get(name)
        if not isinstance(module, _Convtune):
            continue
        try:
            throughout = all(set(passes) <= set(wanted) and _pytorch_throughout(_route(key), passes, keep)
                             for key, passes, keep in calls)
        except Exception as exc:  # (settling measures the autograd detour) the layer stays patched
            log.debug("convtune.torch.tune: %s stays patched: %s", name or "the model", exc)
            continue
        if throughout:
            restore(module)
            report.handed_back.append(name)
    if report.handed_back:
        log.info("convtune.torch.tune: %d patched layer(s) handed back to PyTorch (its own convolution won "
                 "every pass they run, or their plans gain less than a patched call costs): %s",
                 len(report.handed_back), ", ".join(n or "the model" for n in report.handed_back))
