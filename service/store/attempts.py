"""The attempt lifecycle shared by every job row (batches, embed jobs): start, heartbeat.

Both kinds of rows carry ``status``, ``attempts``, ``started_at``, ``heartbeat_at``, ``progress_*`` and
``error``; a worker owns a row only while ``status == "running"`` and ``attempts`` is its attempt, so a
worker presumed dead can never overwrite a newer attempt.

``attempt_history`` tells what happened to each attempt, for clients (GET batch) and operators::

    [{"n": 1, "started_at": "...", "ended_at": "...", "worker": "host:pid",
      "outcome": "worker_lost", "reason": "no heartbeat for 24 s"}, {"n": 2, ..., "outcome": "succeeded"}]

Outcomes: ``running`` (not ended yet), ``succeeded``, ``failed`` (reason: the error), ``cancelled``,
``worker_lost`` (its worker stopped sending heartbeats; reason: for how long).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.store.models import Batch, EmbedJob, ImportJob

JobModel = type[Batch] | type[EmbedJob] | type[ImportJob]


def worker_name() -> str:
    """Who runs an attempt, as the history shows it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def opened(history: Sequence[Any] | None, n: int, now: datetime, worker: str) -> list[Any]:
    """``history`` with attempt ``n`` added as ``running``."""
    entry = {"n": n, "started_at": now.isoformat(), "ended_at": None, "worker": worker, "outcome": "running"}
    return [*(history or []), {**entry, "reason": None}]


def closed(history: Sequence[Any] | None, n: int, outcome: str, reason: str | None, now: datetime) -> list[Any]:
    """``history`` (a new list) with attempt ``n`` ended: ``outcome`` and ``reason``, if it is still running."""
    out = [dict(e) for e in history or []]
    for entry in out:
        if entry.get("n") == n and entry.get("outcome") == "running":
            entry.update(ended_at=now.isoformat(), outcome=outcome, reason=reason)
    return out


def close_running(row: Any, outcome: str, reason: str | None, now: datetime) -> None:
    """End the row's current attempt in its history (ORM row: a batch or embed job loaded for update)."""
    row.attempt_history = closed(row.attempt_history, int(row.attempts), outcome, reason, now)


def start_attempt(
    session: Session, model: JobModel, row_id: str, now: datetime, worker: str | None = None
) -> int | None:
    """Move a ``queued`` row to ``running``; returns the attempt number, None if it was not queued
    (a duplicate delivery, or cancelled meanwhile). The attempt is added to the row's history."""
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
    # The UPDATE holds the row's lock until commit: this read-modify-write of the history is safe.
    attempt, history = session.execute(select(model.attempts, model.attempt_history).where(model.id == row_id)).one()
    session.execute(
        update(model)
        .where(model.id == row_id)
        .values(attempt_history=opened(history, int(attempt), now, worker or worker_name()))
        .execution_options(synchronize_session=False)
    )
    return int(attempt)


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


def write_if_running(session: Session, model: JobModel, row_id: str, attempt: int, values: dict[str, Any]) -> bool:
    """Write ``values`` of a running attempt that goes on (the attempt stays open in the history); False
    when the row is no longer this attempt's (cancelled, or taken over)."""
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


def finish_attempt(
    session: Session,
    model: JobModel,
    row_id: str,
    attempt: int,
    values: dict[str, Any],
    *,
    outcome: str,
    reason: str | None = None,
) -> bool:
    """Write a running attempt's final state (and its ``outcome`` in the history) in one conditional
    UPDATE; False (nothing written) when the row stopped being this attempt's meanwhile (cancelled, or
    taken over). The check and the write are one statement, so a cancellation committed after the job
    last looked can never be overwritten."""
    history = session.execute(
        select(model.attempt_history).where(model.id == row_id).with_for_update()
    ).scalar_one_or_none()
    now = values.get("finished_at") or datetime.now(UTC)
    values = {**values, "attempt_history": closed(history, attempt, outcome, reason, now)}
    return _update_if_running(session, model, row_id, attempt, values)
