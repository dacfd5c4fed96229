"""cuDNN engines through the cuDNN frontend's Python graph API (``nvidia-cudnn-frontend``,
module ``cudnn``; tested with 1.32.0 and cuDNN 9.19).

Every execution plan the frontend's heuristics offer for a problem's pass is a
candidate, and so is every engine of the operation graph with its default knobs
(``get_engine_count``: engines the heuristics leave out, e.g. the one PyTorch's
own search finds); each is identified by **engine id + knobs** (never by its
index in a list).
A cached winner is rebuilt directly from its engine id and knobs
(``create_execution_plan``), without enumerating engines again. Graphs are kept
per problem in process memory; one handle per device, bound to CuPy's current
stream at every call; a plan's by-address launch (the PyTorch layer's calls, and the arrays') is replayed from a
CUDA graph per operand addresses after its second call with them (:mod:`convtune.direct.replay`: the frontend's
execute costs 110 to 140 us of host time a call). Rank 1 runs as a height-1 2-D problem, rank 3 on 5-D tensors. Every dtype and
layout runs natively: bfloat16 and float16 operands with float32 compute, channels-last problems as
tensors with channels-last strides (a 1-D one's memory is (N, L, C)). In ``fp32`` mode
plans with tensor-core numerics (TF32) are excluded by the frontend's numeric
notes, in every mode plans that reduce in reduced precision; the planner's float64 check confirms the error.

The frontend is optional: without it, or without a GPU, the strategy says why
it does not support a problem.
"""

from __future__ import annotations

import atexit
import logging
import math
import threading
import time
from dataclasses import dataclass

from .. import precision
from ..direct import replay
from ..direct import cudnn_frontend as frontend
from ..executor import Executor
from ..problem import ConvProblem
from .base import Config, Strategy, register
from .cudnn_rules import CompileRecord, EngineRecord, fixed_rule, trial_ratio

log = logging.getLogger("convtune")

#: Heuristic modes whose plans are enumerated: A and B rank engines differently (B is the
#: slower, more thorough model); FALLBACK adds engines the ranked lists leave out.
HEURISTICS = ("A", "B", "FALLBACK")
#: Building every offered plan stops after this many seconds (checked between plans).
ENUMERATION_BUDGET_S = 30.0
#: Kernels with more taps are declined: on an H100 (cuDNN 9.19, frontend 1.32) tuning the
#: 4096-tap depthwise backward-data of hyena-long-dw with heuristics A+B+FALLBACK did not finish in
#: 15 minutes, while the FFT path runs such kernels in under a millisecond.
MAX_TAPS = 1024
#: A plan compiled ahead (its build about 2.2 ms of host time on the H200) is verified at the full batch, as built while
#: listing, where the problem's direct work stays within this many FLOPs (every ResNet-50 problem at batch 32: at
#: most 7.4 G) and its kernel is not a large grouped one (cuDNN's slow case): there the two verification runs at the
#: full batch cost less than building the plan again for the verification batch. Runtime-compiled plans always are.
FULL_BATCH_VERIFY_FLOPS = 8e9

#: On a half-precision problem the plans past the first this many in the list (the heuristics' order) wait for the
#: search's second round, which runs only where the first found a candidate faster than PyTorch's call by
#: :data:`convtune.search.FIRST_ROUND_MARGIN` (:meth:`CudnnStrategy.second_round`). PyTorch's search picks among
#: cuDNN's own algorithms there, and replayed on the stored bfloat16 searches (``benchmarks/check_rules.py --rounds``:
#: ConvNeXt-T, SLaK-T and RepLKNet-31B on an H200, ResNet-50 on an H100, today's pruning rules applied) the second
#: round would have run on 53 of the 144 problems where a plan waits, and the plans chosen would have summed to at
#: most 0.7% more time than the full searches' winners (ConvNeXt-T's 1.0068x; ResNet-50's 1.0047x, where 1,899 plans
#: were left waiting). On float32 problems nothing waits: replayed so on the stored float32 searches, ResNet-50's
#: plans would have summed to 1.057x (H100, exhaustive) and the public suite's to 1.067x, for 1.6 and 2.1 s of search
#: saved.
FIRST_ROUND_PLANS = 8


