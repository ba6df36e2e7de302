"""Repository: Label Studio integrations, their task links, outgoing webhook endpoints and deliveries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from service.store.models import (
    Batch,
    Integration,
    Item,
    Label,
    LabelStudioEvent,
    ReconcileRun,
    TaskLink,
    WebhookDelivery,
    WebhookEndpoint,
)

# ------------------------------------------------------------------------------------------ integrations


def get_integration(session: Session, pool_id: str, integration_id: str) -> Integration | None:
    return session.execute(
        select(Integration).where(Integration.id == integration_id, Integration.pool_id == pool_id)
    ).scalar_one_or_none()


def get_integration_by_id(session: Session, integration_id: str, *, for_update: bool = False) -> Integration | None:
    stmt = select(Integration).where(Integration.id == integration_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def list_integrations(session: Session, pool_id: str) -> Sequence[Integration]:
    stmt = select(Integration).where(Integration.pool_id == pool_id).order_by(Integration.created_at, Integration.id)
    return session.execute(stmt).scalars().all()


def pool_integration_ids(session: Session, pool_id: str, kind: str | None = None) -> list[str]:
    """The pool's integrations (of one platform ``kind``, or of every platform), oldest first."""
    stmt = select(Integration.id).where(Integration.pool_id == pool_id)
    if kind is not None:
        stmt = stmt.where(Integration.kind == kind)
    return [str(i) for i in session.execute(stmt.order_by(Integration.created_at)).scalars()]


def lock_integration(session: Session, integration_id: str) -> Integration | None:
    """The integration, locked for the rest of the transaction (PostgreSQL: row lock; SQLite: a no-op
    UPDATE first takes the database's write lock, so what is read next is current)."""
    if session.get_bind().dialect.name == "sqlite":
        session.execute(
            update(Integration).where(Integration.id == integration_id).values(updated_at=Integration.updated_at)
        )
    return get_integration_by_id(session, integration_id, for_update=True)


def update_state(session: Session, integration_id: str, **changes: Any) -> dict[str, Any] | None:
    """Merge ``changes`` into the integration's state under its lock (None values delete a key); returns
    the new state (None: no such integration)."""
    row = lock_integration(session, integration_id)
    if row is None:
        return None
    state = dict(row.state or {})
    for k, v in changes.items():
        if v is None:
            state.pop(k, None)
        else:
            state[k] = v
    row.state = state
    return state


def data_keys(session: Session, pool_id: str, sample: int = 1000) -> set[str]:
    """The keys of item data in the pool (from up to ``sample`` items that carry data)."""
    rows = session.execute(
        select(Item.data).where(Item.pool_id == pool_id, Item.data.is_not(None)).order_by(Item.id).limit(sample)
    ).scalars()
    keys: set[str] = set()
    for d in rows:
        if isinstance(d, dict):
            keys.update(d)
    return keys


def queued_reconcile(session: Session, integration_id: str, since: datetime) -> ReconcileRun | None:
    """A run of the integration still waiting that was requested after ``since`` (older ones may have been
    lost with their job and are not reused)."""
    stmt = select(ReconcileRun).where(
        ReconcileRun.integration_id == integration_id,
        ReconcileRun.status == "queued",
        ReconcileRun.created_at > since,
    )
    return session.execute(stmt.order_by(ReconcileRun.created_at).limit(1)).scalar_one_or_none()


def active_reconcile(session: Session, integration_id: str, since: datetime) -> ReconcileRun | None:
    """A run of the integration queued or running, requested after ``since`` (older ones are presumed lost)."""
    stmt = select(ReconcileRun).where(
        ReconcileRun.integration_id == integration_id,
        ReconcileRun.status.in_(("queued", "running")),
        ReconcileRun.created_at > since,
    )
    return session.execute(stmt.order_by(ReconcileRun.created_at).limit(1)).scalar_one_or_none()


def latest_reconcile(session: Session, integration_id: str) -> ReconcileRun | None:
    stmt = select(ReconcileRun).where(ReconcileRun.integration_id == integration_id)
    return session.execute(stmt.order_by(ReconcileRun.created_at.desc()).limit(1)).scalar_one_or_none()


