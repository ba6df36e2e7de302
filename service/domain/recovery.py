"""The recovery sweep shared by every job row with attempts and a heartbeat (batches, embed jobs).

A running row whose heartbeat is older than ``job_stale_seconds`` was lost with its worker (a killed
process, a lost machine, an RQ timeout). It is put back to ``queued`` and submitted again while it has
attempts left, else marked ``failed``; either way its attempt ends in the history as ``worker_lost``
with the heartbeat gap as the reason. A queued row the queue does not know (lost with Redis, or never
submitted because Redis was down at commit time) is submitted again once older than a grace period.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service.config import Settings
from service.queue import JobQueue, enqueue_on_commit
from service.store.attempts import close_running


@dataclass
class Recovery:
    """What one sweep did: ids re-queued after their worker died, failed (out of attempts), resubmitted."""

    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resubmitted: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.requeued or self.failed or self.resubmitted)


def grace_cutoff(settings: Settings, now: datetime) -> datetime:
    """Queued rows created before this and unknown to the queue are submitted again."""
    return now - timedelta(seconds=min(settings.job_stale_seconds, 60.0))


def lost_in_queue(row: Any, queue: JobQueue, settings: Settings, now: datetime, *, assume_dead: bool) -> bool:
    """A queued row that no worker will ever pick up unless it is submitted again."""
    return assume_dead or (row.created_at < grace_cutoff(settings, now) and not queue.is_pending(row.id))


@dataclass(frozen=True)
class JobKind:
    """How to re-submit one kind of job row: its job function and the keyword that names the row."""

    func_path: str
    id_keyword: str  # enqueue keyword: the job id is the row id (rq's job_id), e.g. batch_id=...
    on_failed: Callable[[Session, Any, datetime], None] | None = None  # e.g. release a batch's reservations


def sweep(
    session: Session,
    rows: Sequence[Any],
    kind: JobKind,
    queue: JobQueue,
    settings: Settings,
    now: datetime,
    report: Recovery,
    *,
    assume_dead: bool,
) -> None:
    """Re-queue, fail or resubmit the dead or lost ``rows`` (queued or running, locked for update)."""
    stale_before = now - timedelta(seconds=settings.job_stale_seconds)
    for row in rows:
        if row.status == "queued":
            if lost_in_queue(row, queue, settings, now, assume_dead=assume_dead):
                enqueue_on_commit(session, queue, kind.func_path, row.id, **{kind.id_keyword: row.id})
                report.resubmitted.append(row.id)
            continue
        beat: datetime = row.heartbeat_at or row.started_at or row.created_at
        if not (assume_dead or beat < stale_before):
            continue
        if assume_dead:
            reason = "the process that ran it was restarted"
        else:
            reason = f"no heartbeat for {(now - beat).total_seconds():.0f} s"
        died = f"the worker running attempt {row.attempts} stopped responding ({reason})"
        close_running(row, "worker_lost", reason, now)
        if row.attempts < settings.job_max_attempts:
            row.status = "queued"
            row.progress_stage = "queued"
            row.progress_done = row.progress_total = 0
            row.error = f"re-queued: {died}"
            enqueue_on_commit(session, queue, kind.func_path, row.id, replace=True, **{kind.id_keyword: row.id})
            report.requeued.append(row.id)
        else:
            row.status = "failed"
            row.error = f"{died}; gave up after {row.attempts} attempt(s)"
            row.finished_at = now
            if kind.on_failed is not None:
                kind.on_failed(session, row, now)
            report.failed.append(row.id)


def job_state(job: Any) -> dict[str, Any]:
    """The fields every job view shares (embed and import jobs): status, ``progress {stage, done, total}``,
    error, attempts and their history, and the job's times."""
    return {
        "status": job.status,
        "progress": {"stage": job.progress_stage, "done": job.progress_done, "total": job.progress_total},
        "error": job.error,
        "attempts": job.attempts,
        "attempt_history": job.attempt_history or [],
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }
