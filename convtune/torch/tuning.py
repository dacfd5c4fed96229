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
convolution while its forward's plan kept the calls without gradients, where that plan gains less per call than a
patched layer's call costs the host (:func:`~convtune.torch._host.dispatch_seconds`): every call pays that, training
calls included. ``hand_back=False`` keeps them patched: a layer handed back runs PyTorch's convolution for shapes the
example run did not show as well.

On CUDA, before anything is searched, :func:`tune` times a few training steps of the model on the example (forward
and gradients, PyTorch's convolution throughout) to learn whether its steps are *host-bound*: the host's time to issue
a step at least :data:`~convtune.timing.HOST_BOUND` of the step's time, the device waiting on the host (small and
mid-sized models under AMP, on a fast GPU). There a plan's faster device work shortens no step, and the host's time is
all that counts: each route weighs what its plans' duels gained in host time alone
(:meth:`~convtune.torch._dispatch.Route.weigh_host`), and so does the hand-back. A plan can save the host at most what
PyTorch's own call costs it, so a patched layer whose training calls cost PyTorch's convolution less host time than
convtune's autograd detour is not searched at all (:func:`~convtune.torch._handback.cannot_gain`: one short measurement
per layer shape) and goes back to PyTorch: :attr:`TuneReport.not_searched`. ``host_bound=False`` weighs device and host
together as each duel measured them, without timing the steps; ``True`` takes the steps as host-bound without timing
them. ``graphed=True`` says the steps will run as CUDA graphs (a captured step,
``torch.compile(mode="reduce-overhead")``), where the host is out of the step: each duel is then decided by the two
contenders' time on the device alone (a spin kernel holds the device while the host issues the calls, so none waits on
the host) and no autograd detour is weighed, so a layer whose plans do less device work stays patched however much
host time its calls take. Where the host's time is half the step or more (host-bound steps included), the layers still
patched after the hand-back are then checked on the whole step (:func:`~convtune.torch._handback.check_steps`): a few
training steps with them patched and with them handed back, in turns, and they all go back to PyTorch unless the
patched step is the faster by 2% (and in all rounds but one): what a layer's duels measured on the layer alone does not
always add up to the step (``TuneReport.step_ratio``).

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

import hashlib
import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..building import compile_ahead
from ..compiling import CompileAhead
from ..planner import Planner
from ..problem import PASSES, ConvProblem
from ..runtime import Runtime, _Held, default_runtime
from ..strategies.pytorch import native_for
from ..text import time_went
from ..worklist import rotated
from . import _dispatch, _handback, functional
from ._bridge import bridge
from ._dispatch import layer_problem
from ._duel import floor_spares_search
from ._formats import tensor_layout
from ._host import left_as_it_was, rng_kept
from .modules import _CONVS, _Convtune

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
    functional._collect.spare = _heuristic_forward
    try:
        with torch.enable_grad(), left_as_it_was(model):
            model(*inputs)
    finally:
        functional._collect.records = functional._collect.spare = None
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
        key = functional.route_key(x, weight, geom, groups, math_mode, owner.convtune_runtime) \
            if isinstance(owner, _Convtune) else None
        found.append(Problem(problem, x.device, passes, names.get(id(owner), "?"),
                             getattr(owner, "convtune_keep_spectra", False), key))
    return found


def _heuristic_forward(owner, x, weight, bias, geom, groups, math_mode):
    """A patched layer's forward call while :func:`collect` runs the model, where PyTorch's algorithm search would
    cost much and buy little (:func:`~convtune.torch._duel.floor_spares_search`): on cuDNN's heuristic pick (1.4 s of
    search spared on SLaK-T's 51x51 layer under AMP on an H200); else ``None`` (PyTorch's own call)."""
    if not isinstance(owner, _Convtune):
        return None
    try:
        problem = layer_problem(tuple(x.shape), tuple(weight.shape), geom.stride, geom.padding, geom.dilation, groups,
                                math_mode, x.dtype, tensor_layout(x, weight))
    except ValueError:
        return None
    if not floor_spares_search(problem):
        return None
    return native_for(problem, benchmark=False, tf32=problem.math == "tf32")(x, weight, bias)


