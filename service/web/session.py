"""Dashboard sessions, held server-side: an API key, given once at sign-in, opens a row of
``web_sessions``, and the browser keeps only a random token that names it.

- The cookie (``bait_session``) holds 32 random bytes; the database stores their SHA-256, never the
  token. It is ``HttpOnly``, ``SameSite=Strict``, limited to ``/ui`` and ``Secure`` over HTTPS.
- A session ends when its user signs out, when an admin of the tenant ends it (``/ui/sessions``), when
  its key is revoked, after ``BAIT_SESSION_IDLE_SECONDS`` without a request, and
  ``BAIT_SESSION_MAX_SECONDS`` after sign-in. An ended session never opens a page again, whatever copy
  of the cookie a browser kept.
- Every request re-reads the key: the dashboard has the key's scopes and counts against its rate limits
  (:func:`service.deps.authorize`, the same check as the API).
- Forms carry the session's CSRF token (checked on every POST). The sign-in form, which has no session
  yet, carries a pre-session token bound to a cookie of its own (``bait_login``, double submit): a page
  of another site can neither read it nor make the browser send it (``SameSite=Strict``), so it cannot
  sign a browser in as the attacker's key, with or without an ``Origin`` header.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from hashlib import sha256

from fastapi import Request, Response
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.config import Settings
from service.deps import authorize
from service.scopes import parse_scopes
from service.security import hash_key
from service.store.models import ApiKey, Tenant, WebSession

COOKIE = "bait_session"
LOGIN_COOKIE = "bait_login"
LOGIN_TOKEN_TTL_S = 3600
# last_seen_at is written at most this often (not on every request); the idle timeout is counted from it
TOUCH_EVERY = timedelta(seconds=60)


@dataclass(frozen=True)
class WebUser:
    key_id: str
    key_prefix: str
    tenant: Tenant
    csrf: str
    session_id: str
    scopes: tuple[str, ...] = ()  # the key's scopes: the dashboard allows what the API would allow this key

    def can(self, scope: str) -> bool:
        return scope in self.scopes


class LoginRequired(Exception):
    """No valid session: the dashboard answers with a redirect to the sign-in page."""


def _now() -> datetime:
    return datetime.now(UTC)


def _token_hash(token: str) -> str:
    return sha256(token.encode()).hexdigest()


def sign_in(session: Session, key: str, user_agent: str | None = None) -> str | None:
    """Open a session for a valid API key; returns the cookie's token, or ``None`` for a bad key."""
    row = session.execute(
        select(ApiKey).where(ApiKey.key_hash == hash_key(key.strip()), ApiKey.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is None:
        return None
    token = secrets.token_urlsafe(32)
    now = _now()
    session.add(
        WebSession(
            token_hash=_token_hash(token),
            key_id=row.id,
            csrf=secrets.token_urlsafe(24),
            user_agent=(user_agent or "")[:200] or None,
            created_at=now,
            last_seen_at=now,
        )
    )
    session.flush()
    return token


def end_reason(row: WebSession, settings: Settings, now: datetime) -> str | None:
    """Why a session that has not been ended is over anyway (``idle``/``expired``), else ``None``."""
    if now - row.created_at > timedelta(seconds=settings.session_max_seconds):
        return "expired"
    if now - row.last_seen_at > timedelta(seconds=settings.session_idle_seconds):
        return "idle"
    return None


def current_user(request: Request, session: Session) -> WebUser:
    """The signed-in user of this request, authorised for the matched route (scope and rate limits).

    Raises:
        LoginRequired: no cookie, or one naming no live session (ended, timed out, key revoked).
        InsufficientScope: the key lacks the route's scope (403, as the API).
        RateLimited: the key spent its rate (429, as the API).
    """
    settings: Settings = request.app.state.settings
    token = request.cookies.get(COOKIE)
    if not token or len(token) > 128:
        raise LoginRequired()
    found = session.execute(
        select(WebSession, ApiKey, Tenant)
        .join(ApiKey, ApiKey.id == WebSession.key_id)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(WebSession.token_hash == _token_hash(token), WebSession.ended_at.is_(None), ApiKey.revoked_at.is_(None))
    ).first()
    if found is None:
        raise LoginRequired()
    row, key, tenant = found
    now = _now()
    if end_reason(row, settings, now) is not None:
        raise LoginRequired()
    authorize(request, key)
    if now - row.last_seen_at > TOUCH_EVERY:
        row.last_seen_at = now
    return WebUser(
        key_id=key.id,
        key_prefix=key.prefix,
        tenant=tenant,
        csrf=row.csrf,
        session_id=row.id,
        scopes=parse_scopes(key.scopes),
    )


def end_session(session: Session, session_id: str, reason: str) -> bool:
    """End one session (``logout``, ``admin``); False when it was already over."""
    result = session.execute(
        update(WebSession)
        .where(WebSession.id == session_id, WebSession.ended_at.is_(None))
        .values(ended_at=_now(), ended_reason=reason)
    )
    return bool(getattr(result, "rowcount", 0))


def set_cookie(response: Response, request: Request, token: str, settings: Settings) -> None:
    response.set_cookie(
        COOKIE,
        token,
        max_age=settings.session_max_seconds,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")


def csrf_ok(user: WebUser, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(user.csrf, token or "")


# ------------------------------------------------------------------------------- sign-in form token


def login_token(request: Request) -> str:
    """The pre-session token for the sign-in form: the browser's ``bait_login`` cookie, or a new one."""
    current = request.cookies.get(LOGIN_COOKIE)
    if current and 20 <= len(current) <= 64:
        return current
    return secrets.token_urlsafe(24)


def set_login_cookie(response: Response, request: Request, token: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        max_age=LOGIN_TOKEN_TTL_S,
        path="/ui/login",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def login_token_ok(request: Request, submitted: str | None) -> bool:
    """The form's token equals the browser's ``bait_login`` cookie (which another site cannot make it send)."""
    cookie = request.cookies.get(LOGIN_COOKIE)
    return bool(cookie) and bool(submitted) and hmac.compare_digest(cookie or "", submitted or "")


def key_sessions(session: Session, tenant_id: str) -> list[tuple[WebSession, ApiKey]]:
    """The sessions of the tenant's keys, newest first (ended ones of the last day included)."""
    since = _now() - timedelta(days=1)
    rows = session.execute(
        select(WebSession, ApiKey)
        .join(ApiKey, ApiKey.id == WebSession.key_id)
        .where(ApiKey.tenant_id == tenant_id)
        .where((WebSession.ended_at.is_(None)) | (WebSession.ended_at > since))
        .order_by(WebSession.created_at.desc())
        .limit(500)
    ).all()
    return [(r[0], r[1]) for r in rows]
