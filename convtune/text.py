"""Text that leaves convtune for a terminal, a spreadsheet or a log: safe and readable.

Labels, layer names and keys can come from an imported file or a shared database, so they may
carry terminal escape sequences or spreadsheet formulas. :func:`printable` escapes control
characters before anything reaches a terminal; :func:`spreadsheet_cell` neutralises a CSV cell that
a spreadsheet would run as a formula, and :func:`from_spreadsheet_cell` undoes exactly that on
import; :func:`control_characters` finds what an import refuses. :func:`human_bytes` writes sizes in
binary units; :func:`time_went` says where the seconds of a piece of work went.

>>> printable("fft[\\x1b]0;pwned\\x07]")
'fft[\\\\x1b]0;pwned\\\\x07]'
>>> spreadsheet_cell("=HYPERLINK(1)"), from_spreadsheet_cell("'=HYPERLINK(1)")
("'=HYPERLINK(1)", '=HYPERLINK(1)')
>>> human_bytes(44014891958272)
'40.0 TiB'
"""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
#: A cell starting with one of these is a formula (or starts one) in common spreadsheets.
_FORMULA_LEAD = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def printable(value) -> str:
    """``str(value)`` with every control character (C0, DEL, C1) written as ``\\xNN``."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def control_characters(value) -> bool:
    return isinstance(value, str) and _CONTROL.search(value) is not None


def spreadsheet_cell(value):
    """A string cell that a spreadsheet would read as a formula, prefixed with ``'``; numbers and
    other cells as they are."""
    if isinstance(value, str) and value.startswith(_FORMULA_LEAD) and not _NUMBER.match(value):
        return "'" + value
    return value


def from_spreadsheet_cell(value: str) -> str:
    """The inverse of :func:`spreadsheet_cell`."""
    if value.startswith("'") and value[1:].startswith(_FORMULA_LEAD) and not _NUMBER.match(value[1:]):
        return value[1:]
    return value


def human_bytes(n) -> str:
    """``n`` bytes in binary units (``'1.5 GiB'``)."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def time_went(phases: dict) -> str:
    """``"name 1.2 s, other 0.3 s"``: the parts of a piece of work (name to seconds, in order) that took 0.05 s or more."""
    return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in phases.items() if seconds >= 0.05)
