"""The benchmark commands of the ``convtune`` command line: ``bench``, ``bench-model`` and ``report``
(added to :func:`convtune.cli.main`)."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys

import click

from ..cache import PlanCache
from ..commandline import (backend_named, busy_note, db_option, dtype_option, echo, format_ms_value, format_table,
                           input_shape_option, layout_option, parse_passes, parse_shapes, positive_ints, within_noise)
from ..network import load_network
from ..runtime import Runtime
from ..text import time_went
from ..timing import CpuTimer, CudaEventTimer
from .dispatch import measure_dispatch_overhead
from .peers import available_peers
from .report import PARITY_BOUND, make_report, parity
from . import runner
from .runner import DROP_IN, speedup, sweep_layers
from .steps import AGAIN, AGAINST, HOST_BOUND, host_bound, paired, speedups

#: The peers that run PyTorch's own call as a plan of the ``torch`` strategy runs it, by math mode: against them a
#: plan that is PyTorch's call is PyTorch's own, not faster or slower
SAME_CALL = {"fp32": ("torch-fp32",), "tf32": ("torch-tf32",)}


def _command_line(name: str) -> str:
    """This process's command line as the results file records it."""
    return "convtune " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv else f"convtune {name}"


def _json_writer(output: str):
    """``write(doc)``: the results document to ``output``, through a temporary file (never half written)."""
    def write(doc):
        with open(output + ".tmp", "w") as fh:
            json.dump(doc, fh, indent=1)
        os.replace(output + ".tmp", output)
    return write


@click.command()
@click.argument("network", required=False)
@db_option
@click.option("--sweep", is_flag=True, help="Also run the fbfft-style synthetic sweep (kernel x input size).")
@click.option("--sweep-kernels", default="3,5,7,9,11,13", show_default=True, help="Sweep kernel sizes.")
@click.option("--sweep-inputs", default="16,32,64,128", show_default=True, help="Sweep input sizes.")
@click.option("--sweep-settings", default="32x64", show_default=True,
              help="Sweep batch x channels settings, comma-separated (e.g. 32x64,128x16).")
@click.option("--passes", default="fwd,dgrad,wgrad", show_default=True)
@click.option("--math", "math_mode", type=click.Choice(["fp32", "tf32"]), default="fp32", show_default=True)
@dtype_option
@layout_option
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Override every layer's batch size.")
@input_shape_option
@click.option("--layers", "only", default=None, help="Comma-separated layer names to run (default: all).")
@click.option("--repeats", type=click.IntRange(min=3), default=25, show_default=True, help="Timed runs per measurement.")
@click.option("--time-budget", type=click.FloatRange(min=0), default=None,
              help="Seconds of timing per problem when a plan must be tuned (see `tune`).")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="bench-results.json", show_default=True,
              help="JSON results file.")
@click.option("--keep-spectra/--no-keep-spectra", default=True, show_default=True,
              help="With all three passes, also measure each layer's FFT round trip with kept spectra.")
def bench(network, db, sweep, sweep_kernels, sweep_inputs, sweep_settings, passes, math_mode, dtype, layout, batch,
          input_shape, only, repeats, time_budget, backend, output, keep_spectra):
    """Time convtune's runtime dispatch against its peers on NETWORK's layers (and/or --sweep).

    Peers, in the same process on the same arrays: PyTorch with cudnn.benchmark=True, TF32
    off and on, and the best single cuDNN engine; a peer that cannot run here is reported
    absent with the reason. Plans come from the cache (tuned on a miss, then stored).

    With all three passes, each layer's round trip with kept spectra is also decided (tuned on a
    miss, stored) and timed, each pass after an L2 flush. convtune's round trip is then what a
    layer with keep_spectra='auto' runs: the kept-spectra round trip where it pays, else the sum
    of the three per-pass plans.
    """

    if not network and not sweep:
        raise click.ClickException("give a NETWORK, --sweep, or both")
    skipped = []
    layers = load_network(network, batch=batch, math=math_mode, input_shape=parse_shapes(input_shape),
                          skipped=skipped, dtype=dtype, layout=layout) if network else []
    for name, op_type, reason in skipped:
        echo(f"skipped {name} ({op_type}): {reason}", err=True)
    if only:
        wanted = [n.strip() for n in only.split(",") if n.strip()]
        missing = [n for n in wanted if n not in {l.name for l in layers}]
        if missing:
            raise click.ClickException(f"no layer(s) named {', '.join(missing)} in {network}")
        layers = [l for l in layers if l.name in wanted]
    pass_list = parse_passes(passes)
    be = backend_named(backend)
    timer = CudaEventTimer(repeats=repeats) if be.name == "cupy" else CpuTimer(repeats=min(repeats, 7))
    runtime = Runtime(store=PlanCache(db), miss_policy="tune", planner_options={"time_budget_s": time_budget})
    peers = available_peers(be)
    for p in peers:
        if p.make is None:
            echo(f"peer {p.name} absent: {p.absent_reason}", err=True)
    sweep_list = None
    if sweep:
        settings = []
        for item in sweep_settings.split(","):
            b, _, c = item.strip().partition("x")
            if not (b.isdigit() and c.isdigit() and int(b) > 0 and int(c) > 0):
                raise click.ClickException(f"--sweep-settings item {item!r} is not BATCHxCHANNELS (e.g. 32x64)")
            settings.append({"batch": int(b), "channels": int(c)})
        sweep_list = sweep_layers(math_mode, positive_ints(sweep_kernels, "--sweep-kernels"),
                                  positive_ints(sweep_inputs, "--sweep-inputs"), settings)
        sweep_list = [dataclasses.replace(l, problem=l.problem.replace(dtype=dtype, layout=layout)) for l in sweep_list]
    total = len(layers) + len(sweep_list or [])
    echo(f"benchmarking {total} layer(s) x {len(pass_list)} pass(es) on {be.device_info().key()}", err=True)
    overhead = measure_dispatch_overhead(be, calls=2000 if be.name == "cupy" else 300)
    command = _command_line("bench")
    checkpoint = _json_writer(output)  # after every layer: an interrupted run keeps what it measured
    try:
        results = runner.run_bench(layers, pass_list, be, runtime, timer, peers, command=command, math_mode=math_mode,
                            sweep=sweep_list, dispatch_overhead=overhead,
                            progress=lambda text: echo(f"  {text}", err=True), checkpoint=checkpoint,
                            keep_spectra=keep_spectra)
    except KeyboardInterrupt:
        if not os.path.exists(output):
            raise click.ClickException("interrupted before the first layer was measured; nothing was written") \
                from None
        raise click.ClickException(f"interrupted; the layers measured before it are in {output} "
                                   "(\"complete\": false), which `convtune report` draws") from None
    available = [p.name for p in peers if p.make is not None]
    rows = []

    def floor(ms):
        return format_ms_value(ms) if ms is not None else ""

    def drop_in(rec):
        d = rec.get("drop_in") or {}
        if d.get("median_ms") is None:
            return "failed" if "failed" in d else "-"
        native = d["route"].startswith(("torch", "pytorch"))  # PyTorch's convolution in the layer
        return format_ms_value(d["median_ms"]) + (" (PyTorch's)" if native else "")
    for entry in results["layers"] + (results["sweep"] or []):
        for pass_, rec in entry["passes"].items():
            c = rec["convtune"]
            pair = rec.get("paired") or {}
            row = [entry["name"], pass_, c.get("plan", "FAILED"), format_ms_value(c.get("median_ms")), drop_in(rec),
                   f"{pair['ratio']:.2f}x" if pair.get("ratio") else "-",
                   floor(rec.get("floor_ms")), f"{c['error']:.1e}" if c.get("error") is not None else "-"]
            for name in available:
                peer = rec["peers"][name]
                ratio = (peer["median_ms"] / c["median_ms"]) if peer.get("median_ms") and c.get("median_ms") else None
                if ratio and name in SAME_CALL.get(math_mode, ()) and str(c.get("plan", "")).startswith("torch["):
                    how = "PyTorch's own"  # the plan is this peer's call: neither is faster
                elif ratio and within_noise(peer["median_ms"], peer.get("spread_ms"), c["median_ms"],
                                            c.get("spread_ms")):
                    how = f"{ratio:.2f}x, within noise"
                else:
                    how = f"{ratio:.2f}x" if ratio else None
                row.append(f"{format_ms_value(peer.get('median_ms'))} ({how})" if how else
                           ("failed" if "failed" in peer else "-"))
            rows.append(row)
        kept = entry.get("kept_spectra") or {}
        if kept.get("median_ms") is not None:
            errors = kept["errors"]
            rows.append([entry["name"], "kept spectra" + ("" if kept["pays"] else " (not used)"), kept["plan"],
                         format_ms_value(kept["median_ms"]), "", "", "", f"{max(errors.values()):.1e}"] + [""] * len(available))
        if entry.get("round_trip"):
            rt = entry["round_trip"]
            pair = entry.get("round_trip_paired") or {}
            row = [entry["name"], "round trip", entry.get("round_trip_plan", "per-pass plans"),
                   format_ms_value(rt.get("convtune")), floor(rt.get(DROP_IN)),
                   f"{pair['ratio']:.2f}x" if pair.get("ratio") else "", floor(entry.get("round_trip_floor_ms")), ""]
            for name in available:
                sp = speedup(rt, name)
                row.append(f"{format_ms_value(rt.get(name))} ({sp:.2f}x)" if sp else "-")
            rows.append(row)
    note = busy_note(" after this bench")
    if note:
        echo(note, err=True)
    echo(format_table(["layer", "pass", "convtune plan", "convtune ms", "drop-in ms", "side by side", "floor ms", "error"] +
                      [f"{n} ms (ratio)" for n in available], rows))
    bandwidth = results.get("copy_bandwidth_GBps")
    echo("drop-in = the pass through a patched PyTorch layer on tensors (float32; PyTorch's: its convolution "
         "won the duel in the layer); side by side = PyTorch's time over the layer's (convtune's for half "
         "precision), timed in turns after tuning with PyTorch run twice per turn (median of per-repeat ratios; "
         "'-': not timed so, their "
         "medians more than 2x apart; a kept-spectra round trip's: the torch-fft peer's whole trip over convtune's, "
         "timed the same way); "
         "ratio = peer time / convtune time (above 1: convtune faster); floor = the bytes an FFT-class layer's "
         "pass must move once, at this device's measured copy bandwidth"
         + (f" ({bandwidth:.0f} GB/s)" if bandwidth else " (not measured)") + "; the torch-fft round trip is a "
         f"training step's forward and backward, timed whole. Warm dispatch overhead: "
         f"{overhead['overhead_us']:.2f} us/call. Results: {output}")
    held_to = "torch-tf32" if math_mode == "tf32" else "torch-fp32"  # (runner.parity_peer: PyTorch in the math mode)
    for name, p in parity(results, peer=held_to).items():
        if p["passes"]:
            below = ", ".join(f"{layer} {pass_} {ratio:.2f}x" + (f" ({held_to} against itself {null:.2f}x)"
                                                                   if (null := p["null"].get((layer, pass_))) else "")
                              for layer, pass_, ratio in p["below"][:8])
            more = f" and {len(p['below']) - 8} more" if len(p["below"]) > 8 else ""
            how = f" ({p['paired']} of them timed side by side with it)" if p["paired"] else ""
            noise = (f"; {len(p['noise'])} of those below are no further from 1 than {held_to} timed against itself "
                     "in the same turns") if p["noise"] else ""
            echo(f"{name}: {p['within']} of {p['passes']} passes within {PARITY_BOUND}x of {held_to}'s time{how}"
                 + (f"; below: {below}{more}" if below else "") + noise)