def prune_events(session: Session, integration_id: str, before: datetime) -> None:
    session.execute(
        delete(LabelStudioEvent).where(
            LabelStudioEvent.integration_id == integration_id, LabelStudioEvent.created_at < before
        )
    )


def get_reconcile(session: Session, integration_id: str, run_id: str) -> ReconcileRun | None:
    stmt = select(ReconcileRun).where(ReconcileRun.id == run_id, ReconcileRun.integration_id == integration_id)
    return session.execute(stmt).scalar_one_or_none()


def list_reconciles(session: Session, integration_id: str, limit: int) -> list[ReconcileRun]:
    """The integration's reconcile runs, newest first."""
    stmt = select(ReconcileRun).where(ReconcileRun.integration_id == integration_id)
    return list(session.execute(stmt.order_by(ReconcileRun.created_at.desc()).limit(limit)).scalars())


def seen_event(session: Session, integration_id: str, annotation_id: int, updated_at: str, now: datetime) -> bool:
    """Record an annotation event; True when it was recorded before (a duplicate)."""
    try:
        with session.begin_nested():
            session.add(
                LabelStudioEvent(
                    integration_id=integration_id, annotation_id=annotation_id, updated_at=updated_at, created_at=now
                )
            )
            session.flush()
    except IntegrityError:
        return True
    return False


def active_batches(session: Session, pool_id: str) -> int:
    stmt = (
        select(func.count()).select_from(Batch).where(Batch.pool_id == pool_id, Batch.status.in_(("queued", "running")))
    )
    return int(session.execute(stmt).scalar_one())


def latest_linked_batch(session: Session, integration_id: str) -> Batch | None:
    """The newest succeeded batch of the pool that was pushed to this integration's project."""
    stmt = (
        select(Batch)
        .join(TaskLink, TaskLink.batch_id == Batch.id)
        .where(TaskLink.integration_id == integration_id, Batch.status == "succeeded")
        .order_by(Batch.created_at.desc())
        .limit(1)
    )
    return session.execute(stmt).scalar_one_or_none()


def open_items_of_batch(session: Session, batch: Batch, now: datetime) -> int:
    """Items of the batch that are still reserved for it (not labeled, reservation not expired)."""
    stmt = (
        select(func.count())
        .select_from(Item)
        .where(
            Item.pool_id == batch.pool_id,
            Item.batch_id == batch.id,
            Item.status == "reserved",
            Item.reserved_until > now,
        )
    )
    return int(session.execute(stmt).scalar_one())


def labels_since(session: Session, pool_id: str, since: datetime) -> int:
    """Label writes (not deletions) of the pool after ``since``."""
    stmt = select(func.count(func.distinct(Label.item_id))).where(
        Label.pool_id == pool_id, Label.deleted == 0, Label.created_at > since
    )
    return int(session.execute(stmt).scalar_one())


def add(session: Session, row: Any) -> None:
    session.add(row)
    session.flush()


def delete_row(session: Session, row: Any) -> None:
    session.delete(row)
    session.flush()


# ------------------------------------------------------------------------------------------ task links


def linked_item_ids(session: Session, integration_id: str, item_ids: Sequence[int]) -> set[int]:
    if not item_ids:
        return set()
    stmt = select(TaskLink.item_id).where(TaskLink.integration_id == integration_id, TaskLink.item_id.in_(item_ids))
    return {int(i) for i in session.execute(stmt).scalars()}


def add_links(
    session: Session, integration_id: str, links: Sequence[tuple[int, int]], batch_id: str | None, now: datetime
) -> None:
    """Record ``(item_id, task_id)`` pairs (the unique (integration, item) constraint forbids duplicates)."""
    session.add_all(
        TaskLink(integration_id=integration_id, item_id=i, task_id=t, batch_id=batch_id, created_at=now)
        for i, t in links
    )
    session.flush()


def links(session: Session, integration_id: str) -> dict[int, tuple[int, str]]:
    """task id -> (item internal id, item external id) of every task linked to the integration."""
    stmt = (
        select(TaskLink.task_id, TaskLink.item_id, Item.external_id)
        .join(Item, Item.id == TaskLink.item_id)
        .where(TaskLink.integration_id == integration_id)
    )
    return {int(t): (int(i), str(e)) for t, i, e in session.execute(stmt)}


