"""Secrets out of logs: the access-log filter and URL redaction.

- ``/labelstudio/<integration>/<secret>/...``: the ML-backend secret sits in the path Label Studio
  calls, so uvicorn's access log would write it on every request. :class:`AccessLogRedactor` (installed
  on the ``uvicorn.access`` logger by ``bait serve``) replaces it with ``***``.
- ``/labelstudio/content/<token>``: the signed link through which Label Studio shows an item's file is
  an access link valid for 30 days (``BAIT_LABELSTUDIO_CONTENT_TTL_SECONDS``): masked the same way.
- Query strings are dropped from access-log paths (they may carry tokens).
- :func:`redact_url`: a URL with its user/password and query replaced, for log lines about webhooks and
  Label Studio.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import urlsplit, urlunsplit

REDACTED = "***"
ACCESS_LOGGER = "uvicorn.access"

_LS_CONTENT = re.compile(r"^(/labelstudio/content/)[^?#]+")
_LS_SECRET = re.compile(r"^(/labelstudio/[^/?#]+/)[^/?#]+")


def redact_path(path: str) -> str:
    """A request path fit for a log: the ML-backend secret and content-link tokens masked, the query
    string dropped."""
    path, sep, _query = path.partition("?")
    if _LS_CONTENT.match(path):
        path = _LS_CONTENT.sub(lambda m: m.group(1) + REDACTED, path)
    else:
        path = _LS_SECRET.sub(lambda m: m.group(1) + REDACTED, path)
    return path + (f"?{REDACTED}" if sep else "")


def redact_url(url: str) -> str:
    """``url`` without credentials or query (``https://***@host/path?***``); unparsable URLs are masked whole."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return REDACTED
    netloc = f"{REDACTED}@{host}{port}" if (parts.username or parts.password) else parts.netloc
    return urlunsplit((parts.scheme, netloc, redact_path(parts.path), REDACTED if parts.query else "", ""))


class AccessLogRedactor(logging.Filter):
    """Masks secrets in uvicorn access-log records (``args = (client, method, path, http_version, status)``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_path(args[2]), *args[3:])
        return True


def install_access_log_redaction() -> AccessLogRedactor:
    """Add the redactor to the ``uvicorn.access`` logger (idempotent); returns it."""
    logger = logging.getLogger(ACCESS_LOGGER)
    for f in logger.filters:
        if isinstance(f, AccessLogRedactor):
            return f
    redactor = AccessLogRedactor()
    logger.addFilter(redactor)
    return redactor
