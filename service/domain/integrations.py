"""Label Studio integrations: connect a pool to a project, authenticate Label Studio's calls to our
ML-backend routes, answer /setup and /predict, and queue the work its webhooks announce.

Connecting checks everything before anything is stored: Label Studio is reachable, the token is
accepted, the project exists, and the mapping fits its labeling config (see
:func:`service.labelstudio.resolve_mapping`). The API token is stored Fernet-encrypted
(:mod:`service.crypto`) and never returned. A random secret is generated per integration; its SHA-256 is
stored and the secret is shown once, inside the ML-backend URL
``<public url>/labelstudio/<integration id>/<secret>`` (``rotate-secret`` makes a new one). A first
reconcile run is queued at connect: it adopts the project's tasks that carry item ids.

Webhook work is queued (Label Studio waits one second for an answer and never retries): annotation
created/updated events become a ``worker.annotation.apply_annotation`` job (applied once per annotation
id and updated time; an unauthenticated event is a hint read back from Label Studio), deletions a
reconcile run (``ANNOTATIONS_DELETED`` carries only annotation ids; reconcile reads the project back), and
``START_TRAINING`` a ``worker.annotation.train_requested`` job: the integration's ``auto_batch`` policy
(:mod:`service.domain.autobatch`) decides whether and when it becomes a batch.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from service import crypto
from service import labelstudio as lsmod
from service.catalog import APPLY_ANNOTATION, PREDICT, RECONCILE, TRAIN_REQUESTED
from service.config import Settings
from service.domain.autobatch import effective_auto_batch
from service.domain.pools import get_pool
from service.errors import BadRequest, NotFound, ServiceError, Unauthorized
from service.labelstudio import (
    IntegrationConfig,
    LabelStudioClient,
    LabelStudioError,
    Mapping,
    prediction_result,
    resolve_mapping,
)
from service.outbound import DestinationRefused, OutboundPolicy, check_destination
from service.queue import JobFailed, JobQueue, JobTimeout, enqueue_on_commit
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store.models import Integration, Pool, ReconcileRun
from service.urls import http_url

log = logging.getLogger(__name__)

ANNOTATION_EVENTS = ("ANNOTATION_CREATED", "ANNOTATION_UPDATED")
DELETE_EVENTS = ("ANNOTATION_DELETED", "ANNOTATIONS_DELETED")


class LabelStudioRejected(ServiceError):
    """Label Studio answered, but refused (token, project, mapping)."""

    status_code = 400
    code = "labelstudio_error"


class LabelStudioUnreachable(ServiceError):
    status_code = 502
    code = "labelstudio_unreachable"


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_service_error(exc: LabelStudioError) -> ServiceError:
    details = {"kind": exc.kind, "status_code": exc.status_code}
    if exc.kind == "refused":
        return DestinationRefused(exc.message, details)
    if exc.kind == "unreachable":
        return LabelStudioUnreachable(exc.message, details)
    return LabelStudioRejected(exc.message, details)


@dataclass(frozen=True)
class ConnectRequest:
    url: str
    token: str
    project_id: int
    config: IntegrationConfig
    verify: bool = True
    public_base: str | None = None  # this service's URL as Label Studio reaches it (for content links)


def check_project(
    settings: Settings,
    url: str,
    token: str,
    project_id: int,
    pool: Pool,
    config: IntegrationConfig,
    data_keys: set[str] | None = None,
) -> Mapping:
    """Reach Label Studio, read the project, and resolve the mapping against its labeling config.

    Raises:
        LabelStudioError: unreachable, token rejected, no such project, or a mapping that does not fit.
    """
    with LabelStudioClient.from_settings(url, token, settings) as ls:
        project = ls.project(project_id)
    label_config = str(project.get("label_config") or "")
    return resolve_mapping(pool.task, pool.classes, pool.n_outputs, config, label_config, data_keys)


def check_config(config: IntegrationConfig) -> dict[str, Any]:
    """Validate the integration options that Label Studio does not check; returns the effective auto_batch.

    Raises:
        BadRequest: saying which option is wrong and how.
    """
    if config.batch_size < 1:
        raise BadRequest("batch_size must be at least 1")
    for name, value in (("id_field", config.id_field), ("data_field", config.data_field)):
        if not value or len(value) > 200 or "\x00" in value:
            raise BadRequest(f"{name} must be a non-empty field name of at most 200 characters")
    dmap = config.data_map or {}
    if len(dmap) > 200:
        raise BadRequest("data_map: at most 200 renames")
    for k, v in dmap.items():
        if not k or not v or len(k) > 200 or len(v) > 200 or "\x00" in k + v:
            raise BadRequest("data_map: keys and values must be non-empty field names of at most 200 characters")
    targets = list(dmap.values())
    if len(set(targets)) != len(targets):
        raise BadRequest("data_map: two item data keys are renamed to the same task field")
    reserved = {config.id_field, lsmod.BATCH_FIELD, lsmod.RANK_FIELD}
    clash = sorted(reserved & set(targets))
    if clash:
        raise BadRequest(f"data_map: {clash} is reserved (our item id, batch id and rank go there)")
    return effective_auto_batch(config)


def connect_labelstudio(
    session: Session, settings: Settings, tenant_id: str, pool_id: str, req: ConnectRequest
) -> tuple[Integration, str]:
    """Create the integration; returns it and its ML-backend secret (shown once)."""
    pool = get_pool(session, tenant_id, pool_id)
    http_url(req.url, "Label Studio url")  # malformed, not http(s), no host: 400 invalid_url
    if not req.token:
        raise BadRequest("token must be a Label Studio API token")
    # Checked even when `verify` is off: workers would call this address later.
    check_destination(req.url, OutboundPolicy.from_settings(settings), "Label Studio url")
    auto_batch = check_config(req.config)
    stored = req.config.to_dict()
    stored["auto_batch"] = auto_batch
    stored["public_base"] = req.public_base
    if req.verify:
        keys = repo.data_keys(session, pool.id)
        try:
            mapping = check_project(settings, req.url, req.token, req.project_id, pool, req.config, keys)
        except LabelStudioError as exc:
            raise as_service_error(exc) from exc
        stored["mapping"] = mapping.to_dict()
    secret = crypto.new_secret()
    now = utcnow()
    row = Integration(
        pool_id=pool.id,
        kind="labelstudio",
        url=req.url.rstrip("/"),
        token_encrypted=crypto.encrypt(settings, req.token),
        project_id=req.project_id,
        config=stored,
        secret_hash=crypto.hash_secret(secret),
        status="ok",
        last_error=None,
        state={},
        created_at=now,
        updated_at=now,
    )
    repo.add(session, row)
    return row, secret


def rotate_secret(session: Session, integration: Integration) -> str:
    """A new ML-backend secret (the old one stops working at once); returns it (shown once)."""
    secret = crypto.new_secret()
    integration.secret_hash = crypto.hash_secret(secret)
    integration.updated_at = utcnow()
    session.flush()
    return secret


def get_integration(session: Session, tenant_id: str, pool_id: str, integration_id: str) -> Integration:
    pool = get_pool(session, tenant_id, pool_id)
    row = repo.get_integration(session, pool.id, integration_id)
    if row is None:
        raise NotFound(f"integration {integration_id!r} not found")
    return row


def list_integrations(session: Session, tenant_id: str, pool_id: str) -> list[Integration]:
    return list(repo.list_integrations(session, get_pool(session, tenant_id, pool_id).id))


def delete_integration(session: Session, tenant_id: str, pool_id: str, integration_id: str) -> None:
    """Disconnect (tasks already in Label Studio stay there; their links are forgotten)."""
    repo.delete_row(session, get_integration(session, tenant_id, pool_id, integration_id))


def request_reconcile(
    session: Session, queue: JobQueue, integration: Integration, trigger: str = "api"
) -> ReconcileRun:
    """A reconcile run of the integration, submitted after commit; one already waiting is reused."""
    waiting = repo.queued_reconcile(session, integration.id, utcnow() - timedelta(minutes=10))
    if waiting is not None:
        return waiting
    run = ReconcileRun(integration_id=integration.id, trigger=trigger, status="queued", created_at=utcnow())
    repo.add(session, run)
    enqueue_on_commit(session, queue, RECONCILE, run.id, run_id=run.id)
    return run


def _hinted_reconcile(session: Session, queue: JobQueue, integration: Integration, interval_s: float) -> dict[str, Any]:
    """A reconcile for a delete event that came without credentials: at most one queued or running per
    integration (the event joins it), and none started within ``interval_s`` of the previous one
    (the event is refused and counted in the integration's ``refused_hints``)."""
    repo.lock_integration(session, integration.id)  # concurrent hints of one integration take turns here
    now = utcnow()
    active = repo.active_reconcile(session, integration.id, now - timedelta(minutes=10))
    if active is not None:
        return {"status": "coalesced", "reconcile_id": active.id}
    last = repo.latest_reconcile(session, integration.id)
    if last is not None and (now - last.created_at).total_seconds() < interval_s:
        state = dict(integration.state or {})
        state["refused_hints"] = int(state.get("refused_hints") or 0) + 1
        state["last_refused_hint_at"] = now.isoformat()
        integration.state = state
        return {
            "status": "ignored",
            "reason": f"a reconcile ran {int((now - last.created_at).total_seconds())} s ago; unauthenticated "
            f"events start at most one every {interval_s:g} s",
        }
    run = request_reconcile(session, queue, integration, trigger="webhook-hint")
    return {"status": "queued", "reconcile_id": run.id}


def get_reconcile(session: Session, integration: Integration, run_id: str) -> ReconcileRun:
    run = repo.get_reconcile(session, integration.id, run_id)
    if run is None:
        raise NotFound(f"reconcile {run_id!r} not found")
    return run


def list_reconciles(session: Session, integration: Integration, limit: int) -> list[ReconcileRun]:
    return repo.list_reconciles(session, integration.id, limit)


def reconcile_view(run: ReconcileRun) -> dict[str, Any]:
    return {
        "id": run.id,
        "trigger": run.trigger,
        "status": run.status,
        "counts": run.counts,
        "error": run.error,
        "created_at": run.created_at,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
    }


def view(session: Session, integration: Integration) -> dict[str, Any]:
    config = dict(integration.config or {})
    mapping = config.pop("mapping", None)
    config.pop("public_base", None)
    state = dict(integration.state or {})
    return {
        "adoption": state.get("adoption"),
        "unmatched_annotations": int(state.get("unmatched_annotations") or 0),
        "refused_hints": int(state.get("refused_hints") or 0),
        "train_requested": state.get("train_requested_at") is not None,
        "auto_batch_stopped": state.get("auto_batch_stopped"),
        "id": integration.id,
        "kind": integration.kind,
        "url": integration.url,
        "project_id": integration.project_id,
        "config": config,
        "mapping": mapping,
        "status": integration.status,
        "last_error": integration.last_error,
        "last_synced_at": integration.last_synced_at,
        "tasks_linked": repo.count_links(session, integration.id),
        "created_at": integration.created_at,
        "updated_at": integration.updated_at,
    }


# ------------------------------------------------------------------------------------------ ML backend


def known_integration(session: Session, integration_id: str) -> Integration:
    """The integration (for an unauthenticated hint); Unauthorized when there is none."""
    row = repo.get_integration_by_id(session, integration_id)
    if row is None:
        raise Unauthorized("unknown integration or wrong secret in the ML-backend URL")
    return row


def authenticate(session: Session, integration_id: str, secret: str | None) -> Integration:
    """The integration whose id and secret match (Unauthorized otherwise; no hint which part is wrong)."""
    row = repo.get_integration_by_id(session, integration_id)
    if row is None or not secret or not crypto.secret_matches(secret, row.secret_hash):
        raise Unauthorized("unknown integration or wrong secret in the ML-backend URL")
    return row


def model_version(session: Session, integration: Integration) -> str:
    """The pool's latest checkpoint id, or ``untrained``."""
    return batches_repo.latest_checkpoint_id(session, integration.pool_id) or "untrained"


def _mapping(integration: Integration) -> Mapping | None:
    stored = (integration.config or {}).get("mapping")
    return Mapping.from_dict(stored) if stored else None


def predict(
    session: Session, queue: JobQueue, settings: Settings, integration: Integration, tasks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One prediction per task, in order: ``{"result", "score", "model_version"}`` (empty result for tasks
    that are not our items, or before the pool has a model)."""
    config = IntegrationConfig.from_dict(integration.config or {})
    mapping = _mapping(integration)
    version = model_version(session, integration)
    ext_ids = [str((t.get("data") or {}).get(config.id_field, "")) for t in tasks]
    empty = {"result": [], "score": 0.0, "model_version": version}
    if mapping is None or version == "untrained":
        return [dict(empty) for _ in tasks]
    known = batches_repo.items_by_external_id(session, integration.pool_id, [e for e in ext_ids if e])
    wanted = sorted({e for e in ext_ids if e in known and known[e][1] is not None})
    by_id: dict[str, dict[str, Any]] = {}
    if wanted:
        try:
            out = queue.call(
                PREDICT,
                f"predict-{uuid.uuid4().hex}",
                timeout=settings.sync_select_wait_seconds,
                pool_id=integration.pool_id,
                item_ids=wanted,
            )
        except (JobFailed, JobTimeout) as exc:
            log.warning("ML-backend predict of integration %s failed: %s", integration.id, exc)
            return [dict(empty) for _ in tasks]
        version = str(out.get("checkpoint_id") or version)
        by_id = {p["item_id"]: p for p in out.get("predictions", [])}
    results = []
    for ext in ext_ids:
        p = by_id.get(ext)
        if p is None:
            results.append({**empty, "model_version": version})
            continue
        if "probs" in p:
            score = float(max(p["probs"].values())) if p["probs"] else 0.0
            result = prediction_result(mapping, p.get("label"), None)
        else:
            score = 1.0
            result = prediction_result(mapping, None, p.get("target"))
        results.append({"result": result, "score": score, "model_version": version})
    return results


def handle_webhook(
    session: Session,
    queue: JobQueue,
    integration: Integration,
    payload: dict[str, Any],
    *,
    verified: bool = True,
    hint_interval_s: float = 60.0,
) -> dict[str, Any]:
    """Queue what a Label Studio webhook asks for; never raises for a payload we do not handle.

    ``verified`` is False for an event that came without credentials (Label Studio's automatic webhook
    in HTTP Basic mode sends none): it is only a hint, its content is not trusted. The job reads the
    annotation back from Label Studio with our token and applies what Label Studio says. A
    ``START_TRAINING`` (Label Studio sends it with the backend's credentials) must be verified.
    Duplicates (a second webhook, a retry) are dropped by the job: (annotation id, updated time) once.
    An unverified delete event coalesces (:func:`_hinted_reconcile`): anyone who knows an integration's
    id can send one, and each reconcile lists the whole Label Studio project with the tenant's token.
    """
    action = str(payload.get("action") or "")
    if action in ANNOTATION_EVENTS:
        annotation = payload.get("annotation") if isinstance(payload.get("annotation"), dict) else {}
        assert isinstance(annotation, dict)
        ann_id = annotation.get("id")
        if not isinstance(ann_id, int) or isinstance(ann_id, bool):
            return {"status": "ignored", "reason": "no annotation id in the payload"}
        if not verified:
            job_id = f"ls-hint-{integration.id}-{ann_id}"
            event: dict[str, Any] = {"action": action, "annotation_id": ann_id, "verify": True}
            enqueue_on_commit(session, queue, APPLY_ANNOTATION, job_id, integration_id=integration.id, event=event)
            return {"status": "queued", "job_id": job_id}
        task = payload.get("task") if isinstance(payload.get("task"), dict) else {}
        assert isinstance(task, dict)
        task_id = (
            annotation.get("task") if not isinstance(annotation.get("task"), dict) else annotation["task"].get("id")
        )
        task_id = task_id or task.get("id")
        if task_id is None:
            return {"status": "ignored", "reason": "no task id in the payload"}
        event = {
            "action": action,
            "task_id": int(task_id),
            "task_data": task.get("data") or {},
            "annotation": {
                k: annotation.get(k)
                for k in ("id", "result", "was_cancelled", "completed_by", "updated_at", "created_at")
            },
        }
        job_id = f"ls-event-{integration.id}-{uuid.uuid4().hex}"
        enqueue_on_commit(session, queue, APPLY_ANNOTATION, job_id, integration_id=integration.id, event=event)
        return {"status": "queued", "job_id": job_id}
    if action in DELETE_EVENTS:
        if not verified:
            return _hinted_reconcile(session, queue, integration, hint_interval_s)
        run = request_reconcile(session, queue, integration, trigger="webhook")
        return {"status": "queued", "reconcile_id": run.id}
    if action == "START_TRAINING":
        if not verified:
            return {"status": "ignored", "reason": "START_TRAINING without the backend's credentials"}
        job_id = f"ls-train-{integration.id}-{uuid.uuid4().hex}"
        enqueue_on_commit(session, queue, TRAIN_REQUESTED, job_id, integration_id=integration.id)
        return {"status": "queued", "job_id": job_id}
    return {"status": "ignored", "action": action}
