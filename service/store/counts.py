"""Item counts of pools without counting their rows: ``pool_item_counts``, kept by the database.

Triggers on ``items`` (migration 0007) record how many items each pool has per ``(split, status,
embedding_status)``, in the same transaction as the write, on every write path (ORM, set-based upserts,
COPY, deletes and cascades). A reader sees counts consistent with the rows its snapshot sees.

On PostgreSQL every statement appends signed delta rows (no counter row is updated in place, so writers of
one pool never wait on each other for it); readers sum them, and fold a pool's rows into one per key once
more than :data:`FOLD_ABOVE` pile up. Folding is one ``DELETE ... RETURNING`` feeding an ``INSERT`` of the
sums: rows a concurrent writer has not committed are invisible to it and stay, so totals are preserved; a
transaction-level advisory lock keeps two folds of one pool from running at once (the second skips).
On SQLite (one writer at a time) the triggers keep one row per key.

Stored status is what the table counts; the effective status (an expired reservation counts as
unlabeled, see ``service.store.items``) is derived by counting the pool's reserved rows whose reservation
has ended, through the ``(pool_id, status, id)`` index: a range over the reserved rows only.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from service.store.models import Item, PoolItemCount

Key = tuple[str, str, str]  # (split, status, embedding_status)
FOLD_ABOVE = 64  # delta rows of one pool (PostgreSQL) above which a reader folds them

_FOLD = text(
    """
    WITH gone AS (
        DELETE FROM pool_item_counts WHERE pool_id = :pool_id RETURNING split, status, embedding_status, n
    )
    INSERT INTO pool_item_counts (pool_id, split, status, embedding_status, n)
    SELECT :pool_id, split, status, embedding_status, sum(n) FROM gone
    GROUP BY split, status, embedding_status HAVING sum(n) <> 0
    """
)


def tallies(session: Session, pool_ids: Sequence[str]) -> dict[str, dict[Key, int]]:
    """``{pool_id: {(split, status, embedding_status): n}}`` (keys with no items left out)."""
    out: dict[str, dict[Key, int]] = {pid: {} for pid in pool_ids}
    if not pool_ids:
        return out
    c = PoolItemCount
    rows = session.execute(
        select(c.pool_id, c.split, c.status, c.embedding_status, func.sum(c.n), func.count())
        .where(c.pool_id.in_(list(pool_ids)))
        .group_by(c.pool_id, c.split, c.status, c.embedding_status)
    ).all()
    stored_rows: dict[str, int] = {}
    for pid, split, status, emb_status, n, m in rows:
        stored_rows[pid] = stored_rows.get(pid, 0) + int(m)
        if int(n):
            out[pid][(split, status, emb_status)] = int(n)
    if session.get_bind().dialect.name == "postgresql":
        for pid, m in stored_rows.items():
            if m > FOLD_ABOVE:
                fold(session, pid)
    return out


def fold(session: Session, pool_id: str) -> bool:
    """Fold a pool's delta rows into one row per key (PostgreSQL); False when another transaction is
    folding it right now (then that one does it)."""
    locked = session.execute(
        text("SELECT pg_try_advisory_xact_lock(hashtext('bait.counts'), hashtext(:pool_id))"), {"pool_id": pool_id}
    ).scalar_one()
    if not locked:
        return False
    session.execute(_FOLD, {"pool_id": pool_id})
    return True


def expired_reservations(
    session: Session, pool_ids: Sequence[str], now: datetime, *, strict: bool = False, selectable: bool = False
) -> dict[str, int]:
    """Reserved rows whose reservation has ended by ``now`` (``<= now``; ``< now`` with ``strict``), per pool;
    with ``selectable`` only those in the train split with a ready embedding."""
    if not pool_ids:
        return {}
    ended = Item.reserved_until < now if strict else Item.reserved_until <= now
    q = select(Item.pool_id, func.count()).where(Item.pool_id.in_(list(pool_ids)), Item.status == "reserved", ended)
    if selectable:
        q = q.where(Item.split == "train", Item.embedding_status == "ready")
    return {pid: int(n) for pid, n in session.execute(q.group_by(Item.pool_id)).all()}


def by_status(session: Session, pool_ids: Sequence[str], now: datetime) -> dict[str, dict[str, int]]:
    """``{pool_id: {"items", "unlabeled", "reserved", "labeled"}}`` by effective status, zeros included."""
    out = {pid: {"items": 0, "unlabeled": 0, "reserved": 0, "labeled": 0} for pid in pool_ids}
    for pid, tally in tallies(session, pool_ids).items():
        for (_split, status, _emb), n in tally.items():
            out[pid][status] = out[pid].get(status, 0) + n
            out[pid]["items"] += n
    for pid, n in expired_reservations(session, pool_ids, now).items():
        out[pid]["reserved"] -= n
        out[pid]["unlabeled"] += n
    return out


def by_embedding_status(
    session: Session, pool_ids: Sequence[str], statuses: Sequence[str]
) -> dict[str, dict[str, int]]:
    """``{pool_id: {embedding_status: n}}``, zeros included for ``statuses``."""
    out = {pid: dict.fromkeys(statuses, 0) for pid in pool_ids}
    for pid, tally in tallies(session, pool_ids).items():
        for (_split, _status, emb), n in tally.items():
            out[pid][emb] = out[pid].get(emb, 0) + n
    return out


def validation(session: Session, pool_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{pool_id: {"validation", "validation_labeled"}}``: items in the validation split, and those of them
    stored as labeled."""
    out = {pid: {"validation": 0, "validation_labeled": 0} for pid in pool_ids}
    for pid, tally in tallies(session, pool_ids).items():
        for (split, status, _emb), n in tally.items():
            if split == "validation":
                out[pid]["validation"] += n
                if status == "labeled":
                    out[pid]["validation_labeled"] += n
    return out


def total(session: Session, pool_id: str) -> int:
    """Items of the pool."""
    return sum(tallies(session, [pool_id])[pool_id].values())


def available(session: Session, pool_id: str, now: datetime) -> int:
    """Items a batch may pick (``service.store.batches.available_clause``): train split, ready embedding,
    unlabeled or under a reservation that ended before ``now``."""
    n = tallies(session, [pool_id])[pool_id].get(("train", "unlabeled", "ready"), 0)
    return n + expired_reservations(session, [pool_id], now, strict=True, selectable=True).get(pool_id, 0)
