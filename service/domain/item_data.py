"""Item content (``data``): the JSON object an annotation tool shows for an item (text, an image or audio
URL, any fields its labeling config names), stored beside the item's embedding or reference.

Rules, checked for a whole request before anything is written:

- an object (``{...}``) whose keys are non-empty strings, at most ``MAX_DEPTH`` levels deep;
- JSON-serializable with finite numbers only (no NaN/Infinity);
- no NUL character in any key or string (PostgreSQL's JSON refuses them);
- at most ``max_bytes`` (default 64 KiB) once serialized as compact UTF-8 JSON.

In bulk files, data travels as JSON strings: a ``data`` string column in Parquet (null: no data), an
optional ``data`` string array in .npz (empty string: no data).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from service.errors import BadRequest

MAX_DEPTH = 32
_SHOWN = 10


class InvalidItemData(BadRequest):
    code = "invalid_item_data"


class _Bad(ValueError):
    pass


def _walk(value: Any, depth: int) -> None:
    if depth > MAX_DEPTH:
        raise _Bad(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise _Bad("keys must be non-empty strings")
            if "\x00" in k:
                raise _Bad("a key holds a NUL character")
            _walk(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _walk(v, depth + 1)
    elif isinstance(value, str):
        if "\x00" in value:
            raise _Bad("a string holds a NUL character")
    elif isinstance(value, bool) or value is None or isinstance(value, int):
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad("numbers must be finite (no NaN or Infinity)")
    else:
        raise _Bad(f"a {type(value).__name__} is not JSON")


def check_one(value: Any, max_bytes: int) -> dict[str, Any]:
    """One item's data, validated (raises ``ValueError`` saying what is wrong)."""
    if not isinstance(value, dict):
        raise _Bad(f"must be a JSON object, got {type(value).__name__ if value is not None else 'null'}")
    _walk(value, 1)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise _Bad(f"is {size} bytes as JSON; the limit is {max_bytes}")
    return value


def check_data(ids: Sequence[str], values: Sequence[Any], max_bytes: int) -> None:
    """Validate the ``data`` of many items (``None``: the item carries none); one bad item rejects all.

    Raises:
        InvalidItemData: naming the first offending items and why.
    """
    bad: list[tuple[str, str]] = []
    for ext, value in zip(ids, values, strict=True):
        if value is None:
            continue
        try:
            check_one(value, max_bytes)
        except ValueError as exc:
            bad.append((ext, str(exc)))
    if bad:
        raise InvalidItemData(
            f"item data: {len(bad)} item(s) have invalid `data`, e.g. item {bad[0][0]!r}: data {bad[0][1]}",
            {"invalid": [{"id": e, "reason": r} for e, r in bad[:_SHOWN]]},
        )


def parse_json_strings(ids: Sequence[str], raw: Sequence[str | None], max_bytes: int) -> list[dict[str, Any] | None]:
    """Bulk files: one JSON string per item (``None`` or ``""``: no data) parsed and validated.

    Raises:
        InvalidItemData: a string that is not JSON, not an object, or breaks a rule above.
    """
    out: list[dict[str, Any] | None] = []
    bad: list[tuple[str, str]] = []
    for ext, text in zip(ids, raw, strict=True):
        if text is None or text == "":
            out.append(None)
            continue
        if len(text) > 4 * max_bytes:  # far above the limit: do not parse it at all
            bad.append((ext, f"is longer than the limit of {max_bytes} bytes"))
            out.append(None)
            continue
        try:
            value = json.loads(text, parse_constant=_no_constant)
            out.append(check_one(value, max_bytes))
        except ValueError as exc:
            bad.append((ext, str(exc) if isinstance(exc, _Bad) else f"is not valid JSON: {exc}"))
            out.append(None)
    if bad:
        raise InvalidItemData(
            f"item data: {len(bad)} item(s) have invalid `data`, e.g. item {bad[0][0]!r}: data {bad[0][1]}",
            {"invalid": [{"id": e, "reason": r} for e, r in bad[:_SHOWN]]},
        )
    return out


def _no_constant(name: str) -> Any:
    raise _Bad(f"holds {name}; numbers must be finite")
