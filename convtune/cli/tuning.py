"""``convtune tune``, ``demo``, ``show`` and ``explain``: tuning networks and reading what was decided."""

from __future__ import annotations

import dataclasses
import math
import os
import shlex
import sys
import textwrap
import time

import click

from .. import roundtrip
from ..backend import get_backend, gpu_available
from ..cache import PlanCache, default_path, resolve_url
from ..cache.records import broken_key
from ..compiling import CompileAhead
from ..commandline import (PASS_NAMES, TABLE_WIDTH, backend_named, busy_note, command, db_option, dtype_option, echo, explain_hint,
                           format_ms, format_table, input_shape_option, layout_option, parse_batches, parse_passes,
                           parse_shapes, parse_size, progress, writable_cache)
from ..fft import cost
from ..network import load_network, unique_problems
from .. import parallel
from ..parallel import Job, parse_devices
from ..planner import Planner
from ..problem import ConvProblem
from ..runtime import Runtime
from ..text import human_bytes
from ..worklist import Worklist


@click.command()
@click.argument("network", required=False)
@db_option
@input_shape_option
@click.option("--passes", default="fwd,dgrad,wgrad", show_default=True, help="Comma-separated passes to tune.")
@click.option("--math", "math_mode", type=click.Choice(["fp32", "tf32"]), default="fp32", show_default=True,
              help="fp32: within 1e-5 of float64; tf32: within 1e-3.")
@dtype_option
@layout_option
@click.option("--batch", "batches", default=None, metavar="N[,N...]",
              help="Override every layer's batch size; a comma-separated list tunes every layer at each.")
@click.option("--pending", is_flag=True,
              help="Tune the problems that runtimes served meanwhile without a plan of their own (the 'nearest' and "
                   "'heuristic' miss policies note them), instead of a NETWORK.")
@click.option("--workspace-limit", default="4GiB", show_default=True, help="Skip candidates needing more (or 'none').")
@click.option("--time-budget", type=click.FloatRange(min=0), default=None,
              help="Seconds of timing per problem; later candidates are skipped once spent.")
@click.option("--retune", is_flag=True, help="Tune again even where the cache has a plan.")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.option("--strategies", default=None, help="Comma-separated strategies to consider (default: all).")
@click.option("--exhaustive", is_flag=True,
              help="Time every correct candidate in full: no strategy rules, no early stopping, fixed repeats.")
@click.option("--keep-spectra", is_flag=True,
              help="Also decide, per layer, whether an FFT round trip with kept spectra beats the three "
                   "per-pass plans (what layers with keep_spectra='auto' follow); needs all three passes.")
@click.option("--keep-limit", default="2GiB", show_default=True,
              help="With --keep-spectra: most memory one layer's kept spectra may hold (or 'none').")
@click.option("--devices", default=None, metavar="I,J,...",
              help="Spread the problems over these GPUs (one worker process each, GPUs of one kind, one plan cache).")
