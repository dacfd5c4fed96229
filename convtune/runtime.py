"""Runtime dispatch: a convolution call finds its plan, then runs it.

Lookup order, the one place it is written down:

1. an **explicit plan** passed by the caller (``plan=``) is used as is;
2. else the runtime's **memo** of built plans for this exact call signature
   (one dict lookup: the warm path, no problem object is built);
3. else the **plan store** (in memory, or the persistent cache) for the
   problem's key on this device: a stored decision is built, never re-timed;
4. else the **miss policy**: ``tune`` (run the planner once and store the
   decision; where another process sharing the cache is tuning the problem, as the ranks of a
   ``torch.distributed`` job do with one model's shapes, wait for its plan instead, see
   :mod:`convtune.worklist`), ``nearest`` (at once, the plan of the nearest tuned problem of the same
   kind, checked against float64 first, else the heuristic; the problem is noted as
   pending, for ``convtune tune --pending``), ``heuristic`` (a fast default, not stored,
   also pending), or ``error``.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time

import numpy as np

from . import precision, roundtrip
from .backend import Backend, backend_for, get_backend
from .cache import MemoryPlanStore, PlanCache, PlanStore
from .errors import CacheError, ConvtuneError, TuningError
from .fft import cost
from .plan import Decision, Plan
from .planner import Planner, build_from_config, build_plan, check_config, heuristic_decision
from .problem import ConvProblem, _tuple, integral
from .roundtrip import DEFAULT_KEEP_LIMIT
from .worklist import POLL_S, store_leases

log = logging.getLogger("convtune")

MISS_POLICIES = ("tune", "nearest", "heuristic", "error")
#: Seconds a call served by the heuristic (or, in the PyTorch layer, by PyTorch for want of a plan)
#: waits before its problem is looked up again.
MISS_TTL_S = 30.0


class _Held:
    """:meth:`Runtime.decision_for`'s answer, with ``wait=False``, for a problem another process is tuning."""

    def __init__(self, holder: str):
        self.holder = holder

    def __repr__(self):
        return f"<held by {self.holder}>"


