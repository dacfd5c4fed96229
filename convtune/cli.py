"""The ``convtune`` command line: tune, show, explain, export, import, info.

Every error a user can cause ends in a one-line message and a non-zero exit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shlex
import sys
import time

import click

from .errors import ConvtuneError
from .text import human_bytes, printable

PASS_NAMES = ("fwd", "dgrad", "wgrad")
_SIZE = re.compile(r"^\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "KI": 2 ** 10, "MI": 2 ** 20,
          "GI": 2 ** 30, "TI": 2 ** 40}


def _echo(text="", **kwargs) -> None:
    """``click.echo`` with every control character but the newline escaped: labels, names and keys can
    come from an imported file or a shared database, and must not drive the terminal."""
    click.echo("\n".join(printable(line) for line in str(text).split("\n")), **kwargs)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except BrokenPipeError:  # `convtune show | head`: the reader left, nothing to report
            sys.stderr.close()
            sys.exit(0)
        except (ConvtuneError, ValueError, OSError) as exc:
            raise click.ClickException(printable(" ".join(str(exc).split("\n")[0].split())) or type(exc).__name__) \
                from None


def parse_size(text: str) -> int | None:
    """'4GiB', '512MB', '1e9' or 'none' to bytes."""
    if text.strip().lower() in ("none", "unlimited"):
        return None
    m = _SIZE.match(text)
    if not m or m.group(2) and m.group(2).upper() not in _UNITS:
        raise ValueError(f"cannot read the size {text!r}; write e.g. 4GiB, 512MB, 1e9 or none")
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])


def _shape(text: str) -> tuple[int, ...]:
    """'32,3,224,224' or '32x3x224x224' to a tuple of positive ints."""
    try:
        shape = tuple(int(v) for v in re.split(r"[,x]", text.strip()) if v.strip())
    except ValueError:
        shape = ()
    if len(shape) < 2 or min(shape) <= 0:
        raise ValueError(f"cannot read the shape {text!r}; write the batch first, e.g. 32,3,224,224")
    return shape


def _shapes(values) -> dict | None:
    """``--input-shape`` values (``N,C,...`` or, for an ONNX model's inputs, ``NAME=N,C,...``) as a dict of input
    name (``None``: unnamed) to shape; ``None`` where none was given."""
    if not values:
        return None
    shapes = {}
    for value in values:
        name, sep, text = value.rpartition("=")
        key = name.strip() if sep else None
        if key in shapes:
            raise ValueError(f"--input-shape gives {'input ' + key if key else 'an unnamed shape'} twice")
        shapes[key] = _shape(text)
    return shapes


input_shape_option = click.option(
    "--input-shape", "input_shape", multiple=True, metavar="[NAME=]N,C,...",
    help="For a PyTorch model (torchvision:NAME, timm:NAME, convtune:NAME, module:callable): its input's shape, "
         "batch first (default: the model's own size with --batch). For an ONNX model, NAME=N,C,... per input "
         "with dynamic dimensions (repeatable; NAME may be left out for a single input).")


def _positive_ints(text: str, option: str) -> tuple[int, ...]:
    """An option's comma-separated positive integers, in order, each once (``ValueError`` naming the option)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError(f"{option} takes positive integers, one or a comma-separated list, got {text!r}")
    return tuple(dict.fromkeys(values))


def _batches(text: str | None) -> list[int | None]:
    """``--batch``: ``None`` (each layer's own), one size, or a comma-separated list of sizes."""
    return [None] if text is None else list(_positive_ints(text, "--batch"))


def _passes(text: str) -> tuple[str, ...]:
    passes = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in passes if p not in PASS_NAMES]
    if bad or not passes:
        raise ValueError(f"unknown pass(es) {', '.join(bad) or text!r}; acceptable: {', '.join(PASS_NAMES)}")
    return passes


def _writable_cache(db):
    """The plan cache of ``--db`` for a command that stores: a read-only one is an error before any work."""
    from .cache import PlanCache
    cache = PlanCache(db)
    if cache.read_only:
        raise click.ClickException(f"the plan cache {cache.display_url} is read-only ({cache.db.read_only_reason}): "
                                   "this command stores into it; give a writable --db")
    return cache


