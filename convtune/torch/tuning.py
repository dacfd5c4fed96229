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

On CUDA, before anything is searched, :func:`tune` times a few training steps of the model on the example (forward
and gradients, PyTorch's convolution throughout) to learn whether its steps are *host-bound*: the host's time to issue
a step at least :data:`~convtune.timing.HOST_BOUND` of the step's time, the device waiting on the host (small and
mid-sized models under AMP, on a fast GPU). There a plan's faster device work shortens no step, and the host's time is
all that counts: each route weighs what its plans' duels gained in host time alone
(:meth:`~convtune.torch._dispatch.Route.weigh_host`), and so does the hand-back. A plan can save the host at most what
PyTorch's own call costs it, so a patched layer whose training calls cost PyTorch's convolution less host time than
convtune's autograd detour is not searched at all (:func:`cannot_gain`: one short measurement per layer shape) and goes
back to PyTorch: :attr:`TuneReport.not_searched`. ``host_bound=False`` weighs device and host together as each duel
measured them (the steps run in CUDA graphs, ``torch.compile(mode="reduce-overhead")``, where the host is out of the
step); ``True`` takes the steps as host-bound without timing them. Where the host's time is half the step or more
(host-bound steps included), the layers still patched after the hand-back are then checked on the whole step
(:func:`_check_steps`): a few training steps with them patched and with them handed back, in turns, and they all go
back to PyTorch unless the patched step is the faster by 2% (and in all rounds but one): what a layer's duels
measured on the layer alone does not always add up to the step (``TuneReport.step_ratio``).

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

import logging
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..compiling import CompileAhead
from ..planner import Planner
from ..problem import PASSES, ConvProblem
from ..runtime import Runtime, _Held, default_runtime
from ..timing import HOST_BOUND
from ..worklist import rotated
from . import _dispatch, functional
from ._bridge import bridge
from ._dispatch import layer_problem, route_for
from ._executors import Native
from ._formats import tensor_layout
from ._host import dispatch_seconds, left_as_it_was, patched_step_ratios, pytorch_host_seconds, rng_kept, step_times
from .modules import _CONVS, _Convtune, restore

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
    try:
        with torch.enable_grad(), left_as_it_was(model):
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
    #: patched layers whose problems were not searched: in host-bound steps no plan would keep them (handed back)
    not_searched: list[str] = field(default_factory=list)
    #: where the host's work shows, the whole step's time with the layers left patched over its time with them handed
    #: back (see :func:`_check_steps`; None: not checked), and the layers that check handed back (in ``handed_back``
    #: too)
    step_ratio: float | None = None
    step_handed_back: list[str] = field(default_factory=list)

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
        if self.not_searched:
            bound += f", {len(self.not_searched)} layers not searched (no plan could gain their host time)"
        if self.step_ratio is not None:
            bound += (f", the whole step {self.step_ratio:.2f}x with the layers left patched against them handed back"
                      + (f" ({len(self.step_handed_back)} handed back then)" if self.step_handed_back else ""))
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


def cannot_gain(problem: ConvProblem, passes: tuple[str, ...], device) -> bool:
    """In host-bound steps, can no plan keep a layer whose training calls run ``passes`` of ``problem`` (its forward
    problem)? There :meth:`~convtune.torch._dispatch.Route.settle` weighs the plans by the host time they save, at
    most PyTorch's own host time per call of each pass, against the autograd detour: where PyTorch's whole training
    call costs the host less than the detour of plans for backward passes, and its forward call less than the
    detour of a forward plan alone, no plan the search could find would be kept (measured once, here)."""
    native = [pytorch_host_seconds(problem.for_pass(p), device) for p in passes]
    return (native[0] < _dispatch.detour_seconds(device, split=False) and
            sum(native) < _dispatch.detour_seconds(device, split=True))


