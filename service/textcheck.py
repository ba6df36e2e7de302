"""Strings the service refuses everywhere: NUL bytes and lone UTF-16 surrogates (and, in ids, every
control character and `/`).

PostgreSQL cannot store NUL in text and no UTF-8 encoder can write a lone surrogate, so such a string
would fail deep in a write as a 500 (and behave differently on SQLite). They are refused at the edge with
400 ``invalid_string`` instead: in JSON bodies (every request model scans its strings), in URL paths and
query strings (:class:`InvalidTextMiddleware`), and in ids of bulk files (``check_ids``). Every check is a
single regular-expression pass: linear in the input.

Ids may not contain `/`: the per-item routes (``/v1/pools/{pool}/items/{item_id}``,
``.../labels/{item_id}``) take the id as one path segment, and `%2F` is decoded before routing, so an id
with a slash could be created but never reached.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.types import ASGIApp, Receive, Scope, Send

from service.errors import error_response

_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")
_BAD_ID = re.compile("[\x00-\x1f\x7f/\ud800-\udfff]")


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored as text (NUL byte, lone surrogate), or None."""
    m = _BAD_TEXT.search(value)
    if m is None:
        return None
    ch = m.group()
    return "contains a NUL byte" if ch == "\x00" else f"contains a lone surrogate U+{ord(ch):04X} (not valid UTF-8)"


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an id (control character, `/`, NUL, lone surrogate), or None."""
    m = _BAD_ID.search(value)
    if m is None:
        return None
    ch = m.group()
    if ch == "/":
        return "contains '/' (ids are one URL path segment)"
    if "\ud800" <= ch <= "\udfff":
        return f"contains a lone surrogate U+{ord(ch):04X} (not valid UTF-8)"
    return f"contains the control character U+{ord(ch):04X}"


def find_bad_text(value: Any, path: tuple[str | int, ...] = ()) -> tuple[tuple[str | int, ...], str] | None:
    """The first string (or mapping key) under ``value`` that cannot be stored: ``(path, problem)``."""
    if isinstance(value, str):
        problem = text_problem(value)
        return (path, problem) if problem else None
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str) and (problem := text_problem(key)):
                return ((*path, key), f"key {problem}")
            found = find_bad_text(item, (*path, key))
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = find_bad_text(item, (*path, i))
            if found:
                return found
    return None


class InvalidTextMiddleware:
    """400 ``invalid_string`` for a URL path or query string holding NUL, a control character or invalid
    UTF-8 after percent-decoding, before any route (and so any database query) sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self._problem(scope)
            if problem is not None:
                response = error_response(400, "invalid_string", problem)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _problem(scope: Scope) -> str | None:
        raw_path = scope.get("raw_path") or scope.get("path", "").encode("utf-8", "surrogatepass")
        query = scope.get("query_string", b"")
        for where, raw in (("URL path", raw_path), ("query string", query)):
            try:
                decoded = unquote_to_bytes(raw).decode("utf-8", "strict")
            except UnicodeError:
                return f"the {where} is not valid percent-encoded UTF-8"
            if re.search("[\x00-\x1f\x7f]", decoded):
                return f"the {where} contains a control character (NUL or below U+0020)"
        return None
