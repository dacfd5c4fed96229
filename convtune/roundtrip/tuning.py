"""Deciding a layer's round trip: the candidates, their timing as the planner times a pass (each pass after its own
L2 flush, on the memory the PyTorch layer hands over), the verdict against the three per-pass plans
(:class:`TripDecision`), and its record in a plan store."""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from .. import precision
from ..backend import Backend, get_backend
from .. import compiling
from ..fft import callbacks, cost, freqmajor, packedgemm
from ..fft import sizes as fft_sizes
from ..plan import CandidateOutcome
from ..building import failure_reason, random_operands, relative_error
from ..problem import ConvProblem
from ..text import human_bytes
from ..strategies import get_strategy
from ..strategies.fft import narrow_variants, own_transform_configs
from ..timing import TimingStats, default_timer

from . import trip as trip_module
from .trip import (DEFAULT_KEEP_LIMIT, KEEP_SIZES, PAYS_FACTOR, VERSION, RoundTrip, TripConfig, block_trip_configs,
                   held_bytes, pointwise_applies, unsupported_reason)

log = logging.getLogger("convtune")


@dataclass(frozen=True)
class TripDecision:
    """What tuning a layer's round trip found: every candidate, the per-pass plans' total, the verdict.

    Why a type of its own beside :class:`~convtune.plan.Decision`: a Decision answers "which plan runs this one
    pass", keyed by the pass's problem, and its winner is a plan the runtime builds; a TripDecision answers "does
    keeping spectra across the layer's three passes beat those three Decisions", keyed by the layer (its forward
    problem), and its verdict (``pays``) is a yes or no that presupposes the three per-pass Decisions. It carries
    the round trip's own version (:data:`VERSION`, re-measured where :func:`stale` says so) and the per-pass total
    it was weighed against, and is kept as a typed record of the plan store, not as a plan row."""

    problem: ConvProblem  # the forward problem
    device_key: str
    per_pass_s: float | None  # sum of the three per-pass winners' medians
    per_pass_labels: tuple[str, ...]
    outcomes: tuple[CandidateOutcome, ...]
    winner: CandidateOutcome | None  # the fastest verified round trip (whether or not it pays)
    pays: bool
    reason: str
    version: int = VERSION
    tuning_s: float = 0.0

    @property
    def config(self) -> TripConfig | None:
        return TripConfig.from_dict(self.winner.config) if self.winner is not None else None

    def as_dict(self) -> dict:
        return {"problem": self.problem.key(), "device_key": self.device_key, "per_pass_s": self.per_pass_s,
                "per_pass_labels": list(self.per_pass_labels), "outcomes": [o.as_dict() for o in self.outcomes],
                "winner": self.winner.as_dict() if self.winner else None, "pays": self.pays, "reason": self.reason,
                "version": self.version, "tuning_s": self.tuning_s}

    @classmethod
    def from_dict(cls, data: dict) -> "TripDecision":
        return cls(problem=ConvProblem.from_key(data["problem"]), device_key=data["device_key"],
                   per_pass_s=data["per_pass_s"], per_pass_labels=tuple(data["per_pass_labels"]),
                   outcomes=tuple(CandidateOutcome.from_dict(o) for o in data["outcomes"]),
                   winner=CandidateOutcome.from_dict(data["winner"]) if data["winner"] else None,
                   pays=bool(data["pays"]), reason=data["reason"], version=int(data["version"]),
                   tuning_s=float(data.get("tuning_s", 0.0)))

    def describe(self) -> str:
        head = f"round trip of {self.problem.describe()}: "
        if self.winner is None or self.winner.timing is None:
            return head + f"no round trip ({self.reason})"
        trip_ms = self.winner.timing.median_s * 1e3
        per = f"{self.per_pass_s * 1e3:.3f} ms" if self.per_pass_s is not None else "unknown"
        verdict = (f"keeps spectra, {human_bytes(self.winner.workspace_bytes)} from forward to backward"
                   if self.pays else "per-pass plans")
        return head + f"{self.winner.label} {trip_ms:.3f} ms against per-pass plans {per}: {verdict} ({self.reason})"


def trip_key(problem: ConvProblem, device_key: str) -> str:
    """The key of a layer's round-trip record in a plan store: the device and the layer's forward problem."""
    return f"{device_key}|{problem.for_pass('fwd').key()}"


