"""Pools: create, read, list, delete. A pool of another tenant does not exist for the caller (404)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.domain.encoders import check_pool_encoder
from service.errors import Conflict, NotFound
from service.store import embedding as embedding_repo
from service.store import items as items_repo
from service.store import pools as pools_repo
from service.store import quality as store_quality
from service.store.models import Pool

_NO_VALIDATION = {"validation": 0, "validation_labeled": 0}


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
    encoder: dict[str, Any] | None = None,
    validation: dict[str, Any] | None = None,
) -> PoolView:
    """Create a pool; its name is unique per tenant (Conflict otherwise).

    ``n_outputs`` is stored for both tasks: ``len(classes)`` for classification, ``m`` for regression.
    """
    if pools_repo.get_pool_by_name(session, tenant_id, name) is not None:
        raise Conflict(f"a pool named {name!r} already exists", {"name": name})
    check_pool_encoder(session, tenant_id, encoder, embedding_dim)
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
        encoder=encoder,
        validation=validation,
        created_at=now,
        updated_at=now,
    )
    try:
        with session.begin_nested():  # a concurrent create of the same name loses cleanly
            pools_repo.add_pool(session, pool)
    except IntegrityError as exc:
        raise Conflict(f"a pool named {name!r} already exists", {"name": name}) from exc
    return PoolView(pool, {"items": 0, "unlabeled": 0, "reserved": 0, "labeled": 0, **_NO_VALIDATION})


def _counts(session: Session, pool_ids: list[str]) -> dict[str, dict[str, int]]:
    """Counts by effective status, and by embedding status (``embedding_ready|pending|error``)."""
    counts = items_repo.count_by_status(session, pool_ids, datetime.now(UTC))
    for pid, by_embedding in embedding_repo.count_embedding_status(session, pool_ids).items():
        counts[pid].update({f"embedding_{k}": v for k, v in by_embedding.items()})  # split off by the api
    for pid, by_split in store_quality.count_validation(session, pool_ids).items():
        counts[pid].update(by_split)
    return counts


def view_pool(session: Session, tenant_id: str, pool_id: str) -> PoolView:
    pool = get_pool(session, tenant_id, pool_id)
    return PoolView(pool, _counts(session, [pool.id])[pool.id])


def list_pools(session: Session, tenant_id: str) -> list[PoolView]:
    pools = pools_repo.list_pools(session, tenant_id)
    counts = _counts(session, [p.id for p in pools])
    return [PoolView(p, counts[p.id]) for p in pools]


def delete_pool(session: Session, tenant_id: str, pool_id: str) -> str:
    """Delete the pool with its items, labels, batches and checkpoints; returns its id."""
    pool = get_pool(session, tenant_id, pool_id)
    deleted = pool.id
    pools_repo.delete_pool(session, deleted)
    return deleted
