"""The client's exceptions: one base, :class:`BaitError`, and one class per error the service names.

The service answers errors as ``{"error": {"code", "message", "details"}}``. :func:`error_from_response`
turns such an answer into the most specific class: first by ``code`` (``unknown_item`` ->
:class:`UnknownItem`), then by HTTP status (404 -> :class:`NotFound`), else :class:`BaitError` itself.
Every instance carries ``status_code``, ``code``, ``message`` and ``details`` as the service sent them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class BaitError(Exception):
    """The base of every error this client raises about the service.

    Attributes:
        status_code: the HTTP status (``None`` when no answer came: :class:`ConnectionFailed`).
        code: the service's machine-readable code (``not_found``, ``rate_limited``, ...).
        message: the service's message, meant for people.
        details: the service's ``details`` (a dict, a list, or None).
    """

    def __init__(self, status_code: int | None, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status_code or ''} {code}: {message}".strip())
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details


class _Retryable(BaitError):
    """An answer that says when to try again (``Retry-After``, in seconds)."""

    def __init__(
        self, status_code: int | None, code: str, message: str, details: Any = None, retry_after: float | None = None
    ) -> None:
        super().__init__(status_code, code, message, details)
        self.retry_after = retry_after


class BadRequest(BaitError):
    """400: the request is wrong (nothing was written)."""


class InvalidEmbedding(BadRequest):
    """400 ``invalid_embedding``: NaN/inf values or the wrong dimension."""


class InvalidLabel(BadRequest):
    """400 ``invalid_label``: an unknown class, a target of the wrong length."""


class UnknownItem(BadRequest):
    """400 ``unknown_item``: a label names an item id the pool does not have."""


class DuplicateId(BadRequest):
    """400 ``duplicate_id``: the same id twice in one request."""


class InvalidId(BadRequest):
    """400 ``invalid_id``: a control character, ``/`` or a NUL byte in an item id."""


class InvalidFile(BadRequest):
    """400 ``invalid_file``: an unreadable .npz/Parquet, missing columns, a wrong dtype."""


class InvalidCursor(BadRequest):
    """400 ``invalid_cursor``: a page cursor the service did not hand out."""


class Unauthorized(BaitError):
    """401: no API key, or an unknown or revoked one."""


class InsufficientScope(BaitError):
    """403 ``insufficient_scope``: the key lacks the scope the request needs (``details.required_scope``)."""


class NotFound(BaitError):
    """404: no such pool, item, batch, ... (or it belongs to another tenant)."""


class Conflict(BaitError):
    """409: the request conflicts with the current state (e.g. an Idempotency-Key reused for another request)."""


class PayloadTooLarge(BaitError):
    """413: the body (or what it inflates to) is above the service's limit (``details.limit_bytes``)."""


class TooManyItems(PayloadTooLarge):
    """413 ``too_many_items``: more items or labels in one JSON request than the service takes."""


class UnsupportedMediaType(BaitError):
    """415: a body format the route does not read."""


class ValidationError(BaitError):
    """422 ``validation_error``: a malformed payload (``details`` lists each field's problem)."""


class RateLimited(_Retryable):
    """429 ``rate_limited``: the key spent its rate; ``retry_after`` says how many seconds to wait.

    Raised only once the client's retries are spent or off (see :class:`bait_client.RetryPolicy`)."""


class InternalError(BaitError):
    """500: the service failed (it logged the details)."""


class Unavailable(_Retryable):
    """503 ``unavailable``: the database or the queue is unreachable for now; ``retry_after`` seconds.

    Raised only once the client's retries are spent or off."""


class ConnectionFailed(BaitError):
    """No answer: the connection failed or timed out (after the retries the request allowed)."""


class BatchFailed(BaitError):
    """:meth:`bait_client.Client.wait` saw the batch end ``failed`` or ``cancelled``."""


class JobFailed(BaitError):
    """A job the client waited for (a stateless selection, an embed job) ended ``failed``."""


class UploadFailed(BaitError):
    """An upload stopped part way. Every row before ``uploaded`` is stored; pass ``start=e.uploaded`` to the
    same upload call to go on from the chunk that failed (``cause`` is the error that stopped it)."""

    def __init__(self, uploaded: int, total: int, cause: BaitError) -> None:
        super().__init__(
            cause.status_code,
            cause.code,
            f"upload stopped after {uploaded} of {total} rows ({cause.message}); resume with start={uploaded}",
            cause.details,
        )
        self.uploaded = uploaded
        self.total = total
        self.cause = cause


BY_CODE: dict[str, type[BaitError]] = {
    "invalid_embedding": InvalidEmbedding,
    "invalid_label": InvalidLabel,
    "unknown_item": UnknownItem,
    "duplicate_id": DuplicateId,
    "invalid_id": InvalidId,
    "invalid_file": InvalidFile,
    "invalid_cursor": InvalidCursor,
    "insufficient_scope": InsufficientScope,
    "too_many_items": TooManyItems,
    "rate_limited": RateLimited,
    "unavailable": Unavailable,
    "validation_error": ValidationError,
}
BY_STATUS: dict[int, type[BaitError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: InsufficientScope,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: ValidationError,
    429: RateLimited,
    500: InternalError,
    503: Unavailable,
}


def retry_after_seconds(headers: Mapping[str, str]) -> float | None:
    """``Retry-After`` in seconds (the service sends whole seconds), or None when absent or unreadable."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:  # an HTTP date: this service never sends one
        return None


def error_from_response(status_code: int, body: Any, headers: Mapping[str, str], text: str = "") -> BaitError:
    """The exception for an error answer (``body``: its parsed JSON, or None)."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        code = str(err.get("code") or "error")
        message = str(err.get("message") or text[:500])
        details = err.get("details")
    else:
        code, message, details = "http_error", text[:500] or f"HTTP {status_code}", None
    cls = BY_CODE.get(code) or BY_STATUS.get(status_code) or BaitError
    # A code whose class belongs to another status (a proxy's 503 with some other body) keeps the status's class.
    if status_code in BY_STATUS and not issubclass(cls, BY_STATUS[status_code]):
        cls = BY_STATUS[status_code]
    if issubclass(cls, _Retryable):
        return cls(status_code, code, message, details, retry_after=retry_after_seconds(headers))
    return cls(status_code, code, message, details)
