"""Routes: Label Studio integrations of a pool (`/v1/pools/{pool}/integrations`).

Connecting checks Label Studio right away (reachable, token accepted, project found, mapping fits its
labeling config) and answers 201 with the integration and, this once, its ML-backend URL (which holds
the secret). The API token is stored encrypted and never returned.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import RequestModel
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import integrations as domain
from service.errors import ERROR_RESPONSES, ErrorBody
from service.labelstudio import IntegrationConfig
from service.queue import JobQueue

router = APIRouter(prefix="/v1/pools/{pool}/integrations", tags=["integrations"])

RESPONSES: dict[int | str, dict[str, Any]] = {
    **ERROR_RESPONSES,
    502: {"model": ErrorBody, "description": "Label Studio could not be reached"},
}


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
    created_at: datetime
    updated_at: datetime


class IntegrationCreated(IntegrationOut):
    ml_backend_url: str = Field(
        description="add this URL in Label Studio (Settings -> Model); it contains the integration's secret and is "
        "shown only now"
    )
    secret: str = Field(description="the secret in ml_backend_url, also the HTTP Basic password; shown only now")


class IntegrationList(BaseModel):
    integrations: list[IntegrationOut]


class ReconcileQueued(BaseModel):
    job_id: str


def queue_of(request: Request) -> JobQueue:
    q: JobQueue = request.app.state.queue
    return q


def public_base(request: Request, configured: str | None) -> str:
    return (configured or str(request.base_url)).rstrip("/")


@router.post(
    "/labelstudio", status_code=status.HTTP_201_CREATED, response_model=IntegrationCreated, responses=RESPONSES
)
def connect_labelstudio(
    pool: str,
    body: LabelStudioConnect,
    request: Request,
    response: Response,
    session: SessionDep,
    settings: SettingsDep,
    tenant: TenantDep,
) -> IntegrationCreated:
    """Connect the pool to a Label Studio project: each succeeded batch is imported as tasks, and
    annotations come back as labels (by webhook, and by reconcile)."""
    config = IntegrationConfig(
        id_field=body.id_field,
        data_field=body.data_field,
        from_name=body.from_name,
        choice_map=body.choice_map,
        predictions=body.predictions,
        batch_size=body.batch_size,
        strategy=body.strategy,
    )
    req = domain.ConnectRequest(
        url=body.url, token=body.token, project_id=body.project_id, config=config, verify=body.verify
    )
    row, secret = domain.connect_labelstudio(session, settings, tenant.id, pool, req)
    response.headers["Location"] = f"/v1/pools/{pool}/integrations/{row.id}"
    base = public_base(request, settings.public_url)
    return IntegrationCreated(
        **domain.view(session, row), ml_backend_url=f"{base}/labelstudio/{row.id}/{secret}", secret=secret
    )


@router.get("", response_model=IntegrationList, responses=ERROR_RESPONSES)
def list_integrations(pool: str, session: SessionDep, tenant: TenantDep) -> IntegrationList:
    rows = domain.list_integrations(session, tenant.id, pool)
    return IntegrationList(integrations=[IntegrationOut(**domain.view(session, r)) for r in rows])


@router.get("/{integration_id}", response_model=IntegrationOut, responses=ERROR_RESPONSES)
def get_integration(pool: str, integration_id: str, session: SessionDep, tenant: TenantDep) -> IntegrationOut:
    """The integration, with its status and the last error of an import, reconcile or webhook."""
    return IntegrationOut(**domain.view(session, domain.get_integration(session, tenant.id, pool, integration_id)))


@router.delete("/{integration_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERROR_RESPONSES)
def delete_integration(pool: str, integration_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    domain.delete_integration(session, tenant.id, pool, integration_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post(
    "/{integration_id}/reconcile",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ReconcileQueued,
    responses=ERROR_RESPONSES,
)
def reconcile(
    pool: str, integration_id: str, request: Request, session: SessionDep, tenant: TenantDep
) -> ReconcileQueued:
    """Read every annotation of the project back and make the pool's labels match (recovers lost webhooks)."""
    row = domain.get_integration(session, tenant.id, pool, integration_id)
    return ReconcileQueued(job_id=domain.request_reconcile(session, queue_of(request), row))
