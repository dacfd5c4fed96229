"""The command line's shared parts: options, argument parsing, tables, progress and the error handling of its
command group, used by :mod:`convtune.cli` and the benchmark commands (:mod:`convtune.bench.commands`)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import textwrap
import sys
import time

import click

from .backend import get_backend, gpu_available
from .cache import PlanCache
from .errors import ConvtuneError
from .text import printable

PASS_NAMES = ("fwd", "dgrad", "wgrad")
#: How the user runs this command line, for the commands its hints print: ``convtune``, or what a wrapper says it is
#: (``scripts/convtune.sh`` sets ``CONVTUNE_PROG``, since its ``convtune`` lives in ``.venv/bin``).
PROG = os.environ.get("CONVTUNE_PROG") or "convtune"


def command(*args) -> str:
    """A command line of this program, as the user must type it (arguments quoted for the shell)."""
    return " ".join([PROG, *(shlex.quote(str(a)) for a in args)])
_SIZE = re.compile(r"^\s*([0-9.eE+]+)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "KB": 1e3, "M": 1e6, "MB": 1e6, "G": 1e9, "GB": 1e9, "T": 1e12, "TB": 1e12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40, "KI": 2 ** 10, "MI": 2 ** 20,
          "GI": 2 ** 30, "TI": 2 ** 40}


def echo(text="", **kwargs) -> None:
    """``click.echo`` with every control character but the newline escaped: labels, names and keys can
    come from an imported file or a shared database, and must not drive the terminal."""
    click.echo("\n".join(printable(line) for line in str(text).split("\n")), **kwargs)


class Group(click.Group):
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


def parse_shape(text: str) -> tuple[int, ...]:
    """'32,3,224,224' or '32x3x224x224' to a tuple of positive ints."""
    try:
        shape = tuple(int(v) for v in re.split(r"[,x]", text.strip()) if v.strip())
    except ValueError:
        shape = ()
    if len(shape) < 2 or min(shape) <= 0:
        raise ValueError(f"cannot read the shape {text!r}; write the batch first, e.g. 32,3,224,224")
    return shape


def parse_shapes(values) -> dict | None:
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
        shapes[key] = parse_shape(text)
    return shapes


input_shape_option = click.option(
    "--input-shape", "input_shape", multiple=True, metavar="[NAME=]N,C,...",
    help="For a PyTorch model (torchvision:NAME, timm:NAME, convtune:NAME, module:callable): its input's shape, "
         "batch first (default: the model's own size with --batch). For an ONNX model, NAME=N,C,... per input "
         "with dynamic dimensions (repeatable; NAME may be left out for a single input).")


def positive_ints(text: str, option: str) -> tuple[int, ...]:
    """An option's comma-separated positive integers, in order, each once (``ValueError`` naming the option)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError(f"{option} takes positive integers, one or a comma-separated list, got {text!r}")
    return tuple(dict.fromkeys(values))


def parse_batches(text: str | None) -> list[int | None]:
    """``--batch``: ``None`` (each layer's own), one size, or a comma-separated list of sizes."""
    return [None] if text is None else list(positive_ints(text, "--batch"))


def parse_passes(text: str) -> tuple[str, ...]:
    passes = tuple(p.strip() for p in text.split(",") if p.strip())
    bad = [p for p in passes if p not in PASS_NAMES]
    if bad or not passes:
        raise ValueError(f"unknown pass(es) {', '.join(bad) or text!r}; acceptable: {', '.join(PASS_NAMES)}")
    return passes


def writable_cache(db):
    """The plan cache of ``--db`` for a command that stores: a read-only one is an error before any work."""
    cache = PlanCache(db)
    if cache.read_only:
        raise click.ClickException(f"the plan cache {cache.display_url} is read-only ({cache.db.read_only_reason}): "
                                   "this command stores into it; give a writable --db")
    return cache


def backend_named(name: str):
    if name == "auto":
        name = "cupy" if gpu_available() else "numpy"
    return get_backend(name)


def busy_note(where: str = "") -> str | None:
    """A warning where the machine is busy (its load average above its cores): timings taken now carry that noise.
    ``None`` where it is not (or the load cannot be read)."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except (AttributeError, OSError):
        return None
    if load <= cores:
        return None
    return (f"note: this machine is busy{where} (load {load:.1f} on {cores} cores): the timings carry its noise; "
            "tune again on an idle machine for plans to keep")


def within_noise(a_ms, a_spread, b_ms, b_spread) -> bool:
    """Are two medians closer than their spreads (interquartile ranges) reach? Then neither is faster."""
    return abs(a_ms - b_ms) <= (a_spread or 0.0) + (b_spread or 0.0)


def format_ms(seconds) -> str:
    return format_ms_value(None if seconds is None else seconds * 1e3)


def format_ms_value(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"


#: The width a table's lines keep to, where its last column (a reason, say) can be wrapped.
TABLE_WIDTH = 120


def format_table(headers, rows, wrap_last: bool = False) -> str:
    """An aligned text table; ``wrap_last``: the last column's text wrapped onto further lines so that the table keeps
    within :data:`TABLE_WIDTH` columns (or 40 characters of it where the other columns take more)."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [max(len(str(h)), *(len(r[i]) for r in rows)) if rows else len(str(h)) for i, h in enumerate(headers)]
    start = sum(widths[:-1]) + 2 * (len(widths) - 1)
    if wrap_last:
        widths[-1] = min(widths[-1], max(40, TABLE_WIDTH - start, len(str(headers[-1]))))

    def lines(cells):
        last = textwrap.wrap(cells[-1], widths[-1]) if wrap_last and len(cells[-1]) > widths[-1] else [cells[-1]]
        first = "  ".join(c.ljust(w) for c, w in zip(cells[:-1], widths)) + ("  " if len(cells) > 1 else "")
        return [(first + last[0]).rstrip()] + [(" " * start + more).rstrip() for more in last[1:]]
    out = lines([str(h) for h in headers]) + ["  ".join("-" * w for w in widths)]
    for r in rows:
        out += lines(r)
    return "\n".join(out)


@contextlib.contextmanager
def progress(items, label: str, describe):
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
            echo(f"{label} {number}/{len(items)}: {describe(item)} ({time.perf_counter() - started:.0f} s so far)",
                 err=True)
            yield item
    yield lines()


def explain_hint(name, network, pass_, *, batch=None, input_shape=None, math_mode="fp32", db=None, dtype="float32",
                  layout="channels_first") -> str:
    """The ``convtune explain`` command that shows one layer's candidates, as it must be typed."""
    args = ["explain", name, "--net", network, "--pass", pass_]
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
    return command(*args)


dtype_option = click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
                            show_default=True, help="The operands' and result's dtype (half precision "
                            "accumulates in float32; its error bound is four of its rounding units).")
layout_option = click.option("--layout", type=click.Choice(["channels_first", "channels_last"]),
                             default="channels_first", show_default=True,
                             help="Memory layout of the operands and result (NCHW or NHWC; NCL or NLC).")

db_option = click.option("--db", "db", metavar="URL", default=None,
                         help="Plan cache: a SQLite path, sqlite:///PATH or postgresql://USER@HOST/DB "
                              "(default: $CONVTUNE_DB, else ~/.cache/convtune/plans.db).")