class Runtime:
    """Holds the plan store, the miss policy and the memo of built plans.

    Parameters
    ----------
    store : PlanStore, optional
        Defaults to a fresh :class:`MemoryPlanStore`.
    miss_policy : {'tune', 'heuristic', 'error'}
    planner_options : dict, optional
        Keyword arguments for :class:`~convtune.planner.Planner` when tuning on a miss
        (``timer``, ``workspace_limit``, ``time_budget_s``, ``strategies``).
    keep_limit : int or None
        Most bytes one layer's round trip may keep between its passes (see :mod:`convtune.roundtrip`;
        ``None``: no limit).
    miss_ttl_s : float
        A call served by the ``heuristic`` policy looks its problem up again after this many seconds,
        so that a plan another process has tuned since is picked up.

    A store that fails (a database down, frozen or unreadable) does not stop a call: the failure is
    logged once, the lookup counts as a miss, and what this runtime tunes meanwhile is kept in its
    memory.
    """

    def __init__(self, store: PlanStore | None = None, miss_policy: str = "tune", planner_options: dict | None = None,
                 keep_limit: int | None = DEFAULT_KEEP_LIMIT, miss_ttl_s: float = MISS_TTL_S):
        if miss_policy not in MISS_POLICIES:
            raise ValueError(f"unknown miss policy {miss_policy!r}; acceptable: {', '.join(MISS_POLICIES)}")
        self.store = store if store is not None else MemoryPlanStore()
        self.miss_policy = miss_policy
        self.planner_options = dict(planner_options or {})
        self._memo: dict[tuple, Plan] = {}
        self._trips: dict[tuple, object] = {}  # (device key, forward problem key) -> TripDecision or None
        self._layer_memos: dict[str, dict] = {}  # front ends' own memos (the PyTorch layer's routes)
        self.keep_limit = keep_limit
        self.miss_ttl_s = miss_ttl_s
        self._retry_at: dict[tuple, float] = {}  # memo signature of a heuristic plan -> when to look again
        self._unsaved: dict[tuple[str, str], Decision] = {}  # tuned while the store failed
        self._store_failures = 0
        self._lock = threading.Lock()
        self.tuned = 0  # problems this runtime tuned on a miss
        self._lease_keeper = None  # Leases on the store, made on the first tuning (None: it keeps none)
        self._leases_checked = False
        self._calibrations_loaded = False

    # -- the store, and what happens when it fails -------------------------------------------------
    def _stored(self, problem: ConvProblem, device_key: str) -> Decision | None:
        kept = self._unsaved.get((device_key, problem.key())) if self._unsaved else None
        if kept is not None:
            return kept
        try:
            return self.store.get(problem, device_key)
        except CacheError as exc:
            self._store_failed("looked up", exc)
            return None

    def _save(self, decision: Decision) -> None:
        try:
            self.store.put(decision)
        except CacheError as exc:
            self._store_failed("stored", exc)
            self._unsaved[(decision.device_key, decision.problem.key())] = decision

    def _store_failed(self, what: str, exc: CacheError) -> None:
        self._store_failures += 1
        level = logging.WARNING if self._store_failures == 1 else logging.DEBUG
        log.log(level, "convtune: a plan could not be %s (%s); going on without the plan cache for it: misses are "
                "handled by the miss policy, and what is tuned stays in this process", what, exc)

    #: plans that serve a call for want of the problem's own: looked up again after ``miss_ttl_s``
    _PROVISIONAL = ("heuristic", "nearest")

    def plan_for(self, problem: ConvProblem, backend: Backend) -> Plan:
        """Steps 3 and 4 of the lookup order for one problem."""
        device_key = backend.device_info().key()
        decision = self._stored(problem, device_key)
        if decision is not None:
            return build_plan(decision, backend, source="cache")
        if self.miss_policy == "error":
            raise ConvtuneError(f"no tuned plan for {problem.key()} on {device_key}; run `convtune tune` for this "
                                "network first, or use miss_policy='tune', 'nearest' or 'heuristic'")
        if self.miss_policy == "nearest":
            plan = self._nearest_plan(problem, backend, device_key)
            if plan is not None:
                return plan
        if self.miss_policy in ("heuristic", "nearest"):
            name, config = heuristic_decision(problem, backend)
            self._note_pending(problem, backend, "heuristic")
            return build_from_config(problem, name, config, backend, "heuristic")
        return build_plan(self._tune_and_store(problem, backend), backend, source="measured")

    def _nearest_plan(self, problem: ConvProblem, backend: Backend, device_key: str) -> Plan | None:
        """The plan of the nearest tuned problem of the same kind, built for ``problem`` and checked once
        against float64 on a small batch (a configuration is made for a shape: one that does not fit this
        one fails to build or is wrong, and is not used); ``None`` where there is none that works."""
        try:
            decision = self.store.nearest(problem, device_key)
        except CacheError as exc:
            self._store_failed("looked up", exc)
            return None
        if decision is None:
            return None
        winner = decision.winner
        try:
            check_config(problem, winner.strategy, winner.config, backend)
            plan = build_from_config(problem, winner.strategy, winner.config, backend, "nearest")
        except Exception as exc:  # the configuration does not carry over to this shape
            log.info("convtune: the plan of %s does not serve %s (%s)", decision.problem.describe(),
                     problem.describe(), exc)
            return None
        log.info("convtune: %s served by the plan of the nearest tuned problem, %s (%s); it is pending, to be tuned "
                 "by `convtune tune --pending`", problem.describe(), decision.problem.describe(), winner.label)
        self._note_pending(problem, backend, decision.problem.key())
        return plan

    def _note_pending(self, problem: ConvProblem, backend: Backend, served_by: str) -> None:
        try:
            self.store.add_pending(problem, backend.device_info(), served_by)
        except CacheError as exc:
            self._store_failed("noted as pending", exc)

    def _load_calibrations(self) -> None:
        """Before this runtime's first tuning: the FFT cost model's calibrations stored with its plans."""
        if self._calibrations_loaded:
            return
        self._calibrations_loaded = True
        try:
            cost.load_calibrations(self.store)
        except CacheError as exc:
            self._store_failed("looked up", exc)

    def _leases(self):
        if not self._leases_checked:
            self._leases_checked = True
            self._lease_keeper = store_leases(self.store)
        return self._lease_keeper

    def _lease(self, problem: ConvProblem, backend: Backend, wait: bool):
        """Take ``problem``'s lease where the store keeps leases: ``None`` (tune it here: the lease is this
        runtime's, or there are no leases), a :class:`Decision` (another process tuned it meanwhile), or,
        with ``wait=False``, :class:`_Held` where another process is tuning it now."""
        leases = self._leases()
        if leases is None:
            return None
        device = backend.device_info()
        said = False
        while True:
            try:
                other = leases.take(problem, device)
                found = self.store.get(problem, device.key(), fresh=True)
            except CacheError as exc:
                self._store_failed("leased", exc)
                return None
            if found is not None:  # stored by the other process (before this lease, or while waiting)
                if other is None:
                    leases.release(problem, device.key())
                return found
            if other is None:
                return None
            if not wait:
                return _Held(other)
            if not said:
                said = True
                log.info("convtune: %s is being tuned by %s (another process on this plan cache); waiting for its "
                         "plan", problem.describe(), other)
            time.sleep(POLL_S)

    def _tune_and_store(self, problem: ConvProblem, backend: Backend, ahead: bool = False, wait: bool = True):
        held = self._lease(problem, backend, wait)
        if held is not None:
            return held
        self._load_calibrations()
        started = time.perf_counter()
        try:
            try:
                decision = Planner(backend, **self.planner_options).tune(problem)
            finally:
                # a call that stalls for seconds deserves a word: at WARNING the first time, then at INFO
                level = logging.WARNING if self.tuned == 0 and not ahead else logging.INFO
                log.log(level, "convtune: %s was not in the plan cache: tuned it in %.1f s%s", problem.describe(),
                        time.perf_counter() - started, "" if self.tuned or ahead else
                        " (every new shape costs this once; tune ahead with `convtune tune NETWORK` or, in "
                        "PyTorch, convtune.torch.tune(model, example_inputs))")
            self._save(decision)
        finally:  # given back once the plan is stored: a process waiting on it then finds the plan
            if self._lease_keeper is not None:
                self._lease_keeper.release(problem, backend.device_info().key())
        self.tuned += 1
        return decision

    def decision_for(self, problem: ConvProblem, backend: Backend, ahead: bool = False, wait: bool = True):
        """The stored decision of ``problem``, tuned and stored first under the ``tune`` policy (``ahead``:
        tuning ahead of the calls, which is then not news worth a warning). Where another process on the
        same cache is tuning it, its plan is waited for; with ``wait=False`` a ``_Held`` marker is
        returned instead (tuning ahead then comes back to it later)."""
        decision = self._stored(problem, backend.device_info().key())
        if decision is None and self.miss_policy == "tune":
            decision = self._tune_and_store(problem, backend, ahead, wait)
        return decision

    def round_trip_for(self, problem: ConvProblem, backend: Backend, refresh: bool = False):
        """The round-trip decision (:class:`~convtune.roundtrip.TripDecision`) of ``problem``'s layer:
        memo, then the store, then (``tune`` policy only) measured against the three per-pass
        winners and stored. ``None`` where there is none and the policy does not tune.
        ``refresh``: measure again (tune policy) even where one is stored."""

        fwd = problem.for_pass("fwd")
        device_key = backend.device_info().key()
        key = (device_key, fwd.key())
        if key in self._trips and not refresh:
            return self._trips[key]
        try:
            decision = None if refresh else roundtrip.load_trip(self.store, fwd, device_key)
        except CacheError as exc:
            self._store_failed("looked up", exc)
            decision = None
        if decision is not None and roundtrip.stale(decision.version, fwd):
            log.info("round trip of %s: stored decision is of version %d, now %d; measuring again", fwd.key(),
                     decision.version, roundtrip.VERSION)
            decision = None
        if decision is None and self.miss_policy == "tune":
            self._load_calibrations()
            per_pass = [self.decision_for(fwd.for_pass(q), backend) for q in ("fwd", "dgrad", "wgrad")]
            times = [d.winner.median_s for d in per_pass]
            per_pass_s = sum(times) if all(t is not None for t in times) else None
            decision = roundtrip.tune_round_trip(fwd, backend, per_pass_s, [d.winner.label for d in per_pass],
                                                 timer=self.planner_options.get("timer"), keep_limit=self.keep_limit)
            try:
                roundtrip.save_trip(self.store, decision)
            except CacheError as exc:
                self._store_failed("stored", exc)
        self._trips[key] = decision
        return decision

    def dispatch(self, signature: tuple, make_problem, a, b, plan: Plan | None, out):
        """Run one pass: explicit plan, memo, store, miss policy (see the module docstring)."""
        if plan is None:
            plan = self._memo.get(signature)
            if plan is None or (plan.source in self._PROVISIONAL and self._retry_at[signature] <= time.monotonic()):
                backend = backend_for(a, b)
                problem = make_problem()
                with self._lock:
                    plan = self.plan_for(problem, backend)
                    self._memo[signature] = plan
                    if plan.source in self._PROVISIONAL:  # looked up again later: a tuned plan may be stored by then
                        self._retry_at[signature] = time.monotonic() + self.miss_ttl_s
        return plan(a, b, out)

    def plan_in_memo(self, problem: ConvProblem) -> Plan:
        """The built plan this runtime dispatched ``problem`` to (after a call)."""
        for plan in self._memo.values():
            if plan.problem == problem:
                return plan
        raise KeyError(f"no plan for {problem.key()} has been dispatched by this runtime")

    def layer_memo(self, name: str) -> dict:
        """A front end's memo of what it built from this runtime's plans (the PyTorch layer keeps its
        per-layer routes here), emptied with the runtime's own by :meth:`clear_memo`."""
        memo = self._layer_memos.get(name)
        if memo is None:
            memo = self._layer_memos.setdefault(name, {})
        return memo

    def clear_memo(self) -> None:
        self._memo.clear()
        self._retry_at.clear()
        self._trips.clear()
        for memo in self._layer_memos.values():
            memo.clear()

    def __repr__(self):
        return f"<Runtime miss_policy={self.miss_policy} store={self.store!r} memo={len(self._memo)}>"