def tune(network, db, input_shape, passes, math_mode, dtype, layout, batches, pending, workspace_limit, time_budget,
         retune, backend, strategies, exhaustive, keep_spectra, keep_limit, devices):
    """Tune every layer of NETWORK and store the plans.

    NETWORK is a YAML/JSON layer list, a built-in network name, an ONNX model (FILE.onnx: its Conv and
    ConvTranspose nodes, shapes by ONNX shape inference; dynamic dimensions need --batch or
    --input-shape NAME=...), or a PyTorch model: torchvision:NAME, timm:NAME, convtune:NAME
    (replknet-31b, slak-t, longconv-1d) or module:callable (also path/file.py:callable), built
    without weights; its convolutions are found by one forward pass on the meta device (give --batch
    or --input-shape), each with the passes training needs.

    Several batch sizes (--batch 8,16,32) or input shapes of a PyTorch model (--input-shape repeated)
    tune every layer at each. Shapes repeated across layers are tuned once. A second run finds every
    plan in the cache and times nothing (use --retune to measure again).

    Runs that share a plan cache (--devices workers, several machines on one PostgreSQL cache) never
    tune a problem twice at once: each takes a lease on the problem it tunes, and waits for the plans
    of problems others hold (or takes them over once a dead worker's lease runs out).
    """

    # every option is checked before any work
    if (network is None) == (not pending):
        raise click.ClickException("give a NETWORK to tune, or --pending (the problems runtimes served without a "
                                   "plan), not both")
    pass_list, batch_list = parse_passes(passes), parse_batches(batches)
    shape_sets = [parse_shapes((v,)) for v in input_shape] if input_shape and all("=" not in v for v in input_shape) \
        else [parse_shapes(input_shape)]
    limit, trip_limit = parse_size(workspace_limit), parse_size(keep_limit)
    strategy_list = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else None
    if keep_spectra and set(pass_list) != {"fwd", "dgrad", "wgrad"}:
        raise click.ClickException("--keep-spectra compares a round trip with the three per-pass plans: "
                                   "use it with --passes fwd,dgrad,wgrad")
    device_list = parse_devices(devices) if devices is not None else None
    be = backend_named(backend)
    if device_list is not None and be.name != "cupy":
        raise click.ClickException("--devices spreads the problems over GPUs; on the NumPy backend the workers "
                                   "would share the CPU's cores and disturb each other's timings (tune without it)")
    planner = Planner(be, workspace_limit=limit, time_budget_s=time_budget, strategies=strategy_list,
                      exhaustive=exhaustive)
    cache = writable_cache(db)
    cost.load_calibrations(cache)
    device = be.device_info()
    if pending:
        layers = []
        problems = [(p, [f"pending (served by {'the heuristic' if served == 'heuristic' else 'a nearby plan'})"])
                    for p, served in cache.pending_problems(device.key())]
        retune = True
        if not problems:
            echo(f"nothing is pending on {device.key()} in {cache.display_url}: every problem a runtime served "
                 "there has a plan of its own")
            return
    else:
        skipped, layers = [], []
        for batch in batch_list:
            for shape in shape_sets:
                found = load_network(network, batch=batch, math=math_mode, input_shape=shape, skipped=skipped,
                                     dtype=dtype, layout=layout)
                if len(batch_list) * len(shape_sets) > 1:  # several sets: the names say which
                    suffix = (f"@b{batch}" if len(batch_list) > 1 else "") + \
                        ("@" + "x".join(map(str, next(iter(shape.values())))) if len(shape_sets) > 1 else "")
                    found = [dataclasses.replace(layer, name=layer.name + suffix) for layer in found]
                layers += found
        for name, op_type, reason in dict.fromkeys(skipped):
            echo(f"skipped {name} ({op_type}): {reason}", err=True)
        problems = unique_problems(layers, pass_list)
    echo(f"{len(layers)} layers, {len(problems)} distinct problems x passes; device {device.key()}; "
         f"cache {cache.display_url}", err=True)
    sources, failures, decisions = {}, [], []
    started = time.perf_counter()
    current = [""]
    names_of = {p.key(): names for p, names in problems}
    device_key = device.key()

    def settle(outcome):
        sources[outcome.problem.key()] = outcome.source
        if outcome.decision is not None:
            decisions.append(outcome.decision)
        if outcome.error is not None:
            failures.append((names_of[outcome.problem.key()][0], outcome.problem, outcome.error))

    try:
        if device_list is not None:
            device_key = _tune_on_devices(problems, names_of, cache, device_list, dict(
                workspace_limit=limit, time_budget_s=time_budget, strategies=strategy_list, exhaustive=exhaustive),
                retune, sources, decisions, failures, started)
        else:
            with Worklist(cache, device, planner.tune, retune=retune) as work:
                if not retune:  # what the cache has needs no progress line: it is looked up, not tuned
                    for problem, names in problems:
                        if cache.get(problem, device_key) is not None:
                            settle(work.attempt(problem))
                to_tune = [(p, names) for p, names in problems if p.key() not in sources]
                # (the next problems' kernels compile while one is searched)
                with progress(to_tune, "tuning", lambda item: f"{item[1][0]} {item[0].pass_}") as bar, \
                        CompileAhead(planner.builds_ahead, [p for p, _n in to_tune], be) as ahead:
                    for index, (problem, names) in enumerate(bar):
                        ahead.reached(index)
                        current[0] = names[0]
                        outcome = work.attempt(problem)
                        if outcome is not None:
                            settle(outcome)
                if work.deferred:
                    echo(f"{len(work.deferred)} problem(s) are being tuned by other workers on this cache; "
                         "waiting for their plans (or for their leases to run out, to tune them here)", err=True)
                for outcome in work.finish():
                    settle(outcome)
    except KeyboardInterrupt:
        done = sum(1 for s in sources.values() if s == "tuned")
        raise click.ClickException(f"interrupted at {current[0] or 'the start'}; the {done} problem(s) tuned so "
                                   "far are saved")
    elapsed = time.perf_counter() - started

    rows = []
    for problem, names in problems:
        plan = cache.plan_row(problem.key(), device_key)
        layer = names[0] + (f" (+{len(names) - 1})" if len(names) > 1 else "")
        if plan is None:
            rows.append((layer, problem.pass_, "-", "-", "-", sources[problem.key()]))
            continue
        untimed = plan["time_median_s"] is None  # the only candidate left after verification
        speedup = f"{plan['speedup_next']:.2f}x" if plan["speedup_next"] else ("only one" if untimed else "-")
        if plan["speedup_next"] and (plan["repeats"] or 0) < 3:
            speedup += " (one run)" if (plan["repeats"] or 0) <= 1 else f" ({plan['repeats']} runs)"
        elif plan["speedup_next"] and not clear_win(plan):
            speedup += " (noise)"
        source = {"elsewhere": "another worker"}.get(sources[problem.key()], sources[problem.key()])
        rows.append((layer, problem.pass_, plan["label"], "not timed" if untimed else format_ms(plan["time_median_s"]),
                     speedup, source))
    echo(format_table(("layer", "pass", "winner", "time ms", "vs next", "source"), rows))
    tuned = sum(1 for s in sources.values() if s == "tuned")
    hits = sum(1 for s in sources.values() if s == "cache")
    if hits == len(problems):
        echo(f"all {hits} plans came from the cache; nothing was timed ({elapsed:.2f} s)")
    else:
        others = sum(1 for s in sources.values() if s == "elsewhere")
        echo(f"{tuned} tuned, {hits} from the cache, " + (f"{others} by another worker, " if others else "") +
             f"{len(failures)} failed in {elapsed:.1f} s")
    if decisions:
        echo(_where_the_time_went(decisions, elapsed, len(device_list or ())))
        note = busy_note(" while it tuned")
        if note:
            echo(note, err=True)
    for name, problem, exc in failures:
        hint = explain_hint(name, network, problem.pass_, batch=problem.batch if batches else None,
                             input_shape=input_shape, math_mode=math_mode, db=db, dtype=dtype, layout=layout) \
            if network else \
            command("explain", problem.key(), *(["--db", db] if db else []))
        echo(f"FAILED {name} {problem.pass_}: no candidate survived; see `{hint}`", err=True)
    if keep_spectra:
        _tune_round_trips(problems, cache, be, planner, retune, trip_limit)
    if failures:
        sys.exit(1)


