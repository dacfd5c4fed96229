"""Routes: what the PyTorch layer runs for one layer signature, built once from the runtime's plans.

A :class:`Route` belongs to one layer signature (input and weight shapes, geometry, math mode,
device) and holds one executor per pass, each resolved on first use through the runtime's lookup
order (memo, plan cache, miss policy) and kept:

* :class:`Native`: the plan's winner is PyTorch's own convolution (the ``torch`` strategy): the
  ATen operator runs on the tensors directly, no conversion;
* :class:`ArrayPlan`: another strategy: the operands become zero-copy NumPy/CuPy views, the
  result is a tensor from PyTorch's allocator that the plan writes into;
* :class:`Fallback`: convtune cannot run this (no plan, no CuPy, a failure): PyTorch's
  convolution with the process's own settings. The reason is logged once.

On the GPU a plan of another strategy must also win a *duel* before a route takes it: the plan and
PyTorch's own convolution (cuDNN's benchmark on) run on random operands of the pass as the layer
would run them, back to back, and the plan wins only where it is faster per call by
:data:`DUEL_MARGIN` (:data:`DUEL_DEVICE_TYPES`). The planner
times a candidate's GPU work; here the host's share counts too (the bridge, the conversions, the
launches), which decides small layers: a plan a few microseconds faster on the GPU can cost a
hundred more on the host. A gradient pass is timed where training runs it, inside a backward
(:func:`~convtune.torch._duel.where_pass_runs`), and on a large layer PyTorch's search is run only where a
floor under its time does not lose already (:data:`~convtune.torch._duel.DUEL_FLOOR_FLOPS`). There is no duel
where the runtime's strategies leave PyTorch's out. The
verdict is stored next to the plans (keyed by device, problem, plan and what the host cost depends on:
:func:`~convtune.torch._duel.duel_conditions`), so a process that finds it runs no duel; one where those
conditions changed duels again.

Every executor takes operands dense in the format they arrive in and the result has the memory
format :func:`result_format` says (channels_last where an operand is), which the fake tensors of the
registered ops promise too. A route's problem carries the call's dtype (float32, bfloat16, float16)
and layout (:func:`tensor_layout`): its plan was tuned for them, PyTorch's own convolution running
them natively, the channels-last depthwise kernels too, and convtune's other strategies through
conversions (:mod:`convtune.precision`). bfloat16 tensors reach convtune's arrays as float32 copies
(NumPy and CuPy have no bfloat16) and their results are converted back, exactly; a by-address form
that reads bfloat16 itself gets the tensors' own memory.
"""

from __future__ import annotations

import logging
import time

import torch

from ..errors import ConvtuneError, TuningError
from ..problem import ConvProblem
from ..runtime import Runtime, default_runtime
from ..strategies import get_strategy
from ..strategies.pytorch import native_for, native_pass
from ._autograd import eager_forward
from ._bridge import bridge
from ._capture import Captures, capturing
from ._duel import (DUEL_DEVICE_TYPES, DUEL_FLOOR_FLOPS, DUEL_MARGIN, Duel, duel_conditions, duel_key, duel_operands,
                    per_call_seconds, search_floor, trip_duel_conditions, where_pass_runs)
from ._executors import ArrayPlan, Fallback, Native
from ._formats import DTYPES, dense, in_result_format
from ._kept import Trips
from ._notes import say_once

log = logging.getLogger("convtune")


#: A pass's executor attribute of a :class:`Route`.
_EXEC = {"fwd": "fwd_exec", "dgrad": "dgrad_exec", "wgrad": "wgrad_exec"}


