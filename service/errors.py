"""One error hierarchy, one handler, one body shape: ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException


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

    def __init__(self, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


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


class InvalidFile(BadRequest):
    code = "invalid_file"  # unreadable .npz/Parquet, missing columns, ragged lists, wrong dtype


class EncoderRejected(BadRequest):
    code = "encoder_rejected"  # an uploaded TorchScript module uses an operator outside the allowlist


class InvalidCursor(BadRequest):
    code = "invalid_cursor"


class TooManyItems(PayloadTooLarge):
    code = "too_many_items"  # more than settings.max_items_per_request in one JSON request


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = ErrorBody(error=ErrorInfo(code=code, message=message, details=details))
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(status_code=status, content=body.model_dump(), headers=headers or None)


# Declared in each route's `responses=` so the OpenAPI shows the error body.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorBody, "description": "Invalid request"},
    401: {"model": ErrorBody, "description": "Missing or invalid API key"},
    403: {"model": ErrorBody, "description": "The API key lacks the scope this route needs (`insufficient_scope`)"},
    404: {"model": ErrorBody, "description": "Not found (or belongs to another tenant)"},
    409: {"model": ErrorBody, "description": "Conflict with the current state"},
    413: {"model": ErrorBody, "description": "Body too large"},
    422: {"model": ErrorBody, "description": "Malformed payload"},
    429: {"model": ErrorBody, "description": "Rate limit of the API key exceeded (see `Retry-After`)"},
}


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
        return error_response(422, "validation_error", message, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 401: "unauthorized", 413: "payload_too_large"}.get(
            exc.status_code, "http_error"
        )
        return error_response(exc.status_code, code, str(exc.detail))