def load_trip(store, problem: ConvProblem, device_key: str) -> TripDecision | None:
    """The round-trip decision of ``problem``'s layer stored in ``store`` (a :class:`~convtune.cache.PlanStore`),
    or ``None`` (an unreadable one too, with a warning)."""
    doc = store.get_record("trip", trip_key(problem, device_key))
    if doc is None:
        return None
    try:
        return TripDecision.from_dict(doc)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("plan store %s: unreadable round-trip decision for %s skipped (%s)", store, problem.key(), exc)
        return None


def save_trip(store, decision: TripDecision) -> None:
    """Store (replacing) a layer's round-trip decision in ``store``."""
    store.put_record("trip", trip_key(decision.problem, decision.device_key), decision.as_dict())


def trip_candidates(problem: ConvProblem, backend: Backend) -> list[TripConfig]:
    """The cheapest transform sizes by the cost model summed over the three passes, plain and (GPU,
    where cuFFT has JIT callbacks) fused, and on the GPU also with the packed product and, where
    they apply, convtune's own transforms; with the pointwise product where a group has at most
    :data:`~convtune.fft.spectral.POINTWISE_MAX_PAIRS` channel pairs (only those for depthwise and
    other many-group layers); and the one-block transforms' (:func:`block_trip_configs`)."""
    p = problem.for_pass("fwd").in_float32()  # (a half-precision or channels_last layer: its float32 trip's)
    calibration = cost.calibration_for(backend.device_info().key())
    ranked = sorted(fft_sizes.size_candidates(p),
                    key=lambda s: sum(cost.estimate(p.for_pass(q), s, calibration) for q in ("fwd", "dgrad", "wgrad")))
    tf32 = p.math == "tf32"
    pointwise = [TripConfig(sizes=s, product="pointwise") for s in ranked[:KEEP_SIZES]] if pointwise_applies(p) else []
    block = block_trip_configs(problem, backend)
    if freqmajor.unsupported_reason(p) is not None:  # depthwise and other many-group layers: pointwise and block
        return pointwise + block
    configs = [TripConfig(sizes=s, tf32=tf32) for s in ranked[:KEEP_SIZES]]
    if backend.name == "cupy":
        fused = callbacks.callbacks_available()
        if fused:
            configs = [dataclasses.replace(c, fused=True) for c in configs] + configs
        packed = packedgemm.packed_available(backend)
        if packed:
            configs += [TripConfig(sizes=s, fused=fused, tf32=tf32, packed=True) for s in ranked[:KEEP_SIZES]]
        # convtune's own transforms where they apply: as the per-pass candidates (convtune.strategies.fft)
        configs += [TripConfig(sizes=c.sizes, tf32=c.tf32, packed=c.packed, own=True)
                    for c in own_transform_configs(p, backend, ranked[:KEEP_SIZES], ("fgemm",), tf32)]
        configs += narrow_variants(p, configs)  # few channels: the packed trips with the narrow product too
    return configs + pointwise + block


def timed_steps(trip: RoundTrip, x, w, dy) -> list:
    """The round trip's three passes as calls of no arguments on the memory the PyTorch layer hands it, which is what
    a round trip is timed on. A bfloat16 trip that reads bfloat16's 16 bits itself (convtune's own transforms, the
    block product: :attr:`RoundTrip.reads_bits`) runs on 16-bit copies of ``x``, ``w`` and ``dy`` (arrays hold
    bfloat16 values in float32 storage, :mod:`convtune.precision`, which would double its reads and writes) and
    writes 16-bit results, as the layer's calls do and as the per-pass plans' launches are timed (``timed``,
    :meth:`convtune.strategies.base.Strategy.build`); the copies are made here, once. Any other trip runs on the
    operands as given."""
    y = dx = dw = None
    if trip.reads_bits:
        xp, p = trip.xp, trip.problem
        x, w, dy = (precision.bits_of(xp, a, p.layout) for a in (x, w, dy))
        y, dx, dw = (precision.empty_bits(xp, shape, p.layout) for shape in (p.y_shape, p.x_shape, p.w_shape))
    return [lambda: trip.forward(x, w, y), lambda: trip.backward_data(dy, dx), lambda: trip.backward_filter(dy, dw)]


