"""Dashboard routes (`/ui`): server-rendered pages (Jinja2), htmx fragments polled for live progress,
and the JSON the charts draw. Every read and write goes through ``service.domain`` like the API, with the
tenant of the signed-in key; forms are POSTed with the session's CSRF token and answered by a redirect.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from service.csvsafe import write_csv
from service.deps import SessionDep
from service.domain import batches as batches_domain
from service.domain import dashboard
from service.domain import quality as quality_domain
from service.domain.labels import LabelWrite, put_labels
from service.domain.pools import get_pool
from service.errors import NotFound, ServiceError
from service.queue import JobQueue
from service.web import session as web_session
from service.web.session import WebUser

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
router = APIRouter(prefix="/ui", include_in_schema=False)


def _user(request: Request, session: SessionDep) -> WebUser:
    """The signed-in user, authorised for this route like an API request (scope, rate limits)."""
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


def _page(request: Request, name: str, user: WebUser | None, status_code: int = 200, **context: Any) -> HTMLResponse:
    # security headers (CSP, nosniff, framing, referrer) come from service.headers, on every response
    return TEMPLATES.TemplateResponse(
        request, name, {"user": user, "csrf": None if user is None else user.csrf, **context}, status_code=status_code
    )


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
    return _login_form(request, next=_safe_next(next), err=err)


def _login_form(request: Request, status_code: int = 200, next: str = "/ui", err: str | None = None) -> HTMLResponse:
    """The sign-in page with a pre-session token, bound to the browser by the ``bait_login`` cookie."""
    token = web_session.login_token(request)
    response = _page(request, "login.html", None, status_code=status_code, next=next, err=err, login_csrf=token)
    web_session.set_login_cookie(response, request, token)
    return response


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    api_key: Annotated[str, Form(max_length=200)],
    next: Annotated[str, Form()] = "/ui",
    login_csrf: Annotated[str, Form(max_length=100)] = "",
) -> Response:
    origin = request.headers.get("origin")
    cross_site = bool(origin) and (origin == "null" or urlsplit(origin).netloc != request.url.netloc)
    if cross_site or not web_session.login_token_ok(request, login_csrf):
        # Login CSRF: another site's form (any Origin, "null" or none) cannot carry the bait_login cookie.
        return _login_form(request, 403, err="sign-in form expired or sent from another site: sign in again here")
    token = web_session.sign_in(session, api_key, request.headers.get("user-agent"))
    if token is None:
        return _login_form(request, 401, next=_safe_next(next), err="invalid or revoked API key")
    response = RedirectResponse(_safe_next(next), status_code=303)
    web_session.set_cookie(response, request, token, request.app.state.settings)
    response.delete_cookie(web_session.LOGIN_COOKIE, path="/ui/login")
    return response


@router.post("/logout")
def logout(request: Request, session: SessionDep, user: UserDep, csrf: Annotated[str, Form()] = "") -> Response:
    _check_post(request, user, csrf)
    web_session.end_session(session, user.session_id, "logout")
    response = RedirectResponse("/ui/login", status_code=303)
    web_session.clear_cookie(response)
    return response


@router.get("/sessions", response_class=HTMLResponse)
def sessions_page(
    request: Request, session: SessionDep, user: UserDep, msg: str | None = None, err: str | None = None
) -> HTMLResponse:
    """An admin's view of the signed-in sessions of the tenant's keys, each of which it can end."""
    settings = request.app.state.settings
    now = web_session._now()
    rows = [
        {
            "id": s.id,
            "key_prefix": k.prefix,
            "key_name": k.name,
            "user_agent": s.user_agent,
            "created_at": s.created_at,
            "last_seen_at": s.last_seen_at,
            "state": s.ended_reason or web_session.end_reason(s, settings, now) or "active",
            "yours": s.id == user.session_id,
        }
        for s, k in web_session.key_sessions(session, user.tenant.id)
    ]
    return _page(request, "sessions.html", user, sessions=rows, msg=msg, err=err)


@router.post("/sessions/{session_id}/end")
def end_session(
    request: Request, session_id: str, session: SessionDep, user: UserDep, csrf: Annotated[str, Form()] = ""
) -> Response:
    _check_post(request, user, csrf)
    ids = {s.id for s, _ in web_session.key_sessions(session, user.tenant.id)}
    if session_id not in ids:  # another tenant's session, or none: the same answer
        raise NotFound(f"session {session_id!r} not found")
    ended = web_session.end_session(session, session_id, "admin")
    return _back("/ui/sessions", message="session ended" if ended else "that session had already ended")


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
    fields = ["position", "item_id", "status", "label", "predicted", "confidence", "text", "uri"]
    return Response(write_csv(rows, fields), media_type="text/csv", headers=headers)


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
    req = batches_domain.BatchRequest(size=size, strategy=strategy, params={})
    try:
        batch, _ = batches_domain.create_batch(
            session, _queue(request), user.tenant.id, pool, req, request.app.state.settings
        )
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
