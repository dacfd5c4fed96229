"""``convtune bench-model``: whole training steps of a model, patched and unpatched, in one process.

A training step is forward, loss, backward and an optimizer step (SGD with momentum), on one
fixed random batch. Modes, run in this order, each on a fresh copy of the same initial weights:

* ``torch-fp32``: PyTorch with ``cudnn.benchmark = True``, TF32 off (convolutions and matmuls);
* ``torch-tf32``: the same with TF32 allowed;
* ``torch-amp-bf16``: PyTorch AMP (``torch.autocast`` bf16) on a channels_last model and input;
* ``convtune-fp32`` / ``convtune-tf32``: the model patched (:func:`convtune.torch.patch`,
  ``math='auto'``) under the flags of the matching PyTorch mode, its plans tuned ahead first
  (:func:`convtune.torch.tune`; from the plan cache where they are there);
* ``convtune-amp-bf16``: the patched model as ``torch-amp-bf16`` runs it (autocast bf16,
  channels_last), its bfloat16 channels_last plans tuned ahead under the same autocast (these modes' layers
  take the drop-in's default ``keep_spectra``);
* ``convtune-fp32-kept``: ``convtune-fp32`` with ``keep_spectra='auto'`` (FFT round trips keeping the
  forward's spectra where the planner measured that they pay; their verdicts tuned ahead with the plans);
* ``convtune-fp32-perpass``: ``convtune-fp32`` with ``keep_spectra=False``: per-pass plans only, whatever the
  default;
* ``convtune-fp32-native``: a diagnosis, not a contender: the model patched as ``convtune-fp32`` is,
  but its runtime's only strategy is PyTorch's convolution (a plan table of its own, in memory), so
  every call goes through the drop-in to PyTorch's own kernels. Its step against ``torch-fp32``'s is
  what the drop-in's host work costs a training step; against ``convtune-fp32``'s, what the plans of
  other strategies gain or lose.

Each mode's steps are timed alone (CUDA events around a step, the host waiting for its end), and the
host's time to issue a step is recorded beside it (``host_ms``: where it nears the step's time, the
device waited on the host). With ``rounds`` (``--rounds N``) above 1 every mode is set up first and
their timed steps then run in N interleaved rounds, so that what drifts in a long run (clocks,
temperature, the allocators' state) weighs on each mode alike rather than on the last ones: the modes
take turns in an order that rotates every round, each turn starts with :data:`TURN_UNTIMED` untimed steps (the
first step after another model's is not what training runs: its operands sit at addresses of the allocator's new to the
plans' by-address launches, which capture their CUDA graphs at the second call with the same addresses, as in the second
step of a training run), and each round's median step of each mode is
kept (``round_ms``), so that a ratio can be taken round by round (:func:`paired`: the median of the
rounds' ratios, which drift between rounds does not move). With ``null`` (``--null``) each PyTorch mode
runs twice, as two copies set up alike (the second named ``...-again``): the ratio of PyTorch to
itself is what the same step measures as, the noise any other ratio carries (METHOD.md: time the
same version twice). On the H100, ResNet-50 under AMP with every layer handed back to PyTorch (the
patched model was PyTorch's own) measured 0.92x in 8 rounds of one or two steps without these.

With ``against`` (``--against DB``), each convtune mode also runs as a copy on the plans of another runtime (another
plan cache: an ``--exhaustive`` tune's, say), named ``...-against`` and interleaved with the others (``rounds``): the
two modes' steps differ only in the plans, so their ratio is the whole step's regret of one search against the
other, with ``null``'s PyTorch-against-itself as its noise. ``benchmarks/compare_plans.py`` compares the same two
caches layer by layer.

With ``graph`` (``--graph``), every mode's training step is captured whole in a CUDA graph after its
warm-up steps and the timed steps are the graph's replays (:func:`capture_step`): the host's work per step
drops out for PyTorch's modes and convtune's alike, as in ``torch.compile(mode="reduce-overhead")`` or a
hand-made ``torch.cuda.graph`` step; with ``rounds`` the modes' graphs are all alive at once and their replays
interleave like eager steps. convtune records the plans its eager steps resolved where they record
safely (kernels, cuFFT work and PyTorch's operations; CuPy refuses cuBLAS calls on a capturing stream, so
the passes of plans that call it are recorded as PyTorch's convolution: ``in_graphs_pytorch`` in the routes).

With ``profile`` (``--profile-steps N``), each mode then runs N more steps under ``torch.profiler``
(not timed with the others): the device's busy time per step (where a step's wall time exceeds it,
the device waited on the host) and the operations with the most device and host time.

The PyTorch modes run before convtune tunes anything (PyTorch's ``cudnn.benchmark`` skips
algorithms whose workspace it cannot allocate, so it must not run beside memory that tuning holds),
and every mode ends by giving its memory back (PyTorch's cache, CuPy's pool). Per mode: the first
step's wall time (one-time costs: cuDNN's algorithm search; convtune's plan lookups, builds and duels
run in its tune-ahead, whose time is reported as its tuning), the
median and spread of the timed steps (CUDA events; host clock on the CPU), peak memory
(``torch.cuda.max_memory_allocated``, convtune's allocations included: they come from PyTorch's
allocator), the loss (the modes must agree), and for convtune the tuning time and where each layer
went (the plan of each pass, or PyTorch's convolution).
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
import platform
import statistics
import time
from datetime import datetime, timezone

import torch
from torch import nn

from .._version import __version__
from ..cache import MemoryPlanStore
from ..direct import replay
from ..runtime import Runtime, default_runtime
from ..torch import models as model_specs
from ..torch.modules import DEFAULT_KEEP_SPECTRA, patch
from ..torch.tuning import tune
from .steps import AGAIN, AGAINST
from .steps import kind as _kind

log = logging.getLogger("convtune")

MODES = ("torch-fp32", "torch-tf32", "torch-amp-bf16", "convtune-fp32", "convtune-tf32", "convtune-amp-bf16",
         "convtune-fp32-kept", "convtune-fp32-perpass", "convtune-fp32-native")
DEFAULT_MODES = ("torch-fp32", "torch-tf32", "torch-amp-bf16", "convtune-fp32")
#: the modes that set ``keep_spectra`` themselves, by their last word
_KEEP = {"-kept": "auto", "-perpass": False}
FORMAT = "convtune-bench-model"
FORMAT_VERSION = 1


def _flags(mode: str, device: torch.device) -> None:
    tf32 = _kind(mode).endswith("tf32")
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _give_back(device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        try:
            import cupy
            cupy.get_default_memory_pool().free_all_blocks()
        except Exception:  # no CuPy: nothing of convtune's to give back
            pass


def _loss(output, target):
    if output.dim() == 2 and target.dtype == torch.long:
        return nn.functional.cross_entropy(output.float(), target)
    return nn.functional.mse_loss(output.float(), target)


def _target(output, generator, device):
    if output.dim() == 2:
        return torch.randint(0, output.shape[1], (output.shape[0],), generator=generator).to(device)
    return torch.randn(output.shape, generator=generator).to(device)


#: Entries of each profile's tables (device time, host time).
PROFILE_TOP = 15


def profile_steps(step, device, steps: int) -> dict:
    """``steps`` training steps under :mod:`torch.profiler`: per step, the device's busy time (the sum of
    its kernels' and copies' own times; a step's wall time beyond it is the device waiting for the host
    or for a synchronisation) and the operations that take most device and host time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    t0 = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        _sync(device)
    wall = time.perf_counter() - t0
    events = prof.key_averages()

    # the device's own events (kernels, copies, sets): an operator's device time is its kernels' again
    on_device = [e for e in events if e.device_type == DeviceType.CUDA]

    def top(attr, among):
        ranked = sorted((e for e in among if getattr(e, attr) > 0), key=lambda e: -getattr(e, attr))
        return [{"name": e.key, "calls_per_step": e.count / steps, "ms_per_step": getattr(e, attr) / steps / 1e3}
                for e in ranked[:PROFILE_TOP]]
    busy = sum(e.self_device_time_total for e in on_device) / steps / 1e3 if device.type == "cuda" else None
    # the drop-in's autograd functions (convtune.torch._ops), forward and backward nodes: their own host
    # time is the drop-in's Python around convtune's plans (the plans' launches and PyTorch calls aside)
    ours = [e for e in events if e.key.startswith(DROP_IN_FUNCTIONS) and e.device_type != DeviceType.CUDA]
    drop_in = {"calls_per_step": sum(e.count for e in ours) / steps,
               "host_ms_per_step": sum(e.self_cpu_time_total for e in ours) / steps / 1e3}
    return {"steps": steps, "wall_ms_per_step": wall / steps * 1e3, "device_busy_ms_per_step": busy,
            "device_top": top("self_device_time_total", on_device) if device.type == "cuda" else [],
            "host_top": top("self_cpu_time_total", events), "drop_in_functions": drop_in}


