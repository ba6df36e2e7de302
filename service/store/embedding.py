"""Embedding repository: items given by reference (uri/text), embed jobs, uploaded encoder models.

An item given by reference is stored with ``embedding_status``: ``pending`` (to be encoded), ``ready``
(its embedding was computed by ``embedding_source``), or ``error`` (``embedding_error`` says why).
Only ``ready`` items with an embedding are ever loaded for selection (see
:func:`service.store.batches.iter_pool_rows`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Table, and_, delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from service.store import counts as counts_repo
from service.store.attempts import start_attempt, touch_attempt
from service.store.items import internal_ids
from service.store.models import EmbedJob, EncoderModel, Item, Pool

ITEMS = cast(Table, Item.__table__)
ACTIVE_JOB = ("queued", "running")
EMBEDDING_STATUSES = ("ready", "pending", "error")
_CHUNK = 2000


# ------------------------------------------------------------------------------------------ items


def upsert_references(
    session: Session,
    pool_id: str,
    external_ids: Sequence[str],
    uris: Sequence[str | None],
    texts: Sequence[str | None],
    now: datetime,
) -> tuple[int, int, int]:
    """Insert or update items given by reference; returns ``(created, updated, to_embed)``.

    A new or changed reference (or one in ``error``: re-sending it retries it) becomes ``pending`` with
    its old embedding dropped; re-sending an unchanged reference rewrites nothing. Status, label,
    reservation and history are kept, as for embedding upserts.
    """
    existing = len(internal_ids(session, pool_id, external_ids))
    dialect = session.get_bind().dialect.name
    insert = pg_insert if dialect == "postgresql" else sqlite_insert
    table = ITEMS
    to_embed = 0
    for start in range(0, len(external_ids), _CHUNK):
        stop = min(start + _CHUNK, len(external_ids))
        stmt = insert(table).values(
            [
                {
                    "pool_id": pool_id,
                    "external_id": external_ids[i],
                    "embedding": None,
                    "uri": uris[i],
                    "text": texts[i],
                    "status": "unlabeled",
                    "embedding_status": "pending",
                    "created_at": now,
                    "updated_at": now,
                }
                for i in range(start, stop)
            ]
        )
        excluded = stmt.excluded
        upsert = stmt.on_conflict_do_update(
            index_elements=[table.c.pool_id, table.c.external_id],
            set_={
                "uri": excluded.uri,
                "text": excluded.text,
                "embedding": None,
                "embedding_status": "pending",
                "embedding_error": None,
                "embedding_source": None,
                "updated_at": excluded.updated_at,
            },
            where=or_(
                table.c.uri.is_distinct_from(excluded.uri),
                table.c.text.is_distinct_from(excluded.text),
                table.c.embedding_status == "error",
            ),
        ).returning(table.c.id)
        to_embed += len(session.execute(upsert).all())
    return len(external_ids) - existing, existing, to_embed


def mark_pending(session: Session, pool_id: str, *, only_errors: bool, now: datetime) -> int:
    """Referenced items back to ``pending`` (all of them, or those in ``error``); returns how many."""
    cond = [Item.pool_id == pool_id, or_(Item.uri.is_not(None), Item.text.is_not(None))]
    if only_errors:
        cond.append(Item.embedding_status == "error")
    result = session.execute(
        update(Item)
        .where(*cond)
        .values(embedding_status="pending", embedding_error=None, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    return int(result.rowcount)  # type: ignore[attr-defined]


def count_embedding_status(session: Session, pool_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """``{pool_id: {"ready", "pending", "error"}}``, zeros included (``service.store.counts``)."""
    return counts_repo.by_embedding_status(session, pool_ids, EMBEDDING_STATUSES)


@dataclass(frozen=True)
class EmbeddingInfo:
    uri: str | None
    has_text: bool
    status: str
    error: str | None
    source: str | None


def embedding_info(session: Session, item_ids: Sequence[int]) -> dict[int, EmbeddingInfo]:
    """Reference and embedding state of some items (internal ids)."""
    out: dict[int, EmbeddingInfo] = {}
    for start in range(0, len(item_ids), _CHUNK):
        rows = session.execute(
            select(
                Item.id,
                Item.uri,
                Item.text.is_not(None),
                Item.embedding_status,
                Item.embedding_error,
                Item.embedding_source,
            ).where(Item.id.in_(list(item_ids[start : start + _CHUNK])))
        ).all()
        for iid, uri, has_text, status, error, source in rows:
            out[int(iid)] = EmbeddingInfo(uri, bool(has_text), status, error, source)
    return out


@dataclass(frozen=True)
class Reference:
    item_id: int
    external_id: str
    uri: str | None
    text: str | None


def references_to_embed(session: Session, pool_id: str, source: str) -> list[Reference]:
    """Items with a reference that are ``pending``, or ``ready`` from another encoder, in id order."""
    rows = session.execute(
        select(Item.id, Item.external_id, Item.uri, Item.text)
        .where(
            Item.pool_id == pool_id,
            or_(Item.uri.is_not(None), Item.text.is_not(None)),
            or_(
                Item.embedding_status == "pending",
                and_(Item.embedding_status == "ready", Item.embedding_source.is_distinct_from(source)),
            ),
        )
        .order_by(Item.id)
    ).all()
    return [Reference(int(r[0]), str(r[1]), r[2], r[3]) for r in rows]


def store_embeddings(
    session: Session,
    refs: Sequence[Reference],
    embeddings: Sequence[bytes | None],
    errors: Sequence[str | None],
    source: str,
    now: datetime,
) -> list[bool]:
    """Write each item's embedding (``ready``) or error; an item whose reference changed since it was
    read is left alone (a newer job encodes it). Returns, per item, whether it was written."""
    written: list[bool] = []
    for ref, emb, err in zip(refs, embeddings, errors, strict=True):
        values: dict[str, Any] = {"embedding_source": source, "updated_at": now}
        if err is None:
            values.update(embedding=emb, embedding_status="ready", embedding_error=None)
        else:
            values.update(embedding=None, embedding_status="error", embedding_error=err[:2000])
        result = session.execute(
            update(Item)
            .where(
                Item.id == ref.item_id,
                Item.uri.is_not_distinct_from(ref.uri),
                Item.text.is_not_distinct_from(ref.text),
            )
            .values(**values)
            .execution_options(synchronize_session=False)
        )
        written.append(int(result.rowcount) == 1)  # type: ignore[attr-defined]
    return written


# ------------------------------------------------------------------------------------- embed jobs


def add_job(session: Session, pool_id: str, now: datetime) -> EmbedJob:
    job = EmbedJob(pool_id=pool_id, status="queued", progress_stage="queued", created_at=now)
    session.add(job)
    session.flush()
    return job


def queued_job(session: Session, pool_id: str) -> EmbedJob | None:
    """The pool's embed job still waiting to start, if any (it will see every pending item)."""
    return (
        session.execute(
            select(EmbedJob)
            .where(EmbedJob.pool_id == pool_id, EmbedJob.status == "queued")
            .order_by(EmbedJob.created_at)
            .limit(1)
        )
        .scalars()
        .first()
    )