_default_runtime: Runtime | None = None


def default_runtime() -> Runtime:
    """The runtime :func:`conv` and the layers use: the persistent plan cache
    (``$CONVTUNE_DB`` or ``~/.cache/convtune/plans.db``, opened on first use), tuning on a miss."""
    global _default_runtime
    if _default_runtime is None:
        _default_runtime = Runtime(store=PlanCache(lazy=True))
    return _default_runtime


def use_cache(url: str | None = None, miss_policy: str = "tune", **planner_options) -> Runtime:
    """Make the default runtime read and write the plan cache at ``url`` (see :func:`convtune.cache.resolve_url`).

    Examples
    --------
    >>> import os, tempfile, convtune
    >>> rt = convtune.use_cache(os.path.join(tempfile.mkdtemp(), "plans.db"), miss_policy="heuristic")
    >>> rt.miss_policy
    'heuristic'
    """
    runtime = Runtime(store=PlanCache(url), miss_policy=miss_policy, planner_options=planner_options)
    set_default_runtime(runtime)
    return runtime


def set_default_runtime(runtime: Runtime | None) -> Runtime | None:
    """Make ``runtime`` the one that :func:`conv` and the layers use (``None``: back to the lazily made
    default); returns the previous one."""
    global _default_runtime
    previous, _default_runtime = _default_runtime, runtime
    return previous