def _tune_on_devices(problems, names_of, cache, devices, planner_options, retune, sources, decisions, failures,
                     started):
    """``tune --devices``: one worker per GPU (:mod:`convtune.parallel`), progress as they report; fills
    ``sources``, ``decisions`` and ``failures`` as the serial loop does."""
    job = Job(cache.url, "cupy", tuple(p.key() for p, _n in problems), planner_options, retune)
    settled = [0]

    def on_event(kind, device, key, detail):
        if kind == "start":
            names = names_of[key]
            echo(f"tuning on GPU {device}: {names[0]} {key.split(':')[2]} ({settled[0]}/{len(problems)} done, "
                 f"{time.perf_counter() - started:.0f} s so far)", err=True)
        elif kind == "settled":
            settled[0] += 1
        elif kind == "failed":
            echo(f"the worker on GPU {device} failed ({detail}); the others take its problems", err=True)
    echo(f"{len(devices)} workers, on GPUs {', '.join(devices)}", err=True)
    result = parallel.tune_parallel(job, devices, on_event)
    for problem, names in problems:
        source = result.sources.get(problem.key(), "FAILED")
        sources[problem.key()] = source
        if source == "FAILED":
            failures.append((names[0], problem, None))
    decisions.extend(result.decisions)
    per_device = {}
    for device in result.tuned_by.values():
        per_device[device] = per_device.get(device, 0) + 1
    if per_device:
        echo("problems tuned per GPU: " + ", ".join(f"GPU {d}: {n}" for d, n in sorted(per_device.items())),
             err=True)
    return result.device_key

