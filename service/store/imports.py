"""Import jobs (``import_jobs``): a Parquet dataset registered by reference, read and written by a worker."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.store.attempts import start_attempt, touch_attempt
from service.store.models import ImportJob

ACTIVE_JOB = ("queued", "running")


def add_job(session: Session, pool_id: str, source: str, now: datetime) -> ImportJob:
    job = ImportJob(pool_id=pool_id, source=source, status="queued", progress_stage="queued", created_at=now)
    session.add(job)
    session.flush()
    return job


def get_job(session: Session, pool_id: str | None, job_id: str, *, for_update: bool = False) -> ImportJob | None:
    stmt = select(ImportJob).where(ImportJob.id == job_id)
    if pool_id is not None:
        stmt = stmt.where(ImportJob.pool_id == pool_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def list_jobs(session: Session, pool_id: str, limit: int) -> Sequence[ImportJob]:
    return (
        session.execute(
            select(ImportJob).where(ImportJob.pool_id == pool_id).order_by(ImportJob.created_at.desc()).limit(limit)
        )
        .scalars()
        .all()
    )


def start_job(session: Session, job_id: str, now: datetime) -> int | None:
    """``queued -> running``; the attempt number, or None if the job was not queued."""
    return start_attempt(session, ImportJob, job_id, now)


def touch_job(
    session: Session, job_id: str, attempt: int, now: datetime, progress: tuple[str, int, int] | None = None
) -> bool:
    """Heartbeat (and progress) of a running import attempt (see :func:`touch_attempt`)."""
    return touch_attempt(session, ImportJob, job_id, attempt, now, progress)


def active_jobs(session: Session) -> Sequence[ImportJob]:
    return session.execute(select(ImportJob).where(ImportJob.status.in_(ACTIVE_JOB)).with_for_update()).scalars().all()