def _backend(name: str):
    from .backend import get_backend, gpu_available
    if name == "auto":
        name = "cupy" if gpu_available() else "numpy"
    return get_backend(name)


def _ms(seconds) -> str:
    return _ms_value(None if seconds is None else seconds * 1e3)


def _ms_value(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def _table(headers, rows) -> str:
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]
    line = "  ".join(str(h).ljust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


@contextlib.contextmanager
def _progress(items, label: str, describe):
    """Progress over ``items`` on stderr: click's bar on a terminal; elsewhere (a pipe, a log file) one
    line per item with the time so far, so that a log shows where a long run is."""
    if getattr(sys.stderr, "isatty", lambda: False)():
        with click.progressbar(items, label=label, file=sys.stderr,
                               item_show_func=lambda item: item and printable(describe(item))) as bar:
            yield bar
        return
    started = time.perf_counter()

    def lines():
        for number, item in enumerate(items, 1):
            _echo(f"{label} {number}/{len(items)}: {describe(item)} ({time.perf_counter() - started:.0f} s so far)",
                  err=True)
            yield item
    yield lines()


def _explain_hint(name, network, pass_, *, batch=None, input_shape=None, math_mode="fp32", db=None, dtype="float32",
                  layout="channels_first") -> str:
    """The ``convtune explain`` command that shows one layer's candidates, as it must be typed."""
    args = ["convtune", "explain", name, "--net", network, "--pass", pass_]
    if dtype != "float32":
        args += ["--dtype", dtype]
    if layout != "channels_first":
        args += ["--layout", layout]
    if batch is not None:
        args += ["--batch", str(batch)]
    for value in input_shape or ():
        args += ["--input-shape", value]
    if math_mode != "fp32":
        args += ["--math", math_mode]
    if db is not None:
        args += ["--db", db]
    return " ".join(shlex.quote(str(a)) for a in args)


dtype_option = click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
                            show_default=True, help="The operands' and result's dtype (half precision "
                            "accumulates in float32; its error bound is four of its rounding units).")
layout_option = click.option("--layout", type=click.Choice(["channels_first", "channels_last"]),
                             default="channels_first", show_default=True,
                             help="Memory layout of the operands and result (NCHW or NHWC; NCL or NLC).")

db_option = click.option("--db", "db", metavar="URL", default=None,
                         help="Plan cache: a SQLite path, sqlite:///PATH or postgresql://USER@HOST/DB "
                              "(default: $CONVTUNE_DB, else ~/.cache/convtune/plans.db).")


@click.group(cls=_Group)
@click.version_option(package_name="convtune")
def main():
    """convtune: convolution auto-tuning engine and cached plan service.

    Tune a network once (`convtune tune resnet50`); training code then finds the
    plans in the cache (`convtune.conv`, `convtune.Conv2d`).
    """


