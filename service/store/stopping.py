"""The stopping rule's rows: each checkpoint's stop-set predictions, agreement and recommendation."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.models import Checkpoint, CheckpointStop, Item


def latest_predictions(session: Session, pool_id: str) -> bytes | None:
    """The stop-set predictions of the pool's latest checkpoint that has them (they carry the stop set)."""
    row = session.execute(
        select(CheckpointStop.predictions)
        .join(Checkpoint, Checkpoint.id == CheckpointStop.checkpoint_id)
        .where(CheckpointStop.pool_id == pool_id, CheckpointStop.predictions.is_not(None))
        .order_by(Checkpoint.round.desc())
        .limit(1)
    ).first()
    return None if row is None else row[0]


def previous_round(session: Session, pool_id: str, n_labels: int, before_round: int) -> tuple[str, bytes | None] | None:
    """``(checkpoint id, stop-set predictions)`` of the previous round of a checkpoint trained on ``n_labels``:
    the latest checkpoint before ``before_round`` trained on a different number of labels (None: there is none;
    predictions None: it has none)."""
    row = session.execute(
        select(Checkpoint.id, CheckpointStop.predictions)
        .outerjoin(CheckpointStop, CheckpointStop.checkpoint_id == Checkpoint.id)
        .where(Checkpoint.pool_id == pool_id, Checkpoint.round < before_round, Checkpoint.n_labels != n_labels)
        .order_by(Checkpoint.round.desc())
        .limit(1)
    ).first()
    return None if row is None else (str(row[0]), row[1])


def unlabeled_candidates(session: Session, pool_id: str) -> Sequence[Any]:
    """``(id, external id)`` of the pool's unlabeled training items with an embedding: where a stop set is
    drawn from."""
    return session.execute(
        select(Item.id, Item.external_id).where(
            Item.pool_id == pool_id,
            Item.split == "train",
            Item.status != "labeled",
            Item.embedding_status == "ready",
        )
    ).all()


def history(session: Session, pool_id: str) -> Sequence[Any]:
    """``(checkpoint id, round, n_labels, validation_metrics, agreement)`` of every checkpoint, oldest first
    (agreement None where not compared or recorded)."""
    return session.execute(
        select(
            Checkpoint.id,
            Checkpoint.round,
            Checkpoint.n_labels,
            Checkpoint.validation_metrics,
            CheckpointStop.agreement,
        )
        .outerjoin(CheckpointStop, CheckpointStop.checkpoint_id == Checkpoint.id)
        .where(Checkpoint.pool_id == pool_id)
        .order_by(Checkpoint.round)
    ).all()


def put(
    session: Session,
    checkpoint_id: str,
    pool_id: str,
    n_items: int,
    predictions: bytes | None,
    agreement: float | None,
    recommendation: dict[str, Any] | None,
    now: datetime,
) -> None:
    session.add(
        CheckpointStop(
            checkpoint_id=checkpoint_id,
            pool_id=pool_id,
            n_items=n_items,
            predictions=predictions,
            agreement=agreement,
            recommendation=recommendation,
            created_at=now,
        )
    )


def latest_recommendation(session: Session, pool_id: str) -> tuple[str, int, int, dict[str, Any] | None] | None:
    """``(checkpoint id, round, n_labels, recommendation or None)`` of the pool's latest checkpoint (None:
    the pool has no checkpoint)."""
    row = session.execute(
        select(Checkpoint.id, Checkpoint.round, Checkpoint.n_labels, CheckpointStop.recommendation)
        .outerjoin(CheckpointStop, CheckpointStop.checkpoint_id == Checkpoint.id)
        .where(Checkpoint.pool_id == pool_id)
        .order_by(Checkpoint.round.desc())
        .limit(1)
    ).first()
    return None if row is None else (str(row[0]), int(row[1]), int(row[2]), row[3])
