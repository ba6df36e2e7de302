"""Item repository: set-based upserts of embeddings, the effective status, pages and counts.

Effective status (defined here once, used by counts, filters, listings and the batch code):
an item stored as ``reserved`` whose ``reserved_until`` has passed counts as ``unlabeled``; a
``reserved`` item without ``reserved_until`` stays reserved until it is labeled or released.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import numpy as np
from sqlalchemy import (
    ColumnElement,
    Row,
    Select,
    Table,
    and_,
    bindparam,
    case,
    literal,
    null,
    or_,
    select,
    text,
    union_all,
    update,
)
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from service.store import counts as counts_repo
from service.store.models import Item

STATUSES = ("unlabeled", "reserved", "labeled")
# Bound parameters per IN (...) query: below SQLite's limit, large enough to keep round trips few.
_IN_CHUNK = 5000
_SQLITE_UPSERT_CHUNK = 5000
ITEMS = cast(Table, Item.__table__)


def _expired(now: datetime) -> ColumnElement[bool]:
    return and_(Item.status == "reserved", Item.reserved_until.is_not(None), Item.reserved_until <= now)


def effective_status(now: datetime) -> ColumnElement[str]:
    """SQL expression: the item's status as clients see it at ``now`` (expired reservations are unlabeled)."""
    return case((_expired(now), literal("unlabeled")), else_=Item.status)


def status_is(status: str, now: datetime) -> ColumnElement[bool]:
    """SQL filter: items whose effective status at ``now`` is ``status``."""
    if status == "unlabeled":
        return or_(Item.status == "unlabeled", _expired(now))
    if status == "reserved":
        return and_(Item.status == "reserved", or_(Item.reserved_until.is_(None), Item.reserved_until > now))
    if status == "labeled":
        return Item.status == "labeled"
    raise ValueError(f"unknown status {status!r}")


def count_by_status(session: Session, pool_ids: Sequence[str], now: datetime) -> dict[str, dict[str, int]]:
    """``{pool_id: {"items", "unlabeled", "reserved", "labeled"}}`` by effective status, zeros included (from
    the counts the database keeps, ``service.store.counts``: no pass over the pool's rows)."""
    return counts_repo.by_status(session, pool_ids, now)


def _chunks(seq: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(seq), size):
        yield seq[start : start + size]


def internal_ids(session: Session, pool_id: str, external_ids: Sequence[str]) -> dict[str, int]:
    """Map external ids of ``pool_id`` to internal item ids; unknown ids are absent from the result."""
    found: dict[str, int] = {}
    for chunk in _chunks(external_ids, _IN_CHUNK):
        rows = session.execute(
            select(Item.external_id, Item.id).where(Item.pool_id == pool_id, Item.external_id.in_(chunk))
        ).all()
        found.update({ext: int(iid) for ext, iid in rows})
    return found


def upsert_embeddings(
    session: Session, pool_id: str, external_ids: Sequence[str], embeddings: np.ndarray, now: datetime
) -> tuple[int, int]:
    """Insert or update items by external id; returns ``(created, updated)``.

    An update replaces the embedding only: status, label, reservation and history are kept.
    New items get internal ids in the order given, so pages list them in upload order.

    Args:
        external_ids: ``n`` unique, validated ids.
        embeddings: ``n x d`` float32 array (stored as little-endian bytes, one row per item).
    """
    with BulkUpsert(session, pool_id, now) as writer:
        writer.write(external_ids, embeddings)
    return writer.created, writer.updated