#: The parts of a tune-ahead, as :attr:`TuneReport.phases` names them: the model run once to find its problems,
#: PyTorch's training steps timed (are they host-bound? their first step runs PyTorch's own algorithm search where
#: ``cudnn.benchmark`` is on), which layers no plan could gain (host-bound steps), the plans (searched or read from the
#: cache), the round trips of layers with kept spectra, the layers' routes (plans built, duels run) and the hand-back
#: (with the whole-step check where it runs).
PHASES = ("problems", "PyTorch's steps", "layers no plan could gain", "plans", "round trips", "routes", "hand-back")


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
    #: whether the plans were weighed for training steps replayed from CUDA graphs (``tune(graphed=True)``)
    graphed: bool = False
    step_host_s: float | None = None
    step_s: float | None = None
    #: patched layers whose problems were not searched: in host-bound steps no plan would keep them (handed back)
    not_searched: list[str] = field(default_factory=list)
    #: where the host's work shows, the whole step's time with the layers left patched over its time with them handed
    #: back (see :func:`~convtune.torch._handback.check_steps`; None: not checked), and the layers that check handed
    #: back (in ``handed_back`` too)
    step_ratio: float | None = None
    step_handed_back: list[str] = field(default_factory=list)
    #: where the time went: seconds per part, in the order they ran (:data:`PHASES`)
    phases: dict[str, float] = field(default_factory=dict)
    #: whether the steps' figures came from the plan cache (an earlier tune-ahead of the model timed them)
    steps_stored: bool = False
    #: patched layer calls (distinct shapes) that those steps ran on cuDNN's heuristic pick, not searched: where the
    #: search costs much and buys little (see :func:`~convtune.torch._host.step_times`)
    steps_spared: int = 0

    def __str__(self):
        others = f"{self.elsewhere} by other processes, " if self.elsewhere else ""
        trips = f", {len(self.trips)} round-trip verdicts" if self.trips else ""
        routes = f", {self.routes} layer routes resolved" if self.routes else ""
        back = f", {len(self.handed_back)} layers handed back to PyTorch" if self.handed_back else ""
        bound = ""
        if self.host_bound is not None:
            spared = (f", {self.steps_spared} layer shape{'s' if self.steps_spared != 1 else ''} on cuDNN's heuristic "
                      "pick" if self.steps_spared else "")
            timed = (f" (host {self.step_host_s * 1e3:.1f} ms of a {self.step_s * 1e3:.1f} ms step{spared}"
                     f"{', as stored' if self.steps_stored else ''})" if self.step_s else "")
            kind = "in CUDA graphs" if self.graphed else "host-bound" if self.host_bound else "not host-bound"
            bound = f", steps {kind}{timed}"
        if self.not_searched:
            bound += f", {len(self.not_searched)} layers not searched (no plan could gain their host time)"
        if self.step_ratio is not None:
            bound += (f", the whole step {self.step_ratio:.2f}x with the layers left patched against them handed back"
                      + (f" ({len(self.step_handed_back)} handed back then)" if self.step_handed_back else ""))
        went = time_went(self.phases)
        text = (f"{len(self.problems)} problems: {self.tuned} tuned, {self.cached} from the plan cache, {others}"
                f"{len(self.failed)} failed{trips}{routes}{back}{bound}, in {self.seconds:.1f} s"
                + (f" ({went})" if went else ""))
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


#: What a tune-ahead says before it times PyTorch's own training steps, which can take a minute.
STEPS_NOTE = "PyTorch's training steps, timed first (the first runs PyTorch's algorithm search)"


def _announce(progress, total: int) -> None:
    """Say that PyTorch's steps are being timed: a line on stderr for the default progress, ``progress(0, total,
    STEPS_NOTE)`` for a callable."""
    if progress is True:
        sys.stderr.write(f"convtune: {STEPS_NOTE}\n")
        sys.stderr.flush()
    elif progress:
        progress(0, total, STEPS_NOTE)


