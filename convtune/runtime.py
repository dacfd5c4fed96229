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

import logging
import threading
import time


from . import roundtrip
from .backend import Backend, backend_for, get_backend
from .cache import MemoryPlanStore, PlanCache, PlanStore
from .cache.records import broken_key
from .errors import CacheError, ConvtuneError, TuningError
from .fft import cost
from .plan import Decision, Plan
from .building import build_from_config, build_plan, check_config, heuristic_decision
from .planner import Planner
from .problem import ConvProblem
from .roundtrip import DEFAULT_KEEP_LIMIT, ledger
from .strategies import get_strategy
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
    kept_budget : float, int or None
        Most bytes the layers' kept spectra may hold at once on one device (:mod:`convtune.roundtrip.ledger`): a
        share of the device memory free when a layer first keeps spectra there (a float up to 1; default a
        quarter), a number of bytes (an int), or ``None`` (no limit). A layer whose spectra do not fit runs its
        per-pass plans for that call.
    miss_ttl_s : float
        A call served by the ``heuristic`` policy looks its problem up again after this many seconds,
        so that a plan another process has tuned since is picked up.

    A store that fails (a database down, frozen or unreadable) does not stop a call: the failure is
    logged once, the lookup counts as a miss, and what this runtime tunes meanwhile is kept in its
    memory.
    """

    def __init__(self, store: PlanStore | None = None, miss_policy: str = "tune", planner_options: dict | None = None,
                 keep_limit: int | None = DEFAULT_KEEP_LIMIT, miss_ttl_s: float = MISS_TTL_S,
                 kept_budget: float | int | None = ledger.DEFAULT_SHARE):
        if miss_policy not in MISS_POLICIES:
            raise ValueError(f"unknown miss policy {miss_policy!r}; acceptable: {', '.join(MISS_POLICIES)}")
        if not (kept_budget is None or isinstance(kept_budget, float) and 0 < kept_budget <= 1 or
                isinstance(kept_budget, int) and not isinstance(kept_budget, bool) and kept_budget >= 0):
            raise ValueError("kept_budget is a share of the free device memory (a float in (0, 1]), a number of "
                             f"bytes (an int) or None (no limit); got {kept_budget!r}")
        self.store = store if store is not None else MemoryPlanStore()
        self.miss_policy = miss_policy
        self.planner_options = dict(planner_options or {})
        for name in self.planner_options.get("strategies") or ():
            get_strategy(name)  # an unknown name fails here, listing the registered ones, not at the first miss
        self._memo: dict[tuple, Plan] = {}
        self._trips: dict[tuple, object] = {}  # (device key, forward problem key) -> TripDecision or None
        self._layer_memos: dict[str, dict] = {}  # front ends' own memos (the PyTorch layer's routes)
        self.keep_limit = keep_limit
        self.kept_budget = kept_budget
        self._kept: dict[str, ledger.KeptLedger] = {}  # device -> what the layers' kept spectra hold there
        self._kept_lock = threading.Lock()
        self.miss_ttl_s = miss_ttl_s
        self._retry_at: dict[tuple, float] = {}  # memo signature of a heuristic plan -> when to look again
        self._unsaved: dict[tuple[str, str], Decision] = {}  # tuned while the store failed
        self._store_failures = 0
        self._lock = threading.Lock()
        self.tuned = 0  # problems this runtime tuned on a miss
        self._lease_keeper = None  # Leases on the store, made on the first tuning (None: it keeps none)
        self._leases_checked = False
        self._calibrations_loaded = False
        self._unbuildable: set[tuple[str, str]] = set()  # stored plans that did not build (said once each)

    # -- the store, and what happens when it fails -------------------------------------------------
    def _stored(self, problem: ConvProblem, device_key: str, failures: list | None = None) -> Decision | None:
        """The stored decision, or ``None``; where the store fails, ``None`` too, the failure logged (once) and, where
        ``failures`` is given, appended to it."""
        kept = self._unsaved.get((device_key, problem.key())) if self._unsaved else None
        if kept is not None:
            return kept
        try:
            return self.store.get(problem, device_key)
        except CacheError as exc:
            self._store_failed("looked up", exc)
            if failures is not None:
                failures.append(exc)
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
        failures: list = []
        decision = self._stored(problem, device_key, failures)
        if decision is not None:
            try:
                return build_plan(decision, backend, source="cache")
            except Exception as exc:  # a stored plan that does not build here (damaged, edited): never an error
                # where a plan could serve the call; the heuristic's (PyTorch's own call where it is installed) does
                self._unbuildable_noted(decision, device_key, exc)
                return self._heuristic_plan(problem, backend)
        if failures:  # not a miss: the plan may well be there
            if self.miss_policy == "error":
                raise ConvtuneError(f"the plan cache did not answer for {problem.key()} ({failures[0]}); its plan may "
                                    "be there: try again once the cache answers, or use another miss policy")
            return self._unanswered_plan(problem, backend, failures[0])
        if self.miss_policy == "error":
            raise ConvtuneError(f"no tuned plan for {problem.key()} on {device_key}; run `convtune tune` for this "
                                "network first, or use miss_policy='tune', 'nearest' or 'heuristic'")
        if self.miss_policy == "nearest":
            plan = self._nearest_plan(problem, backend, device_key)
            if plan is not None:
                return plan
        if self.miss_policy in ("heuristic", "nearest"):
            self._note_pending(problem, backend, "heuristic")
            return self._heuristic_plan(problem, backend)
        try:
            decision = self._tune_and_store(problem, backend)
        except CacheError as exc:  # its lease could not be taken: the cache stopped answering
            return self._unanswered_plan(problem, backend, exc)
        return build_plan(decision, backend, source="measured")

    def _unanswered_plan(self, problem: ConvProblem, backend: Backend, exc: Exception) -> Plan:
        """The heuristic's plan for a call whose plan the cache did not say (it failed or did not answer), looked up
        again after ``miss_ttl_s``. Not tuned here: the plan may well be stored (a shared cache restarting, say), and
        tuning it again would stall the call for a plan that exists and store it twice once the cache is back."""
        log.info("convtune: the plan cache did not answer for %s (%s): the heuristic's plan serves it until it "
                 "does (looked up again in %.0f s)", problem.describe(), exc, self.miss_ttl_s)
        return self._heuristic_plan(problem, backend)

    @staticmethod
    def _heuristic_plan(problem: ConvProblem, backend: Backend) -> Plan:
        name, config = heuristic_decision(problem, backend)
        return build_from_config(problem, name, config, backend, "heuristic")

    def _unbuildable_noted(self, decision: Decision, device_key: str, exc: Exception) -> None:
        """Say once that a stored plan does not build, and note it beside the plan, where ``convtune show`` marks it."""
        problem, label = decision.problem, decision.winner.label
        if (device_key, problem.key()) in self._unbuildable:
            return
        self._unbuildable.add((device_key, problem.key()))
        log.warning("convtune: the stored plan %s of %s does not build (%s: %s); the heuristic's plan serves it "
                    "instead (`convtune tune --retune` measures it again)", label, problem.describe(),
                    type(exc).__name__, exc)
        try:
            self.store.put_record("broken", broken_key(device_key, problem.key(), label),
                                  {"problem": problem.key(), "device_key": device_key, "plan": label,
                                   "reason": f"{type(exc).__name__}: {exc}"})
        except CacheError as store_exc:
            self._store_failed("noted as broken", store_exc)

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
            except CacheError as exc:  # not tuned without its lease: another process may be tuning it
                self._store_failed("leased", exc)
                raise
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
        returned instead (tuning ahead then comes back to it later). :class:`CacheError` where the cache
        does not answer (the plan may be stored: it is not tuned again)."""
        failures: list = []
        decision = self._stored(problem, backend.device_info().key(), failures)
        if decision is None and failures:
            raise CacheError(f"the plan cache did not answer for {problem.key()}: {failures[0]}") from failures[0]
        if decision is None and self.miss_policy == "tune":
            decision = self._tune_and_store(problem, backend, ahead, wait)
        return decision

    def kept_ledger(self, device: str, free_bytes=None) -> ledger.KeptLedger:
        """The :class:`~convtune.roundtrip.ledger.KeptLedger` of the spectra layers keep on ``device`` (a name the
        front end gives it), made on first use: its budget :attr:`kept_budget` bytes, or that share of
        ``free_bytes()`` (the device memory free then; no limit where it says ``None``)."""
        with self._kept_lock:
            kept = self._kept.get(device)
            if kept is None:
                budget = self.kept_budget
                if isinstance(budget, float):
                    free = free_bytes() if free_bytes is not None else None
                    budget = int(budget * free) if free is not None else None
                kept = self._kept[device] = ledger.KeptLedger(budget)
            return kept

    def round_trip_for(self, problem: ConvProblem, backend: Backend, refresh: bool = False,
                       where_spectral: bool = False):
        """The round-trip decision (:class:`~convtune.roundtrip.TripDecision`) of ``problem``'s layer:
        memo, then the store, then (``tune`` policy only) measured against the three per-pass
        winners and stored. ``None`` where there is none and the policy does not tune.
        ``refresh``: measure again (tune policy) even where one is stored. ``where_spectral`` (a layer with
        ``keep_spectra='auto'``): measure only where one of the per-pass winners transforms its operands (an FFT
        strategy's plan); elsewhere the decision says why not, without a winner, and is neither stored nor kept,
        so that a later call without it measures."""

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
            labels = [d.winner.label for d in per_pass]
            if where_spectral and not any(_transforms(d.winner.strategy) for d in per_pass):
                return roundtrip.TripDecision(fwd, device_key, per_pass_s, tuple(labels), (), None, False, (
                    f"no per-pass plan of it transforms its operands ({', '.join(labels)}): no spectra to keep"))
            decision = roundtrip.tune_round_trip(fwd, backend, per_pass_s, labels,
                                                 timer=self.planner_options.get("timer"), keep_limit=self.keep_limit,
                                                 exhaustive=bool(self.planner_options.get("exhaustive")))
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


__all__ = ["Runtime", "MemoryPlanStore", "PlanStore", "tune", "default_runtime", "set_default_runtime", "use_cache",
           "TuningError"]


def _transforms(strategy: str) -> bool:
    """Do ``strategy``'s plans transform their operands into spectra (``False`` for a name not registered)?"""
    try:
        return get_strategy(strategy).transforms
    except ValueError:
        return False
