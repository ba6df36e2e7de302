"""Security headers on every response of the service, set in one place.

The layer wraps the whole application (outside every middleware and the 500 handler), so error pages,
404s of unknown paths, 413s of the body limit and static files get the same headers as pages:

- ``Content-Security-Policy``: the dashboard's policy on ``/ui`` (scripts, styles and data from this
  service only), ``default-src 'none'`` everywhere else (JSON has nothing to load); a route that needs
  another policy (the API docs, content links) sets its own and it is kept;
- ``X-Content-Type-Options: nosniff``, ``X-Frame-Options: DENY`` (with ``frame-ancestors 'none'``) and
  ``Referrer-Policy: same-origin``.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Dashboard pages load scripts, styles and data from this service only (thumbnails are inline data: URIs).
DASHBOARD_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
# Everything else: JSON, plain text, files. Nothing to load, nothing to run, never framed.
DEFAULT_CSP = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
# Content served to annotation tools (an item's file behind a signed link): no script, even opened alone.
CONTENT_CSP = "default-src 'none'; sandbox"

COMMON = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
}


def csp_for(path: str) -> str:
    return DASHBOARD_CSP if path == "/ui" or path.startswith("/ui/") else DEFAULT_CSP


class SecurityHeaders:
    """ASGI wrapper adding the headers above to every HTTP response that does not set them itself."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        csp = csp_for(scope.get("path", ""))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                if "content-security-policy" not in headers:
                    headers["Content-Security-Policy"] = csp
                for name, value in COMMON.items():
                    if name.lower() not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)
