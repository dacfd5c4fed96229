"""What goes back to PyTorch after :func:`convtune.torch.tune` has tuned a model: whether its training steps are
host-bound (:func:`weigh_host`), which patched layers no plan could keep there and so need no search
(:func:`not_searched`, :func:`cannot_gain`), which layers run PyTorch's own convolution throughout (:func:`hand_back`),
and, where the host's work shows in the steps (:func:`host_shows`), whether the layers left patched make the whole
step faster (:func:`check_steps`). See :mod:`convtune.torch.tuning`."""

from __future__ import annotations

import logging
import statistics

from torch import nn

from ..problem import ConvProblem
from ..runtime import default_runtime
from ..timing import HOST_BOUND
from . import _dispatch, functional
from ._bridge import bridge
from ._dispatch import route_for
from ._duel import pytorch_versions
from ._executors import Native
from ._host import dispatch_seconds, host_fingerprint, patched_step_ratios, pytorch_host_seconds, step_times
from .modules import _Convtune, restore

log = logging.getLogger("convtune")

__all__ = ["weigh_host", "cannot_gain", "not_searched", "hand_back", "host_shows", "check_steps", "route_of"]


def route_of(key: tuple):
    """The route a patched layer's calls of ``key`` (:attr:`Problem.route_key`) find: in its runtime."""
    return route_for(*key[:8], key[10] or default_runtime(), *key[8:10])


def pytorch_throughout(route, passes: tuple[str, ...], keep) -> bool:
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
    # (in steps replayed from CUDA graphs, that cost is the host's, out of the step)
    return duel is not None and not duel.gain_at_least(route.host_bound) and \
        duel.gain(route.host_bound, route.graphed) <= (0.0 if route.graphed else dispatch_seconds(route.device))


#: The weighing's own method, part of a stored weighing's key: one measured by another method is measured again (2: the
#: layers where PyTorch's search costs much and buys little run on cuDNN's heuristic pick, not searched).
STEPS_METHOD = 2


def steps_key(device_key: str, signature: str) -> str:
    """The key of a ``steps`` record: the device, the host (:func:`~convtune.torch._host.host_fingerprint`), PyTorch's
    and cuDNN's versions, the weighing's method and the model's ``signature`` (what its steps run)."""
    return f"{device_key}|{host_fingerprint()}|{pytorch_versions()}|steps{STEPS_METHOD}|{signature}"


def weigh_host(report, model, example_inputs, device, host_bound: bool | None, store=None,
               signature: str = "", timing=None, spared: dict | None = None) -> bool:
    """Whether the model's training steps are host-bound: ``host_bound`` where given, else timed
    (:func:`step_times`); recorded in ``report``. Not where the steps cannot be timed (said at debug level).

    Timing them runs PyTorch's own steps, whose first step runs its algorithm search where ``cudnn.benchmark`` is on
    (55.7 s of SLaK-T's tune-ahead under AMP on an H200, its plans all in the cache). So, with a plan ``store`` and the
    model's ``signature``, the figures are stored (:func:`steps_key`) and a later tune-ahead of the same model on the
    same device, host and PyTorch reads them (``report.steps_stored``). ``timing()``, where given, is called before
    the steps are timed (to say so: they can take a minute). The patched layers' calls in ``spared`` run on cuDNN's
    heuristic pick rather than be searched (:func:`~convtune.torch._host.step_times`)."""
    if host_bound is None:
        key = stored = None
        if store is not None and signature:
            try:
                key = steps_key(bridge(device.type).backend.device_info().key(), signature)
                stored = store.get_record("steps", key)
            except Exception as exc:  # (a cache that does not answer: the steps are timed)
                log.debug("convtune.torch.tune: no stored weighing: %s: %s", type(exc).__name__, exc)
        if stored is not None:
            report.step_host_s, report.step_s = stored["host_us"] * 1e-6, stored["step_us"] * 1e-6
            report.steps_stored, report.steps_spared = True, stored.get("spared", 0)
        else:
            if timing is not None:
                timing()
            try:
                report.step_host_s, report.step_s = step_times(model, example_inputs, device, spared=spared)
                report.steps_spared = len(spared or ())
            except Exception as exc:
                log.debug("convtune.torch.tune: training steps not timed (%s: %s); weighing device and host together",
                          type(exc).__name__, exc)
                report.host_bound = False
                return False
            if key is not None:
                try:
                    store.put_record("steps", key, {"signature": signature, "host_us": report.step_host_s * 1e6,
                                                    "step_us": report.step_s * 1e6, "spared": report.steps_spared})
                except Exception as exc:
                    log.debug("convtune.torch.tune: the weighing not stored: %s: %s", type(exc).__name__, exc)
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


def not_searched(routes: dict, layer_calls: dict, wanted: tuple[str, ...]) -> set:
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
        route = route_of(key)
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


#: Where the host's time to issue a training step is at least this share of the step (host-bound steps, and those where
#: the host's work still shows: on an H200, r3d_18 under AMP, its host 70% to 77% of the step, kept 12 of its 20
#: layers by their duels and trained at 0.94x PyTorch), the layers left patched stay so only where the whole training
#: step runs at most ``STEP_GAIN`` of its time with them handed back (the median of
#: :func:`~convtune.torch._host.patched_step_ratios`' rounds) and the patched step was the faster in every round but
#: one at most (rounds that disagree are the host's noise, and a tie goes to PyTorch). In steps the device's work
#: dominates, the duels' times in the layer are what the step sees.
CHECK_HOST_SHARE, STEP_GAIN = 0.5, 0.98


def host_shows(report) -> bool:
    """Does the host's work show in the steps :func:`weigh_host` weighed into ``report``: host-bound, or timed with the
    host's time at least :data:`CHECK_HOST_SHARE` of the step? Where it does, :func:`check_steps` runs."""
    return bool(report.host_bound or (report.step_s and report.step_host_s >= CHECK_HOST_SHARE * report.step_s))


def check_steps(model: nn.Module, example_inputs, device, layer_calls: dict, report) -> None:
    """Where the host's work shows in the steps (:data:`CHECK_HOST_SHARE`), time the whole training step with the layers
    left patched against the same step with them handed back (:func:`~convtune.torch._host.patched_step_ratios`), and
    hand them all back unless the patched step is faster by :data:`STEP_GAIN` (the median) and in every round but one at
    most: each layer was kept by its duels, measured on the layer alone, and a step of many layers can cost the host
    more than their sum said (on an H200, RegNetY-016 under AMP with 26 layers kept trained at 0.85x PyTorch).
    ``report.step_ratio`` gets the median ratio; where the steps cannot be timed, the layers stay as they are (said at
    debug level)."""
    modules = dict(model.named_modules())
    # (a layer whose runtime's strategies leave PyTorch's convolution out was never weighed against it: it stays)
    patched = [(name, modules[name]) for name, calls in layer_calls.items()
               if isinstance(modules.get(name), _Convtune) and
               all(key[7] == device and route_of(key)._duels() for key, _p, _k in calls)]
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


def hand_back(model: nn.Module, layer_calls: dict, wanted: tuple[str, ...], report,
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
                                                 pytorch_throughout(route_of(key), passes, keep))
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
