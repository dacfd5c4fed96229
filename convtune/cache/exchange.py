"""Export and import of plan tables, as JSON or CSV (one flat record per plan).

A JSON export also carries the FFT cost-model calibrations (``fft_calibrations``: device key ->
factors, as ``convtune calibrate`` stored them) and the layers' round-trip verdicts
(``round_trips``: :class:`~convtune.roundtrip.TripDecision` dicts); CSV holds plans only.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

from ..errors import CacheError
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
        from .. import __version__
        doc = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "convtune_version": __version__,
               "exported_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
               "plans": [{c: r[c] for c in COLUMNS} for r in records],
               "fft_calibrations": dict(calibrations or {}), "round_trips": list(round_trips or [])}
        return json.dumps(doc, indent=1, sort_keys=False) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=COLUMNS, lineterminator="\n")
        writer.writeheader()
        for r in records:
            writer.writerow({c: ("" if r[c] is None else r[c]) for c in COLUMNS})
        return buf.getvalue()
    raise ValueError(f"unknown export format {fmt!r}; acceptable formats: {', '.join(FORMATS)}")


def _typed(row: dict) -> dict:
    out = {}
    for c in COLUMNS:
        if c not in row:
            raise CacheError(f"the export lacks column {c!r}")
        v = row[c]
        if c in _INT:
            out[c] = None if v in ("", None) else int(v)
        elif c in _FLOAT:
            out[c] = None if v in ("", None) else float(v)
        else:
            out[c] = "" if v is None else str(v)
    return out


def _json_entry(text: str, name: str, empty):
    """Entry ``name`` of a JSON export; ``empty`` in CSV, or where an older export lacks it."""
    if not text.lstrip().startswith("{"):
        return empty
    try:
        return json.loads(text).get(name) or empty
    except (json.JSONDecodeError, AttributeError) as exc:
        raise CacheError(f"the export is not valid JSON: {exc}") from exc


def read_calibrations(text: str) -> dict:
    """The FFT calibrations of a JSON export (none in CSV, or in exports made before they were kept)."""
    found = _json_entry(text, "fft_calibrations", {})
    if not isinstance(found, dict) or not all(isinstance(v, dict) for v in found.values()):
        raise CacheError("the export's \"fft_calibrations\" entry is not a mapping of device keys to factors")
    return found


def read_round_trips(text: str) -> list:
    """The round-trip verdicts of a JSON export, checked (none in CSV, or in older exports)."""
    from ..roundtrip import TripDecision
    found = _json_entry(text, "round_trips", [])
    if not isinstance(found, list):
        raise CacheError("the export's \"round_trips\" entry is not a list")
    decisions = []
    for i, item in enumerate(found):
        try:
            decisions.append(TripDecision.from_dict(item))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise CacheError(f"round-trip verdict {i} of the export is malformed: {type(exc).__name__}: {exc}") from None
    return decisions


def read_export(text: str, fmt: str | None = None) -> list[dict]:
    """Parse an export (format detected from the content when ``fmt`` is None)."""
    if fmt is None:
        fmt = "json" if text.lstrip().startswith("{") else "csv"
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
            rows = list(csv.DictReader(io.StringIO(text)))
            if rows and set(COLUMNS) - set(rows[0]):
                raise CacheError(f"not a convtune plan export: CSV columns {sorted(set(COLUMNS) - set(rows[0]))} "
                                 "are missing")
        else:
            raise ValueError(f"unknown export format {fmt!r}; acceptable formats: {', '.join(FORMATS)}")
        return [_typed(r) for r in rows]
    except json.JSONDecodeError as exc:
        raise CacheError(f"the export is not valid JSON: {exc}") from exc
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "acceptable formats" in str(exc):
            raise
        raise CacheError(f"malformed plan export: {exc}") from exc
