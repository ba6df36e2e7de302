"""Batches: validate and create (the job is submitted once the request commits), read, list, cancel.

A batch request is validated completely in the web process, before anything is written: size within
what is available now, a strategy the pool's task supports, known parameters of the right types. The
selection itself runs in a worker (``worker.batch_job.run_batch``), which reserves the chosen items.

Reproducibility: every batch has a seed in its ``params`` (the request's, or one drawn here and stored
when the request gives none); the worker trains the head and runs the strategy with it and records the
seeds it used in the batch's diagnostics. The same pool state, parameters and seed give the same picks.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service import catalog
from service.domain import pool_size, strategies
from service.domain.pools import get_pool
from service.errors import BadRequest, Conflict, NotFound
from service.queue import JobQueue, enqueue_on_commit
from service.store import batches as store
from service.store.attempts import close_running
from service.store.models import Batch, Pool

CANCELLABLE = ("queued", "running", "succeeded")


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BatchRequest:
    size: Any
    strategy: Any
    params: Any


def validate_request(
    session: Session, pool: Pool, req: BatchRequest, now: datetime, settings: Any
) -> tuple[int, str, dict[str, Any]]:
    """``(size, strategy, params)`` of a valid request; BadRequest with a clear message otherwise (also a pool too
    large for the one process its strategy would run in: :mod:`service.domain.pool_size`)."""
    spec, params = strategies.check_request(req.strategy, pool.task, req.params, pool.embedding_dim, batch=True)
    size = req.size
    if isinstance(size, bool) or not isinstance(size, int):
        raise BadRequest(f"size must be an integer, got {size!r}")
    if size <= 0:
        raise BadRequest(f"size must be at least 1, got {size}")
    available = store.count_available(session, pool.id, now)
    if size > available:
        raise BadRequest(
            f"size {size} is more than the {available} item(s) available (unlabeled and not reserved) in the pool",
            details={"available": available},
        )
    reads_embeddings = bool(spec.inputs) or strategies.excludes_outliers(spec.name, params)
    n_items = store.count_items(session, pool.id)
    pool_size.check_batch(
        settings, n_items, int(pool.embedding_dim), spec.name, params, reads_embeddings=reads_embeddings
    )
    return size, spec.name, params


def create_batch(
    session: Session,
    queue: JobQueue,
    tenant_id: str,
    pool_id: str,
    req: BatchRequest,
    settings: Any,
    idempotency_key: str | None = None,
) -> tuple[Batch, bool]:
    """Create a batch and submit its job on commit; returns ``(batch, created)``.

    With an ``idempotency_key`` a repeated request returns the batch of the first one (``created`` is
    False); the same key with a different request is a Conflict.
    """
    pool = get_pool(session, tenant_id, pool_id)
    if idempotency_key is not None:
        if not idempotency_key or len(idempotency_key) > 200:
            raise BadRequest("Idempotency-Key must be 1 to 200 characters")
        existing = store.find_batch_by_key(session, pool.id, idempotency_key)
        if existing is not None:
            return _same_request(existing, req), False
    now = utcnow()
    batch = _queued_batch(session, pool, req, now, settings, idempotency_key)
    try:
        with session.begin_nested():  # a concurrent request with the same key loses cleanly
            session.add(batch)
            session.flush()
    except IntegrityError:
        if idempotency_key is None:
            raise
        existing = store.find_batch_by_key(session, pool.id, idempotency_key)
        if existing is None:
            raise
        return _same_request(existing, req), False
    enqueue_on_commit(session, queue, catalog.RUN_BATCH, batch.id, batch_id=batch.id)
    return batch, True


def _queued_batch(
    session: Session, pool: Pool, req: BatchRequest, now: datetime, settings: Any, idempotency_key: str | None = None
) -> Batch:
    """The ``queued`` row of a validated request, with its seed (the request's, or one drawn now and stored,
    so every batch, API or auto-batch, can be reproduced)."""
    size, strategy, params = validate_request(session, pool, req, now, settings)
    if params.get("seed") is None:
        params["seed"] = draw_seed()
    return Batch(
        pool_id=pool.id,
        size=size,
        strategy=strategy,
        params=params,
        status="queued",
        progress_stage="queued",
        progress_done=0,
        progress_total=0,
        idempotency_key=idempotency_key,
        attempts=0,
        created_at=now,
    )


def draw_seed() -> int:
    """A seed for a request that gives none (a non-negative 31-bit integer, as every strategy accepts)."""
    return secrets.randbelow(2**31)


def new_batch_row(session: Session, pool: Pool, req: BatchRequest, now: datetime, settings: Any) -> Batch:
    """A validated ``queued`` batch row that the caller runs itself (the Label Studio auto-batch job)."""
    batch = _queued_batch(session, pool, req, now, settings)
    session.add(batch)
    session.flush()
    return batch


def request_delivery(session: Session, queue: JobQueue, tenant_id: str, pool_id: str, batch_id: str) -> Batch:
    """Queue a new push of a succeeded batch to Label Studio (Conflict unless succeeded)."""
    batch = get_batch(session, tenant_id, pool_id, batch_id)
    if batch.status != "succeeded":
        raise Conflict(f"batch {batch_id!r} is {batch.status}; only a succeeded batch is delivered")
    enqueue_on_commit(session, queue, catalog.REDELIVER, f"ls-deliver-{batch.id}", batch_id=batch.id)
    return batch


def delivery_state(batch: Batch) -> str | None:
    """Label Studio delivery of a batch: ``pending`` (being pushed), ``delivered``, ``failed`` (retry with
    ``POST .../batches/{id}/delivery``), or None when its pool has no integration."""
    info = (batch.diagnostics or {}).get("labelstudio")
    if batch.status == "running" and batch.progress_stage == "push":
        return "pending"
    if not isinstance(info, dict) or not info:
        return None
    return "failed" if any((v or {}).get("status") != "ok" for v in info.values()) else "delivered"


def _same_request(batch: Batch, req: BatchRequest) -> Batch:
    stored = dict(batch.params or {})
    if (req.params or {}).get("seed") is None:
        stored.pop("seed", None)  # the seed the service drew for a request that gave none
    if (batch.size, batch.strategy, stored) != (req.size, req.strategy, req.params or {}):
        raise Conflict(
            "this Idempotency-Key was used for a different batch request",
            details={"batch_id": batch.id},
        )
    return batch


def get_batch(session: Session, tenant_id: str, pool_id: str, batch_id: str) -> Batch:
    pool = get_pool(session, tenant_id, pool_id)
    batch = store.get_batch(session, pool.id, batch_id)
    if batch is None:
        raise NotFound(f"batch {batch_id!r} not found in pool {pool_id!r}")
    return batch


def list_batches(
    session: Session, tenant_id: str, pool_id: str, *, status: str | None, limit: int, before: datetime | None
) -> list[Batch]:
    pool = get_pool(session, tenant_id, pool_id)
    return list(store.list_batches(session, pool.id, status=status, limit=limit, before=before))


def cancel_batch(session: Session, tenant_id: str, pool_id: str, batch_id: str) -> Batch:
    """Cancel a queued or running batch (the job stops at its next check), or give a succeeded batch's
    items back; either way its reservations are released. Conflict for failed/cancelled batches."""
    pool = get_pool(session, tenant_id, pool_id)
    batch = store.get_batch(session, pool.id, batch_id, for_update=True)
    if batch is None:
        raise NotFound(f"batch {batch_id!r} not found in pool {pool_id!r}")
    now = utcnow()
    from_status = batch.status
    # Check and write in one statement: a job finishing at the same moment either sees "cancelled" and
    # writes nothing, or has committed first and its reservations are released below.
    if not store.cancel_if(session, batch.id, CANCELLABLE, now):
        session.refresh(batch)
        raise Conflict(
            f"batch {batch_id!r} is {batch.status} and cannot be cancelled", details={"status": batch.status}
        )
    session.refresh(batch)
    close_running(batch, "cancelled", "cancelled by the client", now)
    released = store.release_reservations(session, batch.id, now)
    diagnostics = dict(batch.diagnostics or {})
    diagnostics["cancelled"] = {"from_status": from_status, "released_items": released}
    batch.diagnostics = diagnostics
    return batch


def outlier_ids(batch: Batch) -> list[str] | None:
    """The batch's picks that the outlier rule flagged (``diagnostics.outliers.items``); None when the batch
    was not checked (not finished, a strategy that reads no embeddings, or a batch from before the check)."""
    info = (batch.diagnostics or {}).get("outliers")
    if not isinstance(info, dict) or not info.get("checked"):
        return None
    return [str(i.get("item_id")) for i in info.get("items") or [] if isinstance(i, dict)]


def batch_view(batch: Batch) -> dict[str, Any]:
    """The batch as the API shows it."""
    return {
        "id": batch.id,
        "status": batch.status,
        "size": batch.size,
        "strategy": batch.strategy,
        "params": batch.params or {},
        "progress": {
            "stage": batch.progress_stage,
            "done": batch.progress_done,
            "total": batch.progress_total,
        },
        "item_ids": batch.item_ids,
        "outliers": outlier_ids(batch),
        "objective": batch.objective,
        "diagnostics": batch.diagnostics or {},
        "checkpoint_id": batch.checkpoint_id,
        "error": batch.error,
        "delivery": delivery_state(batch),
        "attempts": batch.attempts,
        "attempt_history": batch.attempt_history or [],
        "created_at": batch.created_at,
        "started_at": batch.started_at,
        "finished_at": batch.finished_at,
    }
