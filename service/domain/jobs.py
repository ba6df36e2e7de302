"""Recovery of jobs whose worker died: re-queue them (up to ``job_max_attempts``) or fail them.

A running batch whose heartbeat is older than ``job_stale_seconds`` was lost with its worker (a killed
process, a lost machine, an RQ timeout). Nothing of it was written: a batch's result and reservations
are committed in one transaction at its end. It is put back to ``queued`` and submitted again while it
has attempts left, else marked ``failed`` (and its reservations, if any, released).

Who calls it: the in-process runner at app start with ``assume_dead=True`` (any queued or running job
in the database belonged to a previous process); RQ workers at start and every
``sweep_interval_seconds``, where a queued job unknown to Redis (lost with Redis, or never submitted
because Redis was down at commit time) is also submitted again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.embedding import recover_embed_jobs
from service.queue import JobQueue, enqueue_on_commit
from service.store import batches as store

log = logging.getLogger(__name__)

RUN_BATCH = "worker.jobs.run_batch"
RUN_SELECT = "worker.jobs.run_select"


@dataclass
class Recovery:
    requeued: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    resubmitted: list[str] = field(default_factory=list)


def recover_jobs(factory: sessionmaker[Session], queue: JobQueue, settings: Settings, *, assume_dead: bool) -> Recovery:
    """Re-queue or fail dead batch and select jobs; resubmit queued jobs the queue does not know."""
    embed = recover_embed_jobs(factory, queue, settings, assume_dead=assume_dead)
    report = Recovery(requeued=embed.requeued, failed=embed.failed, resubmitted=embed.resubmitted)
    now = datetime.now(UTC)
    stale_before = now - timedelta(seconds=settings.job_stale_seconds)
    grace_before = now - timedelta(seconds=min(settings.job_stale_seconds, 60.0))
    with session_scope(factory) as session:
        for batch in store.active_batches(session):
            if batch.status == "queued":
                lost = assume_dead or (batch.created_at < grace_before and not queue.is_pending(batch.id))
                if lost:
                    enqueue_on_commit(session, queue, RUN_BATCH, batch.id, batch_id=batch.id)
                    report.resubmitted.append(batch.id)
                continue
            beat = batch.heartbeat_at or batch.started_at or batch.created_at
            if not (assume_dead or beat < stale_before):
                continue
            died = f"the worker running attempt {batch.attempts} stopped responding (heartbeat {beat.isoformat()})"
            if batch.attempts < settings.job_max_attempts:
                batch.status = "queued"
                batch.progress_stage = "queued"
                batch.progress_done = batch.progress_total = 0
                batch.error = f"re-queued: {died}"
                enqueue_on_commit(session, queue, RUN_BATCH, batch.id, replace=True, batch_id=batch.id)
                report.requeued.append(batch.id)
            else:
                batch.status = "failed"
                batch.error = f"{died}; gave up after {batch.attempts} attempt(s)"
                batch.finished_at = now
                store.release_reservations(session, batch.id, now)
                report.failed.append(batch.id)
        # A select job has no heartbeat: under RQ it is dead once older than the job timeout.
        timeout_before = now - timedelta(seconds=settings.job_timeout_seconds + settings.job_stale_seconds)
        for job in store.active_select_jobs(session):
            if job.status == "queued":
                if assume_dead or (job.created_at < grace_before and not queue.is_pending(job.id)):
                    enqueue_on_commit(session, queue, RUN_SELECT, job.id, job_id=job.id)
                    report.resubmitted.append(job.id)
                continue
            if assume_dead or (job.started_at or job.created_at) < timeout_before:
                if job.attempts < settings.job_max_attempts:
                    job.status = "queued"
                    enqueue_on_commit(session, queue, RUN_SELECT, job.id, replace=True, job_id=job.id)
                    report.requeued.append(job.id)
                else:
                    job.status = "failed"
                    job.error = f"the worker stopped responding; gave up after {job.attempts} attempt(s)"
                    job.finished_at = now
                    job.arrays = None
                    report.failed.append(job.id)
    if report.requeued or report.failed or report.resubmitted:
        log.warning(
            "job recovery: re-queued %s, failed %s, resubmitted %s", report.requeued, report.failed, report.resubmitted
        )
    return report