def tune(problem: ConvProblem, runtime: Runtime | None = None, backend: Backend | str = "numpy",
         **planner_options) -> Decision:
    """Tune ``problem`` now and store the decision, so later calls dispatch without timing.

    Examples
    --------
    >>> import numpy as np, convtune
    >>> p = convtune.ConvProblem.make(batch=2, in_channels=3, out_channels=4, input_size=(9, 9), kernel_size=3)
    >>> convtune.tune(p).winner.status
    'winner'
    """
    runtime = runtime or default_runtime()
    backend = get_backend(backend) if isinstance(backend, str) else backend
    decision = Planner(backend, **{**runtime.planner_options, **planner_options}).tune(problem)
    runtime.store.put(decision)
    return decision


# -- the public convolution functions ----------------------------------------------------

def _hashable(value):
    return tuple(value) if isinstance(value, list) else value


def _device_id(a):
    """The CUDA device a CuPy array lives on (``None`` for NumPy): built plans (cuFFT plans, cuDNN
    graphs) belong to one device, so the memo keeps one per device."""
    return getattr(getattr(a, "device", None), "id", None)


def _precision(a, b) -> dict:
    """The dtype and layout of a call's operands (they must share a dtype; the layout is ``a``'s)."""
    dtype = precision.dtype_of(a)
    if precision.dtype_of(b) != dtype:
        raise ValueError(f"the operands have dtypes {a.dtype} and {b.dtype}; convtune runs both in one dtype")
    return {"dtype": dtype, "layout": precision.layout_of(a)}