@main.command()
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
    from .network import load_network, unique_problems
    from .parallel import parse_devices
    from .planner import Planner
    from .worklist import Worklist

    # every option is checked before any work
    if (network is None) == (not pending):
        raise click.ClickException("give a NETWORK to tune, or --pending (the problems runtimes served without a "
                                   "plan), not both")
    pass_list, batch_list = _passes(passes), _batches(batches)
    shape_sets = [_shapes((v,)) for v in input_shape] if input_shape and all("=" not in v for v in input_shape) \
        else [_shapes(input_shape)]
    limit, trip_limit = parse_size(workspace_limit), parse_size(keep_limit)
    strategy_list = [s.strip() for s in strategies.split(",") if s.strip()] if strategies else None
    if keep_spectra and set(pass_list) != {"fwd", "dgrad", "wgrad"}:
        raise click.ClickException("--keep-spectra compares a round trip with the three per-pass plans: "
                                   "use it with --passes fwd,dgrad,wgrad")
    device_list = parse_devices(devices) if devices is not None else None
    be = _backend(backend)
    if device_list is not None and be.name != "cupy":
        raise click.ClickException("--devices spreads the problems over GPUs; on the NumPy backend the workers "
                                   "would share the CPU's cores and disturb each other's timings (tune without it)")
    planner = Planner(be, workspace_limit=limit, time_budget_s=time_budget, strategies=strategy_list,
                      exhaustive=exhaustive)
    cache = _writable_cache(db)
    device = be.device_info()
    if pending:
        layers = []
        problems = [(p, [f"pending (served by {'the heuristic' if served == 'heuristic' else 'a nearby plan'})"])
                    for p, served in cache.pending_problems(device.key())]
        retune = True
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
            _echo(f"skipped {name} ({op_type}): {reason}", err=True)
        problems = unique_problems(layers, pass_list)
    _echo(f"{len(layers)} layers, {len(problems)} distinct problems x passes; device {device.key()}; "
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
                with _progress(problems, "tuning", lambda item: f"{item[1][0]} {item[0].pass_}") as bar:
                    for problem, names in bar:
                        current[0] = names[0]
                        outcome = work.attempt(problem)
                        if outcome is not None:
                            settle(outcome)
                if work.deferred:
                    _echo(f"{len(work.deferred)} problem(s) are being tuned by other workers on this cache; "
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
        source = {"elsewhere": "another worker"}.get(sources[problem.key()], sources[problem.key()])
        rows.append((layer, problem.pass_, plan["label"], "not timed" if untimed else _ms(plan["time_median_s"]),
                     speedup, source))
    _echo(_table(("layer", "pass", "winner", "time ms", "vs next", "source"), rows))
    tuned = sum(1 for s in sources.values() if s == "tuned")
    hits = sum(1 for s in sources.values() if s == "cache")
    if hits == len(problems):
        _echo(f"all {hits} plans came from the cache; nothing was timed ({elapsed:.2f} s)")
    else:
        others = sum(1 for s in sources.values() if s == "elsewhere")
        _echo(f"{tuned} tuned, {hits} from the cache, " + (f"{others} by another worker, " if others else "") +
              f"{len(failures)} failed in {elapsed:.1f} s")
    if decisions:
        _echo(_where_the_time_went(decisions, elapsed, len(device_list or ())))
    for name, problem, exc in failures:
        hint = _explain_hint(name, network, problem.pass_, batch=problem.batch if batches else None,
                             input_shape=input_shape, math_mode=math_mode, db=db, dtype=dtype, layout=layout) \
            if network else \
            f"convtune explain {shlex.quote(problem.key())}" + (f" --db {shlex.quote(str(db))}" if db else "")
        _echo(f"FAILED {name} {problem.pass_}: no candidate survived; see `{hint}`", err=True)
    if keep_spectra:
        _tune_round_trips(problems, cache, be, planner, retune, trip_limit)
    if failures:
        sys.exit(1)


def _tune_on_devices(problems, names_of, cache, devices, planner_options, retune, sources, decisions, failures,
                     started):
    """``tune --devices``: one worker per GPU (:mod:`convtune.parallel`), progress as they report; fills
    ``sources``, ``decisions`` and ``failures`` as the serial loop does."""
    from .parallel import Job, tune_parallel
    job = Job(cache.url, "cupy", tuple(p.key() for p, _n in problems), planner_options, retune)
    settled = [0]

    def on_event(kind, device, key, detail):
        if kind == "start":
            names = names_of[key]
            _echo(f"tuning on GPU {device}: {names[0]} {key.split(':')[2]} ({settled[0]}/{len(problems)} done, "
                  f"{time.perf_counter() - started:.0f} s so far)", err=True)
        elif kind == "settled":
            settled[0] += 1
        elif kind == "failed":
            _echo(f"the worker on GPU {device} failed ({detail}); the others take its problems", err=True)
    _echo(f"{len(devices)} workers, on GPUs {', '.join(devices)}", err=True)
    result = tune_parallel(job, devices, on_event)
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
        _echo("problems tuned per GPU: " + ", ".join(f"GPU {d}: {n}" for d, n in sorted(per_device.items())),
              err=True)
    return result.device_key

def _where_the_time_went(decisions, elapsed: float, workers: int = 0) -> str:
    """``tune``'s closing table: per strategy, its candidates and the seconds spent building, verifying and
    timing them; then the search's own phases (listing candidates, operands, float64 references). With
    ``workers`` (``--devices``), the seconds are summed over them."""
    per, phases = {}, {}
    for decision in decisions:
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
    rows += [(what, "", "", "", "", "", "", f"{seconds:.1f}") for what, seconds in
             sorted(phases.items(), key=lambda kv: -kv[1]) if seconds >= 0.05]
    summed = f", summed over the {workers} workers" if workers > 1 else ""
    return (f"where the {elapsed:.1f} s of tuning went (seconds{summed}; 'not tried': unsupported, over the "
            "workspace limit or pruned by a rule):\n" + _table(("strategy / phase", "candidates", "not tried", "timed", "build",
                                                  "verify", "timing", "total"), rows))


def _tune_round_trips(problems, cache, backend, planner, retune, keep_limit):
    """``tune --keep-spectra``: each layer's round-trip verdict, measured (or read from the cache)
    against its three per-pass plans, and stored."""
    from .runtime import Runtime
    layers = {}
    for problem, names in problems:
        layers.setdefault(problem.for_pass("fwd").key(), (problem.for_pass("fwd"), names))
    runtime = Runtime(store=cache, miss_policy="tune", keep_limit=keep_limit,
                      planner_options={"workspace_limit": planner.workspace_limit,
                                       "time_budget_s": planner.time_budget_s, "strategies": planner.strategy_names})
    rows = []
    with _progress(list(layers.values()), "round trips", lambda item: item[1][0]) as bar:
        for problem, names in bar:
            stored = cache.get_trip(problem, backend.device_info().key())
            decision = runtime.round_trip_for(problem, backend, refresh=retune)
            source = "cache" if stored is not None and decision == stored else "tuned"
            trip = decision.winner.timing.median_s if decision.winner is not None and decision.winner.timing else None
            rows.append((names[0], decision.winner.label if decision.winner else "-", _ms(trip),
                         _ms(decision.per_pass_s), "keep spectra" if decision.pays else "per-pass plans", source))
    _echo(_table(("layer", "round trip", "time ms", "per-pass ms", "layers run", "source"), rows))


@main.command()
@click.option("--net", "network", default="starter", show_default=True,
              help="The network to tune (any NETWORK `tune` takes; the built-in 'starter' has one layer of each kind).")
@click.option("--batch", type=click.IntRange(min=1), default=None, help="Override every layer's batch size.")
@click.option("--db", "db", metavar="URL", default=None,
              help="Plan cache (default: a new file in a temporary directory, so that the first run tunes).")
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.pass_context
def demo(ctx, network, batch, db, backend):
    """The whole idea in about a minute on two CPU cores: tune a network, tune it again (every plan
    comes from the cache, nothing is timed), and explain the layer whose winner won by the most.

    `convtune demo --net resnet18 --batch 8` does the same for ResNet-18 (about 20 s on two CPU
    cores).
    """
    import tempfile
    from .cache import PlanCache
    from .network import load_network, unique_problems
    if db is None:
        db = os.path.join(tempfile.mkdtemp(prefix="convtune-demo-"), "plans.db")
    runs = []
    for title in ("1. tune: every candidate is checked against float64, the survivors are timed, the winners "
                  "stored", "2. the same again: every plan comes from the cache, nothing is timed"):
        _echo(f"\n{title}")
        started = time.perf_counter()
        ctx.invoke(tune, network=network, db=db, batches=None if batch is None else str(batch), backend=backend)
        runs.append(time.perf_counter() - started)
    cache = PlanCache(db, create=False, read_only=True)
    layers = load_network(network, batch=batch)
    device = _backend(backend).device_info().key()
    best = None
    for problem, names in unique_problems(layers, PASS_NAMES):
        row = cache.plan_row(problem.key(), device)
        if row and row["speedup_next"] and (best is None or row["speedup_next"] > best[0]):
            best = (row["speedup_next"], names[0], problem.pass_)
    if best is not None:
        _echo(f"\n3. why {best[1]} {best[2]} got its plan: every candidate of its tuning run")
        ctx.invoke(explain, layer=best[1], network=network, pass_=best[2], batch=batch, db=db)
    _echo(f"\nfirst run {runs[0]:.1f} s, second {runs[1]:.1f} s; the plans are in {db}.")
    _echo("Next: `convtune show --db DB`; from Python, convtune.use_cache(DB) and convtune.conv(x, w, ...); from "
          "PyTorch, convtune.torch.patch(model) (README: \"Use it from PyTorch\").")


@main.command()
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
    from .cache import PlanCache
    from .problem import ConvProblem
    cache = PlanCache(db, create=False, read_only=True)
    here = set(_machine_fingerprints())
    rows = []
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
        if current and status != "current":
            continue
        speedup = f"{r['speedup_next']:.2f}x" if r["speedup_next"] else "-"
        err = f"{r['error']:.1e}" if r["error"] is not None else "-"
        rows.append((r["problem_key"].split(":", 1)[1], r["model"], r["label"], _ms(r["time_median_s"]), err,
                     speedup, status))
    if not rows:
        _echo(f"no plans match in {cache.display_url}")
        return
    _echo(_table(("problem", "device", "winner", "time ms", "error", "vs next", "status"), rows))
    _echo(f"{len(rows)} plan(s) in {cache.display_url}")


@main.command()
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
    from .cache import PlanCache
    from .network import load_network
    from .problem import ConvProblem
    cache = PlanCache(db, create=False, read_only=True)
    if network:
        skipped = []
        matches = [l for l in load_network(network, batch=batch, math=math_mode, input_shape=_shapes(input_shape),
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
        _echo(f"== {problem.describe()}  [{problem.key()}]")
        found = [(fp, rows) for fp in fps if (rows := cache.measurement_rows(problem.key(), fp))]
        if not found:
            others = sorted({r["fingerprint"] for r in cache.measurement_rows(problem.key())})
            if device is None and len(others) == 1:  # measured on one other device (a shipped cache): show it
                _echo(f"   not measured on this machine; measured on {others[0]} (--device chooses a device):")
                found = [(others[0], cache.measurement_rows(problem.key(), others[0]))]
            else:
                _explain_nothing(cache, problem, fps, others, layer, network, batch, input_shape, db)
                continue
        for fp, rows in found:
            if len(found) > 1 or len(fps) > 1:
                _echo(f"   on {fp}")
            order = {"winner": 0, "ok": 1, "skipped": 2, "rejected": 3, "failed": 4, "over_budget": 5,
                     "unsupported": 6}
            rows.sort(key=lambda r: (order.get(r["status"], 9), r["time_median_s"] or math.inf))
            table = [(r["label"], r["status"], _ms(r["time_median_s"]), _ms(r["time_spread_s"]),
                      f"{r['error']:.1e}" if r["error"] is not None else "-", human_bytes(r["workspace_bytes"]),
                      _search_cost(r), r["reason"]) for r in rows]
            _echo(_table(("candidate", "status", "median ms", "spread ms", "error", "workspace", "search s", "reason"),
                         table))
            _echo("   " + _why(rows, problem))
        if not shown_legend:
            shown_legend = True
            _echo("   (median: of the timed runs, each after an L2 flush on a GPU; spread: their interquartile "
                  "range; error: ||out - ref|| / ||ref|| against float64; workspace: temporary memory; search: "
                  "seconds spent building / verifying / timing the candidate, and its rank in its strategy's list)")


def _explain_nothing(cache, problem, fps, others, layer, network, batch, input_shape, db) -> None:
    """What ``explain`` says where this problem has no measurements here: plans, other devices, other
    batch sizes of the layer, each with a command that shows them."""
    _echo(f"   no measurements on {' or '.join(fps)}")
    if others:
        _echo(f"   measured on: {', '.join(others)}; give --device with a part of one of them")
    for fp in fps:
        plan = cache.plan_row(problem.key(), fp)
        if plan:
            _echo(f"   plan {plan['label']} ({plan['source']}), {_ms(plan['time_median_s'])} ms")
    batches = cache.measured_batches(problem)
    if batches:
        hints = [_explain_hint(layer, network, problem.pass_, batch=b, input_shape=input_shape, math_mode=problem.math,
                               db=db, dtype=problem.dtype, layout=problem.layout) if network else
                 f"convtune explain {shlex.quote(problem.replace(batch=b).key())}" + (f" --db {shlex.quote(db)}" if db else "")
                 for b in batches]
        _echo(f"   measured at batch size {', '.join(map(str, batches))}" + (f" (not {batch})" if batch else "") + ":")
        for hint in hints:
            _echo(f"     {hint}")


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
    from .backend import get_backend, gpu_available
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


@main.command(name="export")
@db_option
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="File to write (default: standard output).")
def export_cmd(db, fmt, output):
    """Write the plan table as JSON or CSV, to share with other machines."""
    from .cache import PlanCache, write_export
    cache = PlanCache(db, create=False, read_only=True)
    records = cache.export_records()
    calibrations = cache.calibrations()
    trips = cache.trip_decisions()
    text = write_export(records, fmt, calibrations, trips)
    if (calibrations or trips) and fmt == "csv":
        _echo(f"note: CSV holds plans only; the {len(calibrations)} FFT calibration(s) and {len(trips)} "
                   "round-trip verdict(s) are not in it (use --format json to carry them)", err=True)
    if output:
        with open(output, "w") as fh:
            fh.write(text)
        _echo(f"exported {len(records)} plan(s) to {output}", err=True)
    else:
        _echo(text, nl=False)


@main.command(name="import")
@click.argument("file", type=click.Path(dir_okay=False))
@db_option
@click.option("--format", "fmt", type=click.Choice(["auto", "json", "csv"]), default="auto", show_default=True)
def import_cmd(file, db, fmt):
    """Merge an exported plan table into the cache: new plans are added; where both have a plan,
    the better-measured one is kept (timed beats untimed, then the faster median) and differing
    choices are reported as conflicts."""
    from .cache import read_export
    from .cache.exchange import read_calibrations, read_round_trips
    try:
        with open(file) as fh:
            text = fh.read()
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    records = read_export(text, None if fmt == "auto" else fmt)
    calibrations = read_calibrations(text) if fmt != "csv" else {}
    try:
        trips = read_round_trips(text) if fmt != "csv" else []
    except ConvtuneError as exc:
        raise click.ClickException(f"{file}: {exc}") from None
    from .fft.cost import check_calibration
    for device_key, calibration in calibrations.items():  # checked before anything is written
        try:
            check_calibration(device_key, calibration)
        except ValueError as exc:
            raise click.ClickException(f"{file}: {exc}") from None
    cache = _writable_cache(db)
    report = cache.import_records(records)
    _echo(f"imported {len(records)} plan(s) into {cache.display_url}: {report['added']} added, "
               f"{report['replaced']} replaced by better measurements, {report['kept']} kept, "
               f"{report['identical']} identical")
    for c in report["conflicts"]:
        _echo(f"conflict {c['problem_key']} on {c['fingerprint']}: ours {c['ours']}, theirs {c['theirs']}; "
                   f"kept {c['kept']}")
    if calibrations:
        have = cache.calibrations()
        added = {k: v for k, v in calibrations.items() if k not in have}  # a local measurement is kept
        for device_key, calibration in added.items():
            cache.put_calibration(device_key, calibration)
        _echo(f"FFT calibrations: {len(added)} added, {len(calibrations) - len(added)} kept as they were")
    if trips:
        new = [t for t in trips if cache.get_trip(t.problem, t.device_key) is None]  # a local verdict is kept
        for trip in new:
            cache.put_trip(trip)
        _echo(f"round-trip verdicts: {len(new)} added, {len(trips) - len(new)} kept as they were")


@main.command()
@db_option
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.option("--elements", type=click.IntRange(min=1 << 10), default=1 << 24, show_default=True,
              help="Elements per timed batch of transforms.")
def calibrate(db, backend, elements):
    """Measure this device's FFT cost model (transform lengths: powers of 2, 2·3·5·7-smooth, other)
    and store it in the plan cache, which then ranks transform sizes with it on this device."""
    from .fft.calibrate import calibrate as run_calibration
    from .timing import default_timer
    cache = _writable_cache(db)
    be = _backend(backend)
    _echo(f"timing transforms on {be.device_info().key()} ...", err=True)
    result = run_calibration(be, default_timer(be), elements)
    rows = [(m["kind"], "x".join(map(str, m["shape"])), f"{m['gflop']:.3f}", _ms(m["seconds"]),
             f"{m['seconds'] / m['gflop']:.3g}") for m in result["measurements"]]
    _echo(_table(("kind", "length", "GFLOP", "ms", "s/GFLOP"), rows))
    _echo("factors (per counted flop, powers of 2 = 1): " +
               ", ".join(f"{k} {result[k]:.2f}" for k in ("pow2", "smooth", "other")))
    cache.put_calibration(be.device_info().key(), result)
    _echo(f"stored in {cache.display_url}")


@main.command()
@click.argument("output", type=click.Path(dir_okay=False))
@db_option
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
def backup(output, db, force):
    """Write a consistent copy of the plan cache to OUTPUT: one SQLite file (no -wal beside it), fit to
    ship with a model or to open read-only, made while others keep reading and writing (a PostgreSQL
    cache is copied into a SQLite file too)."""
    from .cache import PlanCache
    from .cache.backup import backup as make_backup
    cache = PlanCache(db, create=False, read_only=True)
    counts = make_backup(cache, output, force=force)
    _echo(f"wrote {output}: " + ", ".join(f"{n} {t}" for t, n in counts.items()) + f" (from {cache.display_url})")


@main.command()
@db_option
def info(db):
    """This machine's fingerprint, the backends and strategies available, and the cache."""
    from .backend import BackendError, get_backend
    from .cache import PlanCache, resolve_url
    from .cache.schema import SCHEMA_VERSION
    from .cache.paths import ENV_VAR
    from .strategies import all_strategies
    import os
    for name in ("numpy", "cupy"):
        try:
            dev = get_backend(name).device_info()
        except BackendError as exc:
            _echo(f"{name}: unavailable: {' '.join(str(exc).split())}")
            continue
        _echo(f"{name}: {dev.key()}")
        for field, value in dev.as_dict().items():
            if value not in ("", 0):
                _echo(f"    {field:20s} {value}")
    try:
        import cudnn  # noqa: F401
        _echo(f"cudnn frontend: {getattr(cudnn, '__version__', 'present')}")
    except Exception as exc:  # optional; any import failure means unavailable
        _echo(f"cudnn frontend: unavailable ({type(exc).__name__})")
    _echo("strategies: " + ", ".join(f"{s.name} v{s.version}" for s in all_strategies(True)))
    url = resolve_url(db)
    origin = "given by --db" if db else f"from ${ENV_VAR}" if os.environ.get(ENV_VAR) else \
        f"the default location; --db or ${ENV_VAR} choose another"
    _echo(f"plan cache: {url} ({origin})")
    if db or os.environ.get(ENV_VAR) or url.startswith("sqlite:///") and os.path.exists(url[len("sqlite:///"):]):
        try:
            cache = PlanCache(db, create=False, read_only=True)
            _echo("    " + ", ".join(f"{n} {t}" for t, n in cache.counts().items()) +
                  f", {cache.trip_count()} round-trip verdicts (kept spectra); schema {cache.found_version}" +
                  ("" if cache.found_version == SCHEMA_VERSION else
                   f" (a command that stores into it upgrades it to {SCHEMA_VERSION}, after a backup)"))
            for device_key, cal in cache.calibrations().items():
                _echo(f"    FFT calibration for {device_key}: " +
                           ", ".join(f"{k} {cal[k]:.2f}" for k in ("pow2", "smooth", "other")))
        except ConvtuneError as exc:
            _echo(f"    {exc}")


from .bench import commands as _bench_commands  # noqa: E402,F401  (registers bench, bench-model, report)
