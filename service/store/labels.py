"""Label history repository: every write appends a row; a deletion appends a row with ``deleted=1``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, text
from sqlalchemy.orm import Session

from service.store.models import Label

_CHUNK = 5000


def append_history(
    session: Session,
    pool_id: str,
    rows: Sequence[tuple[int, Any, str | None]],
    now: datetime,
    *,
    deleted: bool = False,
) -> None:
    """Append one history row per ``(item id, value, annotator)``."""
    if session.get_bind().dialect.name == "postgresql":
        # One INSERT ... SELECT over arrays instead of a parameter set per row.
        session.execute(
            text(
                "INSERT INTO labels (pool_id, item_id, value, annotator, deleted, created_at) "
                "SELECT :pool_id, v.item_id, v.value::json, v.annotator, :deleted, :now FROM unnest("
                "CAST(:item_ids AS bigint[]), CAST(:values AS text[]), CAST(:annotators AS text[])"
                ") WITH ORDINALITY AS v(item_id, value, annotator, ord) ORDER BY v.ord"
            ),
            {
                "pool_id": pool_id,
                "item_ids": [r[0] for r in rows],
                "values": [json.dumps(r[1]) for r in rows],
                "annotators": [r[2] for r in rows],
                "deleted": int(deleted),
                "now": now,
            },
        )
        return
    for start in range(0, len(rows), _CHUNK):
        session.execute(
            insert(Label),
            [
                {
                    "pool_id": pool_id,
                    "item_id": item_id,
                    "value": value,
                    "annotator": annotator,
                    "deleted": int(deleted),
                    "created_at": now,
                }
                for item_id, value, annotator in rows[start : start + _CHUNK]
            ],
        )


def history(session: Session, item_id: int) -> Sequence[Label]:
    """An item's label writes, oldest first."""
    return session.execute(select(Label).where(Label.item_id == item_id).order_by(Label.id)).scalars().all()
