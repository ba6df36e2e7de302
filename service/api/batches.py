"""Routes: batches (`/v1/pools/{pool}/batches`). Parse, authorise, delegate to service.domain.batches.

The selection runs in a worker; ``POST`` answers 202 with the batch (``status: queued``) and a
``Location`` to poll. The job is submitted once the request's transaction has committed.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from service.api.schemas import Attempt, RequestModel
from service.deps import RetryOnConflict, SessionDep, TenantDep
from service.domain import batches as domain
from service.errors import ERROR_RESPONSES
from service.queue import JobQueue

router = APIRouter(prefix="/v1/pools/{pool}/batches", tags=["batches"], route_class=RetryOnConflict)

BatchStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


class BatchCreate(RequestModel):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"size": 20, "strategy": "bait", "params": {"seed": 0}}]}
    )

    size: StrictInt = Field(description="number of items to select (at most the unlabeled, unreserved count)")
    strategy: str = Field(default="bait", description="a strategy name; see GET /v1/strategies")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="strategy parameters, plus `seed`, `cold_start` and `exclude_outliers` (true: leave the picks "
        "the outlier rule flags out of the batch, which keeps its size; default true for strategy auto, false for "
        "the others)",
    )


class Progress(BaseModel):
    stage: str | None = Field(
        description="queued | reconcile | load | train | embed | select | store | push | done (reconcile and push: "
        "pools connected to Label Studio)"
    )
    done: int
    total: int


class BatchOut(BaseModel):
    id: str
    status: BatchStatus
    size: int
    strategy: str
    params: dict[str, Any]
    progress: Progress
    item_ids: list[str] | None = Field(description="selected external ids, in pick order (once succeeded)")
    outliers: list[str] | None = Field(
        default=None,
        description="the picks that lie far outside the pool's distribution (robust rule, see "
        "diagnostics.outliers and docs/auto-and-stopping.md); [] when none, null when not checked. "
        "params.exclude_outliers=true (the default of strategy auto) leaves them out of the batch",
    )
    objective: float | None
    diagnostics: dict[str, Any] = Field(
        description="timings per stage, the strategy's diagnostics, head metrics; `auto` (strategy auto: the arm "
        "chosen, the per-arm probabilities and the evidence), `outliers` (the rule's numbers and flagged items)"
    )
    checkpoint_id: str | None
    error: str | None
    delivery: Literal["pending", "delivered", "failed"] | None = Field(
        default=None,
        description="Label Studio push of a connected pool's batch (per project in diagnostics.labelstudio); "
        "failed: retry with POST .../delivery",
    )
    attempts: int
    attempt_history: list[Attempt] = Field(description="every attempt, oldest first, with its outcome")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class BatchList(BaseModel):
    batches: list[BatchOut]
    next_before: datetime | None = Field(description="pass as `before` for the next (older) page")


def queue_of(request: Request) -> JobQueue:
    q: JobQueue = request.app.state.queue
    return q


def location(pool: str, batch_id: str) -> str:
    return f"/v1/pools/{pool}/batches/{batch_id}"


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=BatchOut,
    responses={**ERROR_RESPONSES, 200: {"model": BatchOut, "description": "Same Idempotency-Key: the existing batch"}},
)
def create_batch(
    pool: str,
    body: BatchCreate,
    request: Request,
    response: Response,
    session: SessionDep,
    tenant: TenantDep,
    idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
) -> BatchOut:
    """Ask for the next `size` items to label. Answers 202 at once; poll the `Location` until
    `status` is `succeeded` (then `item_ids` holds the batch, reserved for you) or `failed`.

    Send an `Idempotency-Key` header to make retries safe: a repeated request returns the same batch.
    """
    req = domain.BatchRequest(size=body.size, strategy=body.strategy, params=body.params)
    batch, created = domain.create_batch(
        session, queue_of(request), tenant.id, pool, req, request.app.state.settings, idempotency_key
    )
    response.headers["Location"] = location(pool, batch.id)
    if not created:
        response.status_code = status.HTTP_200_OK
    return BatchOut.model_validate(domain.batch_view(batch))


@router.get("", response_model=BatchList, responses=ERROR_RESPONSES)
def list_batches(
    pool: str,
    session: SessionDep,
    tenant: TenantDep,
    status_: Annotated[BatchStatus | None, Query(alias="status")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    before: Annotated[datetime | None, Query(description="only batches created before this time")] = None,
) -> BatchList:
    """The pool's batches, newest first."""
    rows = domain.list_batches(session, tenant.id, pool, status=status_, limit=limit, before=before)
    out = [BatchOut.model_validate(domain.batch_view(b)) for b in rows]
    return BatchList(batches=out, next_before=out[-1].created_at if len(out) == limit else None)


@router.get("/{batch_id}", response_model=BatchOut, responses=ERROR_RESPONSES)
def get_batch(pool: str, batch_id: str, session: SessionDep, tenant: TenantDep) -> BatchOut:
    """A batch: status, progress, and once succeeded the selected item ids in pick order."""
    return BatchOut.model_validate(domain.batch_view(domain.get_batch(session, tenant.id, pool, batch_id)))


@router.post(
    "/{batch_id}/delivery", status_code=status.HTTP_202_ACCEPTED, response_model=BatchOut, responses=ERROR_RESPONSES
)
def retry_delivery(pool: str, batch_id: str, request: Request, session: SessionDep, tenant: TenantDep) -> BatchOut:
    """Push a succeeded batch into the pool's Label Studio projects again (items that already have a task
    are skipped); poll the batch until `delivery` is `delivered` or `failed`."""
    batch = domain.request_delivery(session, queue_of(request), tenant.id, pool, batch_id)
    return BatchOut.model_validate(domain.batch_view(batch))


@router.post("/{batch_id}/cancel", response_model=BatchOut, responses=ERROR_RESPONSES)
def cancel_batch(pool: str, batch_id: str, session: SessionDep, tenant: TenantDep) -> BatchOut:
    """Cancel a queued or running batch, or give back the items of a succeeded one: its reserved,
    still unlabeled items become selectable again. A running job stops at its next checkpoint."""
    return BatchOut.model_validate(domain.batch_view(domain.cancel_batch(session, tenant.id, pool, batch_id)))
