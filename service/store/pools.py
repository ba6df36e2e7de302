"""Pool repository: every lookup is scoped by tenant, so another tenant's pool is simply not found."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.store.models import Pool


def get_pool(session: Session, tenant_id: str, pool_id: str) -> Pool | None:
    """The pool ``pool_id`` if it belongs to ``tenant_id``, else None."""
    return session.execute(select(Pool).where(Pool.id == pool_id, Pool.tenant_id == tenant_id)).scalar_one_or_none()


def lock_pool(session: Session, pool_id: str) -> Pool | None:
    """The pool (any tenant's: for jobs), its row locked for the rest of the transaction (PostgreSQL;
    SQLite has one writer at a time anyway)."""
    pool = session.get(Pool, pool_id)
    if pool is not None:
        session.execute(select(Pool.id).where(Pool.id == pool_id).with_for_update())
    return pool


def get_pool_by_name(session: Session, tenant_id: str, name: str) -> Pool | None:
    return session.execute(select(Pool).where(Pool.tenant_id == tenant_id, Pool.name == name)).scalar_one_or_none()


def list_pools(session: Session, tenant_id: str) -> Sequence[Pool]:
    stmt = select(Pool).where(Pool.tenant_id == tenant_id).order_by(Pool.created_at, Pool.id)
    return session.execute(stmt).scalars().all()


def add_pool(session: Session, pool: Pool) -> Pool:
    session.add(pool)
    session.flush()
    return pool


def delete_pool(session: Session, pool_id: str) -> None:
    """Delete a pool; items, labels, batches and checkpoints go with it (ON DELETE CASCADE)."""
    session.execute(delete(Pool).where(Pool.id == pool_id))