class Route:
    """One layer signature's executors, one per pass, resolved on first use (see the module docstring)."""

    __slots__ = ("problem", "runtime", "device", "fwd_exec", "dgrad_exec", "wgrad_exec", "fwd_infer", "trips",
                 "verdicts", "capture", "both", "host_bound", "graphed")

    def __init__(self, problem: ConvProblem, runtime: Runtime, device):
        self.problem, self.runtime, self.device = problem, runtime, device
        self.fwd_exec = self.dgrad_exec = self.wgrad_exec = None
        # the forward's plan where settle gave a training call's forward to PyTorch: calls without gradients,
        # which take no autograd detour, keep what won the duel (see infer)
        self.fwd_infer = None
        # (input needs a gradient, weight needs one) -> True where those passes all run PyTorch's own convolution
        # for good, False where they do not and their plans were weighed (see native_for_grads and settle);
        # emptied whenever an executor changes
        self.verdicts = {}
        self.capture = Captures(problem)  # what CUDA graph captures record
        self.trips = Trips(problem, runtime, device, self.capture)  # keep_spectra mode -> round trip, or None
        # cuDNN flags -> PyTorch's computation of both gradients in one call (see native_backward); None: the
        # gradients always come from a call each
        self.both = {}
        # the training steps this layer runs in are host-bound (see weigh_host): settle counts the host's time alone
        self.host_bound = False
        # they run as CUDA graphs (see weigh_host): duels and settle count the device's time alone
        self.graphed = False

    def weigh_host(self, host_bound: bool, graphed: bool = False) -> None:
        """Say whether the training steps that this layer's calls run in are host-bound (the host's time to issue a
        step near the step's time: the device waits on the host), as :func:`convtune.torch.tune` measures it. There a
        plan's faster device work shortens no step, so :meth:`settle` weighs what its duels gained in host time alone
        against the autograd detour; elsewhere in time per call in the layer. A change forgets the weighings made.

        ``graphed``: the steps run as CUDA graphs (a captured step, ``torch.compile(mode="reduce-overhead")``), where
        the host's work is out of the step and only the device's counts: each duel is decided by the two contenders'
        time on the device alone, and settle weighs no detour (the autograd functions' cost is the host's). A change
        of it forgets the passes' executors too: their duels are decided again (from their stored records)."""
        graphed = bool(graphed) and not host_bound
        if graphed != self.graphed:
            self.graphed = graphed
            self.fwd_exec = self.dgrad_exec = self.wgrad_exec = self.fwd_infer = None
            self.verdicts = {}
        if host_bound != self.host_bound:
            self.host_bound = host_bound
            self.verdicts = {}

    # -- running -----------------------------------------------------------------------
    def run(self, pass_: str, a, b, bias=None):
        executor = getattr(self, _EXEC[pass_])
        if executor.__class__ is Native and executor.retry_at is None:
            # PyTorch's own convolution for good, on channels-first operands (most of a settled model's calls):
            # the result's format settled before the launch, one check after it (a pass this short is timed by
            # the host's work, and what follows the launch is not hidden behind the GPU's)
            if a.is_contiguous() and b.is_contiguous():
                out = executor.fn(a, b, bias)
                return out if out.is_contiguous() else out.contiguous()
            return in_result_format(executor(a, b, bias), a, b)
        if executor is None or executor.retry_at is not None or not isinstance(executor, Native):
            if capturing(a):  # a CUDA graph records this call: no lookup, tuning or duel here
                return self.capture.run(pass_, executor, a, b, bias)
            if executor is None or (executor.retry_at is not None and executor.retry_at <= time.monotonic()):
                executor = self.resolve(pass_)  # (served for want of a tuned plan: is there one now?)
        try:
            out = executor(a, b, bias)
        except Exception as exc:
            if isinstance(executor, Native):
                raise  # PyTorch's own error: what the user would have seen without convtune
            executor = self._fall_back(pass_, f"its plan {executor.label} failed ({type(exc).__name__}: {exc})")
            out = executor(a, b, bias)
        else:
            if executor.__class__ is ArrayPlan and not executor.recordable and a.is_cuda:
                self.capture.warm(pass_, a, b)  # (once per thread: what a capture records instead)
        return in_result_format(out, a, b)

    def native_backward(self, dy, x, w, need_bias: bool):
        """``(dx, dw, db)`` of a training call in one call of PyTorch's ``convolution_backward``, as PyTorch's own
        autograd computes them, where both backward passes are PyTorch's convolution for good, with the same
        cuDNN settings (a layer whose forward alone is convtune's: two calls would cost the host one more);
        ``None`` otherwise. Captures take the same path as the eager calls before them, whose cuDNN calls
        they record (cuDNN cannot run its benchmark on a capturing stream)."""
        d, g = self.dgrad_exec, self.wgrad_exec
        if not (self.both is not None and isinstance(d, Native) and isinstance(g, Native) and d.retry_at is None and
                g.retry_at is None and d.flags == g.flags):
            return None
        fn = self.both.get(d.flags)
        if fn is None:
            p = self.problem
            fn = self.both[d.flags] = native_pass("both", p.x_shape, p.w_shape, p.stride, p.padding, p.dilation,
                                                  p.groups, benchmark=d.flags[0], tf32=d.flags[1])
        dx, dw, db = fn(dense(dy), dense(x), dense(w), need_bias)
        # (the formats the per-pass calls give: run)
        return in_result_format(dx, dy, w), in_result_format(dw, x, dy), db

    def native_for_grads(self, need_dx: bool, need_dw: bool) -> bool:
        """:meth:`native` of a training call's passes (the forward, and the backward passes of the operands
        that need gradients), remembered once true: a training step asks it of every layer on every call."""
        key = (need_dx, need_dw)
        if self.verdicts.get(key):
            return True
        passes = ("fwd",) + (("dgrad",) if need_dx else ()) + (("wgrad",) if need_dw else ())
        native = self.native(passes)  # (may resolve a pass, which empties the verdicts)
        if not native and key not in self.verdicts:
            native = self.verdicts[key] = self.settle(passes)
        elif native:
            self.verdicts[key] = True
        return native

    def settle(self, passes) -> bool:
        """Weigh the plans that won these passes' duels against the detour they put the layer's training
        calls on (convtune's autograd functions instead of PyTorch's own: :func:`detour_seconds`): where
        what they gain per training call together is less, PyTorch's convolution runs those passes (said
        once). Each duel times one pass's call, not that detour, which a layer whose every pass is PyTorch's
        does not take: on the H100, RepLKNet-31B's 1x1 layers won their duels by a few microseconds each
        through the bare cuBLAS calls and its training step took 20% longer. In a host-bound step
        (:meth:`weigh_host`) a duel's gain is the host's time it saves. Returns :meth:`native`."""
        plans = [(p, e) for p in passes if not isinstance(e := getattr(self, _EXEC[p]), Native)]
        if not plans or not all(isinstance(e, ArrayPlan) and e.duel is not None for _, e in plans):
            return False  # no verdict to weigh (no duels here, or a plan served for want of its own)
        gain = sum(e.duel.gain(self.host_bound, self.graphed) for _, e in plans)
        # (a forward plan alone leaves both gradients to one call of PyTorch's: native_backward; no detour in a
        # step replayed from a CUDA graph, where the host's work is out of the step)
        detour = 0.0 if self.graphed else detour_seconds(self.device, split=any(p != "fwd" for p, _ in plans))
        if gain >= detour or any(e.duel.gain_at_least(self.host_bound) for _, e in plans):
            return False  # (a gain known only by a floor under PyTorch's time may be far larger: the plans stay)
        of = "host time " if self.host_bound else ""
        for p, e in plans:
            duel = e.duel
            native = duel.native
            if self.host_bound and duel.native_host_s is not None:
                native.label = (f"torch (in a host-bound step {duel.native_host_s * 1e6:.0f} us of host time per call "
                                f"against {duel.plan_host_s * 1e6:.0f} us for {e.label}, whose gain is less than the "
                                f"{detour * 1e6:.0f} us detour per training call)")
            else:
                native.label = (f"torch (in the layer {duel.native_s * 1e6:.0f} us per call against "
                                f"{duel.plan_s * 1e6:.0f} us for {e.label}, less than the {detour * 1e6:.0f} us detour "
                                f"per training call)")
            self._keep(p, native)
            if p == "fwd":
                self.fwd_infer = e
        say_once(f"settle:{self.problem.key()}:{self.device}:{self.host_bound}", "convtune: PyTorch's convolution runs "
                 "%s on %s in training calls: its plans gain %.0f us %sper training call, less than the %.0f us that "
                 "convtune's autograd functions cost it (calls without gradients keep the forward's plan)",
                 self.problem.describe(), self.device, gain * 1e6, of, detour * 1e6, level=logging.INFO)
        return self.native(passes)

    def infer(self, a, b, bias=None):
        """A forward call without gradients: the forward's plan that :meth:`settle` took from training calls
        (they pay an autograd detour that this call does not), else :meth:`run`'s. Where that plan fails,
        :meth:`run`'s executor from then on (said once)."""
        plan = self.fwd_infer
        if plan is None:
            return self.run("fwd", a, b, bias)
        try:
            out = plan(a, b, bias)
        except Exception as exc:
            self.fwd_infer = None
            say_once(f"infer:{self.problem.key()}:{self.device}", "convtune: %s: its forward plan %s failed (%s: %s); "
                     "PyTorch's convolution runs it", self.problem.describe(), plan.label, type(exc).__name__, exc)
            return self.run("fwd", a, b, bias)
        if not plan.recordable and a.is_cuda:
            self.capture.warm("fwd", a, b)  # (what a capture of this call records instead: see Captures.run)
        return in_result_format(out, a, b)

    def native(self, passes) -> bool:
        """Do these passes all run PyTorch's own convolution for good (so autograd needs nothing of
        convtune)? Not where one waits to be looked up again."""
        for p in passes:
            executor = getattr(self, _EXEC[p]) or self.resolve(p)
            if not isinstance(executor, Native) or executor.retry_at is not None:
                return False
        return True

    # -- resolving -------------------------------------------------------------------------
    def resolve(self, pass_: str):
        """Look the pass's plan up (tuning it under the ``tune`` miss policy) and keep its executor."""
        problem = self.problem.for_pass(pass_)
        try:
            br = bridge(self.device.type)
            runtime = self.runtime
            with runtime._lock:  # a miss is tuned here, and the runtime says so
                plan = br.call(self.device.index, runtime.plan_for, problem, br.backend)
            if plan.strategy == "torch":
                fn, flags = get_strategy("torch").native(problem, plan.config)
                executor = Native(fn, plan.label, flags)
            else:
                executor = ArrayPlan(plan, br, problem)
            if plan.source in runtime._PROVISIONAL:  # served for want of its own plan: looked up again later
                executor.retry_at = time.monotonic() + runtime.miss_ttl_s
            elif isinstance(executor, ArrayPlan) and self._duels():
                executor = self._duel(problem, executor)
        except TuningError as exc:  # tuned here and nothing survived: PyTorch runs it, for good (tuning it
            # again would stall a training step for the same answer; `convtune tune` can try again)
            return self._fall_back(pass_, f"{type(exc).__name__}: {exc}")
        except ConvtuneError as exc:  # no plan (a miss the policy does not tune): PyTorch runs it, and the
            # plan is looked up again later (another process may tune it)
            return self._fall_back(pass_, f"{type(exc).__name__}: {exc}", retry=True)
        except Exception as exc:  # no backend, a library that fails: PyTorch runs it
            return self._fall_back(pass_, f"{type(exc).__name__}: {exc}")
        return self._keep(pass_, executor)

    def _keep(self, pass_: str, executor):
        """``executor`` as the pass's from now on; the remembered native verdicts are forgotten."""
        setattr(self, _EXEC[pass_], executor)
        self.verdicts = {}
        if pass_ == "fwd":
            self.fwd_infer = None  # (settle sets it again after its own _keep)
        return executor

    def _duels(self) -> bool:
        allowed = self.runtime.planner_options.get("strategies")
        return self.device.type in DUEL_DEVICE_TYPES and (allowed is None or "torch" in allowed)

    def _duel(self, problem: ConvProblem, plan: "ArrayPlan"):
        """The plan, or PyTorch's convolution where that is faster per call in the layer (see the module
        docstring); where the duel itself fails, the plan (its own failures fall back when it runs)."""
        flags = (True, problem.math == "tf32")
        native = Native(native_for(problem, benchmark=flags[0], tf32=flags[1]), "torch", flags)
        floor = None
        if problem.flops() >= DUEL_FLOOR_FLOPS:  # a search that can cost seconds: not where its floor loses already
            def floor(a, b):
                return search_floor(problem, a, b, self.device)
        try:
            times, hosts, bound, devices = self._per_call(plan.label, duel_conditions(plan.plan.strategy),
                                                          ("plan_us", "native_us"), [plan, native],
                                                          lambda: duel_operands(problem, self.device), problem, floor)
        except Exception as exc:
            log.info("convtune: no duel for %s on %s (%s: %s); its plan %s runs", problem.describe(),
                     self.device, type(exc).__name__, exc, plan.label)
            return plan
        (t_plan, t_native), where, note = self._decisive(times, devices)
        if t_native > t_plan * (1 + DUEL_MARGIN):
            plan.duel = Duel(*times, native, *(hosts or (None, None)), bound, *(devices or (None, None)))
            return plan
        native.label = f"torch ({where} {t_native * 1e6:.0f} us per call, {plan.label} {t_plan * 1e6:.0f} us)"
        say_once(f"duel:{problem.key()}:{self.device}:{self.graphed}", "convtune: PyTorch's convolution runs %s on %s: "
                 "%.0f us per call %s against %.0f us for the plan %s (%s)", problem.describe(), self.device,
                 t_native * 1e6, where, t_plan * 1e6, plan.label, note, level=logging.INFO)
        return native

    def _decisive(self, times, devices) -> tuple:
        """The two contenders' seconds per call that decide their duel, where they were measured and what that
        includes, as said: on the device alone in steps replayed from CUDA graphs (where measured), else in the
        layer."""
        if self.graphed and devices:
            return tuple(devices), "on the device alone", "steps in CUDA graphs"
        return tuple(times), "in the layer", "host work included"

    def _per_call(self, label: str, conditions: str, fields, contenders, operands, problem, floor=None) -> tuple:
        """Two contenders' seconds per call in the layer, the host's seconds per call to issue each
        (:func:`per_call_seconds` on ``operands()``; ``None`` for the host's where not measured), whether the second's
        is a floor (below) and their seconds per call on the device alone (``None`` where not measured), or their stored
        verdict: a duel's record in the plan store, keyed by device, ``problem``, ``label`` and ``conditions``, that
        ``fields`` name (in microseconds; the host's under the same names with ``_host``, the device's with
        ``_device``). A new verdict is stored; raises where the duel itself fails.

        ``floor(a, b)``, where given, puts a floor under the second contender's seconds per call and says its host
        time per call (``(seconds, host seconds)``): where the floor is above the first's time by :data:`DUEL_MARGIN`,
        the second is not run and the floor stands for its time (the record says so under ``bound``)."""
        host_fields = [f.replace("_us", "_host_us") for f in fields]
        device_fields = [f.replace("_us", "_device_us") for f in fields]
        store, device_key, stored = self.runtime.store, None, None
        try:
            device_key = bridge(self.device.type).backend.device_info().key()
            stored = store.get_record("duel", duel_key(device_key, problem, label, conditions))
        except Exception as exc:  # a cache that fails: duel anyway
            log.debug("convtune: no stored duel for %s: %s", problem.key(), exc)
        if stored is not None:
            def read(names):
                return tuple(stored[f] * 1e-6 for f in names) if all(f in stored for f in names) else None
            return tuple(stored[f] * 1e-6 for f in fields), read(host_fields), stored.get("bound") == fields[1], \
                read(device_fields)
        a, b = operands()
        measured: list = []
        on_device: list = []

        def measure():
            under = self._under_floor(problem, contenders[0], floor, a, b, measured, on_device) \
                if floor is not None else None
            if under is not None:
                return under, True
            return per_call_seconds(contenders, a, b, self.device, hosts=measured, devices=on_device), False
        times, bound = where_pass_runs(problem.pass_, measure, self.device)  # (on the thread that runs the pass)
        hosts = tuple(measured) if len(measured) == len(times) else None
        devices = tuple(on_device) if len(on_device) == len(times) else None
        if device_key is not None:
            record = {"problem": problem.key(), "device_key": device_key, "plan": label, "conditions": conditions,
                      **{f: t * 1e6 for f, t in zip(fields, times)}}
            if bound:
                record["bound"] = fields[1]
            if hosts is not None:
                record.update({f: t * 1e6 for f, t in zip(host_fields, hosts)})
            if devices is not None:
                record.update({f: t * 1e6 for f, t in zip(device_fields, devices)})
            try:
                store.put_record("duel", duel_key(device_key, problem, label, conditions), record)
            except Exception as exc:
                log.debug("convtune: the duel of %s not stored: %s", problem.key(), exc)
        return tuple(times), hosts, bound, devices

    def _under_floor(self, problem, first, floor, a, b, hosts: list, devices: list):
        """``[first's seconds per call, the floor]`` where ``floor(a, b)`` is above the first contender's time per
        call by :data:`DUEL_MARGIN` (``hosts`` gets both host times, ``devices`` both device times where measured: the
        floor is one on the device), else ``None``."""
        under, under_host = floor(a, b)
        t_first = per_call_seconds([first], a, b, self.device, hosts=hosts, devices=devices)[0]
        if devices:
            devices.append(under)
        if under > t_first * (1 + DUEL_MARGIN):
            log.info("convtune: %s: PyTorch's algorithm search is not run in the layer: its pick cannot take under "
                     "%.0f us per call, and the plan takes %.0f us", problem.describe(), under * 1e6,
                     t_first * 1e6)
            hosts.append(under_host)
            return [t_first, under]
        hosts.clear()
        devices.clear()
        return None

    def duel_trip(self, trip, kept, per_pass):
        """``keep_spectra='auto'``: ``trip``, whose verdict was measured on the device alone, against the layer's
        per-pass plans per training call in the layer, host work included, as a training step sees them (``kept(x,
        w)`` and ``per_pass(x, w)``: a forward pass and both gradients each, on random operands of the layer). The trip
        where it is faster by :data:`DUEL_MARGIN`, else ``None`` (said once); on a device without duels, or where the
        duel itself fails, the trip. The verdict is stored as a pass's duel is (:func:`trip_duel_conditions`)."""
        if self.device.type not in DUEL_DEVICE_TYPES:
            return trip
        problem = self.problem
        try:
            times, _hosts, _bound, devices = self._per_call(
                f"{trip.config.label()}+kept-spectra", trip_duel_conditions(), ("trip_us", "per_pass_us"),
                [kept, per_pass], lambda: [t.requires_grad_() for t in duel_operands(problem, self.device)], problem)
        except Exception as exc:
            log.info("convtune: no round-trip duel for %s on %s (%s: %s); its round trip runs", problem.describe(),
                     self.device, type(exc).__name__, exc)
            return trip
        (t_trip, t_plans), where, note = self._decisive(times, devices)
        if t_plans > t_trip * (1 + DUEL_MARGIN):
            return trip
        say_once(f"trip-duel:{problem.key()}:{self.device}:{self.graphed}", "convtune: %s on %s runs its per-pass "
                 "plans, not the round trip %s: %.0f us per training call %s against %.0f us (%s)", problem.describe(),
                 self.device, trip.config.label(), t_plans * 1e6, where, t_trip * 1e6, note, level=logging.INFO)
        return None

    def _fall_back(self, pass_: str, reason: str, retry: bool = False):
        problem = self.problem.for_pass(pass_)
        say_once(f"fallback:{problem.key()}:{self.device}", "convtune: PyTorch's convolution runs %s on %s: %s",
                 problem.describe(), self.device, reason)
        executor = Fallback(problem, reason)
        if retry:  # a plan may be tuned by another process meanwhile
            executor.retry_at = time.monotonic() + self.runtime.miss_ttl_s
        return self._keep(pass_, executor)

    def labels(self) -> dict:
        """The executor of each resolved pass, by name (for reports)."""
        return {p: e.label for p, name in _EXEC.items() if (e := getattr(self, name)) is not None}

    def __repr__(self):
        return f"<Route {self.problem.describe()} on {self.device} {self.labels()}>"


