"""One error hierarchy, one handler, one body shape: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

log = logging.getLogger("bait.errors")

# Seconds a client should wait before retrying after a 503 (database or queue unreachable).
RETRY_AFTER_SECONDS = 5


class ErrorInfo(BaseModel):
    code: str
    message: str
    details: Any = None


class ErrorBody(BaseModel):
    error: ErrorInfo


class ServiceError(Exception):
    """Base of every domain error; subclasses fix the HTTP status and the machine-readable code."""

    status_code = 400
    code = "bad_request"
    headers: dict[str, str] | None = None  # extra response headers (e.g. Retry-After)

    def __init__(self, message: str, details: Any = None, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        if code is not None:
            self.code = code


class BadRequest(ServiceError):
    status_code = 400
    code = "bad_request"


class ValidationFailed(ServiceError):
    status_code = 422
    code = "validation_error"


class Unauthorized(ServiceError):
    status_code = 401
    code = "unauthorized"


class InsufficientScope(ServiceError):
    """The key is valid but lacks the scope the route needs (the resource is the key's own tenant's)."""

    status_code = 403
    code = "insufficient_scope"

    def __init__(self, needed: str, held: tuple[str, ...]) -> None:
        super().__init__(
            f"this API key lacks the `{needed}` scope this request needs (it has: {', '.join(held) or 'none'}); "
            f"ask the operator for a key with `bait keys create --scope ...,{needed}`",
            {"required_scope": needed, "key_scopes": list(held)},
        )


class RateLimited(ServiceError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, limit: str, retry_after: int) -> None:
        super().__init__(
            f"rate limit of {limit} per API key exceeded; retry after {retry_after} s",
            {"limit": limit, "retry_after": retry_after},
        )
        self.headers = {"Retry-After": str(retry_after)}


class NotFound(ServiceError):
    status_code = 404
    code = "not_found"


class Conflict(ServiceError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    status_code = 413
    code = "payload_too_large"


class UnsupportedMediaType(ServiceError):
    status_code = 415
    code = "unsupported_media_type"


class ServiceUnavailable(ServiceError):
    status_code = 503
    code = "unavailable"


# Specific 4xx codes of item and label writes: the whole request is rejected, nothing is written.
class InvalidEmbedding(BadRequest):
    code = "invalid_embedding"  # NaN/inf values, wrong dimension


class InvalidLabel(BadRequest):
    code = "invalid_label"  # unknown class, target of the wrong length, label kind not the pool's task


class UnknownItem(BadRequest):
    code = "unknown_item"  # a label names an item id the pool does not have


class DuplicateId(BadRequest):
    code = "duplicate_id"  # the same id twice in one request


class InvalidId(BadRequest):
    code = "invalid_id"  # a control character, `/`, a NUL byte or a lone surrogate in an item id


class InvalidFile(BadRequest):
    code = "invalid_file"  # unreadable .npz/Parquet, missing columns, ragged lists, wrong dtype


class EncoderRejected(BadRequest):
    code = "encoder_rejected"  # an uploaded TorchScript module uses an operator outside the allowlist


class InvalidCursor(BadRequest):
    code = "invalid_cursor"


class TooManyItems(PayloadTooLarge):
    code = "too_many_items"  # more than settings.max_items_per_request in one JSON request


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorInfo(code=code, message=message, details=details))
    all_headers = dict(headers or {})
    if status == 401:
        all_headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(status_code=status, content=body.model_dump(), headers=all_headers or None)


# Declared in each route's `responses=` so the OpenAPI shows the error body.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    403: {"model": ErrorBody, "description": "The API key lacks the scope this route needs (`insufficient_scope`)"},
    404: {"model": ErrorBody, "description": "Not found (or belongs to another tenant)"},
    409: {"model": ErrorBody, "description": "Conflict with the current state"},
    413: {"model": ErrorBody, "description": "Body too large, or it would inflate above the limit"},
    422: {"model": ErrorBody, "description": "Malformed payload"},
    429: {"model": ErrorBody, "description": "Rate limit of the key exceeded; retry after `Retry-After` seconds"},
    500: {"model": ErrorBody, "description": "Internal error (no details are given; the server logs them)"},
    503: {"model": ErrorBody, "description": "Database or queue unreachable; retry after `Retry-After` seconds"},
}
# Routes that read a file body (bulk upload, stateless select) can also answer 415.
UPLOAD_ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    415: {"model": ErrorBody, "description": "Unsupported body format"},
}


def _is_outage(exc: DBAPIError) -> bool:
    """A DBAPI error that means "the database is unreachable or busy", not "this request is wrong"."""
    return isinstance(exc, OperationalError) or exc.connection_invalidated


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def _service_error(_req: Request, exc: ServiceError) -> JSONResponse:
        return error_response(exc.status_code, exc.code, exc.message, exc.details, exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_req: Request, exc: RequestValidationError) -> JSONResponse:
        details = [
            {"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in exc.errors()
        ]
        first = details[0] if details else {"loc": [], "msg": "invalid payload"}
        where = ".".join(str(p) for p in first["loc"] if p != "body")
        message = f"{where}: {first['msg']}" if where else str(first["msg"])
        if details and all(d["type"] in ("invalid_string", "string_unicode") for d in details):
            # NUL bytes / lone surrogates: a well-formed payload with a value that cannot be stored.
            # (`string_unicode`: pydantic met a `\ud800`-style escape while parsing the raw JSON.)
            if first["type"] == "string_unicode":
                message = f"{where or 'a string'} contains a lone surrogate (not valid UTF-8)"
            return error_response(400, "invalid_string", message, details)
        return error_response(422, "validation_error", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        # Keep the exception's headers: 405 carries `Allow`, 401 `WWW-Authenticate`.
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(req) or headers.get("Allow", "")
        return error_response(exc.status_code, code, str(exc.detail), headers=headers)

    @app.exception_handler(DBAPIError)
    async def _database_error(req: Request, exc: DBAPIError) -> JSONResponse:
        if _is_outage(exc):
            log.warning("database unavailable on %s %s: %s", req.method, req.url.path, type(exc.orig).__name__)
            return _unavailable("the database is unavailable")
        return _internal(req, exc)

    @app.exception_handler(PoolTimeoutError)
    async def _pool_timeout(_req: Request, _exc: PoolTimeoutError) -> JSONResponse:
        return _unavailable("the database is busy (no connection free)")

    @app.exception_handler(RedisConnectionError)
    @app.exception_handler(RedisTimeoutError)
    async def _queue_error(req: Request, exc: Exception) -> JSONResponse:
        log.warning("queue unavailable on %s %s: %s", req.method, req.url.path, type(exc).__name__)
        return _unavailable("the job queue is unavailable")

    @app.exception_handler(Exception)
    async def _unhandled(req: Request, exc: Exception) -> JSONResponse:
        return _internal(req, exc)


def _allowed_methods(req: Request) -> str:
    """Every method some route serves at this path (Starlette's own `Allow` names only the methods of the
    first route that matches the path, e.g. POST alone for `/v1/pools`)."""
    allowed = []
    for method in ("GET", "POST", "PUT", "PATCH", "DELETE"):
        scope = {
            "type": "http",
            "path": req.scope["path"],
            "root_path": req.scope.get("root_path", ""),
            "method": method,
        }
        if any(route.matches(dict(scope))[0] == Match.FULL for route in req.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


def _unavailable(message: str) -> JSONResponse:
    return error_response(
        503,
        "unavailable",
        f"{message}; retry in {RETRY_AFTER_SECONDS} s",
        headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


def _internal(req: Request, exc: Exception) -> JSONResponse:
    # The exception's text can hold SQL, paths or data: logged here, never sent to the client.
    log.error("unhandled error on %s %s", req.method, req.url.path, exc_info=exc)
    return error_response(500, "internal_error", "internal error; the server has logged the details")
