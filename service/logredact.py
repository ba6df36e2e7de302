"""Secrets out of logs: the access-log filter and URL redaction.

- ``/labelstudio/<integration>/<secret>/...``: the ML-backend secret sits in the path Label Studio
  calls, so uvicorn's access log would write it on every request. :class:`AccessLogRedactor` (installed
  on the ``uvicorn.access`` logger by ``bait serve``) replaces it with ``***``.
- ``/labelstudio/content/<token>``: the signed link through which Label Studio shows an item's file is
  an access link valid for 30 days (``BAIT_LABELSTUDIO_CONTENT_TTL_SECONDS``): masked the same way.
- Query strings are dropped from access-log paths (they may carry tokens).
- :func:`redact_url`: a URL with its user/password and query replaced, for log lines about webhooks and
  Label Studio.
- :func:`install_log_redaction`: every log record of every library (httpx's "HTTP Request: POST
  http://user:secret@host/hook" line included) has URL credentials (``user:password@``) and secret
  query parameters (``token=``, ``secret=``, ``password=``, ``api_key=``, ``sig=``...) masked when it is
  created, before any handler formats or ships it.
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


_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/\s@?#]+@")
_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:access_token|refresh_token|token|secret|client_secret|password|passwd|pwd|api_key|apikey|key"
    r"|sig|signature|auth|x-amz-signature|x-amz-credential|x-amz-security-token)=)[^&#\s'\"]*"
)


def redact_text(text: str) -> str:
    """``text`` with every URL's credentials and secret query parameters replaced by ``***``."""
    if "://" not in text and "=" not in text:
        return text
    return _SECRET_PARAM.sub(
        lambda m: m.group(1) + REDACTED, _USERINFO.sub(lambda m: m.group(1) + REDACTED + "@", text)
    )


def _needs_look(record: logging.LogRecord) -> bool:
    if "://" in str(record.msg):
        return True
    args = record.args
    items = args.values() if isinstance(args, dict) else args if isinstance(args, tuple) else ()
    return any(not isinstance(a, int | float) and "://" in str(a) for a in items)


def install_log_redaction() -> None:
    """Mask URL credentials in every log record from now on, whichever library logs it (idempotent)."""
    current = logging.getLogRecordFactory()
    if getattr(current, "_bait_redacting", False):
        return

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = current(*args, **kwargs)
        if _needs_look(record):
            try:
                message = record.getMessage()
            except Exception:  # a malformed record: leave it to logging's own error path
                return record
            cleaned = redact_text(message)
            if cleaned != message:
                record.msg, record.args = cleaned, None
        return record

    factory._bait_redacting = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


def install_access_log_redaction() -> AccessLogRedactor:
    """Add the redactor to the ``uvicorn.access`` logger (idempotent); returns it."""
    logger = logging.getLogger(ACCESS_LOGGER)
    for f in logger.filters:
        if isinstance(f, AccessLogRedactor):
            return f
    redactor = AccessLogRedactor()
    logger.addFilter(redactor)
    return redactor
