"""Item content (``data``): the JSON object an annotation tool shows for an item (text, an image or audio
URL, any fields its labeling config names), stored beside the item's embedding or reference.

Rules, checked for a whole request before anything is written:

- an object (``{...}``) whose keys are non-empty strings, at most ``MAX_DEPTH`` levels deep;
- JSON-serializable with finite numbers only (no NaN/Infinity);
- no NUL character in any key or string (PostgreSQL's JSON refuses them);
- at most ``max_bytes`` (default 64 KiB) once serialized as compact UTF-8 JSON;
- links only to what an annotation tool may safely load (:func:`check_link`): ``http(s)://``,
  ``file://`` under the tenant's data root, and raster ``data:image/...``. A string counts as a link
  when it begins with a scheme (``name:``) and holds no whitespace, or when its scheme is one a browser
  runs or opens locally (``javascript:``, ``vbscript:``, ``data:``, ``blob:``, ...), however written:
  browsers ignore leading spaces and control characters, tabs and newlines inside, and letter case.

In bulk files, data travels as JSON strings: a ``data`` string column in Parquet (null: no data), an
optional ``data`` string array in .npz (empty string: no data).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from service.errors import BadRequest

MAX_DEPTH = 32
_SHOWN = 10
_SCHEME = re.compile(r"^([a-z][a-z0-9+.\-]*):")
# Schemes that run code or open something local when a browser follows them, taken as links even with spaces.
ACTIVE_SCHEMES = frozenset(
    {"javascript", "vbscript", "data", "blob", "filesystem", "jar", "view-source", "about", "livescript", "mocha"}
)
RASTER_DATA = re.compile(r"^data:image/(png|jpeg|jpg|gif|webp|bmp|avif)[;,]")


class InvalidItemData(BadRequest):
    code = "invalid_item_data"


class _Bad(ValueError):
    pass


def check_link(value: str, data_root: Path | None) -> None:
    """Refuse a string that a browser would follow as a link to anything but http(s), a file under the
    tenant's root or a raster image (raises ``ValueError`` naming the scheme); plain text passes."""
    # What a browser's URL parser sees: leading C0 controls and spaces stripped, tabs/newlines removed.
    seen = re.sub(r"[\t\n\r]", "", value.lstrip("".join(chr(c) for c in range(0x21)))).lower()
    m = _SCHEME.match(seen)
    if m is None:
        return
    scheme = m.group(1)
    if scheme not in ACTIVE_SCHEMES and any(c.isspace() for c in seen):
        return  # text such as "Note: ..." is not a link
    if scheme in ("http", "https"):
        return
    if scheme == "data" and RASTER_DATA.match(seen):
        return
    if scheme == "file":
        _check_file(value.strip(), data_root)
        return
    raise _Bad(
        f"holds a {scheme}: link; item data may link only to http(s)://, file:// under the tenant's data folder "
        "or a raster data:image/... (put a space after the colon if this is text)"
    )


def _check_file(value: str, data_root: Path | None) -> None:
    if data_root is None:
        raise _Bad("holds a file:// link, but file:// content is disabled for this tenant (no data root)")
    raw = unquote(value[len("file://") :])
    if raw.startswith("localhost/"):
        raw = raw[len("localhost") :]
    if not raw.startswith("/") or "\x00" in raw:
        raise _Bad("holds a file:// link that is not file:///absolute/path")
    real = Path(os.path.realpath(raw))
    if not real.is_relative_to(Path(os.path.realpath(data_root))):
        raise _Bad("holds a file:// link outside the tenant's data folder")


def _walk(value: Any, depth: int, data_root: Path | None = None) -> None:
    if depth > MAX_DEPTH:
        raise _Bad(f"nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, dict):
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise _Bad("keys must be non-empty strings")
            if "\x00" in k:
                raise _Bad("a key holds a NUL character")
            _walk(v, depth + 1, data_root)
    elif isinstance(value, list):
        for v in value:
            _walk(v, depth + 1, data_root)
    elif isinstance(value, str):
        if "\x00" in value:
            raise _Bad("a string holds a NUL character")
        check_link(value, data_root)
    elif isinstance(value, bool) or value is None or isinstance(value, int):
        return
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise _Bad("numbers must be finite (no NaN or Infinity)")
    else:
        raise _Bad(f"a {type(value).__name__} is not JSON")


def check_one(value: Any, max_bytes: int, data_root: Path | None = None) -> dict[str, Any]:
    """One item's data, validated (raises ``ValueError`` saying what is wrong). ``data_root``: the
    tenant's folder, the only place ``file://`` links may point to (None: none allowed)."""
    if not isinstance(value, dict):
        raise _Bad(f"must be a JSON object, got {type(value).__name__ if value is not None else 'null'}")
    _walk(value, 1, data_root)
    size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
    if size > max_bytes:
        raise _Bad(f"is {size} bytes as JSON; the limit is {max_bytes}")
    return value


def check_data(ids: Sequence[str], values: Sequence[Any], max_bytes: int, data_root: Path | None = None) -> None:
    """Validate the ``data`` of many items (``None``: the item carries none); one bad item rejects all.

    Raises:
        InvalidItemData: naming the first offending items and why.
    """
    bad: list[tuple[str, str]] = []
    for ext, value in zip(ids, values, strict=True):
        if value is None:
            continue
        try:
            check_one(value, max_bytes, data_root)
        except ValueError as exc:
            bad.append((ext, str(exc)))
    if bad:
        raise InvalidItemData(
            f"item data: {len(bad)} item(s) have invalid `data`, e.g. item {bad[0][0]!r}: data {bad[0][1]}",
            {"invalid": [{"id": e, "reason": r} for e, r in bad[:_SHOWN]]},
        )


def parse_json_strings(
    ids: Sequence[str], raw: Sequence[str | None], max_bytes: int, data_root: Path | None = None
) -> list[dict[str, Any] | None]:
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
            out.append(check_one(value, max_bytes, data_root))
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