_detours: dict = {}


def detour_seconds(device, split: bool = True) -> float:
    """How much longer a training call (forward and both gradients) of a layer takes on the host through
    convtune's autograd functions than through PyTorch's own, measured once per device on a tiny layer whose
    passes all run PyTorch's convolution either way (so only the detour differs); 0 where it cannot be
    measured. ``split``: the gradients come from two calls (a backward pass is convtune's plan), else from
    one (:meth:`Route.native_backward`: the forward alone is)."""
    return measured_once(_detours, (device, split), lambda: _measure_detour(device, split),
                         "the autograd detour")


def measured_once(memo: dict, key, measure, what: str) -> float:
    """``memo[key]``, measured by ``measure()`` the first time it is asked; 0 where the measurement fails (never an
    error in a training loop or a tune: nothing counted), said at debug level with ``what`` was measured."""
    value = memo.get(key)
    if value is None:
        try:
            value = measure()
        except Exception as exc:
            log.debug("convtune: %s on %s not measured: %s", what, key, exc)
            value = 0.0
        memo[key] = value
    return value


def all_native(route: Route, benchmark: bool | None = None, tf32: bool | None = None) -> Route:
    """``route`` with every pass PyTorch's own convolution, for good, with the cuDNN settings ``benchmark`` and
    ``tf32`` during its calls (``None``: the process's); a fresh route: what the drop-in's own costs are measured on,
    where only the path around PyTorch's call differs, and what a tune-ahead's weighing runs spared layers on."""
    flags = (benchmark, tf32)
    for p, name in _EXEC.items():
        setattr(route, name, Native(native_for(route.problem.for_pass(p), benchmark=benchmark, tf32=tf32), "torch",
                                    flags))
    return route


