"""Recovery of jobs whose worker died: re-queue them (up to ``job_max_attempts``) or fail them.

A running batch whose heartbeat is older than ``job_stale_seconds`` was lost with its worker (a killed
process, a lost machine, an RQ timeout). Nothing of it was written: a batch's result and reservations
are committed in one transaction at its end. It is put back to ``queued`` and submitted again while it
has attempts left, else marked ``failed`` (and its reservations, if any, released).

Who calls it: the in-process runner at app start with ``assume_dead=True`` (any queued or running job
in the database belonged to a previous process), then every ``sweep_interval_seconds``
(:class:`RecoveryTicker`: a job whose start or end met a database outage is picked up again); RQ
workers at start and every ``sweep_interval_seconds``, where a queued job unknown to Redis (lost with
Redis, or never submitted because Redis was down at commit time) is also submitted again.
"""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service import catalog
from service.config import Settings
from service.db import begin_write, run_transaction
from service.domain.embedding import recover_embed_jobs
from service.domain.imports import recover_import_jobs
from service.domain.recovery import JobKind, Recovery, lost_in_queue, sweep
from service.queue import JobQueue, enqueue_on_commit
from service.store import batches as store

log = logging.getLogger(__name__)


def _release(session: Session, batch: Any, now: datetime) -> None:
    store.release_reservations(session, batch.id, now)


BATCH = JobKind(catalog.RUN_BATCH, "batch_id", on_failed=_release)


def recover_jobs(factory: sessionmaker[Session], queue: JobQueue, settings: Settings, *, assume_dead: bool) -> Recovery:
    """Re-queue or fail dead batch, embed, import and select jobs; resubmit queued jobs the queue does not know."""

    def recover(session: Session) -> Recovery:
        begin_write(session)  # SQLite: the rows it reads stay as read until it commits
        report = Recovery()
        now = datetime.now(UTC)
        recover_embed_jobs(session, queue, settings, now, report, assume_dead=assume_dead)
        recover_import_jobs(session, queue, settings, now, report, assume_dead=assume_dead)
        sweep(session, store.active_batches(session), BATCH, queue, settings, now, report, assume_dead=assume_dead)
        _recover_select_jobs(session, queue, settings, now, report, assume_dead=assume_dead)
        return report

    # Two workers sweeping at once lock the same rows: the loser of a deadlock sweeps again.
    report = run_transaction(factory, recover)
    if report:
        log.warning(
            "job recovery: re-queued %s, failed %s, resubmitted %s", report.requeued, report.failed, report.resubmitted
        )
    return report


def _recover_select_jobs(
    session: Session, queue: JobQueue, settings: Settings, now: datetime, report: Recovery, *, assume_dead: bool
) -> None:
    """A select job has no heartbeat: under RQ it is dead once older than the job timeout."""
    timeout_before = now - timedelta(seconds=settings.job_timeout_seconds + settings.job_stale_seconds)
    for job in store.active_select_jobs(session):
        if job.status == "queued":
            if lost_in_queue(job, queue, settings, now, assume_dead=assume_dead):
                enqueue_on_commit(session, queue, catalog.RUN_SELECT, job.id, job_id=job.id)
                report.resubmitted.append(job.id)
            continue
        if assume_dead or (job.started_at or job.created_at) < timeout_before:
            if job.attempts < settings.job_max_attempts:
                job.status = "queued"
                enqueue_on_commit(session, queue, catalog.RUN_SELECT, job.id, replace=True, job_id=job.id)
                report.requeued.append(job.id)
            else:
                job.status = "failed"
                job.error = f"the worker stopped responding; gave up after {job.attempts} attempt(s)"
                job.finished_at = now
                job.arrays = None
                report.failed.append(job.id)


class RecoveryTicker:
    """:func:`recover_jobs` every ``sweep_interval_seconds`` from a daemon thread of the api process, for
    the in-process runner (RQ workers run their own sweep). A job that met a database outage as it
    started (its row still ``queued``, no longer waiting in the runner) or while it ran (a stale
    heartbeat) is submitted again once the database is back, instead of waiting for a restart."""

    def __init__(self, factory: sessionmaker[Session], queue: JobQueue, settings: Settings) -> None:
        self.factory = factory
        self.queue = queue
        self.settings = settings
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bait-job-recovery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.settings.sweep_interval_seconds):
            try:
                recover_jobs(self.factory, self.queue, self.settings, assume_dead=False)
            except Exception:  # the database may still be down: try again next tick
                log.warning("job recovery sweep failed; retrying in %.0f s", self.settings.sweep_interval_seconds)
