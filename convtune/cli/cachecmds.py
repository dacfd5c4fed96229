"""``convtune export``, ``import``, ``calibrate``, ``backup`` and ``info``: the plan cache as files and facts."""

from __future__ import annotations

import os

import click

from ..backend import BackendError, get_backend
from ..cache import PlanCache, read_export, resolve_url, write_export
from ..cache.backup import backup as make_backup
from ..cache.exchange import read_calibrations, read_round_trips
from ..cache.paths import ENV_VAR
from ..cache.schema import SCHEMA_VERSION
from ..commandline import backend_named, db_option, echo, format_ms, format_table, writable_cache
from ..building import check_stored_plan
from ..errors import CacheError, ConvtuneError
from ..fft.calibrate import calibrate as run_calibration
from ..fft import cost
from ..fft.cost import check_calibration
from ..strategies import all_strategies
from ..text import printable
from ..timing import default_timer
from .. import roundtrip


def read_trip_decisions(text: str) -> list:
    """The round-trip verdicts of a JSON export, each checked as the runtime will read it."""
    decisions = []
    for i, item in enumerate(read_round_trips(text)):
        try:
            decisions.append(roundtrip.TripDecision.from_dict(item))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CacheError(f"round-trip verdict {i} of the export is malformed: {type(exc).__name__}: {exc}") from None
    return decisions


@click.command(name="export")
@db_option
@click.option("--format", "fmt", type=click.Choice(["json", "csv"]), default="json", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default=None,
              help="File to write (default: standard output).")
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
def export_cmd(db, fmt, output, force):
    """Write the plan table as JSON or CSV, to share with other machines."""
    if output and os.path.exists(output) and not force:
        raise click.ClickException(f"{output} exists; --force replaces it")
    cache = PlanCache(db, create=False, read_only=True)
    records = cache.export_records()
    calibrations = cost.stored_calibrations(cache)
    trips = cache.records("trip")
    text = write_export(records, fmt, calibrations, trips)
    if (calibrations or trips) and fmt == "csv":
        echo(f"note: CSV holds plans only; the {len(calibrations)} FFT calibration(s) and {len(trips)} "
                   "round-trip verdict(s) are not in it (use --format json to carry them)", err=True)
    if output:
        with open(output, "w") as fh:
            fh.write(text)
        echo(f"exported {len(records)} plan(s) to {output}", err=True)
    else:
        echo(text, nl=False)


@click.command(name="import")
@click.argument("file", type=click.Path(dir_okay=False))
@db_option
@click.option("--format", "fmt", type=click.Choice(["auto", "json", "csv"]), default="auto", show_default=True)
def import_cmd(file, db, fmt):
    """Merge an exported plan table into the cache: new plans are added; where both have a plan,
    the better-measured one is kept (timed beats untimed, then the faster median) and differing
    choices are reported as conflicts."""
    try:
        with open(file) as fh:
            text = fh.read()
    except OSError as exc:
        raise click.ClickException(f"cannot read {file}: {exc.strerror or exc}") from None
    records = read_export(text, None if fmt == "auto" else fmt)
    calibrations = read_calibrations(text) if fmt != "csv" else {}
    try:
        trips = read_trip_decisions(text) if fmt != "csv" else []
    except ConvtuneError as exc:
        raise click.ClickException(f"{file}: {exc}") from None
    for device_key, calibration in calibrations.items():  # checked before anything is written
        try:
            check_calibration(device_key, calibration)
        except ValueError as exc:
            raise click.ClickException(f"{file}: {exc}") from None
    for number, rec in enumerate(records, 1):  # every plan as strictly as the runtime will use it
        try:
            check_stored_plan(rec["problem_key"], rec["strategy"], rec["config"])
        except (ValueError, TypeError, KeyError) as exc:
            raise click.ClickException(f"{file}: plan {number} ({printable(str(rec.get('label')))[:60]}) cannot be "
                                       f"used: {exc}; nothing was imported") from None
    cache = writable_cache(db)
    report = cache.import_records(records)
    echo(f"imported {len(records)} plan(s) into {cache.display_url}: {report['added']} added, "
               f"{report['replaced']} replaced by better measurements, {report['kept']} kept, "
               f"{report['identical']} identical")
    for c in report["conflicts"]:
        echo(f"conflict {c['problem_key']} on {c['fingerprint']}: ours {c['ours']}, theirs {c['theirs']}; "
                   f"kept {c['kept']}")
    if calibrations:
        have = cost.stored_calibrations(cache)
        added = {k: v for k, v in calibrations.items() if k not in have}  # a local measurement is kept
        for device_key, calibration in added.items():
            cost.store_calibration(cache, device_key, calibration)
        echo(f"FFT calibrations: {len(added)} added, {len(calibrations) - len(added)} kept as they were")
    if trips:
        new = [t for t in trips if roundtrip.load_trip(cache, t.problem, t.device_key) is None]  # a local one is kept
        for trip in new:
            roundtrip.save_trip(cache, trip)
        echo(f"round-trip verdicts: {len(new)} added, {len(trips) - len(new)} kept as they were")