#: Of the plans that wait (:data:`FIRST_ROUND_PLANS`), the second round tries the engines' own default plans (no knob
#: set: the ones the listing adds for every engine, and the heuristics' plans of default knobs), not the heuristics'
#: plans with knobs set. Replayed on the stored bfloat16 searches (ResNet-50 on an H100; ConvNeXt-T, SLaK-T and
#: RepLKNet-31B on an H200), the second round's winners were the default plans of engines 45, 58, 62, 63, 65 and 72,
#: and without the knobbed plans (535 of ResNet-50's 828 in its second rounds, 1,122 of RepLKNet-31B's 1,347) the
#: plans chosen summed to the same time as with them, to four places, on every model.
SECOND_ROUND_KNOBS = False


def waits(problem: ConvProblem, rank: int) -> bool:
    """Does the plan at ``rank`` in ``problem``'s list wait for the second round (:data:`FIRST_ROUND_PLANS`)?"""
    return problem.dtype != "float32" and rank >= FIRST_ROUND_PLANS


@dataclass(frozen=True)
class CudnnConfig(Config):
    engine: int
    knobs: tuple[tuple[str, int], ...] = ()  # (knob_type name, value), sorted

    def label(self) -> str:
        knobs = ",".join(f"{k.lower()}={v}" for k, v in self.knobs)
        return f"eng{self.engine}" + (f",{knobs}" if knobs else "")

    @classmethod
    def from_label(cls, text: str) -> "CudnnConfig":
        """The configuration :meth:`label` prints as ``text`` (knob names in the frontend's upper case).

        >>> CudnnConfig.from_label("eng70,idx_mode=0,tile_size=12")
        CudnnConfig(engine=70, knobs=(('IDX_MODE', 0), ('TILE_SIZE', 12)))
        """
        engine, *knobs = text.split(",")
        if not engine.startswith("eng"):
            raise ValueError(f"a cuDNN plan's label starts with eng and its engine number, not {text!r}")
        return cls(int(engine[3:]), tuple(sorted((k.upper(), int(v)) for k, v in (kv.split("=") for kv in knobs))))

    @classmethod
    def from_dict(cls, data: dict) -> "CudnnConfig":
        return cls(engine=int(data["engine"]), knobs=tuple((str(k), int(v)) for k, v in data.get("knobs", ())))


