"""Request body size limit, enforced before and while the body streams in (413, the usual error body).

Upload routes (bulk item files) get ``settings.max_upload_bytes``; every other request gets
``settings.max_json_bytes``. A declared ``Content-Length`` above the limit is refused before a byte
of the body is read; a chunked or lying body is cut off as soon as the running count passes it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import error_response

# Paths (regular expressions on the URL path) whose bodies are bulk uploads, not JSON.
UPLOAD_PATHS: tuple[str, ...] = (r"^/v1/pools/[^/]+/items:bulk$",)


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when the body passes the limit. An HTTPException so that FastAPI's body
    parsing re-raises it unchanged and the app's handler renders it as a 413 error body."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body larger than the limit of {limit} bytes")
        self.limit = limit


class BodySizeLimitMiddleware:
    def __init__(
        self,
        app: ASGIApp,
        *,
        max_json_bytes: int,
        max_upload_bytes: int,
        upload_paths: Iterable[str] = UPLOAD_PATHS,
    ) -> None:
        self.app = app
        self.max_json_bytes = max_json_bytes
        self.max_upload_bytes = max_upload_bytes
        self.upload_paths = [re.compile(p) for p in upload_paths]

    def limit_for(self, path: str) -> int:
        if any(p.match(path) for p in self.upload_paths):
            return self.max_upload_bytes
        return self.max_json_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope.get("path", ""))
        declared = Headers(scope=scope).get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, limit)
            return

        total = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal total
            message = await receive()
            if message["type"] == "http.request":
                total += len(message.get("body", b""))
                if total > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send, limit)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
        response = error_response(
            413,
            "payload_too_large",
            f"request body larger than the limit of {limit} bytes",
            {"limit_bytes": limit},
        )
        response.headers["Connection"] = "close"
        await response(scope, receive, send)