def link_for_task(session: Session, integration_id: str, task_id: int) -> tuple[int, str] | None:
    stmt = (
        select(TaskLink.item_id, Item.external_id)
        .join(Item, Item.id == TaskLink.item_id)
        .where(TaskLink.integration_id == integration_id, TaskLink.task_id == task_id)
    )
    row = session.execute(stmt).first()
    return None if row is None else (int(row[0]), str(row[1]))


def count_links(session: Session, integration_id: str) -> int:
    stmt = select(func.count()).select_from(TaskLink).where(TaskLink.integration_id == integration_id)
    return int(session.execute(stmt).scalar_one())


def items_of_batch(
    session: Session, pool_id: str, external_ids: Sequence[str]
) -> list[tuple[int, str, str | None, str | None, dict[str, Any] | None]]:
    """``(internal id, external id, text, uri, data)`` of the given external ids, in their order."""
    if not external_ids:
        return []
    rows = session.execute(
        select(Item.id, Item.external_id, Item.text, Item.uri, Item.data).where(
            Item.pool_id == pool_id, Item.external_id.in_(list(external_ids))
        )
    ).all()
    by_ext = {str(r[1]): (int(r[0]), str(r[1]), r[2], r[3], r[4]) for r in rows}
    return [by_ext[e] for e in external_ids if e in by_ext]


def item_ids_by_external(session: Session, pool_id: str, external_ids: Sequence[str]) -> dict[str, int]:
    if not external_ids:
        return {}
    stmt = select(Item.external_id, Item.id).where(Item.pool_id == pool_id, Item.external_id.in_(list(external_ids)))
    return {str(e): int(i) for e, i in session.execute(stmt)}


def current_labels(session: Session, item_ids: Sequence[int]) -> dict[int, tuple[str, Any]]:
    """item id -> (status, label) for the given items."""
    if not item_ids:
        return {}
    stmt = select(Item.id, Item.status, Item.label).where(Item.id.in_(list(item_ids)))
    return {int(i): (str(s), v) for i, s, v in session.execute(stmt)}


def last_annotators(session: Session, item_ids: Sequence[int]) -> dict[int, str | None]:
    """item id -> the annotator of its latest label history row."""
    if not item_ids:
        return {}
    latest = (
        select(Label.item_id, func.max(Label.id).label("mid"))
        .where(Label.item_id.in_(list(item_ids)))
        .group_by(Label.item_id)
        .subquery()
    )
    stmt = select(Label.item_id, Label.annotator).join(latest, Label.id == latest.c.mid)
    return {int(i): a for i, a in session.execute(stmt)}


# ------------------------------------------------------------------------------------------ webhooks


def get_endpoint(session: Session, pool_id: str, endpoint_id: str) -> WebhookEndpoint | None:
    return session.execute(
        select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.pool_id == pool_id)
    ).scalar_one_or_none()


def list_endpoints(session: Session, pool_id: str) -> Sequence[WebhookEndpoint]:
    stmt = select(WebhookEndpoint).where(WebhookEndpoint.pool_id == pool_id)
    return session.execute(stmt.order_by(WebhookEndpoint.created_at, WebhookEndpoint.id)).scalars().all()


def active_endpoints_for(session: Session, pool_id: str, event: str) -> list[WebhookEndpoint]:
    rows = session.execute(
        select(WebhookEndpoint).where(WebhookEndpoint.pool_id == pool_id, WebhookEndpoint.active == 1)
    ).scalars()
    return [e for e in rows if event in (e.events or [])]


def list_deliveries(session: Session, endpoint_id: str, *, limit: int) -> Sequence[WebhookDelivery]:
    stmt = (
        select(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id)
        .order_by(WebhookDelivery.created_at.desc(), WebhookDelivery.id)
        .limit(limit)
    )
    return session.execute(stmt).scalars().all()


def get_delivery(session: Session, delivery_id: str, *, for_update: bool = False) -> WebhookDelivery | None:
    stmt = select(WebhookDelivery).where(WebhookDelivery.id == delivery_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def due_deliveries(session: Session, now: datetime, limit: int = 100) -> list[str]:
    stmt = (
        select(WebhookDelivery.id)
        .where(WebhookDelivery.status == "pending", WebhookDelivery.next_attempt_at <= now)
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(limit)
    )
    return [str(i) for i in session.execute(stmt).scalars()]