#: The name prefixes of the drop-in's autograd functions in a profile (``_Forward``, its backward node
#: ``_ForwardBackward``, ``_Backward``, ``_KeptForward``...).
DROP_IN_FUNCTIONS = ("_Forward", "_Backward", "_KeptForward")


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def prepare_mode(mode, base, x, target, device, *, warmup, runtime=None, progress=None, graph=False):
    """Set ``mode`` up on a copy of ``base``: patch and tune ahead (convtune), the first step (timed) and
    ``warmup`` more; returns ``(record, step, runtime)``, ``step()`` being one training step. With
    ``graph``, ``step()`` replays the whole step captured in a CUDA graph (:func:`capture_step`)."""
    _flags(mode, device)
    kind = _kind(mode)
    amp = kind.endswith("amp-bf16")
    model = copy.deepcopy(base).to(device)
    inp = x
    if amp and x.dim() == 4:
        model = model.to(memory_format=torch.channels_last)
        inp = x.contiguous(memory_format=torch.channels_last)
    record = {"mode": mode}
    if kind.endswith("-native"):  # PyTorch's convolution through the drop-in (see the module docstring)
        runtime = Runtime(store=MemoryPlanStore(), planner_options={"strategies": ["torch"]})
    if kind.startswith("convtune"):
        record["patched_layers"] = len(patch(model, math="auto", runtime=runtime,
                                             keep_spectra=_KEEP.get(kind[kind.rfind("-"):], DEFAULT_KEEP_SPECTRA)))
        if progress:
            progress(f"{mode}: tuning ahead")
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            # (the -native modes measure the drop-in's own cost: their layers stay patched; graphed steps leave the
            # host out, so their plans are weighed on the device's time alone)
            report = tune(model, inp, runtime=runtime, progress=False, hand_back=not kind.endswith("-native"),
                          graphed=graph)
        record["tuning"] = {"seconds": report.seconds, "problems": len(report.problems), "tuned": report.tuned,
                            "cached": report.cached, "routes": report.routes, "handed_back": len(report.handed_back),
                            "host_bound": report.host_bound, "graphed": report.graphed,
                            "not_searched": len(report.not_searched),
                            "step_ratio": report.step_ratio, "step_handed_back": len(report.step_handed_back),
                            "step_host_ms": _ms(report.step_host_s),
                            "step_ms": _ms(report.step_s), "steps_spared": report.steps_spared,
                            "failed": [(p.key(), r) for p, r in report.failed],
                            "phases": dict(report.phases)}
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)

    def body(cache=True):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp, cache_enabled=cache):
            out = model(inp)
        loss = _loss(out, target)
        loss.backward()
        opt.step()
        return loss

    def step():
        opt.zero_grad(set_to_none=True)
        return body()

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if progress:
        progress(f"{mode}: first step")
    _sync(device)
    t0 = time.perf_counter()
    first_loss = float(step().detach())
    _sync(device)
    record["first_step_s"] = time.perf_counter() - t0
    record["first_loss"] = first_loss
    for _ in range(warmup):
        step()
    if graph:
        if progress:
            progress(f"{mode}: capturing a step in a CUDA graph")
        t0 = time.perf_counter()
        step = capture_step(body, opt, device)
        record["capture_s"] = time.perf_counter() - t0
    return record, step, runtime