def time_round_trip(timer, backend: Backend, trip: RoundTrip, x, w, dy, label: str = "") -> TimingStats:
    """Time one round trip (its :func:`timed_steps`): with a timer that has ``sequence`` (the CUDA-event timer) each
    pass is timed after its own L2 flush and the three are summed; otherwise the trip is timed as a whole."""
    steps = timed_steps(trip, x, w, dy)
    sequence = getattr(timer, "sequence", None)
    if sequence is not None:
        return sequence(steps, backend, label)
    return timer(lambda: [step() for step in steps], backend, label)


def round_trip_operands(backend: Backend, problem: ConvProblem, seed: int = 0):
    """Fresh random ``x``, ``w`` and ``dy`` for the forward ``problem``'s round trip."""
    p = problem.for_pass("fwd")
    x, w = random_operands(backend, p, seed)
    return x, w, random_operands(backend, p.for_pass("dgrad"), seed + 1)[0]


def round_trip_references(backend: Backend, problem: ConvProblem, x, w, dy) -> list:
    """The float64 ``y``, ``dx`` and ``dw`` of the round trip on these operands."""
    xp = backend.xp
    return [get_strategy("reference").build(problem.for_pass(q), None, backend)(a.astype(xp.float64),
                                                                                 b.astype(xp.float64))
            for q, (a, b) in (("fwd", (x, w)), ("dgrad", (dy, w)), ("wgrad", (x, dy)))]


def compile_block_trips(problem: ConvProblem, configs, backend: Backend) -> None:
    """The block trips' kernels compiled at once on several threads (each trip's module holds only its own kernels,
    :func:`convtune.compiling.only_kernels`: about 3 s of NVRTC each, and replknet-dw31 has 16 candidates); one that
    fails fails again where the trip is built, and is recorded there."""
    if configs and backend.name == "cupy":
        compiling.build_concurrently([lambda c=c: trip_module._block_kept(backend.xp, problem, c) for c in configs],
                                     backend)


_BLOCK_SIZES = re.compile(r"^fft-(?:plane|row)\[sizes?=(\d+(?:x\d+)*)")


def block_size_rule(per_pass_labels) -> Callable[[TripConfig], str | None] | None:
    """The rule on block round trips where the per-pass plans are the one-block transforms' (``fft-plane`` or
    ``fft-row``): a block trip runs the same transforms, so only the transform sizes those plans chose are tried, the
    others skipped with the reason (SLaK-T on an H200: each of its three trips' winners had the size of its forward
    pass's plane plan; 16 of the 30 candidates of its 51x51 layer's verdict, 25.8 s, were at other sizes).
    ``None`` where no per-pass plan is a one-block transform's (every size is tried), and in an exhaustive search."""
    chosen = {tuple(int(n) for n in m.group(1).split("x")) for label in per_pass_labels
              if (m := _BLOCK_SIZES.match(label))}
    if not chosen:
        return None
    said = ", ".join("x".join(map(str, s)) for s in sorted(chosen))

    def rule(config: TripConfig) -> str | None:
        if config.product != "block" or tuple(config.sizes) in chosen:
            return None
        return (f"a block trip at a transform size the per-pass plans did not choose (they chose {said}); "
                "an exhaustive search tries it")
    return rule


