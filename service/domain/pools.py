"""Pools: create, read, list, delete. A pool of another tenant does not exist for the caller (404)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.errors import Conflict, NotFound
from service.store import items as items_repo
from service.store import pools as pools_repo
from service.store.models import Pool


@dataclass(frozen=True)
class PoolView:
    pool: Pool
    counts: dict[str, int]  # items, unlabeled, reserved, labeled (effective status)


def get_pool(session: Session, tenant_id: str, pool_id: str) -> Pool:
    """The caller's pool, or NotFound (also when it exists but belongs to another tenant)."""
    pool = pools_repo.get_pool(session, tenant_id, pool_id)
    if pool is None:
        raise NotFound(f"pool {pool_id!r} not found")
    return pool


def create_pool(
    session: Session,
    tenant_id: str,
    *,
    name: str,
    task: str,
    classes: list[str] | None,
    n_outputs: int | None,
    embedding_dim: int,
    head: dict[str, Any],
) -> PoolView:
    """Create a pool; its name is unique per tenant (Conflict otherwise).

    ``n_outputs`` is stored for both tasks: ``len(classes)`` for classification, ``m`` for regression.
    """
    if pools_repo.get_pool_by_name(session, tenant_id, name) is not None:
        raise Conflict(f"a pool named {name!r} already exists", {"name": name})
    k = len(classes) if task == "classification" and classes is not None else int(n_outputs or 0)
    now = datetime.now(UTC)
    pool = Pool(
        tenant_id=tenant_id,
        name=name,
        task=task,
        classes=classes if task == "classification" else None,
        n_outputs=k,
        embedding_dim=embedding_dim,
        head=head,
        encoder=None,
        created_at=now,
        updated_at=now,
    )
    try:
        with session.begin_nested():  # a concurrent create of the same name loses cleanly
            pools_repo.add_pool(session, pool)
    except IntegrityError as exc:
        raise Conflict(f"a pool named {name!r} already exists", {"name": name}) from exc
    return PoolView(pool, {"items": 0, "unlabeled": 0, "reserved": 0, "labeled": 0})


def view_pool(session: Session, tenant_id: str, pool_id: str) -> PoolView:
    pool = get_pool(session, tenant_id, pool_id)
    counts = items_repo.count_by_status(session, [pool.id], datetime.now(UTC))[pool.id]
    return PoolView(pool, counts)


def list_pools(session: Session, tenant_id: str) -> list[PoolView]:
    pools = pools_repo.list_pools(session, tenant_id)
    counts = items_repo.count_by_status(session, [p.id for p in pools], datetime.now(UTC))
    return [PoolView(p, counts[p.id]) for p in pools]


def delete_pool(session: Session, tenant_id: str, pool_id: str) -> None:
    """Delete the pool with its items, labels, batches and checkpoints."""
    pool = get_pool(session, tenant_id, pool_id)
    pools_repo.delete_pool(session, pool.id)