def _distributed() -> tuple[int, int]:
    """This process's rank and the world size under ``torch.distributed`` (``(0, 1)`` outside it)."""
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def tune(model: nn.Module, example_inputs, passes=PASSES, *, math: str = "auto", runtime: Runtime | None = None,
         progress: bool | Callable[[int, int, str], None] = True, hand_back: bool = True,
         host_bound: bool | None = None, graphed: bool = False) -> TuneReport:
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
        Unpatch the patched layers whose every call runs PyTorch's own convolution, and, where the host's time is
        half the training step or more, those left patched when the whole step is no faster with them (see the module
        docstring): :attr:`TuneReport.handed_back`.
    host_bound : bool, optional
        Whether the training steps are host-bound, where a plan's gains count in host time alone (see the module
        docstring). ``None`` (the default) times a few training steps on CUDA to find out; ``False`` weighs device
        and host together without timing them.
    graphed : bool
        The training steps will run as CUDA graphs (a captured step, ``torch.compile(mode="reduce-overhead")``): the
        host's work is out of them, so each plan's duel with PyTorch's convolution is decided by their time on the
        device alone and no autograd detour is weighed (see the module docstring). Implies ``host_bound=False``.

    Patched layers with ``keep_spectra`` get their round-trip verdicts too (after the per-pass plans they
    are measured against), where all three passes are tuned: :attr:`TuneReport.trips`.

    The model is left as it was found: tuning runs it once on the example, but its buffers (BatchNorm's running
    statistics, say) and PyTorch's random number generators are restored afterwards.
    """
    with rng_kept():
        return _tune(model, example_inputs, passes, math=math, runtime=runtime, progress=progress,
                     hand_back=hand_back, host_bound=False if graphed else host_bound, graphed=graphed)


def _compile_ahead(rt, items) -> CompileAhead:
    """A :class:`~convtune.compiling.CompileAhead` over ``items`` (``(problem, device, names)``) for the runtime's
    planner, started on the first item's CUDA device, for the problems of that device that the plan cache lacks (items
    on other devices compile in their searches; a model whose plans are all stored compiles nothing); elsewhere, and
    where the bridge or the cache does not answer, one that does nothing. Closed before any duel: its threads would
    take the host time the duels measure."""
    nothing = CompileAhead(None, [])
    device = items[0][1] if items else None
    if device is None or device.type != "cuda" or rt.miss_policy != "tune":
        return nothing
    try:
        br = bridge(device.type)
        key = br.call(device.index, lambda: br.backend.device_info().key())
        missing = {p.key() for p, d, _n in items if d == device and rt.store.get(p, key) is None}
    except Exception as exc:  # (no CuPy, a cache that does not answer: the searches compile what they need)
        log.debug("convtune.torch.tune: no compiling ahead: %s: %s", type(exc).__name__, exc)
        return nothing
    if len(missing) < 2:
        return nothing
    planner = Planner(br.backend, **rt.planner_options)
    ahead = CompileAhead(lambda item: planner.builds_ahead(item[0]) if item[1] == device and item[0].key() in missing
                         else None, items, br.backend)
    return br.call(device.index, ahead.start)


def _signature(model: nn.Module, example_inputs, distinct: dict) -> str:
    """What a model's training steps run, as far as their time goes: its class, its parameters' count, training or
    evaluation mode, its inputs' shapes, dtypes and layouts, its convolutions' problems (their count and a digest of
    their keys) and the cuDNN settings PyTorch's convolutions run under (the benchmark, TF32)."""
    inputs = example_inputs if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    shown = ",".join(f"{tuple(t.shape)}:{str(t.dtype).replace('torch.', '')}:{tensor_layout(t)}"
                     if isinstance(t, torch.Tensor) else type(t).__name__ for t in inputs)
    keys = sorted(f"{key}@{device}" for key, device in distinct)
    digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:16]
    parameters = sum(p.numel() for p in model.parameters())
    flags = (f"cudnn.benchmark={torch.backends.cudnn.benchmark},tf32={torch.backends.cudnn.allow_tf32}/"
             f"{torch.backends.cuda.matmul.allow_tf32}")
    return (f"{type(model).__module__}.{type(model).__qualname__}|{parameters} parameters|"
            f"{'training' if model.training else 'evaluation'}|inputs {shown}|{len(keys)} problems {digest}|{flags}")


#: Device types whose plans' kernels compile at run time (NVRTC): the routes' kernels are compiled together, ahead.
COMPILED_DEVICE_TYPES = {"cuda"}


def _compile_routes(rt: Runtime, routes: dict, untuned: set) -> None:
    """Before the routes are resolved one by one: the kernels of the plans they will read from the plan cache,
    compiled at once on several threads (:func:`convtune.building.compile_ahead`), per device. Nothing where the
    bridge or the cache does not answer (the builds compile what they need, said at debug level)."""
    wanted: dict = {}
    for key, (route_passes, _name, _keep) in routes.items():
        if key in untuned or key[7].type not in COMPILED_DEVICE_TYPES:
            continue
        route = _handback.route_of(key)
        wanted.setdefault(key[7], []).extend(route.problem.for_pass(p) for p in route_passes
                                             if getattr(route, f"{p}_exec") is None)
    for device, problems in wanted.items():
        try:
            br = bridge(device.type)

            def compile_stored(br=br, problems=problems):
                device_key = br.backend.device_info().key()
                stored = [d for d in (rt.store.get(p, device_key) for p in problems) if d is not None]
                return compile_ahead(stored, br.backend)
            br.call(device.index, compile_stored)
        except Exception as exc:
            log.debug("convtune.torch.tune: the routes' kernels not compiled ahead: %s: %s", type(exc).__name__, exc)


