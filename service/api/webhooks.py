"""Routes: outgoing webhooks of a pool (`/v1/pools/{pool}/webhooks`) and their delivery log.

Deliveries are signed; the format and how to verify it are in :mod:`service.domain.webhooks`:
``X-Bait-Signature: v1=<hex HMAC-SHA256(secret, "<X-Bait-Timestamp>." + body)>``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Response, status
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import RequestModel
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import webhooks as domain
from service.errors import ERROR_RESPONSES
from service.store.models import WebhookDelivery, WebhookEndpoint

router = APIRouter(prefix="/v1/pools/{pool}/webhooks", tags=["webhooks"])

Event = Literal["batch.succeeded", "batch.failed"]


class WebhookCreate(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"url": "https://hooks.example.com/bait", "events": ["batch.succeeded"]}]},
    )

    url: str = Field(description="http(s) URL that receives a signed POST per event")
    events: list[Event] = Field(default=["batch.succeeded", "batch.failed"], min_length=1)
    secret: str | None = Field(default=None, description="signing secret (16+ characters); generated when left out")


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    active: bool
    created_at: datetime


class WebhookCreated(WebhookOut):
    secret: str = Field(description="HMAC-SHA256 signing secret; shown only now")


class WebhookList(BaseModel):
    webhooks: list[WebhookOut]


class Attempt(BaseModel):
    at: datetime
    attempt: int
    status_code: int | None = Field(description="the receiver's HTTP status (null: no answer)")
    error: str | None
    seconds: float


class DeliveryOut(BaseModel):
    id: str
    event: str
    status: str = Field(description="pending | succeeded | failed")
    attempts: int
    next_attempt_at: datetime | None
    delivered_at: datetime | None
    created_at: datetime
    payload: dict[str, Any]
    log: list[Attempt]


class DeliveryList(BaseModel):
    deliveries: list[DeliveryOut]


def endpoint_out(row: WebhookEndpoint) -> dict[str, Any]:
    return {
        "id": row.id,
        "url": row.url,
        "events": list(row.events or []),
        "active": bool(row.active),
        "created_at": row.created_at,
    }


def delivery_out(row: WebhookDelivery) -> DeliveryOut:
    return DeliveryOut(
        id=row.id,
        event=row.event,
        status=row.status,
        attempts=row.attempts,
        next_attempt_at=row.next_attempt_at,
        delivered_at=row.delivered_at,
        created_at=row.created_at,
        payload=row.payload or {},
        log=[Attempt.model_validate(a) for a in row.log or []],
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=WebhookCreated, responses=ERROR_RESPONSES)
def create_webhook(
    pool: str, body: WebhookCreate, response: Response, session: SessionDep, settings: SettingsDep, tenant: TenantDep
) -> WebhookCreated:
    """Register a callback URL for batch events. Keep the returned `secret` to verify signatures."""
    req = domain.EndpointRequest(url=body.url, events=list(body.events), secret=body.secret)
    row, secret = domain.create_endpoint(session, settings, tenant.id, pool, req)
    response.headers["Location"] = f"/v1/pools/{pool}/webhooks/{row.id}"
    return WebhookCreated(**endpoint_out(row), secret=secret)


@router.get("", response_model=WebhookList, responses=ERROR_RESPONSES)
def list_webhooks(pool: str, session: SessionDep, tenant: TenantDep) -> WebhookList:
    return WebhookList(
        webhooks=[WebhookOut(**endpoint_out(r)) for r in domain.list_endpoints(session, tenant.id, pool)]
    )


@router.get("/{webhook_id}", response_model=WebhookOut, responses=ERROR_RESPONSES)
def get_webhook(pool: str, webhook_id: str, session: SessionDep, tenant: TenantDep) -> WebhookOut:
    return WebhookOut(**endpoint_out(domain.get_endpoint(session, tenant.id, pool, webhook_id)))


@router.delete("/{webhook_id}", status_code=status.HTTP_204_NO_CONTENT, responses=ERROR_RESPONSES)
def delete_webhook(pool: str, webhook_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    domain.delete_endpoint(session, tenant.id, pool, webhook_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{webhook_id}/deliveries", response_model=DeliveryList, responses=ERROR_RESPONSES)
def list_deliveries(
    pool: str,
    webhook_id: str,
    session: SessionDep,
    tenant: TenantDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> DeliveryList:
    """The endpoint's deliveries, newest first, with every attempt's status code."""
    rows = domain.list_deliveries(session, tenant.id, pool, webhook_id, limit=limit)
    return DeliveryList(deliveries=[delivery_out(r) for r in rows])