def capture_step(body, opt, device):
    """A training step captured whole in a CUDA graph, as PyTorch's recipe has it (three steps on a side
    stream first, gradients set to ``None`` before the capture so that the captured backward writes them
    rather than adding to them, autocast without its cast cache); returns ``step()``, which replays it and
    returns the loss (the graph's own tensor). Inside the capture, convtune records the plans that its eager
    steps resolved, where they record safely (:meth:`convtune.torch._dispatch.Route.run`)."""
    if device.type != "cuda":
        raise ValueError("--graph captures CUDA graphs: it needs a CUDA device")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body(cache=False)
    torch.cuda.current_stream(device).wait_stream(side)
    opt.zero_grad(set_to_none=True)
    graph = torch.cuda.CUDAGraph()
    # a stream of its own for each capture: PyTorch keeps a cuBLAS workspace per stream, made on the stream's
    # first use, so a stream that nothing has used yet makes it inside this graph's memory pool; on the one
    # capture stream that torch.cuda.graph shares by default, graphs captured later would use a workspace of
    # an earlier graph's pool, or of no pool (pytorch/pytorch#193402)
    with torch.cuda.graph(graph, stream=torch.cuda.Stream(device)):
        loss = body(cache=False)
    torch.cuda.synchronize(device)

    def step():
        graph.replay()
        return loss
    # The graph reads and writes memory it did not allocate: the parameters, the optimizer's momentum buffers, the
    # input and the target, all made by eager steps before the capture. The step holds them (through ``body``, which
    # holds the model and its input, and ``opt``) for as long as the graph can be replayed: without that the caller's
    # last reference could go, their blocks return to PyTorch's allocator, and a replay writes into whatever the next
    # model put there (an illegal memory access once that memory was given back to the driver).
    step.graph, step.held = graph, (body, opt)  # (freed with the step)
    return step