def tune_round_trip(problem: ConvProblem, backend: Backend | str, per_pass_s: float | None,
                    per_pass_labels=(), *, timer=None, keep_limit: int | None = DEFAULT_KEEP_LIMIT,
                    seed: int = 0, progress=None, exhaustive: bool = False) -> TripDecision:
    """Measure the round-trip candidates of the forward ``problem`` and decide whether keeping spectra
    pays against ``per_pass_s``, the three per-pass winners' total (``None``: not known, never pays).

    Every candidate is checked on the full batch against the float64 reference of all three passes
    (the filter gradient's error grows with the batch) and recorded: ``unsupported``,
    ``over_budget`` (kept bytes over ``keep_limit``), ``rejected``, ``failed`` or timed (``ok``, the
    fastest ``winner``), or ``skipped`` by :func:`block_size_rule` (not in an ``exhaustive`` search).
    """
    backend = get_backend(backend) if isinstance(backend, str) else backend
    timer = timer if timer is not None else default_timer(backend)
    p = problem.for_pass("fwd")
    started = time.perf_counter()
    device_key = backend.device_info().key()

    def decision(outcomes, winner, pays, reason):
        return TripDecision(p, device_key, per_pass_s, tuple(per_pass_labels), tuple(outcomes), winner, pays, reason,
                            tuning_s=time.perf_counter() - started)

    reason = unsupported_reason(p)
    if reason is not None:
        return decision([CandidateOutcome("fft-trip", {}, "fft-trip[*]", "unsupported", reason=reason)], None, False,
                        reason)
    outcomes, kept = [], []
    rule = None if exhaustive else block_size_rule(per_pass_labels)
    for config in trip_candidates(p, backend):
        nbytes = held_bytes(p, config.sizes)
        skip = rule(config) if rule is not None else None
        if skip is not None:
            outcomes.append(CandidateOutcome("fft-trip", config.as_dict(), config.label(), "skipped",
                                             workspace_bytes=nbytes, reason=skip))
        elif keep_limit is not None and nbytes > keep_limit:
            outcomes.append(CandidateOutcome("fft-trip", config.as_dict(), config.label(), "over_budget",
                                             workspace_bytes=nbytes,
                                             reason=f"kept spectra {nbytes} B over the limit {keep_limit} B"))
        else:
            kept.append(config)
    xp = backend.xp
    x, w, dy = round_trip_operands(backend, p, seed)
    refs = None
    if kept:
        try:
            refs = round_trip_references(backend, p, x, w, dy)
        except Exception as exc:
            reason = f"the float64 reference failed: {failure_reason(backend, exc)}"
            outcomes += [CandidateOutcome("fft-trip", c.as_dict(), c.label(), "failed", reason=reason) for c in kept]
            kept = []
    timed = []
    compile_block_trips(p, [c for c in kept if c.product == "block"], backend)
    for config in kept:
        nbytes = held_bytes(p, config.sizes)
        if progress is not None:
            progress(f"round trip {config.label()}")
        try:
            trip = RoundTrip(p, config, backend)
            y, dx, dw = trip(x, w, dy)
            errors = [relative_error(xp, out, ref) for out, ref in zip((y, dx, dw), refs)]
            err = max(errors)
            said = "errors fwd/dgrad/wgrad " + "/".join(f"{e:.2g}" for e in errors)
            if not err <= p.tolerance:
                outcomes.append(CandidateOutcome(
                    "fft-trip", config.as_dict(), config.label(), "rejected", workspace_bytes=nbytes, error=err,
                    reason=said + f", over the {p.math} tolerance {p.tolerance:g}"))
                continue
            stats = time_round_trip(timer, backend, trip, x, w, dy, config.label())
        except Exception as exc:
            outcomes.append(CandidateOutcome("fft-trip", config.as_dict(), config.label(), "failed",
                                             workspace_bytes=nbytes, reason=failure_reason(backend, exc)))
            log.debug("round trip %s failed", config.label(), exc_info=True)
            continue
        outcome = CandidateOutcome("fft-trip", config.as_dict(), config.label(), "ok", workspace_bytes=nbytes,
                                   error=err, timing=stats, reason=said)
        outcomes.append(outcome)
        timed.append(outcome)
    if not timed:
        return decision(outcomes, None, False, "no round-trip candidate survived")
    best = min(timed, key=lambda o: o.timing.median_s)
    winner = dataclasses.replace(best, status="winner")
    outcomes = [winner if o is best else o for o in outcomes]
    trip_s = winner.timing.median_s
    if per_pass_s is None:
        pays, reason = False, "the per-pass plans' times are not known"
    else:
        pays = trip_s < PAYS_FACTOR * per_pass_s
        ratio = per_pass_s / trip_s if trip_s > 0 else math.inf
        reason = (f"{ratio:.2f}x the per-pass plans, holding {winner.workspace_bytes / 2**20:.0f} MiB" if pays else
                  f"per-pass plans are {1 / ratio:.2f}x the round trip's time; keeping spectra needs "
                  f"{1 - PAYS_FACTOR:.0%} better")
    log.info("round trip %s: %s %.3f ms, per-pass %s: %s", p.key(), winner.label, trip_s * 1e3,
             f"{per_pass_s * 1e3:.3f} ms" if per_pass_s is not None else "unknown", "pays" if pays else "does not pay")
    return decision(outcomes, winner, pays, reason)
