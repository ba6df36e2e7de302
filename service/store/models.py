"""SQLAlchemy 2 typed models: the only description of the schema besides the Alembic migrations.

Tenancy: every pool belongs to a tenant; every query of a pool's rows goes through the pool, so a key
never reaches another tenant's data. Embeddings are float32 bytes (``numpy.tobytes``), never JSON.
Item status is stored: ``unlabeled`` | ``reserved`` | ``labeled``; a ``reserved`` item whose
``reserved_until`` has passed counts as unlabeled everywhere (see ``effective status`` in the
repositories) and is released lazily.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy import (
    text as sql_text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every backend (SQLite would otherwise return naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; use datetime.now(UTC)")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# BigInteger primary keys that autoincrement on SQLite too (SQLite only autoincrements INTEGER).
BigIntPK = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ApiKey(Base):
    """An API key: only its SHA-256 hash is stored; ``prefix`` identifies it in listings."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Space-separated scopes (service.scopes): read label select admin. Keys older than scopes have all.
    scopes: Mapped[str] = mapped_column(String(64), server_default="read label select admin")


class WebSession(Base):
    """A dashboard sign-in: the cookie carries a random token whose SHA-256 is ``token_hash``. Signing out,
    an admin ending it, the key's revocation, ``BAIT_SESSION_IDLE_SECONDS`` without a request or
    ``BAIT_SESSION_MAX_SECONDS`` since sign-in end it."""

    __tablename__ = "web_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"), index=True)
    csrf: Mapped[str] = mapped_column(String(64))
    user_agent: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_seen_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    ended_reason: Mapped[str | None] = mapped_column(String(32))  # logout | admin | revoked | idle | expired