def get_job(session: Session, pool_id: str | None, job_id: str, *, for_update: bool = False) -> EmbedJob | None:
    stmt = select(EmbedJob).where(EmbedJob.id == job_id)
    if pool_id is not None:
        stmt = stmt.where(EmbedJob.pool_id == pool_id)
    if for_update:
        stmt = stmt.with_for_update()
    return session.execute(stmt).scalar_one_or_none()


def latest_job(session: Session, pool_id: str) -> EmbedJob | None:
    return (
        session.execute(
            select(EmbedJob).where(EmbedJob.pool_id == pool_id).order_by(EmbedJob.created_at.desc()).limit(1)
        )
        .scalars()
        .first()
    )


def list_jobs(session: Session, pool_id: str, limit: int) -> Sequence[EmbedJob]:
    return (
        session.execute(
            select(EmbedJob).where(EmbedJob.pool_id == pool_id).order_by(EmbedJob.created_at.desc()).limit(limit)
        )
        .scalars()
        .all()
    )


def start_job(session: Session, job_id: str, now: datetime) -> int | None:
    """``queued -> running``; the attempt number, or None if the job was not queued."""
    return start_attempt(session, EmbedJob, job_id, now)


def touch_job(
    session: Session, job_id: str, attempt: int, now: datetime, progress: tuple[str, int, int] | None = None
) -> bool:
    """Heartbeat (and progress) of a running embed-job attempt (see :func:`touch_attempt`)."""
    return touch_attempt(session, EmbedJob, job_id, attempt, now, progress)


def active_jobs(session: Session) -> Sequence[EmbedJob]:
    return session.execute(select(EmbedJob).where(EmbedJob.status.in_(ACTIVE_JOB)).with_for_update()).scalars().all()


# -------------------------------------------------------------------------------- encoder models


def add_encoder(session: Session, model: EncoderModel) -> EncoderModel:
    session.add(model)
    session.flush()
    return model


def get_encoder(session: Session, tenant_id: str, encoder_id: str) -> EncoderModel | None:
    return session.execute(
        select(EncoderModel).where(EncoderModel.id == encoder_id, EncoderModel.tenant_id == tenant_id)
    ).scalar_one_or_none()


def list_encoders(session: Session, tenant_id: str) -> Sequence[Any]:
    """Encoder rows without their bytes."""
    return session.execute(
        select(
            EncoderModel.id,
            EncoderModel.name,
            EncoderModel.kind,
            EncoderModel.config,
            EncoderModel.size_bytes,
            EncoderModel.sha256,
            EncoderModel.created_at,
        )
        .where(EncoderModel.tenant_id == tenant_id)
        .order_by(EncoderModel.created_at, EncoderModel.id)
    ).all()


def delete_encoder(session: Session, encoder_id: str) -> None:
    session.execute(delete(EncoderModel).where(EncoderModel.id == encoder_id))


def pools_using_encoder(session: Session, tenant_id: str, encoder_id: str) -> list[str]:
    pools = session.execute(select(Pool.id, Pool.encoder).where(Pool.tenant_id == tenant_id)).all()
    return [pid for pid, enc in pools if isinstance(enc, dict) and enc.get("model_id") == encoder_id]