class _Graph:
    """One problem's graph: built once; plans appended by engine id + knobs."""

    def __init__(self, cudnn, handle, p: ConvProblem):
        #: runtime-compiled plans built (their outcomes teach the engine's record) and listed but not built
        #: (config -> the reason, :meth:`CudnnStrategy.pruned`), and what keys the engines' records
        self.compiled: set[CudnnConfig] = set()
        self.deferred: dict[CudnnConfig, str] = {}
        self.unbuilt: dict[CudnnConfig, int] = {}  # a deferred plan's index in the list, where it can be replayed
        self.waiting: set[CudnnConfig] = set()  # listed, not built: past the first round (CudnnStrategy.second_round)
        self.problem, self.kind = p, (p.pass_, p.dtype, p.layout)
        self.engine_kind = (p.pass_, p.dtype, p.layout, p.math)  # (what keys the engines' records of plans compiled
        # ahead; ``kind`` keys the runtime-compiled ones')
        x, w, y, pad, stride, dil = frontend.geometry(p)
        f32, io = cudnn.data_type.FLOAT, getattr(cudnn.data_type, frontend.DATA_TYPES[p.dtype])
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        geometry = dict(padding=pad, stride=stride, dilation=dil, compute_data_type=f32)

        def tensor(name, dims):  # every operand and the result in the problem's dtype and layout
            return g.tensor(name=name, dim=dims, stride=frontend.strides(dims, p.layout), data_type=io)
        if p.pass_ == "fwd":
            a, b = tensor("X", x), tensor("W", w)
            out, dims = g.conv_fprop(image=a, weight=b, **geometry), y
        elif p.pass_ == "dgrad":
            a, b = tensor("DY", y), tensor("W", w)
            out, dims = g.conv_dgrad(loss=a, filter=b, **geometry), x
        else:
            a, b = tensor("X", x), tensor("DY", y)
            out, dims = g.conv_wgrad(image=a, loss=b, **geometry), w
        # set the output layout explicitly: an inferred one need not be packed in the problem's layout
        out.set_output(True).set_dim(dims).set_stride(frontend.strides(dims, p.layout)).set_data_type(io)
        g.validate()
        g.build_operation_graph()
        self.graph, self.tensors, self.cudnn = g, (a, b, out), cudnn
        self.built: dict[CudnnConfig, tuple[int, int]] = {}  # config -> (plan index, workspace bytes)
        #: config -> the seconds its plan took to build while listing or asked its workspace, until the planner is
        #: told (CudnnStrategy.built_elsewhere_s); builds that failed, whose plans are no candidates, in failed_s
        self.build_times: dict[CudnnConfig, float] = {}
        self.failed_s = 0.0

    def enumerate(self, math: str, dtype: str = "float32") -> list[tuple[CudnnConfig, int]]:
        """Every plan the heuristics offer, and every engine with default knobs, that builds, with its workspace (the
        numerics :func:`frontend.excluded_notes` rules out left out; a plan that :func:`fixed_rule` prunes, or whose
        engine's record says so, is listed with workspace 0 and not built: :class:`CompileRecord` for a
        runtime-compiled one, see ``RTC_TRIALS``; :class:`EngineRecord` for the others, see ``ENGINE_TRIALS``)."""
        started = time.perf_counter()
        g = self.list_plans(math, dtype)
        self.heuristics_s = time.perf_counter() - started  # (listing_parts tells it)
        found, seen = [], set()
        started = time.perf_counter()
        for index in range(g.get_execution_plan_count()):
            if time.perf_counter() - started > ENUMERATION_BUDGET_S:
                log.info("cuDNN: stopped building plans after %.0f s (%d built)", ENUMERATION_BUDGET_S, len(found))
                break
            try:
                engine, knobs = g.get_engine_and_knobs_at_index(index)
                named = [(getattr(k, "name", str(k)), int(v)) for k, v in knobs.items()]
                # A knob the frontend cannot name (NOT_SET) cannot be replayed: create_execution_plan
                # refuses it. The candidate is then the plan built from the nameable knobs alone, which
                # is exactly what a cached winner is rebuilt from.
                replayable = all(name != "NOT_SET" for name, _v in named)
                config = CudnnConfig(int(engine), tuple(sorted(p for p in named if p[0] != "NOT_SET")))
                if config in seen:
                    continue
                seen.add(config)
                record = None
                reason = fixed_rule(self.problem, config)  # (a plan the fixed rule prunes is not built either)
                if reason is None:
                    record = self._compile_record(index, config)
                    if record is not None:
                        reason = record.skip_reason()
                    else:
                        reason = _CTX.engine_record(config.engine, self.engine_kind).skip_reason(len(found))
                if reason is not None:
                    self.deferred[config] = reason
                    if replayable:
                        self.unbuilt[config] = index
                    found.append((config, 0))
                    continue
                if waits(self.problem, len(found)):  # built if its round comes (workspace_bytes)
                    self.waiting.add(config)
                    if replayable:  # (else rebuilt from its nameable knobs then, as a cached winner is)
                        self.unbuilt[config] = index
                    found.append((config, 0))
                    continue
                if record is not None:
                    self.compiled.add(config)
                t0 = time.perf_counter()
                try:
                    if replayable:
                        g.build_plan_at_index(index)
                        self.built[config] = (index, int(g.get_workspace_size_plan_at_index(index)))
                    else:
                        self.plan(config)
                except Exception:
                    self.failed_s += time.perf_counter() - t0
                    raise
                took = self.build_times[config] = time.perf_counter() - t0
                if record is not None:
                    record.builds.append(took)
            except Exception as exc:  # a plan that is barred or fails to build is skipped
                log.debug("cuDNN plan %d skipped: %s", index, exc)
                continue
            found.append((config, self.built[config][1]))
        return found

    def list_plans(self, math: str, dtype: str = "float32"):
        """The graph with every plan listed (none built): the heuristics' plans and every engine with its default
        knobs, less those the numerics :func:`frontend.excluded_notes` rules out."""
        cudnn, g = self.cudnn, self.graph
        g.create_execution_plans([getattr(cudnn.heur_mode, m) for m in HEURISTICS])
        try:
            engines = int(g.get_engine_count())
        except Exception as exc:  # an older frontend: the heuristics' plans only
            log.debug("cuDNN: no engine count (%s)", exc)
            engines = 0
        for engine in range(engines):
            try:
                g.create_execution_plan(engine, {})
            except Exception as exc:  # the engine does not support this graph
                log.debug("cuDNN engine %d not offered: %s", engine, exc)
        # the notes filter applies to every plan in the list, the engines' default-knob plans included
        notes = [getattr(cudnn.numerical_note, n) for n in frontend.excluded_notes(math, dtype)
                 if hasattr(cudnn.numerical_note, n)]
        if notes:
            g.deselect_numeric_notes(notes)
        return g

    def behavior_notes(self, index: int) -> list[str]:
        """The behavior notes of plan ``index`` (listed, maybe not built), by name; raises where the frontend
        cannot say."""
        return [getattr(n, "name", str(n)) for n in self.graph.get_behavior_notes_for_plan_at_index(index)]

    def _compile_record(self, index: int, config: CudnnConfig) -> CompileRecord | None:
        """The record of ``config``'s engine for this kind of problem where plan ``index`` is runtime-compiled,
        else ``None`` (also where the frontend cannot say)."""
        try:
            notes = self.behavior_notes(index)
        except Exception as exc:  # a frontend without behavior notes: every plan is built
            log.debug("cuDNN: no behavior notes for plan %d (%s)", index, exc)
            return None
        if not any(name.endswith("RUNTIME_COMPILATION") for name in notes):
            return None
        return _CTX.record(config.engine, self.kind)

    def plan(self, config: CudnnConfig) -> tuple[int, int]:
        """Index and workspace of ``config``'s plan, appending and building it if needed."""
        if config not in self.built:
            index = self.unbuilt.pop(config, None)
            deferred = index is not None
            if index is None:  # not listed yet
                knob_types = self.cudnn.knob_type
                self.graph.create_execution_plan(config.engine, {getattr(knob_types, k): v for k, v in config.knobs})
                index = self.graph.get_execution_plan_count() - 1
            t0 = time.perf_counter()
            try:
                self.graph.build_plan_at_index(index)
                self.build_times[config] = time.perf_counter() - t0
            except Exception as exc:
                if config in self.waiting:
                    raise RuntimeError(f"cuDNN does not build plan cudnn[{config.label()}] for this problem ({exc}); "
                                       "it was listed for the search's second round, not built") from exc
                if not deferred:
                    raise
                # (listed without being built: the frontend says only when building that it bars a plan, by the
                # numerical notes the math mode rules out, where the listing would have skipped it)
                raise RuntimeError(f"cuDNN does not build plan cudnn[{config.label()}] for this problem ({exc}); the "
                                   f"rules had pruned it ({self.deferred.get(config)})") from exc
            finally:
                self.waiting.discard(config)
            self.built[config] = (index, int(self.graph.get_workspace_size_plan_at_index(index)))
        return self.built[config]