def _layer_fields(x_shape, w_shape, stride, padding, dilation, groups, math, pass_, dtype="float32",
                  layout="channels_first"):
    if len(x_shape) < 3 or len(w_shape) != len(x_shape):
        raise ValueError(f"expected input (N, C, *spatial) and weight (C_out, C_in/groups, *kernel) of the same "
                         f"rank; got shapes {tuple(x_shape)} and {tuple(w_shape)}")
    groups = integral(groups, "groups")
    if groups <= 0:
        raise ValueError(f"groups must be a positive integer, got {groups}")
    if w_shape[1] * groups != x_shape[1]:
        raise ValueError(f"weight shape {tuple(w_shape)} expects {w_shape[1] * groups} input channels with "
                         f"groups={groups}, but the input has {x_shape[1]}")
    return ConvProblem.make(batch=x_shape[0], in_channels=x_shape[1], out_channels=w_shape[0],
                            input_size=tuple(x_shape[2:]), kernel_size=tuple(w_shape[2:]), stride=stride,
                            padding=padding, dilation=dilation, groups=groups, math=math, pass_=pass_, dtype=dtype,
                            layout=layout)


def _backward_problem(x_shape, w_shape, dy, stride, padding, dilation, groups, math, pass_, **kinds):
    """The problem of a backward pass, checking that ``dy`` has the forward output's shape."""
    problem = _layer_fields(x_shape, w_shape, stride, padding, dilation, groups, math, pass_, **kinds)
    if tuple(dy.shape) != problem.y_shape:
        raise ValueError(f"dy has shape {tuple(dy.shape)} but input {tuple(x_shape)} and weight {tuple(w_shape)} "
                         f"give outputs of shape {problem.y_shape}")
    return problem


# -- PyTorch's argument forms: "same"/"valid" padding, unbatched input, an empty batch ------------------

