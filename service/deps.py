"""FastAPI dependencies: settings, the per-request session (the one commit point), the tenant."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Iterator
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import Depends, Request, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import select
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import TRANSACTION_ATTEMPTS, is_retryable, retry_delay, session_scope
from service.errors import InsufficientScope, Unauthorized
from service.scopes import EXPENSIVE_ROUTES, SIGNED_IN, endpoint_name, required_scope
from service.security import hash_key
from service.store.models import ApiKey, Tenant

log = logging.getLogger(__name__)
bearer = HTTPBearer(auto_error=False, description="API key: `Authorization: Bearer <key>`")


def get_settings_dep(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session(request: Request) -> Iterator[Session]:
    """One transaction per request: committed if the handler returns, rolled back if it raises."""
    with session_scope(request.app.state.sessionmaker) as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session, scope="function")]


class RetryOnConflict(APIRoute):
    """A route whose request runs again, from its dependencies to the commit, when PostgreSQL rolled its
    transaction back for a deadlock or a serialization failure (at most ``TRANSACTION_ATTEMPTS`` runs,
    exponential backoff with full jitter). The session dependency commits inside the route handler
    (``scope="function"``), so a conflict at commit is retried too. Only for routes whose body is read
    whole (JSON): a streamed body cannot be read twice."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def retrying(request: Request) -> Response:
            for retry in range(TRANSACTION_ATTEMPTS - 1):
                try:
                    return await handler(request)
                except DBAPIError as exc:
                    if not is_retryable(exc):
                        raise
                    log.info("%s %s: %s, retrying", request.method, request.url.path, type(exc.orig).__name__)
                await asyncio.sleep(retry_delay(retry))
            return await handler(request)

        return retrying


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def key_and_tenant(session: Session, key: str) -> tuple[ApiKey, Tenant] | None:
    row = session.execute(
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    ).one_or_none()
    return None if row is None else (row[0], row[1])


def get_tenant(
    request: Request,
    session: SessionDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Tenant:
    """The key's tenant, once the key is known, holds the scope the matched route needs
    (:data:`service.scopes.ROUTE_SCOPES`) and is within its rate limits.

    Raises:
        Unauthorized: no key, or an unknown or revoked one (401).
        InsufficientScope: the key lacks the route's scope (403 ``insufficient_scope``).
        RateLimited: the key spent its rate (429 with ``Retry-After``).
    """
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Unauthorized("missing API key: send `Authorization: Bearer <key>` (create one with `bait keys create`)")
    found = key_and_tenant(session, creds.credentials)
    if found is None:
        raise Unauthorized("invalid or revoked API key")
    key, tenant = found
    authorize(request, key)
    return tenant


def authorize(request: Request, key: ApiKey) -> None:
    """The one authorisation check of the API and the dashboard: the key holds the scope the matched
    route needs (:func:`service.scopes.required_scope`) and is within its rate limits (general, and the
    expensive bucket for :data:`service.scopes.EXPENSIVE_ROUTES`).

    Raises:
        InsufficientScope: 403 ``insufficient_scope``.
        RateLimited: 429 with ``Retry-After``.
    """
    route = request.scope.get("route")
    endpoint = getattr(route, "endpoint", None)
    needed = required_scope(endpoint)
    held = tuple(key.scopes.split())
    if needed != SIGNED_IN and needed not in held:
        raise InsufficientScope(needed, held)
    limiter = getattr(request.app.state, "rate_limiter", None)
    if limiter is not None:
        limiter.check(key.id, expensive=endpoint is not None and endpoint_name(endpoint) in EXPENSIVE_ROUTES)


TenantDep = Annotated[Tenant, Depends(get_tenant)]


def now() -> datetime:
    return datetime.now(UTC)