def _phases(phases) -> str:
    """Where a tune-ahead's time went (its report's phases), for the table."""
    went = time_went(phases or {})
    return f" [{went}]" if went else ""


@click.command(name="bench-model")
@click.argument("model")
@db_option
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Batch size (with the model's own input size).")
@input_shape_option
@click.option("--modes", default="torch-fp32,torch-tf32,torch-amp-bf16,convtune-fp32", show_default=True,
              help="Comma-separated: torch-fp32, torch-tf32, torch-amp-bf16 (channels_last), convtune-fp32, "
                   "convtune-tf32, convtune-amp-bf16 (channels_last), convtune-fp32-kept (keep_spectra='auto'), "
                   "convtune-fp32-perpass (keep_spectra=False), "
                   "convtune-fp32-native (a diagnosis: every call through the drop-in to PyTorch's own convolution).")
@click.option("--steps", type=click.IntRange(min=3), default=20, show_default=True, help="Timed training steps per mode.")
@click.option("--warmup", type=click.IntRange(min=0), default=3, show_default=True, help="Untimed steps after the first.")
@click.option("--device", "device_name", default=None, help="Torch device (default: cuda if PyTorch sees one, else cpu).")
@click.option("--profile-steps", type=click.IntRange(min=0), default=0, show_default=True,
              help="After the timed steps, this many more under torch.profiler per mode: the device's busy time "
                   "per step and the operations taking most device and host time (in the JSON).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Every mode set up first, then their timed steps interleaved in this many rounds (what drifts "
                   "over a run weighs on every mode alike; all modes' models are held at once). 1: the modes one "
                   "after another, each timed once (a host-bound step measured so can be off by a quarter).")
@click.option("--null/--no-null", default=None,
              help="Each PyTorch mode twice (the copy named ...-again), so that the table says what PyTorch's step "
                   "measures against itself: the noise of every other ratio. [default: on with --rounds 2 or more]")
@click.option("--against", "against_db", default=None, metavar="DB",
              help="With --rounds: each convtune mode also on the plans of this other plan cache (an --exhaustive "
                   "tune's, say), named ...-against and interleaved: the whole step's regret of one search against "
                   "the other (benchmarks/compare_plans.py compares them layer by layer).")
@click.option("--graph", is_flag=True, default=False,
              help="Capture every mode's training step whole in a CUDA graph (after its warm-up steps) and time "
                   "its replays: PyTorch's modes and convtune's alike, without the host's work per step.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default="bench-model.json", show_default=True,
              help="JSON results file (written after every mode).")
def bench_model_cmd(model, db, batch, input_shape, modes, steps, warmup, device_name, profile_steps, rounds, null,
                    against_db, graph, output):
    """Time whole training steps of MODEL, patched by convtune and not, in one process.

    MODEL is torchvision:NAME, timm:NAME, convtune:NAME (replknet-31b, slak-t, longconv-1d) or
    module:callable. Each mode trains a fresh copy of the same weights on one random batch
    (forward, loss, backward, SGD step): PyTorch first (cudnn.benchmark on; fp32, TF32, AMP bf16
    channels_last), then the patched model, tuned ahead from the plan cache (tuning what is
    missing). Reports per mode the median step time (CUDA events), the first step's time, peak
    memory and, for convtune, the tuning time and what each layer runs.
    """
    try:
        from .model import bench_model
    except ImportError as exc:
        raise click.ClickException(f"bench-model needs PyTorch: {exc}") from None
    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    if null is None:  # (asked for with --rounds 1, it is refused below, saying why)
        null = rounds > 1
    if rounds > steps:
        raise click.ClickException(f"--rounds {rounds} is more than --steps {steps}: each round times at least one "
                                   "step per mode")
    runtime = Runtime(store=PlanCache(db), miss_policy="tune")
    against = None
    if against_db is not None:
        if not os.path.exists(against_db) and "://" not in against_db:
            raise click.ClickException(f"--against: no plan cache at {against_db}")
        against = Runtime(store=PlanCache(against_db), miss_policy="tune")
    command = _command_line("bench-model")
    checkpoint = _json_writer(output)  # after every mode
    try:
        doc = bench_model(model, batch=batch, input_shape=parse_shapes(input_shape), modes=mode_list, steps=steps,
                          warmup=warmup, device=device_name, runtime=runtime, checkpoint=checkpoint, command=command,
                          progress=lambda text: echo(f"  {text}", err=True), profile=profile_steps,
                          rounds=rounds, graph=graph, null=null, against=against)
    except KeyboardInterrupt:
        raise click.ClickException(f"interrupted; the modes measured so far are in {output}") from None
    except ValueError as exc:  # bad arguments (modes, rounds, --graph without CUDA)
        raise click.ClickException(str(exc)) from None
    rows = []
    for m in doc["modes"]:
        if "step_ms" not in m or "failed" in m:  # (an interleaved mode may fail after some rounds)
            rows.append((m["mode"], "-", "-", "-", "-", "-", m.get("failed") or m.get("absent", "")))
            continue
        mem = m.get("peak_memory_bytes")
        tuning = m.get("tuning")
        rows.append((m["mode"], f"{m['step_ms']:.2f}", f"{m['spread_ms']:.2f}", f"{m['host_ms']:.2f}",
                     f"{m['first_step_s']:.2f}",
                     f"{mem / 2 ** 30:.2f}" if mem else "-",
                     f"tuning {tuning['seconds']:.1f} s ({tuning['tuned']} tuned, {tuning['cached']} cached"
                     + (f"; {tuning['handed_back']} of {m['patched_layers']} layers handed back to PyTorch"
                        if tuning.get("handed_back") else "")
                     + ("; weighed as host-bound steps" if tuning.get("host_bound") else "")
                     + ("; weighed on the device's time (steps in CUDA graphs)" if tuning.get("graphed") else "")
                     + (f", {tuning['not_searched']} layers not searched" if tuning.get("not_searched") else "")
                     + (f"; the whole step {tuning['step_ratio']:.2f}x with the layers left patched"
                        + (f", {tuning['step_handed_back']} handed back then" if tuning.get("step_handed_back") else "")
                        if tuning.get("step_ratio") is not None else "")
                     + ")" + _phases(tuning.get("phases")) if tuning else ""))
    echo(f"{model}, input {'x'.join(map(str, doc['input_shape']))} on {doc['device_name']}")
    echo(format_table(("mode", "step ms", "spread ms", "host ms", "first step s", "peak GiB", ""), rows))
    echo("host ms: the host's time to issue a step (near the step's time: the device waited on the host)"
         + (f"; timed steps interleaved over {rounds} rounds (the order rotating, each turn after two untimed steps)"
             if rounds > 1 else "")
         + ("; every step a CUDA graph's replay" if graph else ""))
    by_round = paired(doc)
    for name, ratio in speedups(doc).items():
        text = f"{name}: {ratio:.2f}x"
        if name in by_round:
            mid, low, high = by_round[name]
            text += f" (round by round: median {mid:.2f}x, {low:.2f}x to {high:.2f}x)"
        echo(text + ("  <- PyTorch against itself" if name.split(" vs ")[0].endswith(AGAIN) else
                     f"  <- these plans against {against_db}'s (below 1: theirs faster)"
                     if name.endswith(AGAINST) else ""))
    bound = host_bound(doc)
    if bound:
        echo(f"host-bound: {', '.join(bound)} (the host's time to issue a step is {HOST_BOUND:.0%} of the step or "
             "more). There a faster convolution shortens no step, and what a patched layer costs the host lengthens "
             "it; --graph times whole steps without the host's work.")
    collected = [m for m in doc["modes"] if m.get("gc_collections") and m.get("steps")]
    if collected:
        echo("Python's garbage collector during the timed steps, per step: " + "; ".join(
            f"{m['mode']} {m['gc_collections'] / m['steps']:.1f} collections ({m['gc_full'] / m['steps']:.2f} full), "
            f"{m['gc_s'] / m['steps'] * 1e3:.2f} ms" for m in collected))
    for m in doc["modes"]:
        if m.get("graph_steps"):
            n = m["graph_steps"]
            echo(f"{m['mode']}: the plans' by-address launches made {m['graphs_made'] / n:.1f} CUDA graphs per timed "
                 f"step ({m.get('graph_capture_s', 0) / n * 1e3:.2f} ms of host time) and replayed "
                 f"{m['graph_replays'] / n:.1f} (a graph is made for operands at new addresses: the allocator's, not "
                 "the same every step)")
    for m in doc["modes"]:
        prof = m.get("profile")
        if prof:
            busy = prof["device_busy_ms_per_step"]
            head = (prof["device_top"] or prof["host_top"])[:3]
            echo(f"{m['mode']} profiled: {prof['wall_ms_per_step']:.2f} ms per step"
                 + (f", the device busy {busy:.2f} ms of it" if busy is not None else "")
                 + "; most " + ("device" if prof["device_top"] else "host") + " time: "
                 + ", ".join(f"{e['name'][:60]} {e['ms_per_step']:.2f} ms" for e in head)
                 + (f"; the drop-in's autograd functions: {ours['calls_per_step']:.0f} calls per step, "
                     f"{ours['host_ms_per_step']:.2f} ms of their own host time"
                     if (ours := prof.get("drop_in_functions")) and ours["calls_per_step"] else ""))
    echo(f"results: {output}")


@click.command()
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("-o", "--output", "out_dir", type=click.Path(file_okay=False), default="bench-report", show_default=True)
def report(results, out_dir):
    """Turn `convtune bench` RESULTS (JSON) into PNG figures and an HTML page in a directory."""
    for path in make_report(results, out_dir):
        echo(str(path))