class _Context:
    """Per-process state: the module, one handle per device, graphs per problem."""

    def __init__(self):
        self.lock = threading.Lock()
        self.handles: dict[int, object] = {}
        #: one graph per problem (its key): the one its candidates were enumerated on, or one made for a
        #: rebuilt plan; every executor of the problem appends its plan to it (building the operation graph
        #: once per problem, and never a plan the enumeration built already)
        self.enumerated: dict[str, _Graph] = {}
        self.candidates: dict[str, list[tuple[CudnnConfig, int]]] = {}
        #: (engine, pass, dtype, layout) -> what its runtime-compiled plans cost and achieved here
        self.compiled: dict[tuple, CompileRecord] = {}
        #: (engine, pass, dtype, layout, math) -> how close its plans compiled ahead came to the winners here
        self.engines: dict[tuple, EngineRecord] = {}

    def record(self, engine: int, kind: tuple) -> CompileRecord:
        """The :class:`CompileRecord` of ``engine`` for problems of ``kind`` (pass, dtype, layout)."""
        return self.compiled.setdefault((engine, *kind), CompileRecord())

    def engine_record(self, engine: int, kind: tuple) -> EngineRecord:
        """The :class:`EngineRecord` of ``engine`` for problems of ``kind`` (pass, dtype, layout, math mode)."""
        return self.engines.setdefault((engine, *kind), EngineRecord())

    def handle(self, cudnn, cp):
        device = cp.cuda.Device().id
        if device not in self.handles:
            if not self.handles:
                atexit.register(self.release)
            self.handles[device] = cudnn.create_handle()
        return self.handles[device]

    def release(self) -> None:
        """Drop the problems' graphs, at exit: the frontend's module, going after them, reports each object of its
        still held as a leak (``nanobind: leaked 408 instances!`` and a list, at the end of ResNet-50's tune)."""
        with self.lock:
            self.enumerated.clear()
            self.candidates.clear()


