"""Dashboard routes (`/ui`): server-rendered pages (Jinja2), htmx fragments polled for live progress,
and the JSON the charts draw. Every read and write goes through ``service.domain`` like the API, with the
tenant of the signed-in key; forms are POSTed with the session's CSRF token and answered by a redirect.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from service.deps import SessionDep
from service.domain import batches as batches_domain
from service.domain import dashboard
from service.domain import quality as quality_domain
from service.domain.labels import LabelWrite, put_labels
from service.domain.pools import get_pool
from service.errors import ServiceError
from service.queue import JobQueue
from service.web import session as web_session
from service.web.session import WebUser

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
# Pages load scripts, styles and data from this service only (thumbnails are inline data: URIs).
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
router = APIRouter(prefix="/ui", include_in_schema=False)


def _user(request: Request, session: SessionDep) -> WebUser:
    return web_session.current_user(request, session)


UserDep = Annotated[WebUser, Depends(_user)]


class CsrfFailed(Exception):
    """A POST without the session's CSRF token, or from another origin."""


def _check_post(request: Request, user: WebUser, token: str | None) -> None:
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        raise CsrfFailed()
    if not web_session.csrf_ok(user, token):
        raise CsrfFailed()


def _lacks(user: WebUser, scope: str, url: str) -> Response | None:
    """A redirect back with an error when the signed-in key lacks ``scope`` (the API would answer 403)."""
    if user.can(scope):
        return None
    have = ", ".join(user.scopes)
    return _back(url, error=f"this API key lacks the {scope!r} scope needed for that (it has: {have})")


def _page(request: Request, name: str, user: WebUser | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    response = TEMPLATES.TemplateResponse(
        request, name, {"user": user, "csrf": None if user is None else user.csrf, **context}, status_code=status_code
    )
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    return response


def _back(url: str, message: str | None = None, error: str | None = None) -> RedirectResponse:
    extra = ""
    if message:
        extra = f"?msg={quote(message[:300])}"
    elif error:
        extra = f"?err={quote(error[:300])}"
    return RedirectResponse(url + extra, status_code=303)


def _safe_next(target: str | None) -> str:
    """Only paths of the dashboard itself (no open redirect)."""
    if target and target.startswith("/ui") and not target.startswith("//"):
        return target
    return "/ui"


# ----------------------------------------------------------------------------------------- sign-in


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str | None = None, err: str | None = None) -> HTMLResponse:
    return _page(request, "login.html", None, next=_safe_next(next), err=err)


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    api_key: Annotated[str, Form(max_length=200)],
    next: Annotated[str, Form()] = "/ui",
) -> Response:
    origin = request.headers.get("origin")
    if origin and origin != "null" and urlsplit(origin).netloc != request.url.netloc:
        return _page(request, "login.html", None, status_code=403, next="/ui", err="cross-site sign-in refused")
    value = web_session.sign_in(session, request.app.state.settings, api_key)
    if value is None:
        return _page(
            request, "login.html", None, status_code=401, next=_safe_next(next), err="invalid or revoked API key"
        )
    response = RedirectResponse(_safe_next(next), status_code=303)
    web_session.set_cookie(response, request, value)
    return response


@router.post("/logout")
def logout(request: Request, user: UserDep, csrf: Annotated[str, Form()] = "") -> Response:
    _check_post(request, user, csrf)
    response = RedirectResponse("/ui/login", status_code=303)
    web_session.clear_cookie(response)
    return response


# ------------------------------------------------------------------------------------------- pages


@router.get("", response_class=HTMLResponse)
def pools_page(request: Request, session: SessionDep, user: UserDep) -> HTMLResponse:
    return _page(request, "pools.html", user, pools=dashboard.pools_overview(session, user.tenant.id))


@router.get("/pools/{pool}", response_class=HTMLResponse)
def pool_page(
    request: Request, pool: str, session: SessionDep, user: UserDep, msg: str | None = None, err: str | None = None
) -> HTMLResponse:
    data = dashboard.pool_page(session, user.tenant.id, pool, admin=user.can("admin"))
    return _page(request, "pool.html", user, msg=msg, err=err, **data)


@router.get("/pools/{pool}/batches-fragment", response_class=HTMLResponse)
def batches_fragment(request: Request, pool: str, session: SessionDep, user: UserDep) -> HTMLResponse:
    """The batches table alone: polled every 2 s by the pool page while a batch is queued or running."""
    return _page(request, "_batches.html", user, **dashboard.batches_table(session, user.tenant.id, pool))


@router.get("/pools/{pool}/curve.json")
def curve_json(pool: str, session: SessionDep, user: UserDep, metric: str | None = None) -> Any:
    return quality_domain.curve(session, user.tenant.id, pool, metric)


