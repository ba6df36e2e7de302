"""The one parser of every URL the service accepts (webhooks, Label Studio, item references, data
links): a malformed URL is a 400 ``invalid_url`` that says what is wrong, never a 500, and the message
never repeats the URL's credentials.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, unquote, urlsplit

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


_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")


def split_s3(url: str) -> tuple[str, str]:
    """``(bucket, key)`` of an ``s3://bucket/key`` URL (the key percent-decoded, without its leading ``/``;
    it may end with ``/``, a folder).

    Refused, with a message a user can act on: another scheme, credentials (``user@``), a port, a bucket
    name S3 does not allow, a query string (the endpoint and its options are the operator's settings,
    never a URL's), a fragment, and ``.``, ``..`` or empty path segments (after decoding ``%2e``).

    Raises:
        ValueError: what is wrong with the URL (its credentials never repeated).
    """
    try:
        parts = urlsplit(url.strip())
    except ValueError as exc:
        raise ValueError(f"not a valid URL ({exc})") from None
    if parts.scheme.lower() != "s3":
        raise ValueError("not an s3:// URL")
    if "@" in parts.netloc:
        raise ValueError("an s3:// URL must not carry credentials (user@): they come from the server's environment")
    if parts.query:
        raise ValueError(
            "an s3:// URL must not have a query string (?...): the S3 endpoint and its options are the operator's "
            "settings (BAIT_IMPORT_S3_ENDPOINT, BAIT_IMPORT_S3_REGION), never part of the URL"
        )
    if parts.fragment or url.rstrip().endswith("#"):
        raise ValueError("an s3:// URL must not have a fragment (#...): percent-encode `#` in a key as %23")
    if not _BUCKET.fullmatch(parts.netloc) or ".." in parts.netloc:
        raise ValueError(
            f"{parts.netloc[:80]!r} is not an S3 bucket name (3-63 lowercase letters, digits, `.` and `-`; "
            "no port): use s3://bucket/prefix/..."
        )
    key = unquote(parts.path).removeprefix("/")
    if any(ord(c) < 0x20 or c == "\x7f" for c in key):
        raise ValueError("an s3:// URL's key holds control characters")
    segments = key.split("/")
    if any(s in (".", "..") for s in segments):
        raise ValueError("an s3:// URL must not have `.` or `..` segments: name the objects' prefix itself")
    if any(not s for s in segments[:-1]):
        raise ValueError("an s3:// URL must not have empty segments (`//`)")
    return parts.netloc, key