def _laps(phases: dict, started: float) -> Callable[[str], None]:
    """``lap(name)``: the seconds since the last lap (or since ``started``, a ``time.perf_counter()``) go to
    ``phases[name]``."""
    last = [started]

    def lap(name: str) -> None:
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - last[0]
        last[0] = now
    return lap


def _tune(model, example_inputs, passes, *, math, runtime, progress, hand_back, host_bound, graphed) -> TuneReport:
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
    owners: dict[tuple, set] = {}  # a distinct problem -> the route keys of the calls that need it (None: plain modules)
    spared: dict[tuple, ConvProblem] = {}  # patched layers' calls the weighing runs on cuDNN's heuristic pick
    for item in collect(model, example_inputs, math):
        if item.route_key is not None and floor_spares_search(item.problem):
            spared[item.route_key] = item.problem
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
                owners.setdefault((p.key(), str(item.device)), set()).add(item.route_key)
    report = TuneReport(graphed=graphed)
    lap = _laps(report.phases, started)
    lap(PHASES[0])
    # where plans duel PyTorch's convolution (CUDA): are the steps host-bound? Timed first (PyTorch's convolution
    # throughout), so that the layers no plan could keep there are not searched at all
    duelled = [key for key in routes if key[7].type in _dispatch.DUEL_DEVICE_TYPES]  # (a route key's 8th: the device)
    weigh = _handback.weigh_host(report, model, example_inputs, duelled[0][7], host_bound, rt.store,
                                 _signature(model, example_inputs, distinct),
                                 lambda: _announce(progress, len(distinct)), spared) if duelled else False
    lap(PHASES[1])
    untuned = _handback.not_searched({k: routes[k] for k in duelled}, layer_calls, wanted) if weigh and hand_back \
        else set()
    lap(PHASES[2])
    if untuned:
        report.not_searched = sorted({name for name, calls in layer_calls.items()
                                      if all(key in untuned for key, _p, _k in calls)})
        distinct = {k: v for k, v in distinct.items() if not owners[k] <= untuned}
    report.problems = [(p, names) for p, _d, names in distinct.values()]
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
    with _compile_ahead(rt, items) as ahead:  # (the next problems' kernels compile while one is searched)
        for done, (problem, device, names) in enumerate(items):
            ahead.reached(done)
            shown(done, f"{names[0]} {problem.pass_}")
            if not settle(problem, device, wait=False):
                held.append((problem, device))  # another rank is tuning it: its plan is read at the end
    if held:
        log.info("convtune.torch.tune: waiting for %d problem(s) other processes are tuning", len(held))
    for problem, device in held:
        settle(problem, device, wait=True)
    lap(PHASES[3])
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
    lap(PHASES[4])
    _compile_routes(rt, routes, untuned)
    for key in duelled:
        if key not in untuned:
            # (before the duels, which the steps in CUDA graphs decide on the device's time, and any weighing: settle
            # runs in the hand-back, or at the first call)
            _handback.route_of(key).weigh_host(weigh, graphed)
    for key, (route_passes, name, keep) in routes.items():  # the first step's one-time work, done here
        if key in untuned:
            continue  # (its layer goes back to PyTorch: resolving would tune it)
        shown(len(items), f"{name} route")
        route = _handback.route_of(key)  # the route the layer's calls will find: in the runtime it was patched with
        for pass_ in route_passes:
            if getattr(route, f"{pass_}_exec") is None:
                route.resolve(pass_)  # (never raises: what cannot run falls back, said once)
        if keep and len(route_passes) == len(PASSES):
            route.trips.resolve(keep)  # its round trip built (or None: the per-pass plans, the reason said once)
        report.routes += 1
    lap(PHASES[5])
    if hand_back:
        _handback.hand_back(model, layer_calls, wanted, report, untuned)
        if _handback.host_shows(report):
            shown(len(items), "the whole step, patched and not")
            _handback.check_steps(model, example_inputs, duelled[0][7], layer_calls, report)
    lap(PHASES[6])
    shown(len(items), "done")
    if torch.cuda.is_available() and (any(d.type == "cuda" for _p, d, _n in distinct.values()) or
                                      any(key[7].type == "cuda" for key in routes)):
        torch.cuda.empty_cache()  # what tuning held goes back to the device before training starts
    report.seconds = time.perf_counter() - started
    log.info("convtune.torch.tune: %s", report)
    return report
