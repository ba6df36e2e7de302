"""The service's wire models (as in its OpenAPI at /docs). Unknown fields are kept, so a newer server
does not break an older client."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class PoolCounts(_Model):
    items: int = 0
    unlabeled: int = 0
    reserved: int = 0
    labeled: int = 0


class ValidationCounts(_Model):
    items: int = 0
    labeled: int = 0


class EmbeddingCounts(_Model):
    ready: int = 0
    pending: int = 0
    error: int = 0


class Pool(_Model):
    id: str
    name: str
    task: Literal["classification", "regression"]
    classes: list[str] | None = None
    n_outputs: int
    embedding_dim: int
    head: dict[str, Any] = Field(default_factory=dict)
    encoder: dict[str, Any] | None = None
    validation: dict[str, Any] | None = None
    counts: PoolCounts = Field(default_factory=PoolCounts)
    validation_counts: ValidationCounts = Field(default_factory=ValidationCounts)
    embedding_counts: EmbeddingCounts | None = None
    created_at: datetime


class UpsertResult(_Model):
    created: int
    updated: int
    embed_job_id: str | None = None


class Item(_Model):
    id: str
    status: Literal["unlabeled", "reserved", "labeled"]
    label: str | None = None
    target: list[float] | None = None
    batch_id: str | None = None
    reserved_until: datetime | None = None
    labeled_at: datetime | None = None
    embedding: list[float] | None = None
    uri: str | None = None
    split: Literal["train", "validation"] = "train"
    embedding_status: Literal["ready", "pending", "error"] | None = None
    embedding_error: str | None = None
    embedding_source: str | None = None
    data: dict[str, Any] | None = None


class ItemPage(_Model):
    items: list[Item]
    next_cursor: str | None = None


class LabelsResult(_Model):
    labeled: int


class SplitResult(_Model):
    moved: int


class LabelEvent(_Model):
    value: str | list[float] | None = None
    annotator: str | None = None
    deleted: bool = False
    created_at: datetime


class LabelHistory(_Model):
    item_id: str
    history: list[LabelEvent]


class Progress(_Model):
    stage: str | None = None
    done: int = 0
    total: int = 0


BatchStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class Attempt(_Model):
    n: int
    started_at: datetime
    ended_at: datetime | None = None
    worker: str | None = None
    outcome: str
    reason: str | None = None


class Batch(_Model):
    id: str
    status: BatchStatus
    size: int
    strategy: str
    params: dict[str, Any] = Field(default_factory=dict)
    progress: Progress = Field(default_factory=Progress)
    item_ids: list[str] | None = None
    objective: float | None = None
    diagnostics: dict[str, Any] = Field(default_factory=dict)
    checkpoint_id: str | None = None
    error: str | None = None
    delivery: Literal["pending", "delivered", "failed"] | None = Field(
        default=None, description="Label Studio push of a connected pool's batch"
    )
    attempts: int = 0
    attempt_history: list[Attempt] = Field(default_factory=list)
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


class BatchPage(_Model):
    batches: list[Batch]
    next_before: datetime | None = None


class Checkpoint(_Model):
    id: str
    round: int
    n_labels: int
    metrics: dict[str, Any] = Field(default_factory=dict)
    head: dict[str, Any] = Field(default_factory=dict)
    batch_id: str | None = None
    created_at: datetime


class Prediction(_Model):
    item_id: str
    probs: dict[str, float] | None = Field(default=None, description="classification")
    label: str | None = Field(default=None, description="classification: the most probable class")
    target: list[float] | None = Field(default=None, description="regression")


class Predictions(_Model):
    checkpoint_id: str
    round: int
    predictions: list[Prediction]


class Integration(_Model):
    id: str
    kind: str
    url: str
    project_id: int
    config: dict[str, Any] = Field(default_factory=dict)
    mapping: dict[str, Any] | None = None
    status: str
    last_error: str | None = None
    last_synced_at: datetime | None = None
    tasks_linked: int = 0
    adoption: dict[str, int] | None = None
    unmatched_annotations: int = 0
    created_at: datetime
    updated_at: datetime
    ml_backend_url: str | None = Field(default=None, description="only in the answer to connect")
    secret: str | None = Field(default=None, description="only in the answer to connect")


class Reconcile(_Model):
    id: str
    trigger: str
    status: Literal["queued", "running", "succeeded", "failed"]
    counts: dict[str, int] | None = None
    error: str | None = None
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed")


class SecretRotated(_Model):
    ml_backend_url: str
    secret: str


class Webhook(_Model):
    id: str
    url: str
    events: list[str]
    active: bool
    created_at: datetime
    secret: str | None = Field(default=None, description="only in the answer to create")


class DeliveryAttempt(_Model):
    at: datetime
    attempt: int
    status_code: int | None = None
    error: str | None = None
    seconds: float = 0.0


class Delivery(_Model):
    id: str
    event: str
    status: Literal["pending", "succeeded", "failed"]
    attempts: int
    next_attempt_at: datetime | None = None
    delivered_at: datetime | None = None
    created_at: datetime
    payload: dict[str, Any] = Field(default_factory=dict)
    log: list[DeliveryAttempt] = Field(default_factory=list)


class CurvePoint(_Model):
    round: int
    checkpoint_id: str
    n_labels: int
    n_validation: int = 0
    value: float | None = None
    validation: dict[str, Any] | None = None
    training: dict[str, Any] = Field(default_factory=dict)
    strategy: str | None = None
    previous_batch_id: str | None = None
    trained_for: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime


class Curve(_Model):
    pool_id: str
    task: str
    metric: str
    metrics: list[str] = Field(default_factory=list)
    points: list[CurvePoint] = Field(default_factory=list)


class PoolMap(_Model):
    """The 2-D map of a checkpoint: ``points`` as columns (id, x, y, status, label, predicted, confidence)."""

    checkpoint_id: str
    round: int
    points: Any = None
    total: int = 0
    n_points: int = 0


class Strategy(_Model):
    name: str
    tasks: list[str]
    summary: str = ""
    params: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Strategies(_Model):
    strategies: list[Strategy]
    cold_start: dict[str, Any] = Field(default_factory=dict)
    defaults: dict[str, Any] = Field(default_factory=dict, description="BAIT's default parameters and their rule")

    def names(self) -> list[str]:
        return [s.name for s in self.strategies]


class Selection(_Model):
    """A stateless selection (``POST /v1/select``): once ``succeeded``, ``indices`` are the picked rows."""

    id: str
    status: Literal["queued", "running", "succeeded", "failed"]
    strategy: str
    batch_size: int | None = None
    progress: dict[str, Any] = Field(default_factory=dict)
    indices: list[int] | None = None
    objective: float | None = None
    diagnostics: dict[str, Any] | None = None
    error: str | None = None
    error_type: str | None = None
    created_at: datetime
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed")


class Encoder(_Model):
    id: str
    name: str
    kind: str
    config: dict[str, Any] = Field(default_factory=dict)
    size_bytes: int
    sha256: str | None = None
    created_at: datetime


class _Job(_Model):
    """What every job the service runs for a pool has: status, progress, attempts and times."""

    id: str
    pool_id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: Progress = Field(default_factory=Progress)
    counts: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    attempts: int = 0
    attempt_history: list[Attempt] = Field(default_factory=list)
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


class EmbedJob(_Job):
    """An embed job (the service computes embeddings of the pool's items from their data)."""


class ImportJob(_Job):
    """An import by reference (``POST /v1/pools/{pool}/items:import``): a Parquet dataset under the tenant's
    data folder or an object-store prefix assigned to it, read and written by a worker; its rows appear all at
    once when it succeeds."""

    source: str
    rows_imported: int = 0


class Limits(_Model):
    """The service's size and rate limits (``GET /v1/limits``)."""

    max_json_bytes: int
    max_upload_bytes: int
    max_upload_inflated_bytes: int
    max_items_per_request: int
    max_item_data_bytes: int = 64 * 2**10
    max_select_inflated_bytes: int = 2**30
    sync_select_max_cells: int = 2_000_000
    max_encoder_bytes: int = 100 * 2**20
    rate_limit: str = ""
    rate_limit_expensive: str = ""
