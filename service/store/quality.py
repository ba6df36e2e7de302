"""Validation split and model quality: the SQL behind item splits, validation metrics, curves and maps."""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Text, cast, func, select, update
from sqlalchemy.orm import Session

from service.store import counts as counts_repo
from service.store.items import effective_status
from service.store.models import Batch, Checkpoint, CheckpointMap, Item, Label

SPLITS = ("train", "validation")
_IN_CHUNK = 5000


def set_split(session: Session, pool_id: str, item_ids: Sequence[int], split: str, now: datetime) -> int:
    """Move items (internal ids) to ``split``. An item moved to validation gives up a live reservation
    (it can no longer be part of a batch); its label and history stay. Returns the rows changed."""
    changed = 0
    ids = list(item_ids)
    for begin in range(0, len(ids), _IN_CHUNK):
        chunk = ids[begin : begin + _IN_CHUNK]
        if split == "validation":
            session.execute(
                update(Item)
                .where(Item.pool_id == pool_id, Item.id.in_(chunk), Item.status == "reserved")
                .values(status="unlabeled", reserved_until=None, updated_at=now)
                .execution_options(synchronize_session=False)
            )
        result = session.execute(
            update(Item)
            .where(Item.pool_id == pool_id, Item.id.in_(chunk), Item.split != split)
            .values(split=split, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        changed += int(result.rowcount)  # type: ignore[attr-defined]
    return changed


def splits_of(session: Session, item_ids: Sequence[int]) -> dict[int, str]:
    out: dict[int, str] = {}
    ids = list(item_ids)
    for begin in range(0, len(ids), _IN_CHUNK):
        rows = session.execute(select(Item.id, Item.split).where(Item.id.in_(ids[begin : begin + _IN_CHUNK]))).all()
        out.update({int(i): str(s) for i, s in rows})
    return out


def count_validation(session: Session, pool_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{pool_id: {"validation", "validation_labeled"}}``: items in the validation split, and how many
    of them carry a label (only those score the heads); from ``service.store.counts``."""
    return counts_repo.validation(session, pool_ids)


def validation_rows(session: Session, pool_id: str) -> Sequence[Any]:
    """``(id, external_id, embedding bytes, label)`` of the pool's labeled validation items with an
    embedding, ordered by id."""
    return session.execute(
        select(Item.id, Item.external_id, Item.embedding, Item.label)
        .where(
            Item.pool_id == pool_id,
            Item.split == "validation",
            Item.status == "labeled",
            Item.embedding_status == "ready",
            Item.embedding.is_not(None),
        )
        .order_by(Item.id)
    ).all()


def curve_rows(session: Session, pool_id: str) -> Sequence[Any]:
    """Every checkpoint of the pool, oldest round first, without weights:
    ``(id, round, n_labels, metrics, validation_metrics, batch_id, created_at, batch created_at)``."""
    return session.execute(
        select(
            Checkpoint.id,
            Checkpoint.round,
            Checkpoint.n_labels,
            Checkpoint.metrics,
            Checkpoint.validation_metrics,
            Checkpoint.batch_id,
            Checkpoint.created_at,
            Batch.created_at,
        )
        .outerjoin(Batch, Batch.id == Checkpoint.batch_id)
        .where(Checkpoint.pool_id == pool_id)
        .order_by(Checkpoint.round)
    ).all()


def batch_history(session: Session, pool_id: str) -> Sequence[Any]:
    """``(id, strategy, size, status, created_at, strategy_used)`` of the pool's batches, oldest first
    (``strategy_used``: what ran, from the diagnostics; a cold start replaces the requested strategy)."""
    used = Batch.diagnostics["strategy_used"].as_string().label("strategy_used")
    return session.execute(
        select(Batch.id, Batch.strategy, Batch.size, Batch.status, Batch.created_at, used)
        .where(Batch.pool_id == pool_id)
        .order_by(Batch.created_at, Batch.id)
    ).all()


def put_map(session: Session, checkpoint_id: str, pool_id: str, payload: bytes, n_points: int, now: datetime) -> None:
    """Store a checkpoint's 2-D map (``payload``: JSON bytes, stored zlib-compressed)."""
    session.add(
        CheckpointMap(
            checkpoint_id=checkpoint_id,
            pool_id=pool_id,
            n_points=n_points,
            data=zlib.compress(payload, 6),
            created_at=now,
        )
    )


def get_map(session: Session, pool_id: str, checkpoint_id: str | None) -> tuple[str, int, bytes] | None:
    """``(checkpoint id, round, JSON bytes)`` of the map of ``checkpoint_id`` (the latest one with a map
    when ``None``), or ``None``."""
    stmt = (
        select(CheckpointMap.checkpoint_id, Checkpoint.round, CheckpointMap.data)
        .join(Checkpoint, Checkpoint.id == CheckpointMap.checkpoint_id)
        .where(CheckpointMap.pool_id == pool_id)
    )
    if checkpoint_id is not None:
        stmt = stmt.where(CheckpointMap.checkpoint_id == checkpoint_id)
    row = session.execute(stmt.order_by(Checkpoint.round.desc()).limit(1)).first()
    if row is None:
        return None
    return str(row[0]), int(row[1]), zlib.decompress(row[2])


# ------------------------------------------------------------------------------------------ dashboard


def last_activity(session: Session, pool_ids: Sequence[str]) -> dict[str, datetime]:
    """Latest batch request or label write per pool (pools without either are absent)."""
    out: dict[str, datetime] = {}
    if not pool_ids:
        return out
    ids = list(pool_ids)
    for model in (Batch, Label):
        rows = session.execute(
            select(model.pool_id, func.max(model.created_at)).where(model.pool_id.in_(ids)).group_by(model.pool_id)
        ).all()
        for pid, at in rows:
            if at is not None and (pid not in out or at > out[pid]):
                out[pid] = at
    return out


def label_distribution(session: Session, pool_id: str) -> list[tuple[Any, int]]:
    """``(label, count)`` of the labeled training items (classification: one label per class name)."""
    as_text = cast(Item.label, Text)  # JSON has no equality operator on PostgreSQL: group by its text
    rows = session.execute(
        select(as_text, func.count())
        .where(Item.pool_id == pool_id, Item.status == "labeled", Item.split == "train")
        .group_by(as_text)
    ).all()
    return [(json.loads(label) if label is not None else None, int(n)) for label, n in rows]


def batch_items(
    session: Session, pool_id: str, external_ids: Sequence[str], now: datetime
) -> dict[str, dict[str, Any]]:
    """Items of a batch by external id: effective status, label, split and content (inline text,
    reference, and the item's ``data`` where the schema has it)."""
    cols: list[Any] = [Item.external_id, effective_status(now), Item.label, Item.split, Item.text, Item.uri]
    data_col = getattr(Item, "data", None)  # item content (added by another migration); optional here
    if data_col is not None:
        cols.append(data_col)
    out: dict[str, dict[str, Any]] = {}
    ids = list(external_ids)
    for begin in range(0, len(ids), _IN_CHUNK):
        for row in session.execute(
            select(*cols).where(Item.pool_id == pool_id, Item.external_id.in_(ids[begin : begin + _IN_CHUNK]))
        ).all():
            ext, status, label, split, text, uri = row[:6]
            out[str(ext)] = {
                "status": status,
                "label": label,
                "split": split,
                "text": text,
                "uri": uri,
                "data": row[6] if len(row) > 6 else None,
            }
    return out