def _where_the_time_went(decisions, elapsed: float, workers: int = 0) -> str:
    """``tune``'s closing table: per strategy, its candidates and the seconds spent building, verifying and
    timing them; then the search's own phases (listing candidates, operands, float64 references), the searches'
    time that none of those names, and the time outside the searches (the cache, leases), so that the rows add up
    to the total. With ``workers`` (``--devices``), the seconds are summed over them (and the time outside the
    searches is not shown)."""
    per, phases = {}, {}
    searched = named = 0.0
    for decision in decisions:
        searched += decision.tuning_s
        named += sum(decision.phases.values()) + sum(_spent(o) for o in decision.outcomes)
        for o in decision.outcomes:
            row = per.setdefault(o.strategy, {"candidates": 0, "timed": 0, "not tried": 0, "build": 0.0,
                                              "verify": 0.0, "timing": 0.0})
            row["candidates"] += 1
            row["timed"] += o.timing is not None
            row["not tried"] += o.status in ("unsupported", "over_budget") or o.reason.startswith("pruned")
            for what in ("build", "verify", "timing"):
                row[what] += getattr(o, f"{what}_s") or 0.0
        for what, seconds in decision.phases.items():
            phases[what] = phases.get(what, 0.0) + seconds
    rows = [(name, r["candidates"], r["not tried"], r["timed"], f"{r['build']:.1f}", f"{r['verify']:.1f}",
             f"{r['timing']:.1f}", f"{r['build'] + r['verify'] + r['timing']:.1f}")
            for name, r in sorted(per.items(), key=lambda kv: -(kv[1]["build"] + kv[1]["verify"] + kv[1]["timing"]))]
    phases["the searches' other work"] = searched - named
    if workers <= 1:
        phases["outside the searches (the cache, leases)"] = elapsed - searched
    rows += [(what, "", "", "", "", "", "", f"{seconds:.1f}") for what, seconds in
             sorted(phases.items(), key=lambda kv: -kv[1]) if seconds >= 0.05]
    summed = f", summed over the {workers} workers" if workers > 1 else ""
    return (f"where the {elapsed:.1f} s of tuning went (seconds{summed}; 'not tried': unsupported, over the "
            "workspace limit or pruned by a rule):\n" + format_table(("strategy / phase", "candidates", "not tried", "timed", "build",
                                                  "verify", "timing", "total"), rows) + _longest(decisions))


def _spent(o) -> float:
    """Seconds a search spent on one candidate: building, verifying and timing it (each ``None`` where not done)."""
    return (o.build_s or 0.0) + (o.verify_s or 0.0) + (o.timing_s or 0.0)


#: How many of the longest searches ``tune`` names after its closing table.
LONGEST = 3


