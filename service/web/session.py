"""Dashboard sessions: an API key, given once at sign-in, is exchanged for a signed session cookie.

The cookie holds the key's row id (never the key), the tenant, a CSRF token and the issue time, as
base64 JSON followed by an HMAC-SHA256 signature with a key derived from the service secret
(:func:`service.crypto.derived_key`). It is ``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no
other site's page sends it) and ``Secure`` when the request came over HTTPS. Every request re-checks
that the key still exists and is not revoked, so revoking a key ends its sessions. Forms carry the
session's CSRF token, checked on every POST.
"""

from __future__ import annotations

import base64
import hmac
import json
import secrets
import time
from dataclasses import dataclass
from hashlib import sha256
from typing import Any

from fastapi import Request, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.crypto import derived_key
from service.scopes import parse_scopes
from service.security import hash_key
from service.store.models import ApiKey, Tenant

COOKIE = "bait_session"
MAX_AGE_S = 12 * 3600
_PURPOSE = "dashboard-session-v1"


@dataclass(frozen=True)
class WebUser:
    key_id: str
    key_prefix: str
    tenant: Tenant
    csrf: str
    scopes: tuple[str, ...] = ()  # the key's scopes: the dashboard allows what the API would allow this key

    def can(self, scope: str) -> bool:
        return scope in self.scopes


class LoginRequired(Exception):
    """No valid session: the dashboard answers with a redirect to the sign-in page."""


def _sign(settings: Settings, body: bytes) -> str:
    digest = hmac.new(derived_key(settings, _PURPOSE), body, sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def encode(settings: Settings, payload: dict[str, Any]) -> str:
    # unpadded URL-safe base64: the cookie value needs no quoting
    body = base64.urlsafe_b64encode(json.dumps(payload, separators=(",", ":")).encode()).rstrip(b"=")
    return body.decode() + "." + _sign(settings, body)


def decode(settings: Settings, value: str, now: float | None = None) -> dict[str, Any] | None:
    """The payload of a cookie this service signed and that has not expired, else ``None``."""
    body, _, signature = value.partition(".")
    if not body or not signature or not hmac.compare_digest(_sign(settings, body.encode()), signature):
        return None
    try:
        payload: dict[str, Any] = json.loads(base64.urlsafe_b64decode(body.encode() + b"=" * (-len(body) % 4)))
    except (ValueError, TypeError):
        return None
    if not isinstance(payload, dict) or (now or time.time()) - float(payload.get("iat", 0)) > MAX_AGE_S:
        return None
    return payload


def sign_in(session: Session, settings: Settings, key: str) -> str | None:
    """The cookie value for a valid API key, or ``None``."""
    row = session.execute(
        select(ApiKey).where(ApiKey.key_hash == hash_key(key.strip()), ApiKey.revoked_at.is_(None))
    ).scalar_one_or_none()
    if row is None:
        return None
    return encode(settings, {"k": row.id, "t": row.tenant_id, "c": secrets.token_urlsafe(24), "iat": int(time.time())})


def current_user(request: Request, session: Session) -> WebUser:
    """The signed-in user of this request, or :class:`LoginRequired`."""
    settings: Settings = request.app.state.settings
    raw = request.cookies.get(COOKIE)
    payload = decode(settings, raw) if raw else None
    if payload is None:
        raise LoginRequired()
    found = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where(ApiKey.id == payload.get("k"), ApiKey.revoked_at.is_(None), Tenant.id == payload.get("t"))
    ).first()
    if found is None:
        raise LoginRequired()
    key, tenant = found
    return WebUser(
        key_id=key.id,
        key_prefix=key.prefix,
        tenant=tenant,
        csrf=str(payload.get("c", "")),
        scopes=parse_scopes(key.scopes),
    )


def set_cookie(response: Response, request: Request, value: str) -> None:
    response.set_cookie(
        COOKIE,
        value,
        max_age=MAX_AGE_S,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )


def clear_cookie(response: Response) -> None:
    response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")


def csrf_ok(user: WebUser, token: str | None) -> bool:
    return bool(token) and hmac.compare_digest(user.csrf, token or "")
