"""``convtune bench``: time convtune's runtime dispatch and the peers, per layer and pass.

convtune is timed through the path training code takes: ``convtune.conv`` (and the
backward functions) with a runtime backed by the plan cache, tuning on a miss
before timing. Every result is checked against a float64 reference on the
same device. One JSON document holds everything (:func:`run_bench`).
"""

from __future__ import annotations

import functools
import logging
import math
import platform
import sys
from datetime import datetime, timezone
from typing import Callable

from ..backend import Backend
from ..direct.reference import reference
from ..netlayer import Layer
from ..planner import random_operands, relative_error
from ..problem import ConvProblem
from ..roundtrip import RoundTrip, round_trip_operands, round_trip_references, time_round_trip, timed_steps
from ..arrayapi import conv, conv_backward_data, conv_backward_filter
from ..runtime import Runtime
from ..timing import paired_ratio
from . import torchfft
from .peers import Chosen, NotApplicable, as_cupy

log = logging.getLogger("convtune")

FORMAT = "convtune-bench"
FORMAT_VERSION = 1

#: The synthetic sweep of fbfft's evaluation, kept small enough to run in minutes.
SWEEP_KERNELS = (3, 5, 7, 9, 11, 13)
SWEEP_INPUTS = (16, 32, 64, 128)
SWEEP_SETTINGS = ({"batch": 32, "channels": 64},)


def _dispatch_fn(problem: ConvProblem, a, b, out, runtime: Runtime) -> Callable:
    kw = dict(stride=problem.stride, padding=problem.padding, dilation=problem.dilation, groups=problem.groups,
              math=problem.math, out=out, runtime=runtime)
    if problem.pass_ == "fwd":
        return lambda: conv(a, b, **kw)
    if problem.pass_ == "dgrad":
        return lambda: conv_backward_data(a, b, problem.x_shape, **kw)
    return lambda: conv_backward_filter(a, b, problem.w_shape, **kw)


