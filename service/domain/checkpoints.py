"""Checkpoints (read-only here: the batch job writes them) and predictions from the latest one."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy.orm import Session

from service import catalog
from service.config import Settings
from service.domain.pools import get_pool
from service.errors import BadRequest, Conflict, PayloadTooLarge, ServiceUnavailable
from service.queue import JobFailed, JobQueue, JobTimeout
from service.store import batches as store
from service.store.models import new_id


def list_checkpoints(session: Session, tenant_id: str, pool_id: str, *, limit: int) -> list[dict[str, Any]]:
    pool = get_pool(session, tenant_id, pool_id)
    return [
        {
            "id": r.id,
            "round": r.round,
            "n_labels": r.n_labels,
            "metrics": r.metrics or {},
            "head": r.config or {},
            "batch_id": r.batch_id,
            "created_at": r.created_at,
        }
        for r in store.list_checkpoints(session, pool.id, limit=limit, before_round=None)
    ]


def check_predictions(session: Session, settings: Settings, tenant_id: str, pool_id: str, item_ids: list[str]) -> str:
    """Validate a predictions request before any job runs; returns the pool's id."""
    pool = get_pool(session, tenant_id, pool_id)
    if len(item_ids) > settings.max_items_per_request:
        raise PayloadTooLarge(f"{len(item_ids)} item ids in one request; the limit is {settings.max_items_per_request}")
    dupes = sorted(i for i, n in Counter(item_ids).items() if n > 1)  # linear, not count() per id
    if dupes:
        raise BadRequest(f"item ids repeated in the request: {dupes[:10]}", details={"duplicates": dupes[:100]})
    found = store.existing_external_ids(session, pool.id, item_ids)
    missing = [i for i in item_ids if i not in found]
    if missing:
        raise BadRequest(
            f"{len(missing)} item id(s) not in pool {pool_id!r}: {missing[:10]}", details={"missing": missing[:100]}
        )
    if store.latest_checkpoint_id(session, pool.id) is None:
        raise Conflict(
            "the pool has no trained model yet: request a batch first (each batch of a model-based strategy trains "
            "one, except a cold start: see cold_start in GET /v1/strategies)"
        )
    return pool.id


def run_predictions(queue: JobQueue, settings: Settings, pool_id: str, item_ids: list[str]) -> dict[str, Any]:
    """Run the prediction job and wait for it."""
    try:
        result: dict[str, Any] = queue.call(
            catalog.PREDICT,
            f"predict-{new_id()}",
            timeout=settings.sync_select_wait_seconds,
            pool_id=pool_id,
            item_ids=item_ids,
        )
    except JobTimeout as exc:
        raise ServiceUnavailable(
            f"predictions did not finish in {settings.sync_select_wait_seconds:g} s: {exc}"
        ) from exc
    except JobFailed as exc:
        raise BadRequest(f"predictions failed: {exc}") from exc
    return result