def _longest(decisions) -> str:
    """The :data:`LONGEST` longest searches, each with its seconds and the strategy that took most of them."""
    lines = []
    for d in sorted(decisions, key=lambda d: -d.tuning_s)[:LONGEST]:
        spent: dict[str, float] = {}
        for o in d.outcomes:
            spent[o.strategy] = spent.get(o.strategy, 0.0) + _spent(o)
        most = max(spent.items(), key=lambda kv: kv[1], default=None)
        lines.append(f"  {d.tuning_s:6.1f} s  {d.problem.describe()}"
                     + (f" ({most[0]} {most[1]:.1f} s of it)" if most else ""))
    return ("\nthe longest searches:\n" + "\n".join(lines)) if lines else ""


def _tune_round_trips(problems, cache, backend, planner, retune, keep_limit):
    """``tune --keep-spectra``: each layer's round-trip verdict, measured (or read from the cache)
    against its three per-pass plans, and stored."""
    layers = {}
    for problem, names in problems:
        layers.setdefault(problem.for_pass("fwd").key(), (problem.for_pass("fwd"), names))
    runtime = Runtime(store=cache, miss_policy="tune", keep_limit=keep_limit,
                      planner_options={"workspace_limit": planner.workspace_limit,
                                       "time_budget_s": planner.time_budget_s, "strategies": planner.strategy_names,
                                       "exhaustive": planner.exhaustive})
    rows = []
    with progress(list(layers.values()), "round trips", lambda item: item[1][0]) as bar:
        for problem, names in bar:
            stored = roundtrip.load_trip(cache, problem, backend.device_info().key())
            decision = runtime.round_trip_for(problem, backend, refresh=retune)
            source = "cache" if stored is not None and decision == stored else "tuned"
            trip = decision.winner.timing.median_s if decision.winner is not None and decision.winner.timing else None
            rows.append((names[0], decision.winner.label if decision.winner else "-", format_ms(trip),
                         format_ms(decision.per_pass_s), "keep spectra" if decision.pays else "per-pass plans", source))
    echo(format_table(("layer", "round trip", "time ms", "per-pass ms", "layers run", "source"), rows))


@click.command()
@click.option("--net", "network", default="starter", show_default=True,
              help="The network to tune (any NETWORK `tune` takes; the built-in 'starter' has one layer of each kind).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Override every layer's batch size.")
@click.option("--db", "db", metavar="URL", default=None,
              help="Plan cache (default: demo-plans.db beside the plan cache, made anew, so that the first run "
                   "tunes).")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.pass_context
