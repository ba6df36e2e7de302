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


class Pool(_Model):
    id: str
    name: str
    task: Literal["classification", "regression"]
    classes: list[str] | None = None
    n_outputs: int
    embedding_dim: int
    head: dict[str, Any] = Field(default_factory=dict)
    encoder: dict[str, Any] | None = None
    counts: PoolCounts = Field(default_factory=PoolCounts)
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


class ItemPage(_Model):
    items: list[Item]
    next_cursor: str | None = None


class LabelsResult(_Model):
    labeled: int


class Progress(_Model):
    stage: str | None = None
    done: int = 0
    total: int = 0


BatchStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


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
    attempts: int = 0
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None

    @property
    def done(self) -> bool:
        return self.status in ("succeeded", "failed", "cancelled")


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