def timed_steps(step, device, steps: int) -> tuple[list[float], list[float]]:
    """``steps`` training steps, each timed alone: ``(seconds, host_seconds)`` per step, the first by
    CUDA events around the step (host clock on the CPU), the second the host's time to issue it (until
    ``step()`` returns, before the step's end is awaited: where it nears the first, the step waited on
    the host)."""
    samples, host = [], []
    for _ in range(steps):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            step()
            host.append(time.perf_counter() - t0)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            step()
            samples.append(time.perf_counter() - t0)
            host.append(samples[-1])
    return samples, host


def _summarise(record: dict, samples: list[float], host: list[float]) -> None:
    record["step_ms"] = statistics.median(samples) * 1e3
    ordered = sorted(samples)
    q = statistics.quantiles(ordered, n=4) if len(ordered) >= 4 else (ordered[0], None, ordered[-1])
    record["spread_ms"] = (q[2] - q[0]) * 1e3
    record["host_ms"] = statistics.median(host) * 1e3
    record["steps"] = len(samples)


def run_mode(mode, base, x, target, device, *, steps, warmup, runtime=None, progress=None, profile=0,
             graph=False) -> dict:
    """Train a copy of ``base`` for ``warmup + steps`` steps in ``mode``; returns the mode's record."""
    record, step, runtime = prepare_mode(mode, base, x, target, device, warmup=warmup, runtime=runtime,
                                         progress=progress, graph=graph)
    if progress:
        progress(f"{mode}: {steps} timed steps")
    with _watched(record, steps):
        _summarise(record, *timed_steps(step, device, steps))
    if device.type == "cuda":
        record["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    _finish(record, mode, step, device, runtime, progress, profile)
    step = None  # the memory goes back below
    _give_back(device)
    return record


def _finish(record, mode, step, device, runtime, progress, profile) -> None:
    if profile:
        if progress:
            progress(f"{mode}: {profile} profiled steps")
        record["profile"] = profile_steps(step, device, profile)
    if _kind(mode).startswith("convtune"):
        record["routes"] = _routes(runtime)


class _GcWatch:
    """Python's garbage collections while it is entered (``gc.callbacks``): how many, how many of the oldest
    generation, and the host seconds they took. In a host-bound step a collection lengthens the step it falls in."""

    def __init__(self):
        self.count = self.full = 0
        self.seconds = 0.0
        self._started: float | None = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self.count += 1
            self.full += info.get("generation") == 2
            self._started = None

    def __enter__(self) -> _GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)


@contextlib.contextmanager
def _watched(record: dict, steps: int):
    """Around ``steps`` timed steps of ``record``'s mode: the CUDA graphs its plans made and replayed
    (:func:`_count_graphs`) and Python's garbage collections (``gc_collections``, ``gc_full``, ``gc_s``) added
    to ``record``."""
    before = replay.counts()
    with _GcWatch() as collections:
        yield
    _count_graphs(record, before, steps)
    record["gc_collections"] = record.get("gc_collections", 0) + collections.count
    record["gc_full"] = record.get("gc_full", 0) + collections.full
    record["gc_s"] = record.get("gc_s", 0.0) + collections.seconds