def demo(ctx, network, batch, db, backend):
    """The whole idea in about a minute on two CPU cores: tune a network, tune it again (every plan
    comes from the cache, nothing is timed), and explain the layer whose winner won by the most.

    `convtune demo --net resnet18 --batch 8` does the same for ResNet-18 (about 20 s on two CPU
    cores).
    """
    if db is None:  # one file beside the plan cache, made anew each time (so that the first run tunes)
        url = resolve_url()  # (the plan cache's own: --db's default, $CONVTUNE_DB, else the default location)
        folder = os.path.dirname(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else str(default_path().parent)
        os.makedirs(folder, exist_ok=True)
        db = os.path.join(folder, "demo-plans.db")
        for stale in (db, db + "-wal", db + "-shm"):
            if os.path.exists(stale):
                os.remove(stale)
    runs = []
    for title in ("1. tune: every candidate is checked against float64, the survivors are timed, the winners "
                  "stored", "2. the same again: every plan comes from the cache, nothing is timed"):
        echo(f"\n{title}")
        started = time.perf_counter()
        ctx.invoke(tune, network=network, db=db, batches=None if batch is None else str(batch), backend=backend)
        runs.append(time.perf_counter() - started)
    cache = PlanCache(db, create=False, read_only=True)
    layers = load_network(network, batch=batch)
    device = backend_named(backend).device_info().key()
    best = None
    for problem, names in unique_problems(layers, PASS_NAMES):
        row = cache.plan_row(problem.key(), device)
        if row and row["speedup_next"] and clear_win(row) and (best is None or row["speedup_next"] > best[0]):
            best = (row["speedup_next"], names[0], problem.pass_)
    if best is not None:
        echo(f"\n3. why {best[1]} {best[2]} got its plan: every candidate of its tuning run")
        ctx.invoke(explain, layer=best[1], network=network, pass_=best[2], batch=batch, db=db)
    echo(f"\nfirst run {runs[0]:.1f} s, second {runs[1]:.1f} s; the plans are in {db}.")
    echo(f"Next: `{command('show', '--db', db)}`; from Python, convtune.use_cache({db!r}) and convtune.conv(x, w, "
         "...); from PyTorch, convtune.torch.patch(model) (README: \"Use it from PyTorch\").")


def clear_win(row) -> bool:
    """Did a stored plan win clearly: timed on several runs whose spread (interquartile range) is within a tenth of
    the median, and faster than the runner-up by more than that spread? (A win inside the noise explains nothing.)"""
    median, spread = row.get("time_median_s"), row.get("time_spread_s") or 0.0
    if not median or (row.get("repeats") or 0) < 3 or spread > 0.1 * median:
        return False
    return (row.get("speedup_next") or 0.0) * median > median + spread


@click.command()
@db_option
@click.option("--device", default=None, help="Only devices whose fingerprint contains this text.")
@click.option("--strategy", default=None, help="Only plans of this strategy.")
@click.option("--pass", "pass_", type=click.Choice(PASS_NAMES), default=None)
@click.option("--math", "math_mode", type=click.Choice(["fp32", "tf32"]), default=None)
@click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default=None)
@click.option("--layout", type=click.Choice(["channels_first", "channels_last"]), default=None)
@click.option("--problem", default=None, help="Only problem keys containing this text (e.g. ker7x7).")
@click.option("--current", is_flag=True, help="Only plans usable by this convtune on this machine.")
def show(db, device, strategy, pass_, math_mode, dtype, layout, problem, current):
    """List the plan table (plans of other devices and older strategy versions too, marked)."""
    cache = PlanCache(db, create=False, read_only=True)
    here = set(_machine_fingerprints())
    broken = {broken_key(d["device_key"], d["problem"], d["plan"]): d for d in cache.records("broken")
              if {"device_key", "problem", "plan", "reason"} <= set(d)}
    rows, marked = [], []
    for r in cache.plan_rows():
        p = ConvProblem.from_key(r["problem_key"])
        if device and device not in r["fingerprint"]:
            continue
        if strategy and r["strategy"] != strategy or pass_ and p.pass_ != pass_ or math_mode and p.math != math_mode:
            continue
        if dtype and p.dtype != dtype or layout and p.layout != layout:
            continue
        if problem and problem not in r["problem_key"]:
            continue
        status = "current" if r["fingerprint"] in here and r["current_versions"] else \
            ("old strategy versions" if r["fingerprint"] in here else "other device")
        note = broken.get(broken_key(r["fingerprint"], r["problem_key"], r["label"]))
        if note is not None:
            status += "; did not build"
            marked.append(note)
        if current and status != "current":
            continue
        speedup = f"{r['speedup_next']:.2f}x" if r["speedup_next"] else "-"
        err = f"{r['error']:.1e}" if r["error"] is not None else "-"
        rows.append((r["problem_key"].split(":", 1)[1], r["model"], r["label"], format_ms(r["time_median_s"]), err,
                     speedup, status))
    if not rows:
        echo(f"no plans match in {cache.display_url}")
        return
    echo(format_table(("problem", "device", "winner", "time ms", "error", "vs next", "status"), rows))
    echo(f"{len(rows)} plan(s) in {cache.display_url}")
    for doc in marked:
        echo(f"  {doc['plan']} of {doc['problem']} did not build where it was looked up ({doc['reason']}); "
             "`tune NETWORK --retune` on that device measures it again")


