"""Embedding items given by reference: upserts of uri/text items, embed jobs, encoder changes, recovery.

An embed job encodes every item of its pool that is ``pending`` (or ``ready`` from another encoder)
with the pool's encoder. One waits per pool at most: a request that needs one while one is queued
reuses it (it will see every pending item when it starts). Jobs start after the commit of the
transaction that made items pending: on upserts of uri/text items, on ``POST .../embed`` (which also
retries items in ``error``), and when the pool's encoder changes (everything is embedded again).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service import catalog
from service.config import Settings
from service.domain.encoders import accepts_text, check_pool_encoder
from service.domain.recovery import JobKind, Recovery, job_state, sweep
from service.errors import BadRequest, NotFound, TooManyItems
from service.queue import JobQueue, enqueue_on_commit
from service.store import embedding as repo
from service.store.models import EmbedJob, Pool
from service.urls import split_url

log = logging.getLogger(__name__)

URI_SCHEMES = ("file", "http", "https")


def utcnow() -> datetime:
    return datetime.now(UTC)


class InvalidReference(BadRequest):
    code = "invalid_reference"  # a uri of an unsupported scheme, text for a non-text encoder, no encoder


def check_references(pool: Pool, ids: Sequence[str], uris: Sequence[str | None], texts: Sequence[str | None]) -> None:
    """Refuse references the pool cannot encode, before anything is written."""
    if not pool.encoder:
        raise InvalidReference(
            "the pool has no encoder: items given by `uri` or `text` need one "
            '(PATCH /v1/pools/{pool} {"encoder": {"kind": ...}})'
        )
    if any(t is not None for t in texts) and not accepts_text(pool):
        first = next(i for i, t in zip(ids, texts, strict=True) if t is not None)
        raise InvalidReference(
            f"item {first!r}: inline `text` needs the text-minilm encoder; the pool's is {pool.encoder.get('kind')!r}"
        )
    for ext, uri in zip(ids, uris, strict=True):
        if uri is None:
            continue
        scheme = split_url(uri, f"item {ext!r} uri").scheme.lower()
        if scheme not in URI_SCHEMES:
            raise InvalidReference(
                f"item {ext!r}: unsupported uri scheme {scheme or '(none)'!r}; use file://, http:// or https://",
                {"id": ext},
            )


def upsert_references(
    session: Session,
    queue: JobQueue,
    pool: Pool,
    ids: Sequence[str],
    uris: Sequence[str | None],
    texts: Sequence[str | None],
    max_items: int,
) -> tuple[int, int, str | None]:
    """Upsert items given by reference and start an embed job when some need encoding.

    Returns:
        ``(created, updated, embed job id or None)``.
    """
    if len(ids) > max_items:
        raise TooManyItems(f"{len(ids)} items in one request; the limit is {max_items}", {"limit": max_items})
    check_references(pool, ids, uris, texts)
    created, updated, to_embed = repo.upsert_references(session, pool.id, ids, uris, texts, utcnow())
    job = start_job(session, queue, pool) if to_embed else None
    return created, updated, None if job is None else job.id


def start_job(session: Session, queue: JobQueue, pool: Pool) -> EmbedJob:
    """The pool's queued embed job, or a new one submitted on commit."""
    job = repo.queued_job(session, pool.id)
    if job is not None:
        return job
    job = repo.add_job(session, pool.id, utcnow())
    enqueue_on_commit(session, queue, catalog.RUN_EMBED, job.id, job_id=job.id)
    return job


def request_job(session: Session, queue: JobQueue, pool: Pool) -> EmbedJob:
    """``POST .../embed``: retry items in ``error`` and encode everything pending."""
    if not pool.encoder:
        raise InvalidReference("the pool has no encoder to embed with")
    repo.mark_pending(session, pool.id, only_errors=True, now=utcnow())
    return start_job(session, queue, pool)


def set_encoder(
    session: Session, queue: JobQueue, tenant_id: str, pool: Pool, config: dict[str, Any] | None
) -> EmbedJob | None:
    """Change the pool's encoder; every item given by reference is embedded again (a job is started
    when there are any). Unchanged config: nothing happens."""
    check_pool_encoder(session, tenant_id, config, int(pool.embedding_dim))
    if (pool.encoder or None) == (config or None):
        return None
    pool.encoder = config
    pool.updated_at = utcnow()
    n = repo.mark_pending(session, pool.id, only_errors=False, now=utcnow())
    if n and config:
        return start_job(session, queue, pool)
    return None


def get_job(session: Session, pool: Pool, job_id: str | None) -> EmbedJob:
    job = repo.latest_job(session, pool.id) if job_id is None else repo.get_job(session, pool.id, job_id)
    if job is None:
        raise NotFound("no embed job" if job_id is None else f"embed job {job_id!r} not found")
    return job


def list_jobs(session: Session, pool: Pool, limit: int) -> Sequence[EmbedJob]:
    return repo.list_jobs(session, pool.id, limit)


def job_view(job: EmbedJob) -> dict[str, Any]:
    return {"id": job.id, "pool_id": job.pool_id, **job_state(job), "counts": job.counts or {}}


EMBED_JOB = JobKind(catalog.RUN_EMBED, "job_id")


def recover_embed_jobs(
    session: Session, queue: JobQueue, settings: Settings, now: datetime, report: Recovery, *, assume_dead: bool
) -> None:
    """Re-queue (or fail, out of attempts) embed jobs whose worker died; resubmit lost queued ones.

    Same rules as for batches (:func:`service.domain.recovery.sweep`). What a dead job wrote stays (each
    chunk of items is committed with its embeddings); the next attempt encodes what is still pending.
    """
    sweep(session, repo.active_jobs(session), EMBED_JOB, queue, settings, now, report, assume_dead=assume_dead)
