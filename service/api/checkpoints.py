"""Routes: checkpoints (trained heads, one per batch) and predictions from the latest one.

Predictions need the numerics, so they run as a job; the request waits for it up to
``sync_select_wait_seconds`` (503 when no worker answered in time).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import RequestModel
from service.config import Settings
from service.deps import SessionDep, TenantDep
from service.domain import checkpoints as domain
from service.errors import ERROR_RESPONSES
from service.queue import JobQueue

router = APIRouter(prefix="/v1/pools/{pool}", tags=["checkpoints"])


class CheckpointOut(BaseModel):
    id: str
    round: int = Field(description="1 for the pool's first checkpoint, then one more per batch")
    n_labels: int = Field(description="labeled items the head was trained on")
    metrics: dict[str, Any]
    head: dict[str, Any] = Field(description="the head's configuration")
    batch_id: str | None
    created_at: datetime


class CheckpointList(BaseModel):
    checkpoints: list[CheckpointOut]


class PredictionsIn(RequestModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{"item_ids": ["img-0001", "img-0002"]}]})

    item_ids: list[str] = Field(min_length=1, description="external ids of items of the pool")


class PredictionsOut(BaseModel):
    checkpoint_id: str
    round: int
    predictions: list[dict[str, Any]] = Field(
        description='classification: {"item_id", "probs": {class: p}, "label"}; regression: {"item_id", "target"}'
    )


@router.get("/checkpoints", response_model=CheckpointList, responses=ERROR_RESPONSES)
def list_checkpoints(
    pool: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> CheckpointList:
    """The pool's trained heads, newest round first (metadata and metrics; never the weights)."""
    rows = domain.list_checkpoints(session, tenant.id, pool, limit=limit)
    return CheckpointList(checkpoints=[CheckpointOut(**r) for r in rows])


@router.post("/predictions", response_model=PredictionsOut, responses=ERROR_RESPONSES)
def predictions(
    pool: str, body: PredictionsIn, request: Request, session: SessionDep, tenant: TenantDep
) -> PredictionsOut:
    """Class probabilities (or regression targets) of the given items from the latest checkpoint."""
    settings: Settings = request.app.state.settings
    queue: JobQueue = request.app.state.queue
    pool_id = domain.check_predictions(session, settings, tenant.id, pool, body.item_ids)
    session.rollback()  # end the read transaction: no connection sits idle in a transaction while we wait
    result = domain.run_predictions(queue, settings, pool_id, body.item_ids)
    return PredictionsOut(**result)
