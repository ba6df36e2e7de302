"""The one parser of every URL the service accepts (webhooks, Label Studio, item references, data
links): a malformed URL is a 400 ``invalid_url`` that says what is wrong, never a 500, and the message
never repeats the URL's credentials.
"""

from __future__ import annotations

from urllib.parse import SplitResult, urlsplit

from service.errors import BadRequest
from service.logredact import redact_url


class InvalidUrl(BadRequest):
    code = "invalid_url"


def split_url(url: str, what: str = "url") -> SplitResult:
    """``url`` parsed, its port checked (``urlsplit`` defers that error to ``.port``).

    Raises:
        InvalidUrl: not a string, an unbalanced IPv6 bracket, a port out of range or not a number,
            control characters.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidUrl(f"{what} must be a non-empty URL", {"field": what})
    if any(ord(c) < 0x20 or c == "\x7f" for c in url):
        raise InvalidUrl(f"{what} holds control characters", {"field": what})
    try:
        parts = urlsplit(url.strip())
        _ = parts.port
    except ValueError as exc:
        raise InvalidUrl(f"{what} is not a valid URL ({exc}): {redact_url(url)!r}", {"field": what}) from None
    return parts


def http_url(url: str, what: str = "url") -> SplitResult:
    """An absolute ``http(s)://`` URL with a host (:func:`split_url` plus the scheme and host)."""
    parts = split_url(url, what)
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise InvalidUrl(
            f"{what} must be an absolute http(s):// URL with a host, got {redact_url(url)!r}",
            {"field": what},
        )
    return parts
