"""Validation split and model quality: move items between splits, hold out incoming labels, the
learning curve over a pool's checkpoints, and the 2-D map of a checkpoint.

Validation items (``split = "validation"``) are never selected, never reserved and never trained on:
the batch job leaves them out of the pool it loads, and scores every head it trains on the labeled
ones (metrics stored with the checkpoint). A pool may hold out a fraction of incoming labels at random
(``validation: {"fraction", "seed"}``): when an item that is not labeled yet receives its first label,
it goes to validation if ``sha256(f"{seed}:{item id}")``, read as a number in [0, 1), is below
``fraction`` — a reproducible draw per item, independent of the order labels arrive in.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.domain.items import check_ids
from service.domain.pools import get_pool
from service.errors import NotFound, UnknownItem, ValidationFailed
from service.store import items as items_repo
from service.store import quality as store
from service.store import stopping as stop_store
from service.store.models import Item, Pool

CLASSIFICATION_METRICS = ("accuracy", "macro_f1", "log_loss", "ece")
REGRESSION_METRICS = ("rmse", "mae", "r2")
_SHOWN = 10


def held_out(seed: int, fraction: float, external_id: str) -> bool:
    """Whether the pool's random hold-out sends ``external_id`` to validation (deterministic)."""
    digest = hashlib.sha256(f"{seed}:{external_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < fraction


def hold_out_incoming(session: Session, pool: Pool, found: dict[str, int]) -> int:
    """Before labels are written: move the items getting their first label to validation where the pool's
    hold-out draw says so. ``found`` maps external ids to internal ids. Returns how many moved."""
    config = pool.validation
    if not config:
        return 0
    fraction, seed = float(config["fraction"]), int(config.get("seed") or 0)
    chosen = [iid for ext, iid in found.items() if held_out(seed, fraction, ext)]
    if not chosen:
        return 0
    fresh: list[int] = []
    for begin in range(0, len(chosen), 5000):
        fresh += session.execute(
            select(Item.id).where(
                Item.id.in_(chosen[begin : begin + 5000]), Item.split == "train", Item.status != "labeled"
            )
        ).scalars()
    return store.set_split(session, pool.id, fresh, "validation", datetime.now(UTC)) if fresh else 0


def move_items(session: Session, pool: Pool, external_ids: Sequence[str], split: str) -> int:
    """Move items to ``split`` (``train`` | ``validation``); all must exist. Returns how many changed."""
    if split not in store.SPLITS:
        raise ValidationFailed(f"split must be one of {list(store.SPLITS)}", {"split": split})
    check_ids(list(external_ids), "item_id")
    found = items_repo.internal_ids(session, pool.id, external_ids)
    missing = [e for e in external_ids if e not in found]
    if missing:
        raise UnknownItem(
            f"{len(missing)} item id(s) not in pool {pool.name!r}, e.g. {missing[0]!r}", {"missing": missing[:_SHOWN]}
        )
    return store.set_split(session, pool.id, list(found.values()), split, datetime.now(UTC))


def splits(session: Session, internal_ids: Sequence[int]) -> dict[int, str]:
    return store.splits_of(session, internal_ids)


def _strategy_before(batches: Sequence[Any], created: datetime | None) -> tuple[str | None, str | None]:
    """``(id, strategy)`` of the last succeeded batch created before ``created``."""
    if created is None:
        return None, None
    best: tuple[str | None, str | None] = (None, None)
    for b in batches:
        if b.created_at >= created:
            break
        if b.status == "succeeded":
            best = (b.id, getattr(b, "strategy_used", None) or b.strategy)  # what ran (cold start: typiclust)
    return best


def curve(session: Session, tenant_id: str, pool_id: str, metric: str | None = None) -> dict[str, Any]:
    """The pool's learning curve: one point per checkpoint, oldest first.

    Each point has the number of training labels, the validation metrics (``None`` when the pool had no
    labeled validation item then), the training metrics, and ``strategy``: the strategy of the batch whose
    selected items were labeled before this round (``"seed"`` for the first head, trained on the labels
    given before any batch); ``trained_for`` is the batch whose job trained this head.
    """
    pool = get_pool(session, tenant_id, pool_id)
    names = CLASSIFICATION_METRICS if pool.task == "classification" else REGRESSION_METRICS
    metric = metric or names[0]
    if metric not in names:
        raise ValidationFailed(f"metric must be one of {list(names)} for a {pool.task} pool", {"metric": metric})
    batches = store.batch_history(session, pool.id)
    by_id = {b.id: b for b in batches}
    points = []
    for cid, rnd, n_labels, train_metrics, val, batch_id, created_at, batch_created in store.curve_rows(
        session, pool.id
    ):
        prev_id, prev_strategy = _strategy_before(batches, batch_created)
        val = val or None
        val_metrics = None if val is None else val.get("metrics")
        own = by_id.get(batch_id) if batch_id else None
        points.append(
            {
                "round": rnd,
                "checkpoint_id": cid,
                "n_labels": n_labels,
                "n_validation": 0 if val is None else int(val.get("n", 0)),
                "value": None if val_metrics is None else val_metrics.get(metric),
                "validation": val_metrics,
                "training": train_metrics or {},
                "strategy": prev_strategy or "seed",
                "previous_batch_id": prev_id,
                "trained_for": {"batch_id": batch_id, "strategy": None if own is None else own.strategy},
                "created_at": created_at,
            }
        )
    return {
        "pool_id": pool.id,
        "task": pool.task,
        "metric": metric,
        "metrics": list(names),
        "points": points,
        "stop": stop_recommendation(session, pool, metric),
    }


def stop_recommendation(session: Session, pool: Pool, metric: str | None = None) -> dict[str, Any]:
    """The stopping rule at the pool's latest checkpoint for ``metric`` (default accuracy / rmse):
    ``{"recommended", "reason", "evidence"}``, computed by the worker that trained the checkpoint
    (``selection.stopping``; ``worker.stopping`` stores it). Without a checkpoint, or one trained before the
    rule existed, it is not recommended and the reason says what is missing."""
    names = CLASSIFICATION_METRICS if pool.task == "classification" else REGRESSION_METRICS
    metric = metric or names[0]
    latest = stop_store.latest_recommendation(session, pool.id)
    if latest is None:
        return {
            "recommended": False,
            "reason": "Keep labeling: no model trained yet (each batch of a model-based strategy trains one "
            "and records the stopping evidence).",
            "evidence": {"checkpoints": 0, "missing": ["a trained checkpoint"]},
        }
    checkpoint_id, rnd, _n_labels, recommendation = latest
    found = (recommendation or {}).get("by_metric", {}).get(metric)
    if found is None:
        return {
            "recommended": False,
            "reason": f"Keep labeling: the latest checkpoint (round {rnd}) has no stopping evidence (it was trained "
            "before the stopping rule, or its stop set could not be predicted); the next batch records it.",
            "evidence": {"checkpoint_id": checkpoint_id, "round": rnd, "missing": ["stopping evidence"]},
        }
    evidence = dict(found.get("evidence") or {})
    evidence.update(checkpoint_id=checkpoint_id, round=rnd, stop_set=(recommendation or {}).get("stop_set"))
    return {"recommended": bool(found["recommended"]), "reason": str(found["reason"]), "evidence": evidence}


def map_json(session: Session, tenant_id: str, pool_id: str, checkpoint_id: str | None) -> bytes:
    """The stored 2-D map of a checkpoint (the latest by default) as JSON bytes, with its checkpoint id
    and round spliced in (the stored document is returned without re-parsing it)."""
    pool = get_pool(session, tenant_id, pool_id)
    found = store.get_map(session, pool.id, checkpoint_id)
    if found is None:
        what = f"checkpoint {checkpoint_id!r}" if checkpoint_id else "the pool"
        raise NotFound(f"no 2-D map for {what}: maps are drawn when a batch trains a head")
    cid, rnd, payload = found
    head = f'{{"checkpoint_id":"{cid}","round":{rnd},'.encode()
    return head + payload[1:]