class Pool(Base):
    __tablename__ = "pools"
    __table_args__ = (UniqueConstraint("tenant_id", "name"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    task: Mapped[str] = mapped_column(String(20))  # classification | regression
    classes: Mapped[list[Any] | None] = mapped_column(JSON)  # class names, classification
    n_outputs: Mapped[int] = mapped_column(Integer)  # len(classes) or m regression outputs
    embedding_dim: Mapped[int] = mapped_column(Integer)
    head: Mapped[dict[str, Any]] = mapped_column(JSON)  # {"kind": "linear"|"mlp", ...}
    encoder: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # data references (later)
    validation: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {"fraction", "seed"}: incoming labels held out
    # Bumped by the database (triggers, migration 0008) whenever an item's id, embedding, embedding status or
    # split changes, or an item is added or deleted: what a worker's pool cache is keyed by.
    content_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class Item(Base):
    __tablename__ = "items"
    __table_args__ = (
        UniqueConstraint("pool_id", "external_id"),
        # Keyset pages (ordered by id) are index ranges: all items, by stored status, not-ready embeddings.
        Index("ix_items_pool_id", "pool_id", "id"),
        Index("ix_items_pool_status_id", "pool_id", "status", "id"),
        Index(
            "ix_items_pool_embedding_status",
            "pool_id",
            "embedding_status",
            "id",
            postgresql_where=sql_text("embedding_status <> 'ready'"),
            sqlite_where=sql_text("embedding_status <> 'ready'"),
        ),
        Index("ix_items_batch", "batch_id"),
        Index("ix_items_pool_split", "pool_id", "split", "status"),
        Index("ix_items_pool_content_seq", "pool_id", "content_seq"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"))
    external_id: Mapped[str] = mapped_column(String(512))
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary)  # float32 little-endian, embedding_dim values
    uri: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16), default="unlabeled")  # unlabeled | reserved | labeled
    batch_id: Mapped[str | None] = mapped_column(ForeignKey("batches.id", ondelete="SET NULL"))
    reserved_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    text: Mapped[str | None] = mapped_column(Text)  # inline text for text encoders
    # Content shown to annotators (a JSON object: text, image URL, any fields the labeling tool shows).
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # Embedding lifecycle for items given by reference (uri/text): ready | pending | error.
    embedding_status: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready")
    embedding_error: Mapped[str | None] = mapped_column(Text)
    embedding_source: Mapped[str | None] = mapped_column(String(200))  # encoder name@version that produced it
    # train | validation: validation items are never selected, reserved or trained on; they score each head.
    split: Mapped[str] = mapped_column(String(16), default="train", server_default="train")
    label: Mapped[Any | None] = mapped_column(JSON)  # current label: class name (str) or target list
    labeled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    # The pool's content_version at which this row last changed (set by the database's triggers, never by code).
    content_seq: Mapped[int] = mapped_column(BigInteger, server_default="0")


class ItemTombstone(Base):
    """A deleted item of a pool that still exists, with the pool's content_version of its deletion (written by
    the database's delete trigger), so a worker's cache drops the row."""

    __tablename__ = "item_tombstones"
    __table_args__ = (Index("ix_item_tombstones_pool_seq", "pool_id", "seq"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(BigInteger)
    seq: Mapped[int] = mapped_column(BigInteger)


class Label(Base):
    """Label history: every write appends a row; a DELETE appends a row with ``deleted=1``."""

    __tablename__ = "labels"
    __table_args__ = (Index("ix_labels_item", "item_id", "id"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    value: Mapped[Any | None] = mapped_column(JSON)
    annotator: Mapped[str | None] = mapped_column(String(200))
    deleted: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class PoolItemCount(Base):
    """How many items of a pool have each ``(split, status, embedding_status)``: written only by the database's
    triggers on ``items`` (migration 0007), read through ``service.store.counts``. On PostgreSQL a key has
    several rows (signed deltas, summed by readers and folded now and then); on SQLite one."""

    __tablename__ = "pool_item_counts"
    __table_args__ = (Index("ix_pool_item_counts_key", "pool_id", "split", "status", "embedding_status"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"))
    split: Mapped[str] = mapped_column(String(16))
    status: Mapped[str] = mapped_column(String(16))
    embedding_status: Mapped[str] = mapped_column(String(16))
    n: Mapped[int] = mapped_column(BigInteger)


class Batch(Base):
    """A selection request and its job: status, progress, result."""

    __tablename__ = "batches"
    __table_args__ = (UniqueConstraint("pool_id", "idempotency_key"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    size: Mapped[int] = mapped_column(Integer)
    strategy: Mapped[str] = mapped_column(String(64))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued|running|succeeded|failed|cancelled
    progress_stage: Mapped[str | None] = mapped_column(String(64))
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    item_ids: Mapped[list[Any] | None] = mapped_column(JSON)  # ordered external ids
    objective: Mapped[float | None] = mapped_column(Float)
    diagnostics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    checkpoint_id: Mapped[str | None] = mapped_column(String(32))
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # [{"n", "started_at", "ended_at", "worker", "outcome", "reason"}] (service.store.attempts)
    attempt_history: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Checkpoint(Base):
    """A trained head: weights bytes (torch state dict), its config, the round and metrics."""

    __tablename__ = "checkpoints"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    batch_id: Mapped[str | None] = mapped_column(String(32))
    round: Mapped[int] = mapped_column(Integer)
    n_labels: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Scores of the head on the pool's labeled validation items ({"n", "metrics": {...}}); null without any.
    validation_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    weights: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CheckpointMap(Base):
    """A 2-D picture of the pool at a checkpoint: PCA of the head's penultimate features of at most
    ``map_max_points`` sampled items, with status and label; zlib-compressed JSON, served as is."""

    __tablename__ = "checkpoint_maps"

    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"), primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    n_points: Mapped[int] = mapped_column(Integer)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class CheckpointStop(Base):
    """The stopping rule at a checkpoint (``selection.stopping``): the head's predictions on the pool's stop
    set (npz bytes: internal item ``ids`` and ``pred``, class indices or targets; the set is chosen once per
    pool and carried from checkpoint to checkpoint), their ``agreement`` with the previous round's (kappa or
    R²; null when not compared), and the ``recommendation`` per validation metric."""

    __tablename__ = "checkpoint_stops"

    checkpoint_id: Mapped[str] = mapped_column(ForeignKey("checkpoints.id", ondelete="CASCADE"), primary_key=True)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    n_items: Mapped[int] = mapped_column(Integer)
    predictions: Mapped[bytes | None] = mapped_column(LargeBinary)
    agreement: Mapped[float | None] = mapped_column(Float)
    recommendation: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class SelectJob(Base):
    """A stateless POST /v1/select request: arrays in (npz bytes), indices out."""

    __tablename__ = "select_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    strategy: Mapped[str] = mapped_column(String(64))
    request: Mapped[dict[str, Any]] = mapped_column(JSON)  # batch_size, task, params, labeled, reserved
    arrays: Mapped[bytes | None] = mapped_column(LargeBinary)  # npz: embeddings, probs; dropped when done
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress_stage: Mapped[str | None] = mapped_column(String(64))
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class Integration(Base):
    """A pool's connection to an annotation platform (Label Studio). The API token is stored encrypted;
    ``secret_hash`` authenticates Label Studio's calls to the per-integration ML-backend URL."""

    __tablename__ = "integrations"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    kind: Mapped[str] = mapped_column(String(32))  # labelstudio
    url: Mapped[str] = mapped_column(Text)
    token_encrypted: Mapped[bytes] = mapped_column(LargeBinary)
    project_id: Mapped[int] = mapped_column(Integer)
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # id field, result mapping, options
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True)
    status: Mapped[str] = mapped_column(String(16), default="ok")  # ok | error
    last_error: Mapped[str | None] = mapped_column(Text)
    last_synced_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Sync state: adoption counts, unmatched annotations, a pending train request, the Data Manager view id.
    state: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)


class LabelStudioEvent(Base):
    """An annotation event already handled: (annotation id, its updated time) once per integration, so the
    same event delivered twice (two webhooks, a retry) is applied once."""

    __tablename__ = "labelstudio_events"
    __table_args__ = (UniqueConstraint("integration_id", "annotation_id", "updated_at"),)

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    integration_id: Mapped[str] = mapped_column(ForeignKey("integrations.id", ondelete="CASCADE"))
    annotation_id: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ReconcileRun(Base):
    """One reconcile of an integration (a readable job): status and written/removed/unmatched counts."""

    __tablename__ = "reconcile_runs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    integration_id: Mapped[str] = mapped_column(ForeignKey("integrations.id", ondelete="CASCADE"), index=True)
    trigger: Mapped[str] = mapped_column(String(32))  # api | connect | webhook | batch
    status: Mapped[str] = mapped_column(String(16), default="queued")  # queued | running | succeeded | failed
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class TaskLink(Base):
    """One item imported as one task of an integration's project (never imported twice)."""

    __tablename__ = "task_links"
    __table_args__ = (
        UniqueConstraint("integration_id", "item_id"),
        Index("ix_task_links_task", "integration_id", "task_id"),
    )

    id: Mapped[int] = mapped_column(BigIntPK, primary_key=True, autoincrement=True)
    integration_id: Mapped[str] = mapped_column(ForeignKey("integrations.id", ondelete="CASCADE"))
    item_id: Mapped[int] = mapped_column(ForeignKey("items.id", ondelete="CASCADE"))
    task_id: Mapped[int] = mapped_column(BigInteger)
    batch_id: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookEndpoint(Base):
    """An outgoing callback URL of a pool, with the secret its deliveries are signed with."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(Text)
    secret_encrypted: Mapped[bytes] = mapped_column(LargeBinary)
    events: Mapped[list[Any]] = mapped_column(JSON)  # e.g. ["batch.succeeded", "batch.failed"]
    active: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class WebhookDelivery(Base):
    """One event to one endpoint: retried with backoff, every attempt's outcome logged."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (Index("ix_webhook_deliveries_due", "status", "next_attempt_at"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True)
    event: Mapped[str] = mapped_column(String(64))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), default="pending")  # pending | succeeded | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    log: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [{"at", "status_code", "error", "seconds"}]
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class EncoderModel(Base):
    """A user-uploaded encoder (TorchScript module bytes), stored like checkpoints, size-limited."""

    __tablename__ = "encoder_models"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(32))  # torchscript
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # input layout, normalisation, output dim
    data: Mapped[bytes] = mapped_column(LargeBinary)
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class EmbedJob(Base):
    """Computing embeddings of a pool's referenced items (uri/text) with the pool's encoder."""

    __tablename__ = "embed_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress_stage: Mapped[str | None] = mapped_column(String(64))
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {"embedded", "errors", "skipped"}
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # [{"n", "started_at", "ended_at", "worker", "outcome", "reason"}] (service.store.attempts)
    attempt_history: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class ImportJob(Base):
    """Importing a Parquet dataset by reference (``POST /v1/pools/{pool}/items:import``): the rows are read
    by a worker from the tenant's data folder and written in one transaction at the end."""

    __tablename__ = "import_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    pool_id: Mapped[str] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    source: Mapped[str] = mapped_column(Text)  # the file:// URL as the client sent it
    status: Mapped[str] = mapped_column(String(16), default="queued")
    progress_stage: Mapped[str | None] = mapped_column(String(64))
    progress_done: Mapped[int] = mapped_column(Integer, default=0)
    progress_total: Mapped[int] = mapped_column(Integer, default=0)
    counts: Mapped[dict[str, Any] | None] = mapped_column(JSON)  # {"files", "rows", "created", "updated"}
    error: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    attempt_history: Mapped[list[Any] | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
