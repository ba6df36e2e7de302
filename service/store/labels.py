"""Label history repository: every write appends a row; a deletion appends a row with ``deleted=1``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select
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
