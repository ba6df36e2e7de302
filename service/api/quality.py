"""Routes: the validation split (move items), the learning curve and the 2-D map of a pool."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import ExternalId
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import quality as domain
from service.domain import store_arrivals
from service.domain.pools import get_pool
from service.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/pools/{pool}", tags=["quality"])


class SplitMove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    item_ids: list[ExternalId] = Field(min_length=1, max_length=100_000, description="external ids of the pool")
    split: Literal["train", "validation"] = Field(
        description="validation: never selected, reserved or trained on (a live reservation is released); "
        "its labeled items score every head"
    )


class SplitResult(BaseModel):
    moved: int = Field(description="items whose split changed")


class CurvePoint(BaseModel):
    round: int
    checkpoint_id: str
    n_labels: int = Field(description="labeled training items the head was trained on")
    n_validation: int = Field(description="labeled validation items it was scored on")
    value: float | None = Field(description="the requested validation `metric` (null without validation items)")
    validation: dict[str, Any] | None = Field(
        description="classification: accuracy, macro_f1, log_loss, ece, per_class_recall; regression: rmse, mae, r2"
    )
    training: dict[str, Any] = Field(description="the head's metrics on its training labels")
    strategy: str = Field(description="strategy of the batch whose items were labeled before this round ('seed': none)")
    previous_batch_id: str | None
    trained_for: dict[str, Any] = Field(description="the batch whose job trained this head")
    created_at: datetime


class StopRecommendation(BaseModel):
    recommended: bool = Field(description="the stopping rule says the next labels are unlikely to help")
    reason: str = Field(description="one sentence: what the rule saw, or what it still needs")
    evidence: dict[str, Any] = Field(
        description="agreement {measure (kappa | r2), threshold, window, rounds_compared, recent, lowest, stable}, "
        "validation {metric, rounds_scored, n_labels, values, min_gain, flat}, expected_gain_next {labels, value, "
        "low, high, se, level} (metric units, positive = better; null until 3 rounds are scored), missing, "
        "checkpoint_id, round, stop_set {items, compared_with, items_compared}"
    )


class Curve(BaseModel):
    pool_id: str
    task: str
    metric: str
    metrics: list[str]
    points: list[CurvePoint]
    stop: StopRecommendation = Field(
        description="the stopping rule at the latest checkpoint for `metric` (docs: auto-and-stopping.md)"
    )


@router.patch("/items", response_model=SplitResult, responses=ERROR_RESPONSES)
def move_items(
    pool: str, body: SplitMove, request: Request, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> SplitResult:
    """Move items between the `train` and `validation` splits (labels and history stay)."""
    p = get_pool(session, tenant.id, pool)
    moved = domain.move_items(session, p, body.item_ids, body.split)
    if moved:
        store_arrivals.write_on_commit(session, request.app.state.queue, settings, p.id)
    return SplitResult(moved=moved)


@router.get("/curve", response_model=Curve, responses=ERROR_RESPONSES)
def curve(
    pool: str,
    session: SessionDep,
    tenant: TenantDep,
    metric: Annotated[
        str | None, Query(max_length=32, description="validation metric of `value` (default accuracy / rmse)")
    ] = None,
) -> Curve:
    """Validation metric vs number of training labels, one point per checkpoint (oldest first), with the
    strategy that chose the labels added before each round, and whether the stopping rule recommends to stop
    labeling (stable predictions on a fixed stop set and a flat validation curve)."""
    return Curve(**domain.curve(session, tenant.id, pool, metric))


@router.get(
    "/map",
    responses={
        **ERROR_RESPONSES,
        200: {
            "description": "`points` as columns: id, x, y, status (selected | labeled | reserved | unlabeled | "
            "validation), label, predicted, confidence; `total` items in the pool, `n_points` drawn (at most 20,000)",
            "content": {"application/json": {}},
        },
    },
)
def pool_map(
    pool: str,
    session: SessionDep,
    tenant: TenantDep,
    checkpoint_id: Annotated[str | None, Query(max_length=32, description="default: the latest checkpoint")] = None,
) -> Response:
    """The 2-D map of a checkpoint: PCA of the head's penultimate features of a sample of the pool
    (computed by the worker that trained the head; items of that batch have status `selected`)."""
    return Response(domain.map_json(session, tenant.id, pool, checkpoint_id), media_type="application/json")