_CTX = _Context()
_LISTING = threading.local()  # (the parts of this thread's last listing: CudnnStrategy.listing_parts)


@register
class CudnnStrategy(Strategy):
    name = "cudnn"
    version = 3
    config_type = CudnnConfig
    #: cuDNN reads every dtype and layout itself: bfloat16 and float16 engines with float32 compute, tensors
    #: with channels-last strides (3: before, those problems ran float32 channels-first between conversions)
    native_dtypes = ("float32", "bfloat16", "float16")
    native_layouts = ("channels_first", "channels_last")
    changes = {3: lambda p: p.dtype != "float32" or p.layout != "channels_first"}
    rules_learned = True  # runtime-compiled engines' records (RTC_TRIALS)

    def serves_shape(self, problem: ConvProblem) -> bool:
        return problem.rank in (1, 2, 3) and math.prod(problem.kernel_size) <= MAX_TAPS

    def supports(self, problem: ConvProblem, backend) -> str | None:
        if backend is None or getattr(backend, "name", "") != "cupy":
            return "cuDNN needs the CuPy (GPU) backend"
        started = time.perf_counter()
        cudnn, reason = frontend.load()
        _LISTING.loading = time.perf_counter() - started  # (the first time, importing the frontend and cuDNN)
        if cudnn is None:
            return reason
        if problem.rank not in (1, 2, 3):
            return f"rank {problem.rank} is not wired to cuDNN"
        taps = math.prod(problem.kernel_size)
        if taps > MAX_TAPS:
            return (f"a kernel of {taps} taps is over {MAX_TAPS}: cuDNN's engines for such kernels take minutes "
                    "to tune (the FFT path is the one for them)")
        return None

    def _enumerated(self, problem: ConvProblem, backend) -> list[tuple[CudnnConfig, int]]:
        key = problem.key()
        with _CTX.lock:
            if key not in _CTX.candidates:
                started = time.perf_counter()
                cudnn, _ = frontend.load()
                handle = _CTX.handle(cudnn, backend.xp)  # (the first on a device initialises cuDNN there)
                loading = getattr(_LISTING, "loading", 0.0) + time.perf_counter() - started
                started, graph = time.perf_counter(), None
                try:
                    graph = _Graph(cudnn, handle, problem)
                    built = time.perf_counter()
                    _CTX.candidates[key] = graph.enumerate(problem.math, problem.dtype)
                    _CTX.enumerated[key] = graph
                except Exception as exc:  # the frontend declines the whole graph
                    log.info("cuDNN offers no plan for %s: %s", key, exc)
                    _CTX.candidates[key] = []
                finally:
                    _LISTING.parts = {"listing cudnn: loading cuDNN": loading} if graph is None else {
                        "listing cudnn: loading cuDNN": loading,
                        "listing cudnn: operation graphs": built - started,
                        "listing cudnn: heuristics and engines": getattr(graph, "heuristics_s", 0.0),
                        "listing cudnn: plans that failed to build": getattr(graph, "failed_s", 0.0)}
            return _CTX.candidates[key]

    def listing_parts(self) -> dict[str, float]:
        """The last listing's parts in this thread (:meth:`Strategy.listing_parts`): loading the frontend and
        initialising cuDNN on the device (the first listing's), making the problem's operation graph, asking the
        heuristics for their plans and every engine for its default one, and building plans that failed to build (the
        rest of a listing: the plans' notes, the rules; a plan that builds is its candidate's build,
        :meth:`built_elsewhere_s`)."""
        parts, _LISTING.parts, _LISTING.loading = getattr(_LISTING, "parts", {}), {}, 0.0
        return parts

    def candidates(self, problem, backend):
        return [config for config, _ws in self._enumerated(problem, backend)]

    def built_elsewhere_s(self, problem, config) -> float:
        """The seconds ``config``'s plan took to build while listing (the first round's plans) or when asked its
        workspace (a waiting or pruned plan's), told once: 0.2 to 2.7 s for a runtime-compiled plan on the H100, a few
        milliseconds for one compiled ahead, most of what cuDNN's candidates cost a bfloat16 model's tuning."""
        graph = _CTX.enumerated.get(problem.key())
        if graph is None:
            return 0.0
        with _CTX.lock:
            return graph.build_times.pop(config, 0.0)

    def workspace_bytes(self, problem, config) -> int:
        graph = _CTX.enumerated.get(problem.key())
        if graph is not None and (config in graph.deferred or config in graph.waiting):
            # (an exhaustive search wants a pruned plan after all; a second round, a waiting one)
            with _CTX.lock:
                return graph.plan(config)[1]
        for known, ws in _CTX.candidates.get(problem.key(), ()):
            if known == config:
                return ws
        return graph.built[config][1] if graph and config in graph.built else 0

    def pruned(self, problem, config, backend, room=None):
        fixed = self.fixed_rule(problem, config, backend, room)
        if fixed is not None:
            return fixed
        graph = _CTX.enumerated.get(problem.key())
        return graph.deferred.get(config) if graph is not None else None

    def fixed_rule(self, problem, config, backend, room=None):
        """:func:`fixed_rule`, the rule fitted on measured searches."""
        return fixed_rule(problem, config)

    def second_round(self, problem, config, rank):
        """Past the heuristics' first :data:`FIRST_ROUND_PLANS` in the list, a half-precision problem's plans wait
        for the search's second round (and are not built while listing): see :func:`waits`."""
        if waits(problem, rank):
            return f"past the heuristics' first {FIRST_ROUND_PLANS} plans of a {problem.dtype} problem"
        return None

    def left_out_of_second_round(self, problem, config, rank):
        """A waiting plan with knobs set (:data:`SECOND_ROUND_KNOBS`): the second round tries the engines' default
        plans."""
        if config.knobs and not SECOND_ROUND_KNOBS:
            return (f"a plan with knobs set past the heuristics' first {FIRST_ROUND_PLANS} of a {problem.dtype} problem "
                    "(the second round tries the engines' default plans)")
        return None

    def verified_at_full_batch(self, problem, config) -> bool:
        """A plan built while listing, for the full batch: verified as built, not built again on another graph for the
        verification batch. A runtime-compiled plan's build takes 0.2 to 2.7 s on the H100 (about 25 s of ResNet-50's
        tuning under AMP); one compiled ahead, 2.2 ms on the H200's host (6,081 builds, listing and verification
        together, were 13.7 s of ResNet-50's 38 s AMP tune), where the problem is small enough
        (:data:`FULL_BATCH_VERIFY_FLOPS`). A plan listed but not built (deferred by its engine's record) is verified at
        the verification batch."""
        graph = _CTX.enumerated.get(problem.key())
        if graph is None or config not in graph.built:
            return False
        if config in graph.compiled:
            return True
        large_grouped = problem.groups > 1 and math.prod(problem.kernel_size) > 49
        return problem.flops() <= FULL_BATCH_VERIFY_FLOPS and not large_grouped

    def observe(self, problem, outcomes, winner) -> None:
        """Each engine tried here counts one trial, at its best plan's time over the winner's (a plan that failed,
        was rejected or was too slow to time counts as infinitely slow): in its :class:`CompileRecord` for its
        runtime-compiled plans, in its :class:`EngineRecord` for the others."""
        graph = _CTX.enumerated.get(problem.key())
        if graph is None or not winner.median_s:
            return
        compiled: dict[int, float] = {}
        ahead: dict[int, float] = {}
        for o in outcomes:
            if o.strategy != self.name:
                continue
            config = CudnnConfig.from_dict(o.config)
            ratio = trial_ratio(o.status, o.median_s, o.error, winner.median_s)
            if ratio is not None:
                closest = compiled if config in graph.compiled else ahead
                closest[config.engine] = min(ratio, closest.get(config.engine, math.inf))
        with _CTX.lock:
            for engine, ratio in compiled.items():
                _CTX.record(engine, graph.kind).tried(ratio)
            for engine, ratio in ahead.items():
                _CTX.engine_record(engine, graph.engine_kind).tried(ratio)

    def heuristic_config(self, problem, backend):
        configs = self.candidates(problem, backend)
        if not configs:
            raise RuntimeError(f"cuDNN offers no plan for {problem.describe()}")
        return configs[0]

    def build(self, problem, config, backend):
        cudnn, reason = frontend.load()
        if cudnn is None:
            raise RuntimeError(reason)
        cp = backend.xp
        key = problem.key()
        with _CTX.lock:
            graph = _CTX.enumerated.get(key)
            if graph is None:  # straight from engine id + knobs: no enumeration
                graph = _CTX.enumerated[key] = _Graph(cudnn, _CTX.handle(cudnn, cp), problem)
            index, ws_bytes = graph.plan(config)
            graph.build_times.pop(config, None)  # (a build here is the caller's to time)
        workspace = cp.empty(max(ws_bytes, 1), dtype=cp.uint8)
        handle = _CTX.handle(cudnn, cp)
        execute = graph.graph.execute_plan_at_index
        ws_ptr = workspace.data.ptr
        shape = problem.result_shape
        a_t, b_t, out_t = graph.tensors
        uids = frontend.ordered_uids(execute, graph.tensors)

        def direct(a: int, b: int, out: int, stream) -> None:
            """The plan on dense data of the problem's dtype and layout (bfloat16 as 16-bit numbers) given by
            device address, on ``stream``: the PyTorch bridge's path (no array views), and the arrays' below
            (:func:`convtune.precision.launched` beyond float32 channels-first). Where the frontend binds operands by position
            (``tensor_uids``), a call costs the host 8 to 10 us less than through the mapping form, of the 110
            to 140 us that the frontend's execute takes on the H100's host for any layer size."""
            cudnn.set_stream(handle, stream.ptr)
            if uids is None:
                execute({a_t: a, b_t: b, out_t: out}, ws_ptr, index, handle)
            else:
                execute((a, b, out), ws_ptr, index, handle, tensor_uids=uids)
        # the frontend's execute replayed from a CUDA graph per operand addresses (the workspace is the plan's own:
        # one address), which costs the host a few microseconds instead of the execute's 110 to 140
        # (the plan's workspace lives as long as the plan: cuDNN writes it)
        launch = replay.AddressReplay(direct, f"the cuDNN plan {self.describe(config)} of {problem.describe()}",
                                      holds=workspace)
        if (problem.dtype, problem.layout) != ("float32", "channels_first"):
            return precision.launched(launch, problem, cp)

        def run(a, b, out=None):
            # cuDNN is handed raw pointers to packed NCHW data: views are packed first
            a, b = cp.ascontiguousarray(a), cp.ascontiguousarray(b)
            target = out if out is not None and out.flags.c_contiguous else cp.empty(shape, dtype=cp.float32)
            launch(a.data.ptr, b.data.ptr, target.data.ptr, cp.cuda.get_current_stream())
            if out is not None and target is not out:
                out[...] = target
                return out
            return target
        return Executor(run, launch=launch)  # (by address: the PyTorch bridge)