def seconds_per_call(fn, device, calls: int) -> float:
    """Seconds per call of ``fn()``, ``calls`` of them issued back to back, the device synchronised before and after
    (the host's work and the device's together)."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls


def _measure_detour(device, split: bool = True, calls: int = 100, rounds: int = 7) -> float:
    problem = layer_problem((2, 4, 8, 8), (4, 4, 3, 3), (1, 1), (1, 1), (1, 1), 1, "fp32")
    route = all_native(Route(problem, None, device))
    if split:
        route.both = None
    x = torch.randn(problem.x_shape, device=device, requires_grad=True)
    w = torch.randn(problem.w_shape, device=device, requires_grad=True)
    conv = torch.nn.functional.conv2d

    # (the backward of a sum, as a training step's loss: a backward given a gradient tensor has PyTorch import its
    # symbolic shapes, and SymPy with them, on its first call: seconds of a tune-ahead where that had not happened)
    def through():
        eager_forward(x, w, None, route).sum().backward()

    def direct():
        conv(x, w, None, 1, 1).sum().backward()
    with torch.autocast(device.type, enabled=False), torch.enable_grad():  # (a training call may be under AMP)
        for fn in (through, direct):  # warm-up (cuDNN's choices, the allocator)
            for _ in range(5):
                fn()
        # the two paths in turn, round by round (what drifts weighs on both); the median difference
        differences = sorted(seconds_per_call(through, device, calls) - seconds_per_call(direct, device, calls)
                             for _ in range(rounds))
        return max(0.0, differences[len(differences) // 2])


def layer_problem(x_shape, w_shape, stride, padding, dilation, groups, math, dtype=torch.float32,
                  layout="channels_first") -> ConvProblem:
    """The forward problem of a layer signature (``ValueError`` where the geometry is invalid)."""
    return ConvProblem.make(batch=x_shape[0], in_channels=x_shape[1], out_channels=w_shape[0],
                            input_size=tuple(x_shape[2:]), kernel_size=tuple(w_shape[2:]), stride=stride,
                            padding=padding, dilation=dilation, groups=groups, math=math, dtype=DTYPES[dtype],
                            layout=layout)


def route_for(x_shape, w_shape, stride, padding, dilation, groups, math: str, device,
              runtime: Runtime | None = None, dtype=torch.float32, layout: str = "channels_first") -> Route:
    """The route of a layer signature, made once per runtime (its memo ``'torch'``)."""
    rt = runtime or default_runtime()
    memo = rt.layer_memo("torch")
    key = (x_shape, w_shape, stride, padding, dilation, groups, math, device, dtype, layout)
    route = memo.get(key)
    if route is None:
        problem = layer_problem(x_shape, w_shape, stride, padding, dilation, groups, math, dtype, layout)
        route = memo.setdefault(key, Route(problem, rt, device))
    return route
