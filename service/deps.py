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
from service.errors import Unauthorized
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


def tenant_for_key(session: Session, key: str) -> Tenant | None:
    row = session.execute(
        select(Tenant)
        .join(ApiKey, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == hash_key(key), ApiKey.revoked_at.is_(None))
    ).scalar_one_or_none()
    return row


def get_tenant(
    session: SessionDep,
    creds: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Tenant:
    if creds is None or creds.scheme.lower() != "bearer" or not creds.credentials:
        raise Unauthorized("missing API key: send `Authorization: Bearer <key>` (create one with `bait keys create`)")
    tenant = tenant_for_key(session, creds.credentials)
    if tenant is None:
        raise Unauthorized("invalid or revoked API key")
    return tenant


TenantDep = Annotated[Tenant, Depends(get_tenant)]


def now() -> datetime:
    return datetime.now(UTC)