@click.command()
@click.argument("layer")
@click.option("--net", "network", default=None, help="Network holding LAYER (a file or a built-in name).")
@db_option
@click.option("--pass", "pass_", type=click.Choice(PASS_NAMES), default=None, help="One pass (default: all).")
@click.option("--math", "math_mode", type=click.Choice(["fp32", "tf32"]), default="fp32", show_default=True)
@dtype_option
@layout_option
@click.option("--batch", type=click.IntRange(min=1), default=None)
@input_shape_option
@click.option("--device", default=None, help="Device fingerprint text (default: this machine's).")
def explain(layer, network, db, pass_, math_mode, dtype, layout, batch, input_shape, device):
    """Every candidate of LAYER's latest tuning run, and why the winner won.

    LAYER is a layer name of --net, or a problem key as `convtune show` prints it.
    """
    cache = PlanCache(db, create=False, read_only=True)
    if network:
        skipped = []
        matches = [l for l in load_network(network, batch=batch, math=math_mode, input_shape=parse_shapes(input_shape),
                                           skipped=skipped, dtype=dtype, layout=layout) if l.name == layer]
        if not matches:
            why = next((f": it is a {op} node convtune leaves out ({reason})" for name, op, reason in skipped
                        if name == layer), "")
            raise click.ClickException(f"no layer named {layer!r} in {network}{why}")
        base = matches[0].problem
        problems = [base.for_pass(p) for p in ([pass_] if pass_ else PASS_NAMES)]
    else:
        key = layer if layer.startswith("ck") else "ck1:" + layer
        try:
            problems = [ConvProblem.from_key(key)]
        except ValueError:
            raise click.ClickException(f"{layer!r} is not a problem key; give the layer's network with --net") \
                from None
    if device is not None:
        fps = sorted({r["fingerprint"] for r in cache.device_rows() if device in r["fingerprint"]})
        if len(fps) != 1:
            raise click.ClickException(f"--device {device!r} matches {len(fps)} devices; be more specific")
    else:
        fps = _machine_fingerprints()
    shown_legend = False
    for problem in problems:
        echo(f"== {problem.describe()}  [{problem.key()}]")
        found = [(fp, rows) for fp in fps if (rows := cache.measurement_rows(problem.key(), fp))]
        if not found:
            others = sorted({r["fingerprint"] for r in cache.measurement_rows(problem.key())})
            if device is None and len(others) == 1:  # measured on one other device (a shipped cache): show it
                echo(f"   not measured on this machine; measured on {others[0]} (--device chooses a device):")
                found = [(others[0], cache.measurement_rows(problem.key(), others[0]))]
            else:
                _explain_nothing(cache, problem, fps, others, layer, network, batch, input_shape, db)
                continue
        for fp, rows in found:
            if len(found) > 1 or len(fps) > 1:
                echo(f"   on {fp}")
            order = {"winner": 0, "ok": 1, "skipped": 2, "rejected": 3, "failed": 4, "over_budget": 5,
                     "unsupported": 6}
            rows.sort(key=lambda r: (order.get(r["status"], 9), r["time_median_s"] or math.inf))
            table = [(r["label"], r["status"], format_ms(r["time_median_s"]), format_ms(r["time_spread_s"]),
                      f"{r['error']:.1e}" if r["error"] is not None else "-", human_bytes(r["workspace_bytes"]),
                      _search_cost(r), r["reason"]) for r in rows]
            echo(format_table(("candidate", "status", "median ms", "spread ms", "error", "workspace", "search s", "reason"),
                              table, wrap_last=True))
            echo(textwrap.fill(_why(rows, problem), TABLE_WIDTH, initial_indent="   ", subsequent_indent="    ",
                               break_on_hyphens=False))
            search = cache.get_record("search", rows[0]["run_id"]) if rows[0].get("run_id") else None
            if search and search.get("phases"):
                own = ", ".join(f"{what} {seconds:.2f} s" for what, seconds in
                                sorted(search["phases"].items(), key=lambda kv: -kv[1]))
                echo(textwrap.fill(f"the search took {search['tuning_s']:.2f} s; its own work beside the candidates': "
                                   f"{own}", TABLE_WIDTH, initial_indent="   ", subsequent_indent="    "))
        if not shown_legend:
            shown_legend = True
            echo(textwrap.fill("(median: of the timed runs, each after an L2 flush on a GPU; spread: their interquartile "
                               "range; error: ||out - ref|| / ||ref|| against float64; workspace: temporary memory; "
                               "search: seconds spent building / verifying / timing the candidate, and its rank in its "
                               "strategy's list)", TABLE_WIDTH, initial_indent="   ", subsequent_indent="    "))