def _count_graphs(record: dict, before: tuple, steps: int) -> None:
    """Add to ``record`` the CUDA graphs the plans' by-address launches made and replayed, and the host seconds
    making them took, since ``before`` was read (:func:`convtune.direct.replay.counts`), over ``steps`` more timed
    steps; nothing where the mode made and replayed none (PyTorch's modes, plans without such launches)."""
    now = replay.counts()
    if now[:2] == before[:2] and "graphs_made" not in record:
        return
    for name, was, is_ in zip(("graphs_made", "graph_replays", "graph_capture_s"), before, now):
        record[name] = record.get(name, 0) + is_ - was
    record["graph_steps"] = record.get("graph_steps", 0) + steps


#: Untimed steps at the start of each mode's turn in interleaved rounds (see the module docstring).
TURN_UNTIMED = 2


def run_interleaved(modes, base, x, target, device, *, steps, warmup, rounds, runtime=None, progress=None,
                    profile=0, report=None, graph=False, runtimes=None) -> list[dict]:
    """Every mode set up in turn (PyTorch's first, as :func:`bench_model` orders them), then their timed
    steps in ``rounds`` interleaved rounds (each mode ``steps / rounds`` steps per round, in turn), so
    that what drifts over a run (clocks, temperature, the allocator's state) weighs on every mode alike.
    A mode whose set-up fails is a record with ``failed``; the others go on. ``report(records)`` is
    called after each set-up and each round with the records so far (``rounds``: the rounds done), so
    that an interrupted run keeps what it measured. ``runtimes``: a mode's own runtime, where it has one
    (the ``...-against`` copies)."""
    prepared = []  # (record, step, runtime)
    records = []
    for mode in modes:
        try:
            prepared.append(prepare_mode(mode, base, x, target, device, warmup=warmup,
                                         runtime=(runtimes or {}).get(mode, runtime), progress=progress, graph=graph))
        except Exception as exc:
            log.warning("bench-model %s failed: %s", mode, exc)
            prepared.append(({"mode": mode, "failed": f"{type(exc).__name__}: {exc}"}, None, None))
        records.append(prepared[-1][0])
        if report:
            report(records)
    per_round = [steps // rounds + (1 if r < steps % rounds else 0) for r in range(rounds)]
    samples = [([], []) for _ in prepared]  # each mode's step and host seconds so far
    turns = list(zip(prepared, samples))
    for r, n in enumerate(per_round):
        if progress:
            progress(f"round {r + 1} of {rounds}: {n} timed steps per mode")
        first = r % len(turns)  # (the order rotates: no mode always follows the same one)
        for (record, step, _), (all_s, all_h) in turns[first:] + turns[:first]:
            if "failed" in record:
                continue
            _flags(record["mode"], device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                for _ in range(TURN_UNTIMED):  # untimed: the first steps after another model's
                    step()
                _sync(device)
                with _watched(record, n):
                    s, h = timed_steps(step, device, n)
            except Exception as exc:
                log.warning("bench-model %s failed: %s", record["mode"], exc)
                record["failed"] = f"{type(exc).__name__}: {exc}"
                continue
            all_s += s
            all_h += h
            _summarise(record, all_s, all_h)
            record["rounds"] = r + 1
            record.setdefault("round_ms", []).append(statistics.median(s) * 1e3)
            if device.type == "cuda":
                record["peak_memory_bytes"] = max(record.get("peak_memory_bytes", 0),
                                                  torch.cuda.max_memory_allocated(device))
        if report:
            report(records)
    for record, step, rt in prepared:
        if "failed" not in record:
            _flags(record["mode"], device)
            _finish(record, record["mode"], step, device, rt, progress, profile)
    prepared = None
    _give_back(device)
    return records


def _routes(runtime) -> list[dict]:
    rt = runtime or default_runtime()
    routes = []
    for route in rt.layer_memo("torch").values():
        entry = {"layer": route.problem.key(), **route.labels()}
        if route.capture.native:  # passes recorded in CUDA graphs as PyTorch's convolution
            entry["in_graphs_pytorch"] = sorted(route.capture.native)
        routes.append(entry)
    return routes


def bench_model(spec: str, *, batch=None, input_shape=None, modes=DEFAULT_MODES, steps=20, warmup=3,
                device=None, runtime=None, seed=0, progress=None, checkpoint=None, command="", profile=0,
                rounds=1, graph=False, null=False, against=None) -> dict:
    """Benchmark ``spec``'s training step in every mode (see the module docstring), in :data:`MODES`'
    order; returns the JSON document (``checkpoint(doc)`` is called after each mode; interleaved, after each
    mode's set-up and each round). ``rounds`` above 1: the timed steps of all modes interleaved in that
    many rounds (:func:`run_interleaved`). ``graph``: every mode's step captured whole in a CUDA graph and
    replayed (:func:`capture_step`), PyTorch's modes too. ``null``: each PyTorch mode twice (interleaved
    only; see the module docstring). ``against``: a runtime on another plan cache, each convtune mode run on its
    plans too (interleaved only)."""
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {', '.join(unknown)}; acceptable: {', '.join(MODES)}")
    if not 1 <= rounds <= steps:
        raise ValueError(f"rounds must be between 1 and the timed steps ({steps}), got {rounds}")
    if null and rounds < 2:
        raise ValueError("--null times each PyTorch mode twice side by side: it needs --rounds 2 or more")
    if against is not None and rounds < 2:
        raise ValueError("--against times each convtune mode on two caches' plans side by side: it needs --rounds 2 "
                         "or more")
    modes = sorted(dict.fromkeys(modes), key=MODES.index)
    if against is not None and not any(m.startswith("convtune") for m in modes):
        raise ValueError("--against compares convtune modes' plans: give at least one convtune mode")
    if null:  # (the copies set up right after PyTorch's modes, before convtune tunes anything)
        peers = [m for m in modes if m.startswith("torch")]
        modes = peers + [m + AGAIN for m in peers] + [m for m in modes if not m.startswith("torch")]
    runtimes = {}
    if against is not None:  # (each copy right after its mode)
        modes = [c for m in modes for c in ((m, m + AGAINST) if m.startswith("convtune") else (m,))]
        runtimes = {m: against for m in modes if m.endswith(AGAINST)}
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if graph and device.type != "cuda":
        raise ValueError(f"a CUDA graph captures work on a CUDA device, not on {device}: drop --graph or run on a GPU")
    torch.manual_seed(seed)
    base = model_specs.build_model(spec, "cpu")
    shape = model_specs.input_shape_for(spec, base, batch, input_shape)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=gen).to(device)
    with torch.no_grad():  # the output's shape, for the loss's target
        probe = copy.deepcopy(base).eval().to(device)
        out_shape = (shape[0], *probe(x[:2]).shape[1:])
    target = _target(torch.empty(out_shape), gen, device)
    del probe
    _give_back(device)
    doc = {"format": FORMAT, "format_version": FORMAT_VERSION, "command": command,
           "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "model": spec,
           "input_shape": list(shape), "parameters": model_specs.parameter_count(base), "device": str(device),
           "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else
           (platform.processor() or f"{platform.machine()} CPU"),  # (processor() is empty on many Linux systems)
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
           "convtune": __version__, "steps": steps, "warmup": warmup, "rounds": rounds, "graph": graph,
           "null": null, "against": getattr(getattr(against, "store", None), "display_url", None)
           if against is not None else None,
           "modes": [],
           "complete": False}
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        doc["modes"] += [{"mode": m, "absent": "this GPU has no bf16"} for m in modes if m.endswith("amp-bf16")]
        modes = [m for m in modes if not m.endswith("amp-bf16")]
    if rounds > 1:
        before = list(doc["modes"])

        def report(records):
            doc["modes"] = before + records
            if checkpoint:
                checkpoint(doc)
        run_interleaved(modes, base, x, target, device, steps=steps, warmup=warmup, rounds=rounds, runtime=runtime,
                        progress=progress, profile=profile, report=report, graph=graph, runtimes=runtimes)
        modes = []
    for mode in modes:
        try:
            doc["modes"].append(run_mode(mode, base, x, target, device, steps=steps, warmup=warmup, runtime=runtime,
                                         progress=progress, profile=profile, graph=graph))
        except Exception as exc:  # a failed mode is a result; the others still run
            log.warning("bench-model %s %s failed: %s", spec, mode, exc)
            doc["modes"].append({"mode": mode, "failed": f"{type(exc).__name__}: {exc}"})
            _give_back(device)
        if checkpoint:
            checkpoint(doc)
    doc["complete"] = True
    if checkpoint:
        checkpoint(doc)
    return doc