def bench_pass(problem: ConvProblem, backend: Backend, runtime: Runtime, timer, peers, seed: int = 0) -> dict:
    """One layer, one pass: every peer, then convtune, timings and errors vs float64.

    The peers run first and memory is given back before convtune's turn: PyTorch's
    ``cudnn.benchmark`` skips algorithms whose workspace it cannot allocate, so it must not run
    beside what tuning holds (on the H100 PyTorch fp32's fbfft-L2 forward took 1.6x longer when
    timed after convtune's tuning than before it)."""
    xp = backend.xp
    a, b = random_operands(backend, problem, seed)
    ref = reference(xp, problem, a.astype(xp.float64), b.astype(xp.float64))
    record = {"peers": {}}
    paired_peer, peer_fn = parity_peer(problem), None
    for peer in peers:
        if peer.make is None:
            record["peers"][peer.name] = {"absent": peer.absent_reason}
            continue
        try:
            fn = peer.make(problem, a, b)  # (the cuDNN peer tunes here: no engine is its failure, not the bench's)
        except NotApplicable as exc:
            record["peers"][peer.name] = {"not_applicable": str(exc)}
            continue
        except Exception as exc:
            record["peers"][peer.name] = {"failed": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
            _give_back_memory(backend)
            continue
        try:
            err = relative_error(xp, as_cupy(fn(), xp).reshape(problem.result_shape), ref)
            stats = timer(fn, backend, peer.name)
            record["peers"][peer.name] = {"median_ms": stats.median_s * 1e3, "spread_ms": stats.spread_s * 1e3,
                                          "repeats": stats.repeats, "error": err}
            if isinstance(fn, Chosen):
                record["peers"][peer.name]["plan"] = fn.label
            if peer.name == paired_peer:
                peer_fn = fn  # timed again beside the drop-in below
        except Exception as exc:
            record["peers"][peer.name] = {"failed": f"{type(exc).__name__}: {exc}"}
        _give_back_memory(backend)
    # convtune's call returns its result as the peers' do (no ``out``): a plan of PyTorch's own
    # convolution hands back PyTorch's tensor as a view, where writing into ``out`` would add a copy
    # (on the H100 3-D layers' PyTorch plans measured 0.23x to 0.97x of PyTorch itself with it; how
    # much of that was the copy and how much the array path's host work was not measured)
    layer_call = None  # the pass as the PyTorch layer runs it
    try:
        drop_in = _drop_in_call(problem, a, b, runtime) if problem.dtype != "float32" else None
        if drop_in is not None:  # half precision: as training runs it, on tensors of its dtype (no conversions
            call, route, how = drop_in  # around PyTorch's own plan; the others' are theirs), like the PyTorch peers
            err = relative_error(xp, as_cupy(call(), xp), ref)
            label = _drop_in_label(route, problem.pass_, how)
            plan = runtime.plan_for(problem, backend)  # (resolved by the call above: its source)
        else:
            plan = None
            if problem.dtype == "bfloat16":  # float32 arrays of bfloat16 values: the array API would see float32
                plan = runtime.plan_for(problem, backend)
                call = functools.partial(plan, a, b)
            else:
                call = _dispatch_fn(problem, a, b, None, runtime)
            err = relative_error(xp, call(), ref)  # (tunes on a cache miss; the timed calls are warm hits)
            plan = plan or runtime.plan_in_memo(problem)
            label = plan.label
        stats = timer(call, backend, "convtune")
        record["convtune"] = {"plan": label, "source": plan.source,
                              "median_ms": stats.median_s * 1e3, "spread_ms": stats.spread_s * 1e3,
                              "repeats": stats.repeats, "error": err}
        if drop_in is not None:
            record["convtune"]["via"] = "convtune.torch on tensors of the problem's dtype and layout"
            layer_call = call
    except Exception as exc:  # a failure is a result to report, not a reason to stop the benchmark
        log.warning("convtune failed on %s: %s", problem.key(), exc)
        record["convtune"] = {"failed": f"{type(exc).__name__}: {exc}"}
    if problem.dtype == "float32" and "failed" not in record["convtune"]:
        # (not beside what the array call and its tuning left pooled, as no contestant runs beside another's cache:
        # on the H100 PyTorch's own wgrad of a 3-D layer, the peer's call exactly, measured 176 us, spread 81, there
        # against the peer's 56; whether the pool was the cause is not established)
        _give_back_memory(backend)
        record["drop_in"], layer_call = bench_drop_in(problem, a, b, ref, backend, runtime, timer)
    if peer_fn is not None and layer_call is not None and hasattr(timer, "interleaved"):
        _give_back_memory(backend)
        contender = DROP_IN if "drop_in" in record else "convtune"  # (half precision: convtune's call is the layer's)
        theirs = (record["peers"].get(paired_peer) or {}).get("median_ms")
        ours = (record.get("drop_in") or record["convtune"]).get("median_ms")
        if theirs and ours and not 1 / PAIRED_WITHIN <= theirs / ours <= PAIRED_WITHIN:
            record["paired"] = {"skipped": f"the separate medians differ by more than {PAIRED_WITHIN:g}x: timing "
                                           "them side by side would decide nothing"}
        else:
            record["paired"] = bench_paired(paired_peer, peer_fn, layer_call, contender, backend, timer,
                                            pair_ms=theirs + ours if theirs and ours else None)
    del ref, a, b, peer_fn, layer_call
    return record


def parity_peer(problem: ConvProblem) -> str:
    """The PyTorch peer a pass is held to (the per-pass targets' ``<= 1.03x PyTorch``): PyTorch in the problem's
    dtype and layout with TF32 as the problem's math mode allows."""
    return "torch-tf32" if problem.math == "tf32" else "torch-fp32"


#: The side-by-side measurement's repeats: at least the timer's, more for quick passes (as many as fit in
#: PAIRED_BUDGET_S), at most PAIRED_MAX_REPEATS.
PAIRED_BUDGET_S, PAIRED_MAX_REPEATS = 1.0, 200
#: A pass is timed side by side only where the separate medians are within this factor of each other: further
#: apart, the parity verdict is not in doubt, and next to a peer many times slower the contender measured
#: slower than alone (on the H100, long-16k-dw's passes took 0.87-0.98 ms beside PyTorch's 47-332 ms, 0.58 alone)
PAIRED_WITHIN = 2.0


def bench_paired(peer_name: str, peer_fn, layer_call, contender: str, backend: Backend, timer,
                 pair_ms: float | None = None) -> dict:
    """The pass through the PyTorch layer and the parity peer timed side by side, repeat by repeat
    (:meth:`CudaEventTimer.interleaved`), after convtune has tuned and given its memory back (PyTorch's
    algorithm choice was made when the peer first ran, before tuning). Each side's median and the median of
    the per-repeat ratios (peer / drop-in): the per-pass parity figure, freer of drift than two medians
    taken minutes apart. The peer runs a second time in each repeat, and its ratio to itself (``null_ratio``)
    says how far from 1 the measurement puts two runs of one call. ``pair_ms``: the two calls' time together,
    as measured before (on the GPU, more repeats for quick passes, whose ratios scatter most)."""
    repeats = getattr(timer, "repeats", 25)
    if pair_ms and backend.name == "cupy":  # (a CPU timer's repeat lasts its minimum time, however quick the call)
        repeats = max(repeats, min(PAIRED_MAX_REPEATS, int(PAIRED_BUDGET_S * 1e3 / pair_ms)))
    try:
        # the peer twice: the same call timed against itself (METHOD.md: "time the same version twice; a difference
        # smaller than that is noise"); on the H100 one PyTorch call measured 0.95x of itself in the same interleaved
        # run on 17-20 us passes of 3-D layers
        peer, ours, again = timer.interleaved([peer_fn, layer_call, peer_fn], backend, f"{peer_name} / {contender}",
                                              repeats=repeats)
        ratio, null = paired_ratio(peer, ours), paired_ratio(peer, again)
        return {"peer": peer_name, "contender": contender, "peer_ms": peer.median_s * 1e3,
                "median_ms": ours.median_s * 1e3, "ratio": ratio.median_s, "ratio_spread": ratio.spread_s,
                "repeats": ours.repeats, "null_ratio": null.median_s, "null_spread": null.spread_s}
    except Exception as exc:  # a result to report
        return {"failed": f"{type(exc).__name__}: {exc}"}


def bench_drop_in(problem: ConvProblem, a, b, ref, backend: Backend, runtime: Runtime, timer) -> dict:
    """A float32 pass as a PyTorch user's patched layer runs it: the layer's route on tensors (the plan, or
    PyTorch's convolution where it won the duel in the layer, host work and all), timed like the peers; the
    array API above pays what a PyTorch user does not (DLPack views, its own dispatch) and skips the duel.
    Returns ``(record, call)``: ``call`` runs the pass again (None where it could not run)."""
    try:
        drop_in = _drop_in_call(problem, a, b, runtime)
        if drop_in is None:
            return {"absent": "PyTorch is not installed"}, None
        call, route, how = drop_in
        err = relative_error(backend.xp, as_cupy(call(), backend.xp).reshape(problem.result_shape), ref)
        before = _allocator_counts()
        stats = timer(call, backend, "drop-in")
        record = {"route": _drop_in_label(route, problem.pass_, how), "median_ms": stats.median_s * 1e3,
                  "spread_ms": stats.spread_s * 1e3, "min_ms": stats.min_s * 1e3, "repeats": stats.repeats,
                  "error": err}
        if before is not None:  # (a timed call that reaches the driver for memory pays for it: shown, not hidden)
            record["allocator"] = {k: v - before[k] for k, v in _allocator_counts().items()}
        return record, call
    except Exception as exc:  # a result to report
        return {"failed": f"{type(exc).__name__}: {exc}"}, None


def _allocator_counts() -> dict | None:
    """PyTorch's CUDA caching allocator's counts of device allocations, frees and retries (a retry frees the cache and
    allocates again), or ``None`` without a CUDA PyTorch: their change over the drop-in's timed calls is in the record."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    stats = torch.cuda.memory_stats()
    return {"device_allocs": stats.get("num_device_alloc", 0), "device_frees": stats.get("num_device_free", 0),
            "retries": stats.get("num_alloc_retries", 0)}


def _drop_in_call(problem: ConvProblem, a, b, runtime: Runtime):
    """``(call, route, label)``: the pass as the PyTorch layer runs it in a training step, on tensors of the
    problem's dtype made from the operands (``call()`` returns the result tensor), and what runs it; ``None``
    without PyTorch. That is the layer's route, except for a gradient pass of a layer whose training calls
    PyTorch's own convolution and autograd run (every pass of the layer settled to PyTorch's convolution:
    ``Route.native_for_grads``): there the pass is PyTorch's own computation of it, as its autograd makes it;
    the route's per-pass call, with its host work, is a path such a layer's training never takes."""
    try:
        import torch

        from ..torch._dispatch import _EXEC, route_for
    except ImportError:
        return None
    dtype = getattr(torch, problem.dtype)
    ta, tb = (torch.from_dlpack(v).to(dtype) for v in (a, b))  # (the layout's strides are kept)
    fwd = problem.for_pass("fwd")
    route = route_for(fwd.x_shape, fwd.w_shape, fwd.stride, fwd.padding, fwd.dilation, fwd.groups, fwd.math,
                      ta.device, runtime, dtype, fwd.layout)
    if problem.pass_ != "fwd" and route.native_for_grads(True, True):  # (resolves the layer's every pass)
        compute = getattr(route, _EXEC[problem.pass_]).fn  # (with the cuDNN flags its plan was measured with)
        return (lambda: compute(ta, tb)), route, "PyTorch's autograd (every pass of the layer is PyTorch's)"
    return (lambda: route.run(problem.pass_, ta, tb)), route, None


def _drop_in_label(route, pass_: str, how: str | None) -> str:
    """What runs a pass in the PyTorch layer (:func:`_drop_in_call`'s ``how`` added where it is not the route)."""
    return route.labels()[pass_] + (f", run by {how}" if how else "")


def round_trip(passes: dict) -> dict:
    """Sum of the passes' medians per contestant (``drop-in``: the PyTorch layer's routes, where measured);
    None where any pass is missing."""
    names = {"convtune"} | {n for rec in passes.values() for n in rec["peers"]}
    if any("drop_in" in rec for rec in passes.values()):
        names.add(DROP_IN)
    totals = {}
    for name in sorted(names):
        ms = [(rec["convtune"] if name == "convtune" else rec.get("drop_in", {}) if name == DROP_IN else
               rec["peers"].get(name, {})).get("median_ms") for rec in passes.values()]
        totals[name] = sum(ms) if ms and all(m is not None for m in ms) else None
    return totals


#: The round trip's key for the PyTorch layer's routes (:func:`bench_drop_in`).
DROP_IN = "drop-in"


def bench_kept_spectra(problem: ConvProblem, backend: Backend, runtime: Runtime, timer, seed: int = 0) -> dict:
    """The layer's round trip with kept spectra (:mod:`convtune.roundtrip`), as the runtime decided it
    (tuned on a miss): the decision, and the winning round trip timed with the bench's timer (each
    pass after an L2 flush, on the memory the PyTorch layer hands it: :func:`convtune.roundtrip.timed_steps`) and
    checked against float64, whether or not it pays."""
    try:
        decision = runtime.round_trip_for(problem, backend)
    except Exception as exc:
        log.warning("round trip of %s failed: %s", problem.key(), exc)
        return {"failed": f"{type(exc).__name__}: {exc}"}
    if decision is None:
        return {"absent": "no stored round-trip decision and the runtime does not tune"}
    rec = {"decision": decision.describe(), "pays": decision.pays, "reason": decision.reason,
           "per_pass_labels": list(decision.per_pass_labels)}
    if decision.winner is None:
        return rec
    try:
        p = problem.for_pass("fwd")
        x, w, dy = round_trip_operands(backend, p, seed)
        trip = RoundTrip(p, decision.config, backend)
        errors = [relative_error(backend.xp, out, ref)
                  for out, ref in zip(trip(x, w, dy), round_trip_references(backend, p, x, w, dy))]
        stats = time_round_trip(timer, backend, trip, x, w, dy, "convtune-trip")
        trip.release()
    except Exception as exc:
        log.warning("round trip of %s failed: %s", problem.key(), exc)
        rec["failed"] = f"{type(exc).__name__}: {exc}"
        return rec
    rec.update(plan=decision.winner.label, median_ms=stats.median_s * 1e3, spread_ms=stats.spread_s * 1e3,
               repeats=stats.repeats, errors=dict(zip(("fwd", "dgrad", "wgrad"), errors)),
               held_bytes=decision.winner.workspace_bytes)
    return rec


def bench_peer_round_trip(problem: ConvProblem, backend: Backend, timer, seed: int = 0) -> dict:
    """The torch-fft peer's round trip as a training step runs it (forward with autograd, one backward
    for both gradients), timed whole and checked against float64."""
    import torch
    p = problem.for_pass("fwd")
    try:
        x, w, dy = round_trip_operands(backend, p, seed)
        fn = torchfft.round_trip(torch, p, x, w, dy)
        xp = backend.xp
        errors = [relative_error(xp, as_cupy(out, xp), ref)
                  for out, ref in zip(fn(), round_trip_references(backend, p, x, w, dy))]
        stats = timer(fn, backend, "torch-fft-trip")
    except Exception as exc:
        log.warning("the torch-fft round trip of %s failed: %s", problem.key(), exc)
        return {"failed": f"{type(exc).__name__}: {exc}"}
    within = max(errors) <= p.tolerance
    if not within:
        log.warning("the torch-fft round trip of %s misses its %s bound (relative error %.1e over %.0e)",
                    problem.key(), p.math, max(errors), p.tolerance)
    return {"median_ms": stats.median_s * 1e3, "spread_ms": stats.spread_s * 1e3, "repeats": stats.repeats,
            "errors": dict(zip(("fwd", "dgrad", "wgrad"), errors)), "within_bound": within}


def bench_trip_paired(problem: ConvProblem, backend: Backend, runtime: Runtime, timer, pair_ms: float,
                      seed: int = 0) -> dict:
    """The layer's kept-spectra round trip (the runtime's decision) and the torch-fft peer's, each timed whole after
    an L2 flush and side by side (:func:`bench_paired`: in turns, the peer twice a turn; the ratio is the peer's time
    over convtune's). The round trip's own figure sums its passes, each after its own flush; on the H100 a trip timed
    whole beside the peer came out 5 to 30% slower than that while its host time was longer, so both are reported."""
    import torch
    if not hasattr(timer, "interleaved"):
        return {"absent": "the timer cannot time calls side by side"}
    try:
        p = problem.for_pass("fwd")
        trip = RoundTrip(p, runtime.round_trip_for(problem, backend).config, backend)
        x, w, dy = round_trip_operands(backend, p, seed)
        peer = torchfft.round_trip(torch, p, x, w, dy)
        steps = timed_steps(trip, x, w, dy)  # (bfloat16: on its 16 bits where the trip reads them, as the layer runs it)
    except Exception as exc:  # a result to report
        return {"failed": f"{type(exc).__name__}: {exc}"}
    return bench_paired(torchfft.NAME, peer, lambda: [step() for step in steps], "convtune", backend, timer, pair_ms)


def bench_layer(layer: Layer, passes, backend, runtime, timer, peers, progress=None, keep_spectra=True,
                bandwidth: float | None = None) -> dict:
    entry = {"name": layer.name, "problem": layer.problem.key(), "flops": layer.problem.flops(), "passes": {}}
    fft_class = torchfft.unsupported_reason(layer.problem) is None
    for pass_ in passes:
        if progress:
            progress(f"{layer.name} {pass_}")
        entry["passes"][pass_] = bench_pass(layer.problem.for_pass(pass_), backend, runtime, timer, peers)
        if fft_class and bandwidth:
            entry["passes"][pass_]["floor_ms"] = torchfft.floor_ms(layer.problem.for_pass(pass_), bandwidth)
        _give_back_memory(backend)
    if set(passes) == {"fwd", "dgrad", "wgrad"}:
        entry["round_trip"] = round_trip(entry["passes"])
        if fft_class and bandwidth:
            entry["round_trip_floor_ms"] = torchfft.floor_ms(layer.problem, bandwidth, round_trip_=True)
        if fft_class and any(p.name == torchfft.NAME and p.make is not None for p in peers):
            if progress:
                progress(f"{layer.name} torch-fft round trip")
            trip = entry["torch_fft_round_trip"] = bench_peer_round_trip(layer.problem, backend, timer)
            if trip.get("median_ms") is not None:  # what a training step with the peer runs, timed whole
                entry["round_trip"][torchfft.NAME] = trip["median_ms"]
            _give_back_memory(backend)
        if keep_spectra:
            if progress:
                progress(f"{layer.name} round trip with kept spectra")
            kept = entry["kept_spectra"] = bench_kept_spectra(layer.problem, backend, runtime, timer)
            # convtune's round trip is what a layer with keep_spectra='auto' runs: the kept-spectra round
            # trip where the planner found that it pays, else the three per-pass plans
            if kept.get("pays") and kept.get("median_ms") is not None:
                entry["round_trip_per_pass_ms"] = entry["round_trip"].get("convtune")
                entry["round_trip"]["convtune"] = kept["median_ms"]
                entry["round_trip_plan"] = kept["plan"]
                peer_ms = (entry.get("torch_fft_round_trip") or {}).get("median_ms")  # (the peer's whole trip)
                if peer_ms is not None:
                    if progress:
                        progress(f"{layer.name} round trip side by side with {torchfft.NAME}")
                    entry["round_trip_paired"] = bench_trip_paired(layer.problem, backend, runtime, timer,
                                                                   peer_ms + kept["median_ms"])
            _give_back_memory(backend)
    return entry


def _give_back_memory(backend) -> None:
    """Return CuPy's pooled blocks (and PyTorch's cached ones, where PyTorch is loaded) after each
    measurement, so large layers' arrays do not add up and no contestant runs beside another's cache."""
    if backend.name == "cupy":
        backend.xp.get_default_memory_pool().free_all_blocks()
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()


def sweep_layers(math_mode: str, kernels=SWEEP_KERNELS, inputs=SWEEP_INPUTS, settings=SWEEP_SETTINGS) -> list[Layer]:
    """fbfft-style grid over kernel size x input size (valid convolution, stride 1)."""
    layers = []
    for s in settings:
        for k in kernels:
            for n in inputs:
                if k > n:
                    continue
                p = ConvProblem.make(batch=s["batch"], in_channels=s["channels"], out_channels=s["channels"],
                                     input_size=(n, n), kernel_size=k, math=math_mode)
                layers.append(Layer(f"sweep-k{k}-i{n}-c{s['channels']}-b{s['batch']}", p, "synthetic sweep"))
    return layers


def copy_bandwidth(backend, timer, nbytes: int | None = None) -> float | None:
    """The device's measured copy bandwidth in bytes per second (an array read and another written,
    counted as both), what a layer's floor (:func:`convtune.bench.torchfft.floor_ms`) is taken at."""
    xp = backend.xp
    nbytes = nbytes or ((256 << 20) if backend.name == "cupy" else (64 << 20))
    try:
        src = xp.ones(nbytes // 4, dtype=xp.float32)
        dst = xp.empty_like(src)
        stats = timer(lambda: xp.copyto(dst, src), backend, "copy")
    except Exception as exc:  # memory: the floors are left out, not the benchmark
        log.warning("copy bandwidth not measured: %s", exc)
        return None
    finally:
        src = dst = None
    return 2 * nbytes / stats.median_s if stats.median_s > 0 else None


def environment(backend) -> dict:
    env = {"python": platform.python_version(), "numpy": backend.device_info().numpy}
    for name in ("torch", "cupy"):
        try:
            mod = __import__(name)
            env[name] = mod.__version__
        except ImportError:
            pass
    if "torch" in env:
        import torch
        env["torch_cudnn"] = torch.backends.cudnn.version() if torch.cuda.is_available() else None
    return env


def run_bench(layers: list[Layer], passes, backend, runtime, timer, peers, *, command: str, math_mode: str,
              sweep: list[Layer] | None = None, dispatch_overhead: dict | None = None, progress=None,
              checkpoint=None, keep_spectra: bool = True) -> dict:
    """Benchmark every layer (then the sweep); ``checkpoint(results)`` is called after each one,
    so a long run that is cut off keeps what it measured."""
    results = {
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "command": command,
        "device": backend.device_info().as_dict(), "device_key": backend.device_info().key(),
        "backend": backend.name, "environment": environment(backend), "math": math_mode, "timer": repr(timer),
        "peers": {p.name: ({"available": True} if p.make else {"available": False, "reason": p.absent_reason})
                  for p in peers},
        "dispatch_overhead": dispatch_overhead, "keep_spectra": keep_spectra, "layers": [], "sweep": [] if sweep else None, "complete": False,
    }
    bandwidth = copy_bandwidth(backend, timer)
    results["copy_bandwidth_GBps"] = bandwidth / 1e9 if bandwidth else None
    for key, items in (("layers", layers), ("sweep", sweep or [])):
        for layer in items:
            results[key].append(bench_layer(layer, passes, backend, runtime, timer, peers, progress, keep_spectra,
                                            bandwidth))
            if checkpoint:
                checkpoint(results)
    results["complete"] = True
    if checkpoint:
        checkpoint(results)
    return results


def speedup(entry_times: dict, peer: str) -> float | None:
    ours, theirs = entry_times.get("convtune"), entry_times.get(peer)
    if ours is None or theirs is None or ours <= 0 or not math.isfinite(theirs):
        return None
    return theirs / ours