@click.command()
@db_option
@click.option("--backend", type=click.Choice(["auto", "numpy", "cupy"]), default="auto", show_default=True)
@click.option("--elements", type=click.IntRange(min=1 << 10), default=1 << 24, show_default=True,
              help="Elements per timed batch of transforms.")
def calibrate(db, backend, elements):
    """Measure this device's FFT cost model (transform lengths: powers of 2, 2·3·5·7-smooth, other)
    and store it in the plan cache, which then ranks transform sizes with it on this device."""
    cache = writable_cache(db)
    be = backend_named(backend)
    echo(f"timing transforms on {be.device_info().key()} ...", err=True)
    result = run_calibration(be, default_timer(be), elements)
    rows = [(m["kind"], "x".join(map(str, m["shape"])), f"{m['gflop']:.3f}", format_ms(m["seconds"]),
             f"{m['seconds'] / m['gflop']:.3g}") for m in result["measurements"]]
    echo(format_table(("kind", "length", "GFLOP", "ms", "s/GFLOP"), rows))
    echo("factors (per counted flop, powers of 2 = 1): " +
               ", ".join(f"{k} {result[k]:.2f}" for k in ("pow2", "smooth", "other")))
    cost.store_calibration(cache, be.device_info().key(), result)
    echo(f"stored in {cache.display_url}")


@click.command()
@click.argument("output", type=click.Path(dir_okay=False))
@db_option
@click.option("--force", is_flag=True, help="Replace OUTPUT if it exists.")
def backup(output, db, force):
    """Write a consistent copy of the plan cache to OUTPUT: one SQLite file (no -wal beside it), fit to
    ship with a model or to open read-only, made while others keep reading and writing (a PostgreSQL
    cache is copied into a SQLite file too)."""
    cache = PlanCache(db, create=False, read_only=True)
    counts = make_backup(cache, output, force=force)
    echo(f"wrote {output}: " + ", ".join(f"{n} {t}" for t, n in counts.items()) + f" (from {cache.display_url})")


@click.command()
@db_option
def info(db):
    """This machine's fingerprint, the backends and strategies available, and the cache."""
    for name in ("numpy", "cupy"):
        try:
            dev = get_backend(name).device_info()
        except BackendError as exc:
            echo(f"{name}: unavailable: {' '.join(str(exc).split())}")
            continue
        echo(f"{name}: {dev.key()}")
        for field, value in dev.as_dict().items():
            if value not in ("", 0):
                echo(f"    {field:20s} {value}")
    try:
        import cudnn  # noqa: F401
        echo(f"cudnn frontend: {getattr(cudnn, '__version__', 'present')}")
    except Exception as exc:  # optional; any import failure means unavailable
        echo(f"cudnn frontend: unavailable ({type(exc).__name__})")
    echo("strategies: " + ", ".join(f"{s.name} v{s.version}" for s in all_strategies(True)))
    url = resolve_url(db)
    origin = "given by --db" if db else f"from ${ENV_VAR}" if os.environ.get(ENV_VAR) else \
        f"the default location; --db or ${ENV_VAR} choose another"
    echo(f"plan cache: {url} ({origin})")
    if db or os.environ.get(ENV_VAR) or url.startswith("sqlite:///") and os.path.exists(url[len("sqlite:///"):]):
        try:
            cache = PlanCache(db, create=False, read_only=True)
            echo("    " + ", ".join(f"{n} {t}" for t, n in cache.counts().items()) +
                 f", {len(cache.records('trip'))} round-trip verdicts (kept spectra); schema {cache.found_version}" +
                 ("" if cache.found_version == SCHEMA_VERSION else
                   f" (a command that stores into it upgrades it to {SCHEMA_VERSION}, after a backup)"))
            for device_key, cal in cost.stored_calibrations(cache).items():
                echo(f"    FFT calibration for {device_key}: " +
                           ", ".join(f"{k} {cal[k]:.2f}" for k in ("pow2", "smooth", "other")))
        except ConvtuneError as exc:
            echo(f"    {exc}")
