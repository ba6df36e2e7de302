"""CSV that a spreadsheet opens as data, never as formulas (OWASP "CSV injection").

A cell that begins with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return is a formula to Excel,
LibreOffice and Google Sheets (``=HYPERLINK(...)``, ``=cmd|' /C calc'!A0``). Every CSV the service
writes goes through :func:`write_csv`, which prefixes such cells with a single quote, so the cell shows
the text as typed and runs nothing. Numbers the service itself produces (floats, ints) are left alone:
a negative confidence is not a formula.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def neutralise(value: Any) -> Any:
    """``value`` as a spreadsheet-safe cell: text starting with a formula character gets a leading ``'``."""
    if isinstance(value, str) and value.startswith(FORMULA_START):
        return "'" + value
    return value


def write_csv(rows: Iterable[Mapping[str, Any]], fieldnames: Sequence[str]) -> str:
    """The CSV text of ``rows`` (a header, then one line per row), every text cell neutralised."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(fieldnames))
    writer.writeheader()
    for row in rows:
        writer.writerow({k: neutralise(v) for k, v in row.items()})
    return buf.getvalue()
