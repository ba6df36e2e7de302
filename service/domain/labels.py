"""Labels: write many at once (class name or target vector), delete one, read an item's history.

A label write sets the item's current label, marks it ``labeled`` and clears its reservation; the
``batch_id`` that selected it stays as provenance. Every write and deletion appends a history row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.domain import quality
from service.domain.items import check_ids, get_item
from service.errors import InvalidLabel, NotFound, TooManyItems, UnknownItem
from service.store import items as items_repo
from service.store import labels as labels_repo
from service.store.models import Label, Pool

_SHOWN = 10


@dataclass(frozen=True)
class LabelWrite:
    item_id: str
    label: str | None = None  # class name (classification)
    target: list[float] | None = None  # m values (regression)
    annotator: str | None = None


def _value(pool: Pool, w: LabelWrite) -> Any:
    """The stored value of one label, or InvalidLabel saying why it does not fit the pool."""
    if pool.task == "classification":
        if w.label is None:
            raise InvalidLabel(
                f"item {w.item_id!r}: pool {pool.name!r} is a classification pool: give `label` (a class name), "
                "not `target`",
                {"item_id": w.item_id, "classes": pool.classes},
            )
        return w.label
    if w.target is None:
        raise InvalidLabel(
            f"item {w.item_id!r}: pool {pool.name!r} is a regression pool: give `target` "
            f"({pool.n_outputs} numbers), not `label`",
            {"item_id": w.item_id},
        )
    if len(w.target) != pool.n_outputs:
        raise InvalidLabel(
            f"item {w.item_id!r}: target length: expected {pool.n_outputs}, got {len(w.target)}",
            {"item_id": w.item_id, "expected": pool.n_outputs, "got": len(w.target)},
        )
    if not all(math.isfinite(v) for v in w.target):
        raise InvalidLabel(
            f"item {w.item_id!r}: target values must be finite (no NaN or infinity)", {"item_id": w.item_id}
        )
    return [float(v) for v in w.target]


def put_labels(session: Session, pool: Pool, writes: list[LabelWrite], *, annotator: str | None, max_items: int) -> int:
    """Validate every label, then write them all; returns how many were written.

    Raises:
        TooManyItems, DuplicateId, InvalidLabel, UnknownItem: nothing is written.
    """
    if len(writes) > max_items:
        raise TooManyItems(
            f"{len(writes)} labels in one request; the limit is {max_items}", {"limit": max_items, "got": len(writes)}
        )
    ext_ids = [w.item_id for w in writes]
    check_ids(ext_ids, "item_id")
    values = [_value(pool, w) for w in writes]
    if pool.task == "classification":
        valid = set(pool.classes or [])
        unknown = sorted({v for v in values if v not in valid})
        if unknown:
            raise InvalidLabel(
                f"unknown class(es) {unknown[:_SHOWN]}; valid classes: {pool.classes}",
                {"unknown": unknown[:_SHOWN], "classes": pool.classes},
            )
    found = items_repo.internal_ids(session, pool.id, ext_ids)
    missing = [e for e in ext_ids if e not in found]
    if missing:
        raise UnknownItem(
            f"{len(missing)} item id(s) not in pool {pool.name!r}, e.g. {missing[0]!r}; upload the items first",
            {"missing": missing[:_SHOWN]},
        )
    quality.hold_out_incoming(session, pool, found)  # the pool's random validation hold-out, if any
    now = datetime.now(UTC)
    items_repo.set_labels(session, [(found[e], v) for e, v in zip(ext_ids, values, strict=True)], now)
    labels_repo.append_history(
        session,
        pool.id,
        [(found[w.item_id], v, w.annotator or annotator) for w, v in zip(writes, values, strict=True)],
        now,
    )
    return len(writes)


def delete_label(session: Session, pool: Pool, item_id: str, *, annotator: str | None = None) -> None:
    """Remove an item's label: it goes back to ``unlabeled``; history gets a ``deleted`` row."""
    row = get_item(session, pool, item_id)
    if row.status != "labeled":
        raise NotFound(f"item {item_id!r} has no label")
    now = datetime.now(UTC)
    items_repo.clear_label(session, row.internal_id, now)
    labels_repo.append_history(session, pool.id, [(row.internal_id, None, annotator)], now, deleted=True)


def label_history(session: Session, pool: Pool, item_id: str) -> list[Label]:
    row = get_item(session, pool, item_id)
    return list(labels_repo.history(session, row.internal_id))