class BulkUpsert:
    """Upserts of embeddings block by block, in the caller's transaction (so a failure anywhere, e.g. in a
    later block, writes nothing once the caller rolls back). Every write is a plain INSERT ... ON CONFLICT
    DO UPDATE on ``items``, so the row and statement triggers on it (counts, content versions) fire.

    PostgreSQL: each block goes by binary COPY into a temporary staging table, then one set-based
    ``INSERT ... SELECT ... ON CONFLICT`` moves it into ``items`` in block order. SQLite: ``executemany``
    of the upsert. Ids must be unique across all blocks (the caller checks).
    """

    def __init__(self, session: Session, pool_id: str, now: datetime) -> None:
        self.session, self.pool_id, self.now = session, pool_id, now
        self.created = self.updated = 0
        self.postgresql = session.get_bind().dialect.name == "postgresql"
        self._cursor: Any = None

    def __enter__(self) -> BulkUpsert:
        if self.postgresql:
            dbapi_conn: Any = self.session.connection().connection.driver_connection
            self._cursor = dbapi_conn.cursor()
            self._cursor.execute("DROP TABLE IF EXISTS bait_item_upload")
            self._cursor.execute(
                "CREATE TEMP TABLE bait_item_upload (ord int4 NOT NULL, external_id text NOT NULL, "
                "embedding bytea NOT NULL) ON COMMIT DROP"
            )
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._cursor is not None:
            try:
                if exc_type is None:
                    self._cursor.execute("DROP TABLE bait_item_upload")
            finally:
                self._cursor.close()
                self._cursor = None

    def write(self, external_ids: Sequence[str], embeddings: np.ndarray) -> tuple[int, int]:
        """Upsert one block; returns its ``(created, updated)`` (also added to the totals)."""
        emb = np.ascontiguousarray(embeddings, dtype="<f4")
        if self.postgresql:
            created = self._write_postgresql(external_ids, emb)
        else:
            created = self._write_generic(external_ids, emb)
        self.created += created
        self.updated += len(external_ids) - created
        return created, len(external_ids) - created

    def _write_postgresql(self, external_ids: Sequence[str], emb: np.ndarray) -> int:
        cur = self._cursor
        cur.execute("TRUNCATE bait_item_upload")
        with cur.copy("COPY bait_item_upload (ord, external_id, embedding) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["int4", "text", "bytea"])
            for i, ext in enumerate(external_ids):
                copy.write_row((i, ext, emb[i].data))
        cur.execute(
            """
            WITH up AS (
                INSERT INTO items (pool_id, external_id, embedding, uri, status, created_at, updated_at)
                SELECT %(pool)s, external_id, embedding, NULL, 'unlabeled', %(now)s, %(now)s
                FROM bait_item_upload ORDER BY ord
                ON CONFLICT (pool_id, external_id) DO UPDATE
                SET embedding = EXCLUDED.embedding, uri = NULL, text = NULL, embedding_status = 'ready',
                    embedding_error = NULL, embedding_source = NULL, updated_at = EXCLUDED.updated_at
                -- re-sending identical embeddings (a retried upload) rewrites nothing
                WHERE items.embedding IS DISTINCT FROM EXCLUDED.embedding OR items.uri IS NOT NULL
                    OR items.text IS NOT NULL OR items.embedding_status <> 'ready'
                RETURNING (xmax = 0) AS inserted
            )
            SELECT count(*) FILTER (WHERE inserted) FROM up
            """,
            {"pool": self.pool_id, "now": self.now},
        )
        (created,) = cur.fetchone()
        # Every id that was not inserted existed already: it counts as updated, rewritten or not.
        return int(created)

    def _write_generic(self, external_ids: Sequence[str], emb: np.ndarray) -> int:
        existing = len(internal_ids(self.session, self.pool_id, external_ids))
        table = ITEMS
        stmt = sqlite_insert(table)
        stmt = stmt.on_conflict_do_update(
            index_elements=[table.c.pool_id, table.c.external_id],
            set_={
                "embedding": stmt.excluded.embedding,
                "uri": None,
                "text": None,
                "embedding_status": "ready",
                "embedding_error": None,
                "embedding_source": None,
                "updated_at": stmt.excluded.updated_at,
            },
        )
        for start in range(0, len(external_ids), _SQLITE_UPSERT_CHUNK):
            stop = min(start + _SQLITE_UPSERT_CHUNK, len(external_ids))
            self.session.execute(
                stmt,
                [
                    {
                        "pool_id": self.pool_id,
                        "external_id": external_ids[i],
                        "embedding": emb[i].tobytes(),
                        "status": "unlabeled",
                        "created_at": self.now,
                        "updated_at": self.now,
                    }
                    for i in range(start, stop)
                ],
            )
        return len(external_ids) - existing


@dataclass(frozen=True)
class ItemRow:
    internal_id: int
    external_id: str
    status: str  # effective status
    label: Any
    batch_id: str | None
    reserved_until: datetime | None
    labeled_at: datetime | None
    embedding: bytes | None
    data: dict[str, Any] | None = None


def set_data(session: Session, pool_id: str, values: Sequence[tuple[str, dict[str, Any]]], now: datetime) -> None:
    """Replace the ``data`` of existing items ``(external id, data)`` (items not given keep theirs)."""
    if not values:
        return
    table = ITEMS
    stmt = (
        update(table)
        .where(table.c.pool_id == pool_id, table.c.external_id == bindparam("ext"))
        .values(data=bindparam("new_data"), updated_at=now)
    )
    conn = session.connection()
    for chunk in _chunks(values, 1000):
        conn.execute(stmt, [{"ext": e, "new_data": d} for e, d in chunk])


def _item_columns(now: datetime, include_embedding: bool) -> list[Any]:
    cols: list[Any] = [
        Item.id.label("id"),
        Item.external_id.label("external_id"),
        effective_status(now).label("eff_status"),
        Item.label.label("label"),
        Item.batch_id.label("batch_id"),
        Item.reserved_until.label("reserved_until"),
        Item.labeled_at.label("labeled_at"),
        (Item.embedding if include_embedding else literal(None)).label("embedding"),
        Item.data.label("data"),
    ]
    return cols


def _to_item_row(row: Row[Any]) -> ItemRow:
    iid, ext, status, label, batch_id, until, labeled_at, emb, data = tuple(row)
    return ItemRow(
        internal_id=int(iid),
        external_id=ext,
        status=status,
        label=label,
        batch_id=batch_id,
        reserved_until=until if status == "reserved" else None,
        labeled_at=labeled_at,
        embedding=emb,
        data=data,
    )


def page_items(
    session: Session,
    pool_id: str,
    *,
    now: datetime,
    status: str | None = None,
    after: int | None = None,
    limit: int = 100,
    include_embedding: bool = False,
    embedding_status: str | None = None,
) -> list[ItemRow]:
    """Items of a pool in internal-id order, after internal id ``after``, at most ``limit``.

    Every page is an index range whatever the pool's size (keyset pagination): ``(pool_id, id)``,
    ``(pool_id, status, id)`` by status, the partial ``(pool_id, embedding_status, id)`` for items whose
    embedding is not ready. ``unlabeled`` is two ranges (stored unlabeled, and reserved with an ended
    reservation) merged by id, so a page never walks over the labeled rows between its items.
    """

    def arm(*conds: ColumnElement[bool]) -> Select[Any]:
        q = select(*_item_columns(now, include_embedding)).where(Item.pool_id == pool_id, *conds)
        if embedding_status is not None:
            q = q.where(Item.embedding_status == embedding_status)
            if embedding_status != "ready":  # lets the planner use the partial index of not-ready items
                q = q.where(Item.embedding_status != "ready")
        if after is not None:
            q = q.where(Item.id > after)
        return q.order_by(Item.id).limit(limit)

    if status == "unlabeled":
        both = union_all(
            select(arm(Item.status == "unlabeled").subquery()),
            select(arm(Item.status == "reserved", Item.reserved_until <= now).subquery()),
        ).subquery()
        rows = session.execute(select(both).order_by(both.c.id).limit(limit)).all()
    elif status is not None:
        rows = session.execute(arm(status_is(status, now))).all()
    else:
        rows = session.execute(arm()).all()
    return [_to_item_row(r) for r in rows]


def get_item(session: Session, pool_id: str, external_id: str, *, now: datetime) -> ItemRow | None:
    row = session.execute(
        select(*_item_columns(now, True)).where(Item.pool_id == pool_id, Item.external_id == external_id)
    ).one_or_none()
    return None if row is None else _to_item_row(row)


def set_labels(session: Session, values: Sequence[tuple[int, Any]], now: datetime) -> None:
    """Label items (internal id, value): status ``labeled``, reservation cleared, ``batch_id`` kept.

    The rows are locked in id order before they are written: two writes of the same items given in
    different orders then queue behind each other instead of deadlocking (an UPDATE ... FROM locks rows
    in whatever order its join produces them).
    """
    table = ITEMS
    values = sorted(values, key=lambda v: v[0])
    if session.get_bind().dialect.name == "postgresql":
        ids = [iid for iid, _ in values]
        session.execute(
            text("SELECT id FROM items WHERE id = ANY(CAST(:ids AS bigint[])) ORDER BY id FOR UPDATE"), {"ids": ids}
        )
        # One set-based statement over arrays instead of one UPDATE per item.
        session.execute(
            text(
                "UPDATE items SET label = v.label::json, status = 'labeled', labeled_at = :now, "
                "reserved_until = NULL, updated_at = :now "
                "FROM unnest(CAST(:ids AS bigint[]), CAST(:labels AS text[])) AS v(id, label) WHERE items.id = v.id"
            ),
            {"ids": ids, "labels": [json.dumps(v) for _, v in values], "now": now},
        )
        return
    for chunk in _chunks(values, _SQLITE_UPSERT_CHUNK):
        session.execute(
            table.update()
            .where(table.c.id == bindparam("b_id"))
            .values(
                label=bindparam("b_label", type_=table.c.label.type),
                status="labeled",
                labeled_at=now,
                reserved_until=None,
                updated_at=now,
            ),
            [{"b_id": iid, "b_label": value} for iid, value in chunk],
        )


def clear_label(session: Session, item_id: int, now: datetime) -> None:
    """Remove an item's current label: back to ``unlabeled`` (history is kept in ``labels``)."""
    table = ITEMS
    session.execute(
        table.update()
        .where(table.c.id == item_id)
        .values(label=null(), labeled_at=None, status="unlabeled", reserved_until=None, updated_at=now)
    )
