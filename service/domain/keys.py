"""Tenants and API keys (used by `bait keys ...` and the embedded bootstrap)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from service.errors import NotFound
from service.scopes import ALL_SCOPES, format_scopes
from service.security import generate_key, hash_key, key_prefix
from service.store.models import ApiKey, Tenant, WebSession


@dataclass(frozen=True)
class KeyInfo:
    id: str
    tenant: str
    prefix: str
    name: str | None
    created_at: datetime
    revoked_at: datetime | None
    scopes: tuple[str, ...] = ALL_SCOPES


def get_or_create_tenant(session: Session, name: str) -> Tenant:
    tenant = session.execute(select(Tenant).where(Tenant.name == name)).scalar_one_or_none()
    if tenant is None:
        tenant = Tenant(name=name)
        session.add(tenant)
        session.flush()
    return tenant


def create_key(
    session: Session, tenant_name: str, name: str | None = None, scopes: Iterable[str] = ALL_SCOPES
) -> tuple[str, KeyInfo]:
    """Mint a key for ``tenant_name`` (created if new). Returns the plaintext key (shown once) and its info.

    Args:
        scopes: what the key may do (:mod:`service.scopes`); all of them unless narrowed. The CLI's
            default is narrower (no ``admin``).

    Raises:
        ValueError: an empty tenant name, an unknown scope or no scope.
    """
    if not tenant_name.strip():
        raise ValueError("tenant name must not be empty")
    stored = format_scopes(scopes)
    tenant = get_or_create_tenant(session, tenant_name.strip())
    key = generate_key()
    row = ApiKey(tenant_id=tenant.id, prefix=key_prefix(key), key_hash=hash_key(key), name=name, scopes=stored)
    session.add(row)
    session.flush()
    return key, _info(row, tenant.name)


def list_keys(session: Session, tenant_name: str | None = None) -> list[KeyInfo]:
    q = select(ApiKey, Tenant.name).join(Tenant, Tenant.id == ApiKey.tenant_id).order_by(ApiKey.created_at)
    if tenant_name is not None:
        q = q.where(Tenant.name == tenant_name)
    return [_info(k, t) for k, t in session.execute(q).all()]


def revoke_key(session: Session, key_id_or_prefix: str) -> KeyInfo:
    rows = session.execute(
        select(ApiKey, Tenant.name)
        .join(Tenant, Tenant.id == ApiKey.tenant_id)
        .where((ApiKey.id == key_id_or_prefix) | (ApiKey.prefix == key_id_or_prefix))
    ).all()
    if len(rows) != 1:
        raise NotFound(f"no single key with id or prefix {key_id_or_prefix!r} ({len(rows)} match)")
    key, tenant = rows[0]
    now = datetime.now(UTC)
    if key.revoked_at is None:
        key.revoked_at = now
    # its dashboard sessions end with it (they would be refused anyway: every request re-reads the key)
    session.execute(
        update(WebSession)
        .where(WebSession.key_id == key.id, WebSession.ended_at.is_(None))
        .values(ended_at=now, ended_reason="revoked")
    )
    session.flush()
    return _info(key, tenant)


def count_active_keys(session: Session) -> int:
    return int(
        session.execute(select(func.count()).select_from(ApiKey).where(ApiKey.revoked_at.is_(None))).scalar_one()
    )


def _info(row: ApiKey, tenant: str) -> KeyInfo:
    return KeyInfo(row.id, tenant, row.prefix, row.name, row.created_at, row.revoked_at, tuple(row.scopes.split()))