@router.get("/pools/{pool}/map.json")
def map_json(pool: str, session: SessionDep, user: UserDep, checkpoint_id: str | None = None) -> Response:
    return Response(
        quality_domain.map_json(session, user.tenant.id, pool, checkpoint_id), media_type="application/json"
    )


@router.get("/pools/{pool}/batches/{batch}", response_class=HTMLResponse)
def batch_page(
    request: Request,
    pool: str,
    batch: str,
    session: SessionDep,
    user: UserDep,
    msg: str | None = None,
    err: str | None = None,
) -> HTMLResponse:
    data = dashboard.batch_page(session, user.tenant.id, pool, batch)
    return _page(request, "batch.html", user, msg=msg, err=err, **data)


@router.get("/pools/{pool}/batches/{batch}/export.{fmt}")
def export_batch(pool: str, batch: str, fmt: str, session: SessionDep, user: UserDep) -> Response:
    if fmt not in ("csv", "jsonl"):
        return Response("export as .csv or .jsonl", status_code=404, media_type="text/plain")
    rows = dashboard.export_rows(dashboard.batch_page(session, user.tenant.id, pool, batch))
    headers = {"Content-Disposition": f'attachment; filename="batch-{batch}.{fmt}"'}
    if fmt == "jsonl":
        body = "".join(json.dumps(r) + "\n" for r in rows)
        return Response(body, media_type="application/x-ndjson", headers=headers)
    buf = io.StringIO()
    writer = csv.DictWriter(
        buf, fieldnames=["position", "item_id", "status", "label", "predicted", "confidence", "text", "uri"]
    )
    writer.writeheader()
    writer.writerows(rows)
    return Response(buf.getvalue(), media_type="text/csv", headers=headers)


# ----------------------------------------------------------------------------------------- actions


def _queue(request: Request) -> JobQueue:
    queue: JobQueue = request.app.state.queue
    return queue


@router.post("/pools/{pool}/batches")
def request_batch(
    request: Request,
    pool: str,
    session: SessionDep,
    user: UserDep,
    size: Annotated[int, Form(ge=1, le=1_000_000)],
    strategy: Annotated[str, Form(max_length=64)],
    csrf: Annotated[str, Form()] = "",
) -> Response:
    _check_post(request, user, csrf)
    if (denied := _lacks(user, "select", f"/ui/pools/{pool}")) is not None:
        return denied
    req = batches_domain.BatchRequest(size=size, strategy=strategy, params={})
    try:
        batch, _ = batches_domain.create_batch(session, _queue(request), user.tenant.id, pool, req)
    except ServiceError as exc:
        if exc.status_code == 404:
            raise
        return _back(f"/ui/pools/{pool}", error=exc.message)
    return _back(f"/ui/pools/{pool}", message=f"batch {batch.id} requested: {size} items by {strategy}")


@router.post("/pools/{pool}/batches/{batch}/cancel")
def cancel_batch(
    request: Request, pool: str, batch: str, session: SessionDep, user: UserDep, csrf: Annotated[str, Form()] = ""
) -> Response:
    _check_post(request, user, csrf)
    if (denied := _lacks(user, "select", f"/ui/pools/{pool}/batches/{batch}")) is not None:
        return denied
    try:
        batches_domain.cancel_batch(session, user.tenant.id, pool, batch)
    except ServiceError as exc:
        if exc.status_code == 404:
            raise
        return _back(f"/ui/pools/{pool}/batches/{batch}", error=exc.message)
    return _back(f"/ui/pools/{pool}/batches/{batch}", message="batch cancelled; its reserved items are free again")


@router.post("/pools/{pool}/labels")
def label_item(
    request: Request,
    pool: str,
    session: SessionDep,
    user: UserDep,
    item_id: Annotated[str, Form(max_length=512)],
    value: Annotated[str, Form(max_length=10_000)],
    back: Annotated[str, Form()] = "/ui",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    """Label one item by hand (class name, or comma-separated numbers for a regression target)."""
    _check_post(request, user, csrf)
    target = _safe_next(back)
    if (denied := _lacks(user, "label", target)) is not None:
        return denied
    p = get_pool(session, user.tenant.id, pool)
    try:
        if p.task == "classification":
            write = LabelWrite(item_id=item_id, label=value)
        else:
            try:
                numbers = [float(v) for v in value.replace(";", ",").split(",") if v.strip()]
            except ValueError:
                return _back(target, error=f"target must be numbers separated by commas, got {value!r}")
            write = LabelWrite(item_id=item_id, target=numbers)
        put_labels(session, p, [write], annotator=f"dashboard:{user.key_prefix}", max_items=1)
    except ServiceError as exc:
        return _back(target, error=exc.message)
    return _back(target, message=f"{item_id} labeled {value}")
