"""Batch, reservation, checkpoint and select-job repository: the SQL behind batches and their jobs.

Reservations: an item is reserved by a batch while ``status = 'reserved'`` and ``reserved_until`` lies
in the future; a reservation whose time has passed counts as unlabeled everywhere (it is released
lazily, by the next reservation that takes the item). Reserving is one conditional UPDATE whose WHERE
clause is re-checked under the row locks, so two batches can never hold the same item.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select, text, update
from sqlalchemy.orm import Session

from service.store import content as content_repo
from service.store import counts as counts_repo
from service.store.attempts import start_attempt, touch_attempt
from service.store.models import Batch, Checkpoint, Item, SelectJob

ACTIVE_BATCH = ("queued", "running")


# ------------------------------------------------------------------------------------------------
# Effective item status
# ------------------------------------------------------------------------------------------------


def available_clause(now: datetime) -> ColumnElement[bool]:
    """Items that may be picked: unlabeled, or reserved by a reservation that has expired; and with an
    embedding (items given by reference that are pending or in error are never picked); never validation items."""
    return and_(
        Item.embedding_status == "ready",
        Item.split == "train",
        or_(Item.status == "unlabeled", and_(Item.status == "reserved", Item.reserved_until < now)),
    )


def reserved_clause(now: datetime) -> ColumnElement[bool]:
    """Items held by a live reservation."""
    return and_(Item.status == "reserved", Item.reserved_until >= now)


def count_available(session: Session, pool_id: str, now: datetime) -> int:
    """Items :func:`available_clause` selects, from ``service.store.counts`` (no pass over the pool)."""
    return counts_repo.available(session, pool_id, now)


def count_items(session: Session, pool_id: str) -> int:
    return counts_repo.total(session, pool_id)


def design_rows(session: Session, pool_id: str, now: datetime) -> Sequence[Any]:
    """``(item id, status)`` of the items labeled or under a live reservation."""
    # status IN (...) first: an index range on (pool_id, status) instead of a pass over every row of the pool
    return session.execute(
        select(Item.id, Item.status).where(
            Item.pool_id == pool_id,
            Item.status.in_(("labeled", "reserved")),
            or_(Item.status == "labeled", reserved_clause(now)),
        )
    ).all()


def try_lock_selection(session: Session, pool_id: str) -> bool:
    """Take the pool's selection lock for the rest of the transaction if it is free (PostgreSQL: a
    transaction-level advisory lock keyed by the pool, which blocks no reader or writer of the pool's
    rows, only other selections); True elsewhere (SQLite: the worker's process lock serialises)."""
    if session.get_bind().dialect.name != "postgresql":
        return True
    return bool(
        session.execute(
            text("SELECT pg_try_advisory_xact_lock(hashtext('bait.selection'), hashtext(:pool_id))"),
            {"pool_id": pool_id},
        ).scalar_one()
    )


def iter_pool_rows(session: Session, pool_id: str, chunk: int = 8192) -> Iterator[Sequence[Any]]:
    """Every item of the pool with an embedding (``embedding_status = 'ready'``: items given by reference
    that are pending or in error are left out; a ready item without one is reported by the loader; validation
    items are left out: they are never selected, reserved or trained on)
    ordered by id, in chunks of rows
    ``(id, external_id, embedding bytes, status, reserved_until, label)``.
    (:func:`service.store.content.stream_selectable`: binary server-side cursor on PostgreSQL).
    """
    yield from content_repo.stream_selectable(
        session,
        pool_id,
        "id, external_id, embedding, status, reserved_until, label",
        [Item.id, Item.external_id, Item.embedding, Item.status, Item.reserved_until, Item.label],
        chunk,
        "pool_rows",
    )


def items_by_external_id(
    session: Session, pool_id: str, external_ids: Sequence[str]
) -> dict[str, tuple[int, bytes | None]]:
    """``external id -> (item id, embedding bytes)`` for the ids that exist in the pool."""
    found: dict[str, tuple[int, bytes | None]] = {}
    ids = list(dict.fromkeys(external_ids))
    for begin in range(0, len(ids), 5000):
        rows = session.execute(
            select(Item.external_id, Item.id, Item.embedding).where(
                Item.pool_id == pool_id, Item.external_id.in_(ids[begin : begin + 5000])
            )
        ).all()
        found.update({str(r[0]): (int(r[1]), r[2]) for r in rows})
    return found


def existing_external_ids(session: Session, pool_id: str, external_ids: Sequence[str]) -> set[str]:
    ids = list(dict.fromkeys(external_ids))
    found: set[str] = set()
    for begin in range(0, len(ids), 5000):
        found.update(
            session.execute(
                select(Item.external_id).where(Item.pool_id == pool_id, Item.external_id.in_(ids[begin : begin + 5000]))
            ).scalars()
        )
    return found


# ------------------------------------------------------------------------------------------------
# Reservations
# ------------------------------------------------------------------------------------------------


def reserve_items(
    session: Session, pool_id: str, batch_id: str, item_ids: Sequence[int], now: datetime, until: datetime
) -> int:
    """Reserve the items still available; returns how many were reserved (all-or-nothing is the caller's)."""
    reserved = 0
    ids = sorted(item_ids)
    postgres = session.get_bind().dialect.name == "postgresql"
    for begin in range(0, len(ids), 5000):
        if postgres:  # lock in id order, as label writes do, so the two never deadlock
            session.execute(
                select(Item.id).where(Item.id.in_(ids[begin : begin + 5000])).order_by(Item.id).with_for_update()
            )
        result = session.execute(
            update(Item)
            .where(Item.pool_id == pool_id, Item.id.in_(ids[begin : begin + 5000]), available_clause(now))
            .values(status="reserved", batch_id=batch_id, reserved_until=until, updated_at=now)
            .execution_options(synchronize_session=False)
        )
        reserved += int(result.rowcount)  # type: ignore[attr-defined]
    return reserved


def release_reservations(session: Session, batch_id: str, now: datetime) -> int:
    """Give the batch's still-reserved items back (labeled items keep their label)."""
    result = session.execute(
        update(Item)
        .where(Item.batch_id == batch_id, Item.status == "reserved")
        .values(status="unlabeled", batch_id=None, reserved_until=None, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------------------------
# Batches
# ------------------------------------------------------------------------------------------------


def get_batch(session: Session, pool_id: str, batch_id: str, *, for_update: bool = False) -> Batch | None:
    stmt = select(Batch).where(Batch.id == batch_id, Batch.pool_id == pool_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def cancel_if(session: Session, batch_id: str, statuses: tuple[str, ...], now: datetime) -> bool:
    """``status := cancelled`` if the batch is in one of ``statuses``, as one conditional UPDATE."""
    result = session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.status.in_(statuses))
        .values(status="cancelled", finished_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount) == 1  # type: ignore[attr-defined]


def get_batch_by_id(session: Session, batch_id: str, *, for_update: bool = False) -> Batch | None:
    stmt = select(Batch).where(Batch.id == batch_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def find_batch_by_key(session: Session, pool_id: str, key: str) -> Batch | None:
    return session.execute(
        select(Batch).where(Batch.pool_id == pool_id, Batch.idempotency_key == key)
    ).scalar_one_or_none()


def list_batches(
    session: Session, pool_id: str, *, status: str | None, limit: int, before: datetime | None
) -> Sequence[Batch]:
    stmt = select(Batch).where(Batch.pool_id == pool_id)
    if status is not None:
        stmt = stmt.where(Batch.status == status)
    if before is not None:
        stmt = stmt.where(Batch.created_at < before)
    return session.execute(stmt.order_by(Batch.created_at.desc(), Batch.id.desc()).limit(limit)).scalars().all()


def start_batch(session: Session, batch_id: str, now: datetime) -> int | None:
    """Move a ``queued`` batch to ``running``; returns the attempt number, None if it was not queued."""
    return start_attempt(session, Batch, batch_id, now)


def touch_batch(
    session: Session, batch_id: str, attempt: int, now: datetime, progress: tuple[str, int, int] | None = None
) -> bool:
    """Heartbeat (and progress) of a running batch attempt (see :func:`touch_attempt`)."""
    return touch_attempt(session, Batch, batch_id, attempt, now, progress)


def active_batches(session: Session) -> Sequence[Batch]:
    return session.execute(select(Batch).where(Batch.status.in_(ACTIVE_BATCH)).with_for_update()).scalars().all()


# ------------------------------------------------------------------------------------------------
# Checkpoints
# ------------------------------------------------------------------------------------------------


def count_checkpoints(session: Session, pool_id: str) -> int:
    return int(
        session.execute(select(func.count()).select_from(Checkpoint).where(Checkpoint.pool_id == pool_id)).scalar_one()
    )


def latest_checkpoint_id(session: Session, pool_id: str) -> str | None:
    return session.execute(
        select(Checkpoint.id).where(Checkpoint.pool_id == pool_id).order_by(Checkpoint.round.desc()).limit(1)
    ).scalar_one_or_none()


def latest_checkpoint(session: Session, pool_id: str) -> Checkpoint | None:
    return (
        session.execute(
            select(Checkpoint)
            .where(Checkpoint.pool_id == pool_id)
            .order_by(Checkpoint.round.desc(), Checkpoint.created_at.desc())
            .limit(1)
        )
        .scalars()
        .first()
    )


def list_checkpoints(session: Session, pool_id: str, *, limit: int, before_round: int | None) -> Sequence[Any]:
    """Checkpoint rows without their weights."""
    stmt = select(
        Checkpoint.id,
        Checkpoint.round,
        Checkpoint.n_labels,
        Checkpoint.metrics,
        Checkpoint.config,
        Checkpoint.batch_id,
        Checkpoint.created_at,
    ).where(Checkpoint.pool_id == pool_id)
    if before_round is not None:
        stmt = stmt.where(Checkpoint.round < before_round)
    return session.execute(stmt.order_by(Checkpoint.round.desc()).limit(limit)).all()


# ------------------------------------------------------------------------------------------------
# Select jobs
# ------------------------------------------------------------------------------------------------


def get_select_job(
    session: Session, tenant_id: str | None, job_id: str, *, for_update: bool = False
) -> SelectJob | None:
    stmt = select(SelectJob).where(SelectJob.id == job_id)
    if tenant_id is not None:
        stmt = stmt.where(SelectJob.tenant_id == tenant_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def start_select_job(session: Session, job_id: str, now: datetime) -> int | None:
    result = session.execute(
        update(SelectJob)
        .where(SelectJob.id == job_id, SelectJob.status == "queued")
        .values(status="running", attempts=SelectJob.attempts + 1, started_at=now, progress_stage="select")
        .execution_options(synchronize_session=False)
    )
    if int(result.rowcount) != 1:  # type: ignore[attr-defined]
        return None
    return int(session.execute(select(SelectJob.attempts).where(SelectJob.id == job_id)).scalar_one())


def select_job_progress(session: Session, job_id: str, attempt: int, done: int, total: int) -> bool:
    result = session.execute(
        update(SelectJob)
        .where(SelectJob.id == job_id, SelectJob.status == "running", SelectJob.attempts == attempt)
        .values(progress_done=done, progress_total=total)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount) == 1  # type: ignore[attr-defined]


def active_select_jobs(session: Session) -> Sequence[SelectJob]:
    return (
        session.execute(select(SelectJob).where(SelectJob.status.in_(ACTIVE_BATCH)).with_for_update()).scalars().all()
    )
