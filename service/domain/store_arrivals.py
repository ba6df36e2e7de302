"""The pool store written as items arrive (issue 26): after a change to a pool's selectable rows commits (an
upload, an import, a split move, an encoder change, an embed job), a job writes the pool's new content version
to the pool store (:data:`service.catalog.WRITE_POOL_STORE`, one job id per pool: ``store-<pool id>``), so the
next batch on the cluster finds its version written. Only with ``BAIT_POOL_STORE_ON_ARRIVAL`` on
(:attr:`service.config.Settings.store_on_arrival`).

The job is submitted, never run inline: the request or the job that changed the rows does not wait for the store,
and a store that cannot be written fails the store job only, never the upload. A submission that fails is logged;
the next arrival, or the pool's next batch on the cluster, writes the version then.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.orm import Session

from service import catalog
from service.queue import JobQueue, enqueue_on_commit

log = logging.getLogger(__name__)


def job_id(pool_id: str) -> str:
    """The store job's id for a pool: one waiting per pool (a second arrival meanwhile joins it)."""
    return f"store-{pool_id}"


def write_on_commit(session: Session, queue: JobQueue | None, settings: Any, pool_id: str) -> bool:
    """Submit the pool's store write once ``session`` commits (nothing on rollback). Returns whether one was
    hooked (False with the setting off, or without a queue: logged)."""
    if not settings.store_on_arrival:
        return False
    if queue is None:
        log.warning("pool store: no job queue to write pool %s with; its next batch on the cluster writes it", pool_id)
        return False
    enqueue_on_commit(session, queue, catalog.WRITE_POOL_STORE, job_id(pool_id), pool_id=pool_id)
    return True


def write_now(queue: JobQueue | None, settings: Any, pool_id: str) -> bool:
    """Submit the pool's store write now (the change has committed already). A queue that cannot take it is
    logged, not raised: the change itself succeeded. Returns whether it was submitted."""
    if not settings.store_on_arrival:
        return False
    if queue is None:
        log.warning("pool store: no job queue to write pool %s with; its next batch on the cluster writes it", pool_id)
        return False
    try:
        queue.enqueue(catalog.WRITE_POOL_STORE, job_id(pool_id), pool_id=pool_id)
    except Exception:
        log.exception("pool store: could not submit the write of pool %s; its next arrival or batch writes it", pool_id)
        return False
    return True