def padding_sides(padding, kernel, dilation, stride) -> list[tuple[int, int]]:
    """Zeros before and after each spatial axis for ``padding``: an int, a sequence, ``'valid'`` or
    ``'same'`` (an even kernel's extra zero after, as in PyTorch; stride 1 only)."""
    rank = len(kernel)
    if isinstance(padding, str):
        if padding == "valid":
            return [(0, 0)] * rank
        if padding == "same":
            if any(s != 1 for s in _per_axis(stride, rank, "stride")):
                raise ValueError("padding='same' is not supported for strided convolutions")
            totals = [d * (k - 1) for d, k in zip(_per_axis(dilation, rank, "dilation"), kernel)]
            return [(t // 2, t - t // 2) for t in totals]
        raise ValueError(f"invalid padding string {padding!r}; acceptable: 'valid', 'same', or integers")
    return [(p, p) for p in _per_axis(padding, rank, "padding")]


def _per_axis(value, rank, name):
    return _tuple(value, rank, name)


def _general(a, w, padding):
    """Does this call need :func:`_normalized` (a string padding, an unbatched or empty input)?"""
    return isinstance(padding, str) or a.ndim == w.ndim - 1 or (a.ndim == w.ndim and a.shape[0] == 0)


def _normalized(x_like, w, stride, padding, dilation):
    """``(unbatched, left pads, right extra per axis)`` of a call in PyTorch's forms."""
    if w.ndim < 3:
        raise ValueError(f"expected a weight (C_out, C_in/groups, *kernel); got shape {tuple(w.shape)}")
    unbatched = len(x_like) == w.ndim - 1
    sides = padding_sides(padding, tuple(w.shape[2:]), dilation, stride)
    return unbatched, tuple(left for left, _ in sides), tuple(right - left for left, right in sides)


def _xp(a):
    return importlib.import_module("cupy") if type(a).__module__.startswith("cupy") else np


def _pad_after(xp, a, extra):
    if not any(extra):
        return a
    return xp.pad(a, [(0, 0), (0, 0)] + [(0, e) for e in extra])


def _into(out, result):
    if out is None:
        return result
    out[...] = result
    return out


def _conv_general(x, w, stride, padding, dilation, groups, math, plan, out, runtime):
    xp = _xp(x)
    unbatched, pads, extra = _normalized(x.shape, w, stride, padding, dilation)
    xb = _pad_after(xp, x[None] if unbatched else x, extra)
    if xb.shape[0] == 0:  # an empty batch: an empty result, as in PyTorch
        problem = _layer_fields((1, *xb.shape[1:]), w.shape, stride, pads, dilation, groups, math, "fwd")
        y = xp.zeros((0, *problem.y_shape[1:]), dtype=x.dtype)
    else:
        y = conv(xb, w, stride, pads, dilation, groups, math=math, plan=plan, runtime=runtime)
    return _into(out, y[0] if unbatched else y)


def _dgrad_general(dy, w, x_shape, stride, padding, dilation, groups, math, plan, out, runtime):
    xp = _xp(dy)
    unbatched, pads, extra = _normalized(x_shape, w, stride, padding, dilation)
    full = (1, *x_shape) if unbatched else tuple(x_shape)
    padded = (*full[:2], *(n + e for n, e in zip(full[2:], extra)))
    dyb = dy[None] if unbatched else dy
    if full[0] == 0:
        dx = xp.zeros(full, dtype=dy.dtype)
    else:
        dx = conv_backward_data(dyb, w, padded, stride, pads, dilation, groups, math=math, plan=plan, runtime=runtime)
        dx = dx[(slice(None), slice(None), *(slice(0, n) for n in full[2:]))]
    return _into(out, dx[0] if unbatched else dx)


def _wgrad_general(x, dy, w_shape, stride, padding, dilation, groups, math, plan, out, runtime):
    xp = _xp(x)
    w_like = np.empty(w_shape, dtype=np.uint8)  # only its shape is read
    unbatched, pads, extra = _normalized(x.shape, w_like, stride, padding, dilation)
    xb = _pad_after(xp, x[None] if unbatched else x, extra)
    dyb = dy[None] if unbatched else dy
    if xb.shape[0] == 0:  # nothing summed: a zero gradient
        dw = xp.zeros(tuple(w_shape), dtype=x.dtype)
    else:
        dw = conv_backward_filter(xb, dyb, w_shape, stride, pads, dilation, groups, math=math, plan=plan,
                                  runtime=runtime)
    return _into(out, dw)


def conv(x, w, stride=1, padding=0, dilation=1, groups=1, *, math="fp32", plan: Plan | None = None, out=None,
         runtime: Runtime | None = None):
    """Forward convolution (cross-correlation, as in PyTorch) through a tuned plan.

    Parameters
    ----------
    x : array (N, C_in, *spatial) or, unbatched, (C_in, *spatial); NumPy or CuPy; float32 or float16;
        channels-last strides make a channels_last problem (see :mod:`convtune.precision`)
    w : array (C_out, C_in // groups, *kernel), of ``x``'s dtype
    stride, dilation : int or sequence of ints, per spatial axis
    padding : int, sequence of ints, ``'valid'`` or ``'same'`` (stride 1; an even kernel's extra zero
        goes after, as in PyTorch)
    groups : int
    math : {'fp32', 'tf32'}
    plan : Plan, optional
        Use this plan and skip the lookup.
    out : array, optional
        Written in place and returned.

    Returns
    -------
    array (N, C_out, *out_spatial), of the same kind as ``x``.

    Examples
    --------
    >>> import numpy as np, convtune
    >>> x = np.random.rand(2, 3, 8, 8).astype(np.float32)
    >>> w = np.random.rand(4, 3, 3, 3).astype(np.float32)
    >>> convtune.conv(x, w, padding=1).shape
    (2, 4, 8, 8)
    """
    if _general(x, w, padding):
        return _conv_general(x, w, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("fwd", x.shape, w.shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups, math,
           type(x), x.dtype, w.dtype, x.strides, _device_id(x))
    rt = runtime or default_runtime()

    def make():
        return _layer_fields(x.shape, w.shape, stride, padding, dilation, groups, math, "fwd", **_precision(x, w))
    return rt.dispatch(sig, make, x, w, plan, out)


def conv_backward_data(dy, w, x_shape, stride=1, padding=0, dilation=1, groups=1, *, math="fp32",
                       plan: Plan | None = None, out=None, runtime: Runtime | None = None):
    """Gradient with respect to the input: ``dx`` of shape ``x_shape`` from ``dy`` and ``w``.

    ``x_shape`` is needed because with a stride several input sizes give the same output size.
    """
    x_shape = tuple(x_shape)
    if isinstance(padding, str) or dy.ndim == w.ndim - 1 or (x_shape and x_shape[0] == 0):
        return _dgrad_general(dy, w, x_shape, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("dgrad", dy.shape, w.shape, x_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           math, type(dy), dy.dtype, w.dtype, dy.strides, _device_id(dy))
    rt = runtime or default_runtime()

    def make():
        return _backward_problem(x_shape, w.shape, dy, stride, padding, dilation, groups, math, "dgrad",
                                 **_precision(dy, w))
    return rt.dispatch(sig, make, dy, w, plan, out)


def conv_backward_filter(x, dy, w_shape, stride=1, padding=0, dilation=1, groups=1, *, math="fp32",
                         plan: Plan | None = None, out=None, runtime: Runtime | None = None):
    """Gradient with respect to the weight: ``dw`` of shape ``w_shape`` from ``x`` and ``dy``."""
    w_shape = tuple(w_shape)
    if isinstance(padding, str) or x.ndim == len(w_shape) - 1 or (x.ndim == len(w_shape) and x.shape[0] == 0):
        return _wgrad_general(x, dy, w_shape, stride, padding, dilation, groups, math, plan, out, runtime)
    sig = ("wgrad", x.shape, dy.shape, w_shape, _hashable(stride), _hashable(padding), _hashable(dilation), groups,
           math, type(x), x.dtype, dy.dtype, x.strides, _device_id(x))
    rt = runtime or default_runtime()

    def make():
        return _backward_problem(x.shape, w_shape, dy, stride, padding, dilation, groups, math, "wgrad",
                                 **_precision(x, dy))
    return rt.dispatch(sig, make, x, dy, plan, out)


__all__ = ["Runtime", "MemoryPlanStore", "PlanStore", "conv", "conv_backward_data", "conv_backward_filter", "tune",
           "default_runtime", "set_default_runtime", "use_cache", "TuningError"]
