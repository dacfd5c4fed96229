"""Export and import of plan tables, as JSON or CSV (one flat record per plan).

Every text cell of an import is checked: control characters (terminal escape sequences) are refused,
with the record's number; CSV cells that a spreadsheet would run as formulas are written with a
leading ``'`` and read back without it (:mod:`convtune.text`). A JSON export also carries the FFT cost-model calibrations (``fft_calibrations``: device key ->
factors, as ``convtune calibrate`` stored them) and the layers' round-trip verdicts
(``round_trips``: :class:`~convtune.roundtrip.TripDecision` dicts); CSV holds plans only.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import datetime, timezone

from .._version import __version__
from ..errors import CacheError
from ..text import control_characters, from_spreadsheet_cell, printable, spreadsheet_cell
from .schema import DEVICE_FIELDS, PLAN_FIELDS

FORMAT_NAME = "convtune-plans"
FORMAT_VERSION = 1
FORMATS = ("json", "csv")
COLUMNS = ("fingerprint", *DEVICE_FIELDS, "problem_key", "strategy_versions", *PLAN_FIELDS)
_INT = {"sm_count", "memory_bytes", "repeats", "workspace_bytes"}
_FLOAT = {"time_median_s", "time_spread_s", "error", "speedup_next", "tuning_s"}


def write_export(records: list[dict], fmt: str, calibrations: dict | None = None,
                 round_trips: list[dict] | None = None) -> str:
    """Serialise exported records (and, in JSON, the FFT calibrations and round-trip verdicts) as
    ``json`` or ``csv`` text."""
    if fmt == "json":
        doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "convtune_version": __version__,
               "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "plans": [{c: r[c] for c in COLUMNS} for r in records],
               "fft_calibrations": dict(calibrations or {}), "round_trips": list(round_trips or [])}
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in records:  # no cell a spreadsheet would run as a formula (read_export undoes the guard)
            writer.writerow({c: ("" if r[c] is None else spreadsheet_cell(r[c])) for c in COLUMNS})
        return buf.getvalue()
    raise ValueError(f"unknown export format {fmt!r}; acceptable formats: {', '.join(FORMATS)}")


#: The largest count a column holds (SQL's BIGINT): a larger number is no count of anything here.
_MOST = 2 ** 63 - 1


def _count(value) -> int:
    """A count (repeats, bytes, SMs): a non-negative whole number, as an int or its text."""
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(f"{value!r} is not a whole number")
    number = int(value)
    if not 0 <= number <= _MOST:
        raise ValueError(f"{value!r} is out of range (0 to {_MOST})")
    return number


def _measure(value) -> float:
    """A measured quantity (seconds, an error, a ratio): finite and not negative."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a finite, non-negative number")
    return number


def _typed(row: dict, number: int, csv_row: bool) -> dict:
    """One record with its columns' types; ``number`` (1-based) names it in errors."""
    if not isinstance(row, dict):
        raise CacheError(f"plan {number} of the export is not a mapping of columns")
    out = {}
    for c in COLUMNS:
        if c not in row or (csv_row and row[c] is None):
            raise CacheError(f"plan {number} of the export lacks column {c!r}" +
                             (" (a truncated file?)" if csv_row else ""))
        v = row[c]
        try:
            if c in _INT:
                out[c] = None if v in ("", None) else _count(v)
            elif c in _FLOAT:
                out[c] = None if v in ("", None) else _measure(v)
            else:
                text = "" if v is None else str(v)
                if control_characters(text):
                    raise CacheError(f"plan {number} of the export has control characters in {c!r} "
                                     f"({printable(text)[:80]}); refused")
                out[c] = from_spreadsheet_cell(text) if csv_row else text
        except (TypeError, ValueError) as exc:
            raise CacheError(f"plan {number} of the export: column {c!r}: {exc}") from None
    return out


def _json_entry(text: str, name: str, empty):
    """Entry ``name`` of a JSON export; ``empty`` in CSV, or where an older export lacks it."""
    if not text.lstrip().startswith("{"):
        return empty
    try:
        return json.loads(text).get(name) or empty
    except (json.JSONDecodeError, AttributeError) as exc:
        raise CacheError(f"the export is not valid JSON: {exc}") from exc


def _refuse_control(value, where: str) -> None:
    """Refuse control characters anywhere in a JSON value's strings (keys included)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse_control(k, where)
            _refuse_control(v, where)
    elif isinstance(value, list):
        for v in value:
            _refuse_control(v, where)
    elif control_characters(value):
        raise CacheError(f"{where} has control characters ({printable(value)[:80]}); refused")


def read_calibrations(text: str) -> dict:
    """The FFT calibrations of a JSON export (none in CSV, or in exports made before they were kept)."""
    found = _json_entry(text, "fft_calibrations", {})
    if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
        raise CacheError("the export's \"fft_calibrations\" entry is not a mapping of device keys to factors")
    _refuse_control(found, "the export's \"fft_calibrations\" entry")
    return found


def read_round_trips(text: str) -> list[dict]:
    """The round-trip verdicts of a JSON export as records (none in CSV, or in older exports), their text cells
    checked; :class:`convtune.roundtrip.TripDecision` reads each."""
    found = _json_entry(text, "round_trips", [])
    if not isinstance(found, list):
        raise CacheError("the export's \"round_trips\" entry is not a list")
    for i, item in enumerate(found):
        if not isinstance(item, dict):
            raise CacheError(f"round-trip verdict {i} of the export is malformed: not a mapping")
        _refuse_control(item, f"round-trip verdict {i} of the export")
    return found


def read_export(text: str, fmt: str | None = None) -> list[dict]:
    """Parse an export (format detected from the content when ``fmt`` is None)."""
    if not text.strip():
        raise CacheError("the file is empty: not a convtune plan export")
    if fmt is None:
        fmt = "json" if text.lstrip().startswith(("{", "[")) else "csv"
    try:
        if fmt == "json":
            doc = json.loads(text)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT_NAME:
                raise CacheError(f"not a convtune plan export (expected \"format\": \"{FORMAT_NAME}\")")
            if doc.get("format_version") != FORMAT_VERSION:
                raise CacheError(f"plan export format version {doc.get('format_version')!r} is not supported; "
                                 f"this convtune reads version {FORMAT_VERSION}")
            rows = doc.get("plans")
            if not isinstance(rows, list):
                raise CacheError("the export's \"plans\" entry is not a list")
        elif fmt == "csv":
            reader = csv.DictReader(io.StringIO(text))
            missing = sorted(set(COLUMNS) - set(reader.fieldnames or ()))
            if missing:
                raise CacheError(f"not a convtune plan export: CSV columns {missing} are missing")
            rows = list(reader)
        else:
            raise ValueError(f"unknown export format {fmt!r}; acceptable formats: {', '.join(FORMATS)}")
        return [_typed(r, number, fmt == "csv") for number, r in enumerate(rows, 1)]
    except json.JSONDecodeError as exc:
        raise CacheError(f"the export is not valid JSON: {exc}") from exc
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "acceptable formats" in str(exc):
            raise
        raise CacheError(f"malformed plan export: {exc}") from exc
