"""The attempt lifecycle shared by every job row (batches, embed jobs): start, heartbeat.

Both kinds of rows carry ``status``, ``attempts``, ``started_at``, ``heartbeat_at``, ``progress_*`` and
``error``; a worker owns a row only while ``status == "running"`` and ``attempts`` is its attempt, so a
worker presumed dead can never overwrite a newer attempt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.store.models import Batch, EmbedJob

JobModel = type[Batch] | type[EmbedJob]


def start_attempt(session: Session, model: JobModel, row_id: str, now: datetime) -> int | None:
    """Move a ``queued`` row to ``running``; returns the attempt number, None if it was not queued
    (a duplicate delivery, or cancelled meanwhile)."""
    result = session.execute(
        update(model)
        .where(model.id == row_id, model.status == "queued")
        .values(
            status="running",
            attempts=model.attempts + 1,
            started_at=now,
            heartbeat_at=now,
            progress_stage="load",
            progress_done=0,
            progress_total=0,
            error=None,
        )
        .execution_options(synchronize_session=False)
    )
    if int(result.rowcount) != 1:  # type: ignore[attr-defined]
        return None
    return int(session.execute(select(model.attempts).where(model.id == row_id)).scalar_one())


def touch_attempt(
    session: Session,
    model: JobModel,
    row_id: str,
    attempt: int,
    now: datetime,
    progress: tuple[str, int, int] | None = None,
) -> bool:
    """Heartbeat (and progress) of a running attempt; False when the row is no longer this attempt's to
    run (cancelled, or taken over after this worker was presumed dead)."""
    values: dict[str, Any] = {"heartbeat_at": now}
    if progress is not None:
        values.update(progress_stage=progress[0], progress_done=progress[1], progress_total=progress[2])
    return _update_if_running(session, model, row_id, attempt, values)


def _update_if_running(session: Session, model: JobModel, row_id: str, attempt: int, values: dict[str, Any]) -> bool:
    """One UPDATE of ``values`` that applies only while the row is still this attempt's running job."""
    result = session.execute(
        update(model)
        .where(model.id == row_id, model.status == "running", model.attempts == attempt)
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount) == 1  # type: ignore[attr-defined]


def finish_attempt(session: Session, model: JobModel, row_id: str, attempt: int, values: dict[str, Any]) -> bool:
    """Write a running attempt's final state in one conditional UPDATE; False (nothing written) when the
    row stopped being this attempt's meanwhile (cancelled, or taken over). The check and the write are
    one statement, so a cancellation committed after the job last looked can never be overwritten."""
    return _update_if_running(session, model, row_id, attempt, values)