def _explain_nothing(cache, problem, fps, others, layer, network, batch, input_shape, db) -> None:
    """What ``explain`` says where this problem has no measurements here: plans, other devices, other
    batch sizes of the layer, each with a command that shows them."""
    echo(f"   no measurements on {' or '.join(fps)}")
    if others:
        echo(f"   measured on: {', '.join(others)}; give --device with a part of one of them")
    for fp in fps:
        plan = cache.plan_row(problem.key(), fp)
        if plan:
            echo(f"   plan {plan['label']} ({plan['source']}), {format_ms(plan['time_median_s'])} ms")
    batches = cache.measured_batches(problem)
    if batches:
        hints = [explain_hint(layer, network, problem.pass_, batch=b, input_shape=input_shape, math_mode=problem.math,
                               db=db, dtype=problem.dtype, layout=problem.layout) if network else
                 f"convtune explain {shlex.quote(problem.replace(batch=b).key())}" + (f" --db {shlex.quote(db)}" if db else "")
                 for b in batches]
        echo(f"   measured at batch size {', '.join(map(str, batches))}" + (f" (not {batch})" if batch else "") + ":")
        for hint in hints:
            echo(f"     {hint}")


def _search_cost(row) -> str:
    """What searching a candidate cost, as ``build/verify/timing #rank`` (``-`` where not recorded: tuned by a
    convtune before schema 2)."""
    parts = [row.get(k) for k in ("build_s", "verify_s", "timing_s")]
    if all(p is None for p in parts):
        return "-"
    text = "/".join("-" if p is None else f"{p:.2f}" for p in parts)
    return text + (f" #{row['rank']}" if row.get("rank") is not None else "")


def _machine_fingerprints() -> list[str]:
    """This machine's device fingerprints: the GPU's (when CuPy sees one) and the CPU's."""
    return [get_backend(n).device_info().key() for n in (["cupy"] if gpu_available() else []) + ["numpy"]]


def _why(rows, problem) -> str:
    winner = next((r for r in rows if r["status"] == "winner"), None)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in
              ("rejected", "failed", "unsupported", "over_budget", "skipped")}
    tail = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items() if n)
    if winner is None:
        return f"no candidate survived ({tail})"
    timed = [r for r in rows if r["status"] == "ok" and r["time_median_s"] is not None]
    if winner["time_median_s"] is None:
        why = f"winner {winner['label']}: the only candidate left after verification, so nothing was timed"
    elif timed:
        nxt = min(timed, key=lambda r: r["time_median_s"])
        why = (f"winner {winner['label']}: fastest of {len(timed) + 1} timed candidates, "
               f"{nxt['time_median_s'] / winner['time_median_s']:.2f}x faster than {nxt['label']}, "
               f"error {winner['error']:.1e} within the {problem.math} tolerance {problem.tolerance:g}")
        gap = nxt["time_median_s"] - winner["time_median_s"]
        noise = max(winner["time_spread_s"] or 0.0, nxt["time_spread_s"] or 0.0)
        if gap <= noise:
            why += (f" (WITHIN NOISE: the medians differ by {gap * 1e3:.3f} ms, less than the spread of "
                    f"{noise * 1e3:.3f} ms; either would do)")
    else:
        why = f"winner {winner['label']}: the only candidate timed"
    return why + (f"; {tail}" if tail else "")
