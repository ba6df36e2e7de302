"""Routes: Label Studio's ML-backend protocol, one base URL per integration.

Label Studio sends no bearer token to an ML backend, and the webhook it creates has no auth header, so
these routes authenticate by the integration's secret instead of an API key, in either of two forms:

- secret in the URL (paste it into Label Studio as is)::

      <service>/labelstudio/<integration id>/<secret>/{health,setup,predict,webhook}

- HTTP Basic (Label Studio's "Use basic authentication" option), password = the secret, any user name::

      <service>/labelstudio/<integration id>/{health,setup,predict,webhook}

  Label Studio's automatic webhook (created with the ML backend, at ``<backend url>/webhook``) carries no
  credentials in this mode: its events are accepted as hints, and the annotation is read back from Label
  Studio with the integration's API token before anything is written (no 401s, nothing trusted).

The secret is returned once, when the integration is created; only its SHA-256 is stored. A wrong id
or secret is a 401 with no hint which part is wrong. Serve the service over HTTPS when Label Studio
reaches it across a network: the secret travels in the URL or the header.

``/webhook`` answers 200 at once and queues the work (Label Studio waits one second and never retries);
labels lost with a webhook come back with the next reconcile. Events are applied once per (annotation id,
updated time), so a second webhook to the same URL is harmless.

``GET /labelstudio/content/<token>`` serves an item's ``file://`` content to Label Studio through a
signed, expiring link (see :mod:`service.domain.content`).
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import FileResponse
from pydantic import BaseModel, Field
from sqlalchemy.orm import Session

from service.deps import SessionDep, SettingsDep
from service.domain import content
from service.domain import integrations as domain
from service.domain.platforms import platform_for
from service.errors import ERROR_RESPONSES, BadRequest
from service.headers import CONTENT_CSP
from service.queue import JobQueue
from service.store.models import Integration

router = APIRouter(prefix="/labelstudio/{integration_id}", tags=["labelstudio ml backend"])


class Health(BaseModel):
    status: str = "UP"
    model_class: str = "bait-service"


class SetupOut(BaseModel):
    model_version: str = Field(description="the pool's latest checkpoint id, or `untrained`")


class PredictIn(BaseModel):
    tasks: list[dict[str, Any]] = Field(default_factory=list)
    project: str | None = None
    label_config: str | None = None
    params: dict[str, Any] | None = None


class Prediction(BaseModel):
    result: list[dict[str, Any]]
    score: float
    model_version: str


class PredictOut(BaseModel):
    results: list[Prediction] = Field(description="one prediction per task, in the order of `tasks`")


def _basic_secret(authorization: str | None) -> str | None:
    if not authorization or not authorization.lower().startswith("basic "):
        return None
    try:
        decoded = base64.b64decode(authorization[6:].strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.split(":", 1)[1] if ":" in decoded else None


def _queue(request: Request) -> JobQueue:
    q: JobQueue = request.app.state.queue
    return q


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = json.loads(await request.body() or b"{}")
    except ValueError as exc:
        raise BadRequest("the body must be JSON") from exc
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _health(session: Session, integration_id: str, secret: str | None) -> Health:
    domain.authenticate(session, integration_id, secret)
    return Health()


def _setup(session: Session, integration: Integration) -> SetupOut:
    return SetupOut(model_version=domain.model_version(session, integration))


# Label Studio's webhook payload (read by the route itself): {"action": "ANNOTATION_CREATED", "task": {...}, ...}.
_WEBHOOK_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {"type": "object", "additionalProperties": True},
                "example": {"action": "ANNOTATION_CREATED", "task": {"id": 1}, "annotation": {"id": 1, "result": []}},
            }
        },
    }
}


# -------------------------------------------------------------------------- secret in the URL


@router.get("/{secret}/health", response_model=Health, responses=ERROR_RESPONSES)
def health(integration_id: str, secret: str, session: SessionDep) -> Health:
    return _health(session, integration_id, secret)


@router.post("/{secret}/setup", response_model=SetupOut, responses=ERROR_RESPONSES)
def setup(integration_id: str, secret: str, session: SessionDep) -> SetupOut:
    return _setup(session, domain.authenticate(session, integration_id, secret))


@router.post("/{secret}/predict", response_model=PredictOut, responses=ERROR_RESPONSES)
def predict(
    integration_id: str, secret: str, body: PredictIn, request: Request, session: SessionDep, settings: SettingsDep
) -> PredictOut:
    integration = domain.authenticate(session, integration_id, secret)
    results = platform_for(integration.kind).predict(session, _queue(request), settings, integration, body.tasks)
    return PredictOut(results=[Prediction(**r) for r in results])


@router.post("/{secret}/webhook", responses=ERROR_RESPONSES, openapi_extra=_WEBHOOK_BODY_DOC)
async def webhook(integration_id: str, secret: str, request: Request) -> dict[str, Any]:
    return await _webhook(request, integration_id, secret)


# -------------------------------------------------------------------------- HTTP Basic


@router.get("/health", response_model=Health, responses=ERROR_RESPONSES)
def health_basic(
    integration_id: str, session: SessionDep, authorization: Annotated[str | None, Header()] = None
) -> Health:
    return _health(session, integration_id, _basic_secret(authorization))


@router.post("/setup", response_model=SetupOut, responses=ERROR_RESPONSES)
def setup_basic(
    integration_id: str, session: SessionDep, authorization: Annotated[str | None, Header()] = None
) -> SetupOut:
    return _setup(session, domain.authenticate(session, integration_id, _basic_secret(authorization)))


@router.post("/predict", response_model=PredictOut, responses=ERROR_RESPONSES)
def predict_basic(
    integration_id: str,
    body: PredictIn,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    authorization: Annotated[str | None, Header()] = None,
) -> PredictOut:
    integration = domain.authenticate(session, integration_id, _basic_secret(authorization))
    results = platform_for(integration.kind).predict(session, _queue(request), settings, integration, body.tasks)
    return PredictOut(results=[Prediction(**r) for r in results])


@router.post("/webhook", responses=ERROR_RESPONSES, openapi_extra=_WEBHOOK_BODY_DOC)
async def webhook_basic(
    integration_id: str, request: Request, authorization: Annotated[str | None, Header()] = None
) -> dict[str, Any]:
    """Basic mode. Label Studio's automatic webhook sends no credentials: such an event is taken as a hint
    only (the annotation is read back from Label Studio with our token); wrong credentials are a 401."""
    if authorization is None:
        return await _webhook(request, integration_id, None, verified=False)
    return await _webhook(request, integration_id, _basic_secret(authorization))


async def _webhook(
    request: Request, integration_id: str, secret: str | None, *, verified: bool = True
) -> dict[str, Any]:
    """Authenticate, queue the work, answer at once (the session commits before the response)."""
    payload = await _json_body(request)
    from starlette.concurrency import run_in_threadpool

    def handle() -> dict[str, Any]:
        session: Session = request.app.state.sessionmaker()
        try:
            if verified:
                integration = domain.authenticate(session, integration_id, secret)
            else:
                integration = domain.known_integration(session, integration_id)
            out = platform_for(integration.kind).handle_webhook(
                session,
                _queue(request),
                integration,
                payload,
                verified=verified,
                hint_interval_s=request.app.state.settings.labelstudio_hint_interval_seconds,
            )
            session.commit()
            return out
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    return await run_in_threadpool(handle)


content_router = APIRouter(tags=["labelstudio ml backend"])


@content_router.get("/labelstudio/content/{token}", responses=ERROR_RESPONSES, response_class=FileResponse)
def item_content(token: str, session: SessionDep, settings: SettingsDep) -> FileResponse:
    """An item's file behind a signed, expiring link put in a task: raster images and plain text inline,
    anything else as an attachment; sandboxed, never sniffed."""
    ref = content.verify(settings, token)
    path, media = content.resolve(session, settings, ref)
    headers = {
        "Cache-Control": "private, max-age=3600",
        "Content-Disposition": content.disposition(media, path.name),
        "Content-Security-Policy": CONTENT_CSP,
        "X-Content-Type-Options": "nosniff",
    }
    return FileResponse(path, media_type=media, headers=headers)
