"""The dashboard (`/ui`) and the offline API docs (`/docs`, `/redoc`), served by the API process.

Everything a page loads comes from this service: templates in ``templates/``, scripts and styles in
``static/`` (third-party ones vendored from npm under ``static/vendor``, see its VENDORED.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import quote

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from service.errors import ServiceError
from service.web import routes
from service.web.session import LoginRequired

STATIC = Path(__file__).parent / "static"
VENDOR = "/ui/static/vendor"
# The docs pages carry FastAPI's inline bootstrap script; ReDoc runs its search in a blob: worker.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; "
    "frame-ancestors 'none'"
)


def install(app: FastAPI) -> None:
    """Mount the dashboard, its static files and the docs pages on ``app`` (created with
    ``docs_url=None, redoc_url=None``)."""
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")
    app.include_router(routes.router)
    api_handler: Any = app.exception_handlers.get(ServiceError)

    @app.exception_handler(LoginRequired)
    async def _login_required(request: Request, _exc: LoginRequired) -> Response:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        if request.method != "GET" or request.url.path.endswith(".json") or "fragment" in request.url.path:
            return Response("sign in again", status_code=401, media_type="text/plain")
        return RedirectResponse(f"/ui/login?next={quote(target)}", status_code=303)

    @app.exception_handler(routes.CsrfFailed)
    async def _csrf_failed(request: Request, _exc: routes.CsrfFailed) -> Response:
        return routes.TEMPLATES.TemplateResponse(
            request, "error.html", {"user": None, "status": 403, "message": "form expired or sent from another site: "
                                    "reload the page and try again"}, status_code=403
        )  # fmt: skip

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> Response:
        if not request.url.path.startswith("/ui") or request.url.path.endswith(".json"):
            response: Response = await api_handler(request, exc)
            return response
        return routes.TEMPLATES.TemplateResponse(
            request, "error.html", {"user": None, "status": exc.status_code, "message": exc.message},
            status_code=exc.status_code, headers=exc.headers,
        )  # fmt: skip

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return _csp(
            get_swagger_ui_html(
                openapi_url=app.openapi_url or "/openapi.json",
                title=f"{app.title} - Swagger UI",
                swagger_js_url=f"{VENDOR}/swagger-ui/swagger-ui-bundle.js",
                swagger_css_url=f"{VENDOR}/swagger-ui/swagger-ui.css",
                swagger_favicon_url=f"{VENDOR}/swagger-ui/favicon-32x32.png",
                swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from validator.swagger.io
            )
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return _csp(
            get_redoc_html(
                openapi_url=app.openapi_url or "/openapi.json",
                title=f"{app.title} - ReDoc",
                redoc_js_url=f"{VENDOR}/redoc/redoc.standalone.js",
                redoc_favicon_url=f"{VENDOR}/swagger-ui/favicon-32x32.png",
                with_google_fonts=False,
            )
        )


def _csp(response: HTMLResponse) -> HTMLResponse:
    response.headers["Content-Security-Policy"] = DOCS_CSP
    return response
