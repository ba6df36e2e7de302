"""Routes: Label Studio integrations of a pool (`/v1/pools/{pool}/integrations`).

Connecting checks Label Studio right away (reachable, token accepted, project found, mapping fits its
labeling config) and answers 201 with the integration and, this once, its ML-backend URL (which holds
the secret). The API token is stored encrypted and never returned.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import RequestModel
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import integrations as domain
from service.domain.platforms import platform_for
from service.errors import ERROR_RESPONSES, ErrorBody
from service.labelstudio import IntegrationConfig
from service.queue import JobQueue

router = APIRouter(prefix="/v1/pools/{pool}/integrations", tags=["integrations"])

RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    502: {"model": ErrorBody, "description": "Label Studio could not be reached"},
}


class AutoBatch(RequestModel):
    size: int | None = Field(default=None, ge=1, le=1_000_000, description="batch size (default: batch_size)")
    when: Literal["batch_done", "every_n_labels"] = Field(
        default="batch_done",
        description="batch_done: once every item of the latest pushed batch is labeled; every_n_labels: once n "
        "labels arrived since it was created",
    )
    n: int | None = Field(default=None, ge=1, le=1_000_000, description="labels per batch with every_n_labels")
    stop_when_recommended: bool = Field(
        default=False,
        description="create no batch while the stopping rule recommends stopping (GET .../curve `stop`, on the "
        "pool's default metric); the integration's auto_batch_stopped then says why",
    )


class LabelStudioConnect(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"url": "http://127.0.0.1:8080", "token": "<label studio token>", "project_id": 1}]
        },
    )

    url: str = Field(description="Label Studio's base URL, e.g. http://127.0.0.1:8080")
    token: str = Field(min_length=1, description="a Label Studio API token (legacy token or personal access token)")
    project_id: int = Field(ge=1, description="the Label Studio project to import batches into")
    id_field: str = Field(default="item_id", min_length=1, description="task.data field carrying our item id")
    data_field: str = Field(
        default="text", min_length=1, description="task.data field that gets the item's text (or its uri)"
    )
    from_name: str | None = Field(
        default=None,
        description="the labeling config's control holding the label (<Choices> for classification; <Number>, "
        "<Rating> or <TextArea> for regression); default: the only control of a fitting type",
    )
    choice_map: dict[str, str] | None = Field(
        default=None, description="Label Studio choice -> class name, where they differ (default: same names)"
    )
    predictions: bool = Field(default=True, description="import the model's predictions as pre-annotations")
    batch_size: int = Field(default=10, ge=1, description="size of the batch a START_TRAINING webhook requests")
    strategy: str = Field(default="bait", description="strategy of the batch a START_TRAINING webhook requests")
    data_map: dict[str, str] | None = Field(
        default=None,
        description="item data key -> task data field, where they differ (default: task data = item data, same keys)",
    )
    auto_batch: AutoBatch | None = Field(
        default=None,
        description="when START_TRAINING (e.g. Label Studio's 'train on submission') creates a batch; default "
        '{"size": batch_size, "when": "batch_done"}; never while a batch of the pool is queued or running',
    )
    next_batch_view: bool = Field(
        default=True, description='keep a Data Manager view "bait: next batch" (the latest batch, unlabeled, by rank)'
    )
    verify: bool = Field(default=True, description="check Label Studio, the project and the mapping now (recommended)")


class IntegrationOut(BaseModel):
    id: str
    kind: str
    url: str
    project_id: int
    config: dict[str, Any] = Field(description="id_field, data_field, from_name, choice_map, predictions, ...")
    mapping: dict[str, Any] | None = Field(description="the control and value translation checked at connect time")
    status: str = Field(description="ok | error")
    last_error: str | None = Field(description="why the last import, reconcile or webhook failed")
    last_synced_at: datetime | None = Field(description="end of the last successful reconcile")
    tasks_linked: int = Field(description="items imported as tasks (or adopted) so far")
    adoption: dict[str, int] | None = Field(
        description="last reconcile: tasks of the project linked to items (linked), adopted now, carrying an unknown "
        "item id (unknown), or a further task of an item that already has one (ambiguous)"
    )
    unmatched_annotations: int = Field(
        description="annotations on tasks that match no item of the pool (they become no label)"
    )
    refused_hints: int = Field(
        default=0,
        description="delete events that came without credentials and were refused because a reconcile had run "
        "less than BAIT_LABELSTUDIO_HINT_INTERVAL_SECONDS before",
    )
    train_requested: bool = Field(description="a START_TRAINING waits for the auto_batch policy to allow a batch")
    auto_batch_stopped: dict[str, Any] | None = Field(
        default=None,
        description="with auto_batch.stop_when_recommended: why auto batches stopped ({reason, round, at}: the "
        "stopping rule's reason at that checkpoint round); null while they run",
    )
    created_at: datetime
    updated_at: datetime


class IntegrationCreated(IntegrationOut):
    ml_backend_url: str = Field(
        description="add this URL in Label Studio (Settings -> Model); it contains the integration's secret and is "
        "shown only now"
    )
    secret: str = Field(description="the secret in ml_backend_url, also the HTTP Basic password; shown only now")


class IntegrationConnected(IntegrationCreated):
    reconcile: ReconcileOut = Field(description="the first reconcile: adopts the project's existing tasks")


class SecretRotated(BaseModel):
    ml_backend_url: str = Field(description="the new ML-backend URL (update it in Label Studio); shown only now")
    secret: str = Field(description="the new secret (also the HTTP Basic password); the old one stops working now")


class IntegrationList(BaseModel):
    integrations: list[IntegrationOut]


class ReconcileOut(BaseModel):
    id: str
    trigger: str = Field(description="api | connect | webhook | batch")
    status: Literal["queued", "running", "succeeded", "failed"]
    counts: dict[str, int] | None = Field(
        description="tasks, written, removed, unchanged, adopted, unknown, ambiguous, unmatched"
    )
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ReconcileList(BaseModel):
    reconciles: list[ReconcileOut]


def queue_of(request: Request) -> JobQueue:
    q: JobQueue = request.app.state.queue
    return q


def public_base(request: Request, configured: str | None) -> str:
    return (configured or str(request.base_url)).rstrip("/")


@router.post(
    "/labelstudio", status_code=status.HTTP_201_CREATED, response_model=IntegrationConnected, responses=RESPONSES
)
def connect_labelstudio(
    pool: str,
    body: LabelStudioConnect,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
) -> IntegrationConnected:
    """Connect the pool to a Label Studio project: each batch is pushed as tasks showing the items'
    content, and annotations come back as labels (by Label Studio's webhook, and by reconcile). The
    project's existing tasks that carry one of the pool's item ids are adopted by a first reconcile."""
    config = IntegrationConfig(
        id_field=body.id_field,
        data_field=body.data_field,
        from_name=body.from_name,
        choice_map=body.choice_map,
        predictions=body.predictions,
        batch_size=body.batch_size,
        strategy=body.strategy,
        data_map=body.data_map,
        auto_batch=None if body.auto_batch is None else body.auto_batch.model_dump(exclude_none=True),
        next_batch_view=body.next_batch_view,
    )
    base = public_base(request, settings.public_url)
    req = domain.ConnectRequest(
        url=body.url, token=body.token, project_id=body.project_id, config=config, verify=body.verify, public_base=base
    )
    row, secret = domain.connect_labelstudio(session, settings, tenant.id, pool, req)
    run = domain.request_reconcile(session, queue_of(request), row, trigger="connect")
    response.headers["Location"] = f"/v1/pools/{pool}/integrations/{row.id}"
    return IntegrationConnected(
        **platform_for(row.kind).health(session, row),
        ml_backend_url=f"{base}/labelstudio/{row.id}/{secret}",
        secret=secret,
        reconcile=ReconcileOut(**domain.reconcile_view(run)),
    )


@router.get("", response_model=IntegrationList, responses=ERROR_RESPONSES)
def list_integrations(pool: str, session: SessionDep, tenant: TenantDep) -> IntegrationList:
    rows = domain.list_integrations(session, tenant.id, pool)
    return IntegrationList(integrations=[IntegrationOut(**platform_for(r.kind).health(session, r)) for r in rows])


@router.get("/{integration_id}", response_model=IntegrationOut, responses=ERROR_RESPONSES)
def get_integration(pool: str, integration_id: str, session: SessionDep, tenant: TenantDep) -> IntegrationOut:
    """The integration, with its status and the last error of an import, reconcile or webhook."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    return IntegrationOut(**platform_for(row.kind).health(session, row))


@router.delete("/{integration_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERROR_RESPONSES)
def delete_integration(pool: str, integration_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    domain.delete_integration(session, tenant.id, pool, integration_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{integration_id}/reconcile",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ReconcileOut,
    responses=ERROR_RESPONSES,
)
def reconcile(
    pool: str, integration_id: str, request: Request, response: Response, session: SessionDep, tenant: TenantDep
) -> ReconcileOut:
    """Read every annotation of the project back and make the pool's labels match (recovers lost webhooks,
    adopts tasks that carry item ids). Poll the `Location` for its status and counts."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    run = domain.request_reconcile(session, queue_of(request), row)
    response.headers["Location"] = f"/v1/pools/{pool}/integrations/{integration_id}/reconciles/{run.id}"
    return ReconcileOut(**domain.reconcile_view(run))


@router.get("/{integration_id}/reconciles", response_model=ReconcileList, responses=ERROR_RESPONSES)
def list_reconciles(
    pool: str,
    integration_id: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> ReconcileList:
    """The integration's reconciles, newest first (by the API, at connect, by webhooks and by batches)."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    return ReconcileList(
        reconciles=[ReconcileOut(**domain.reconcile_view(r)) for r in domain.list_reconciles(session, row, limit)]
    )


@router.get("/{integration_id}/reconciles/{run_id}", response_model=ReconcileOut, responses=ERROR_RESPONSES)
def get_reconcile(pool: str, integration_id: str, run_id: str, session: SessionDep, tenant: TenantDep) -> ReconcileOut:
    """A reconcile: status and counts (written, removed, adopted, unknown, ambiguous, unmatched)."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    return ReconcileOut(**domain.reconcile_view(domain.get_reconcile(session, row, run_id)))


@router.post("/{integration_id}/rotate-secret", response_model=SecretRotated, responses=ERROR_RESPONSES)
def rotate_secret(
    pool: str, integration_id: str, request: Request, session: SessionDep, settings: SettingsDep, tenant: TenantDep
) -> SecretRotated:
    """A new ML-backend secret; the old one stops working at once. In Label Studio, update the ML backend's
    URL (or its Basic password), and in URL-secret mode also the URL of the webhook Label Studio created
    for it (Settings -> Webhooks): Label Studio does not change that one by itself."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    secret = domain.rotate_secret(session, row)
    base = public_base(request, settings.public_url)
    return SecretRotated(ml_backend_url=f"{base}/labelstudio/{row.id}/{secret}", secret=secret)