def _untuned(routes: dict, layer_calls: dict, wanted: tuple[str, ...]) -> set:
    """In host-bound steps: the route keys of patched layers that no plan could keep (:func:`cannot_gain`), whose
    problems need no search: layers whose every call needs a gradient, runs per-pass plans (no kept spectra) and
    is tuned here in every pass it needs (so the layer can be handed back), in a runtime whose plans duel PyTorch's
    convolution. Said at INFO."""
    calls_of: dict[tuple, list] = {}
    for calls in layer_calls.values():
        for key, passes, keep in calls:
            calls_of.setdefault(key, []).append((passes, keep))
    untuned = set()
    for key, (route_passes, _name, _keep) in routes.items():
        calls = calls_of.get(key, [])
        if not calls or any(keep or len(passes) < 2 or not set(passes) <= set(wanted) for passes, keep in calls):
            continue
        route = _route(key)
        if not route._duels():
            continue  # (its runtime's strategies leave PyTorch's out: no plan is weighed against it, all are kept)
        problem = route.problem
        try:
            if cannot_gain(problem, route_passes, key[7]):
                untuned.add(key)
        except Exception as exc:  # (not measured: searched as usual)
            log.debug("convtune.torch.tune: PyTorch's host time for %s not measured: %s", problem.describe(), exc)
    # a layer goes back only where all its calls do: one with a call that is searched stays patched, and its other
    # calls' routes would be tuned at its first training call, so they are searched here too
    changed = True
    while changed:
        changed = False
        for calls in layer_calls.values():
            keys = {key for key, _p, _k in calls}
            if keys & untuned and not keys <= untuned:
                untuned -= keys
                changed = True
    if untuned:
        log.info("convtune.torch.tune: %d layer shape(s) not searched: in host-bound steps PyTorch's convolution "
                 "costs their training calls' host less than convtune's autograd detour, so no plan would be kept",
                 len(untuned))
    return untuned


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
        Unpatch the patched layers whose every call runs PyTorch's own convolution, and, where the host's time is
        half the training step or more, those left patched when the whole step is no faster with them (see the module
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
    with rng_kept():
        return _tune(model, example_inputs, passes, math=math, runtime=runtime, progress=progress,
                     hand_back=hand_back, host_bound=host_bound)


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
    ahead = CompileAhead(lambda item: item[1] == device and item[0].key() in missing and planner.prepare_ahead(item[0]),
                         items, br.backend)
    return br.call(device.index, ahead.start)


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
    owners: dict[tuple, set] = {}  # a distinct problem -> the route keys of the calls that need it (None: plain modules)
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
                owners.setdefault((p.key(), str(item.device)), set()).add(item.route_key)
    report = TuneReport()
    # where plans duel PyTorch's convolution (CUDA): are the steps host-bound? Timed first (PyTorch's convolution
    # throughout), so that the layers no plan could keep there are not searched at all
    duelled = [key for key in routes if key[7].type in _dispatch.DUEL_DEVICE_TYPES]  # (a route key's 8th: the device)
    weigh = _weigh_host(report, model, example_inputs, duelled[0][7], host_bound) if duelled else False
    untuned = _untuned({k: routes[k] for k in duelled}, layer_calls, wanted) if weigh and hand_back else set()
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
        if key in untuned:
            continue  # (its layer goes back to PyTorch: resolving would tune it)
        shown(len(items), f"{name} route")
        route = _route(key)  # the route the layer's calls will find: in the runtime it was patched with
        for pass_ in route_passes:
            if getattr(route, f"{pass_}_exec") is None:
                route.resolve(pass_)  # (never raises: what cannot run falls back, said once)
        if keep and len(route_passes) == len(PASSES):
            route.trips.resolve(keep)  # its round trip built (or None: the per-pass plans, the reason said once)
        report.routes += 1
    for key in duelled:
        if key not in untuned:
            _route(key).weigh_host(weigh)  # (before any weighing: settle runs in the hand-back, or at the first call)
    if hand_back:
        _hand_back(model, layer_calls, wanted, report, untuned)
        if weigh or (report.step_s and report.step_host_s >= CHECK_HOST_SHARE * report.step_s):
            shown(len(items), "the whole step, patched and not")
            _check_steps(model, example_inputs, duelled[0][7], layer_calls, report)
    shown(len(items), "done")
    if torch.cuda.is_available() and (any(d.type == "cuda" for _p, d, _n in distinct.values()) or
                                      any(key[7].type == "cuda" for key in routes)):
        torch.cuda.empty_cache()  # what tuning held goes back to the device before training starts
    report.seconds = time.perf_counter() - started
    log.info("convtune.torch.tune: %s", report)
    return report


#: Where the host's time to issue a training step is at least this share of the step (host-bound steps, and those where
#: the host's work still shows: on an H200, r3d_18 under AMP, its host 70% to 77% of the step, kept 12 of its 20
#: layers by their duels and trained at 0.94x PyTorch), the layers left patched stay so only where the whole training
#: step runs at most ``STEP_GAIN`` of its time with them handed back (the median of
#: :func:`~convtune.torch._host.patched_step_ratios`' rounds) and the patched step was the faster in every round but
#: one at most (rounds that disagree are the host's noise, and a tie goes to PyTorch). In steps the device's work
#: dominates, the duels' times in the layer are what the step sees.
CHECK_HOST_SHARE, STEP_GAIN = 0.5, 0.98


def _check_steps(model: nn.Module, example_inputs, device, layer_calls: dict, report: TuneReport) -> None:
    """Where the host's work shows in the steps (:data:`CHECK_HOST_SHARE`), time the whole training step with the
    layers left patched against the same step with them handed back (:func:`~convtune.torch._host.patched_step_ratios`),
    and hand them all back unless the patched step is faster by :data:`STEP_GAIN` (the median) and in every round but
    one at most: each layer was kept by its duels, measured on the layer alone, and a step of many layers can cost the
    host more than their sum said (on an H200, RegNetY-016 under AMP with 26 layers kept trained at 0.85x PyTorch).
    ``report.step_ratio`` gets the median ratio; where the steps cannot be timed, the layers stay as they are (said at
    debug level)."""
    modules = dict(model.named_modules())
    # (a layer whose runtime's strategies leave PyTorch's convolution out was never weighed against it: it stays)
    patched = [(name, modules[name]) for name, calls in layer_calls.items()
               if isinstance(modules.get(name), _Convtune) and
               all(key[7] == device and _route(key)._duels() for key, _p, _k in calls)]
    if not patched:
        return
    try:
        ratios = patched_step_ratios(model, example_inputs, device, [m for _n, m in patched])
    except Exception as exc:
        log.debug("convtune.torch.tune: the whole step not checked (%s: %s); the patched layers stay",
                  type(exc).__name__, exc)
        return
    report.step_ratio = statistics.median(ratios)
    faster = sum(r < 1.0 for r in ratios)
    if report.step_ratio <= STEP_GAIN and faster >= len(ratios) - 1:
        return
    for name, module in patched:
        restore(module)
        report.handed_back.append(name)
        report.step_handed_back.append(name)
    log.info("convtune.torch.tune: %d patched layer(s) handed back to PyTorch: with them patched a training step took "
             "%.2fx its time with them handed back (median of %d rounds, faster in %d), not %.2fx or less in all "
             "rounds but one at most: %s", len(patched), report.step_ratio, len(ratios), faster, STEP_GAIN,
             ", ".join(n or "the model" for n, _m in patched))


def _hand_back(model: nn.Module, layer_calls: dict, wanted: tuple[str, ...], report: TuneReport,
               untuned: set = frozenset()) -> None:
    """Unpatch the patched layers whose every call runs PyTorch's convolution throughout (its passes all
    tuned here, or not searched: ``untuned`` route keys); their names go to ``report.handed_back``."""
    modules = dict(model.named_modules())
    for name, calls in layer_calls.items():
        module = modules.get(name)
        if not isinstance(module, _Convtune):
            continue
        try:
            throughout = all(key in untuned or (set(passes) <= set(wanted) and
                                                 _pytorch_throughout(_route(key), passes, keep))
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
