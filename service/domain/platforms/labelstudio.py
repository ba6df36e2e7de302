"""Label Studio, the first annotation platform (:class:`LabelStudioPlatform`).

- :func:`import_batch` (``push_batch``): the batch's items that have no task yet in the project become
  tasks; task data comes from the item's content (:func:`service.labelstudio.build_task_data`: item
  ``data`` keys, renamed by ``data_map``, the item's text or uri in ``data_field``, our id in ``id_field``,
  ``file://`` content as a signed URL of ours) plus ``bait_batch`` and ``bait_rank``; the pool model's
  prediction rides along as a pre-annotation. A :class:`~service.store.models.TaskLink` per task (unique
  per integration and item) makes re-imports no-ops. Then the Data Manager view "bait: next batch" is
  pointed at the batch.
- :func:`reconcile`: reads every task of the project with its annotations and makes our labels match;
  tasks carrying one of our item ids but no link (tasks the user imported, or links lost) are adopted, so
  nothing is imported twice; annotations on tasks we cannot match are counted (``unmatched_annotations``
  on the integration).
- :func:`apply_annotation` (``apply_event``): an ``ANNOTATION_CREATED``/``UPDATED`` webhook (once per
  annotation id and updated time); an unauthenticated hint is read back from Label Studio first.
- The web side (connect, the ML backend's ``/predict``, webhook intake, the integration's view) is in
  :mod:`service.domain.integrations`; the platform object hands those on.

Failures (unreachable, token rejected, mapping that no longer fits) are written to the integration
(``status: error``, ``last_error``) and, for an import, to the batch (``error`` and
``diagnostics.labelstudio``), never dropped silently. All HTTP goes through
:class:`service.labelstudio.LabelStudioClient` with timeouts.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service import crypto
from service.config import Settings
from service.db import session_scope
from service.domain import content
from service.domain import integrations as web
from service.domain.labels import LabelWrite, delete_label, put_labels
from service.domain.platforms.base import AnnotationPlatform, PlatformEnv
from service.errors import ServiceError
from service.labelstudio import (
    BATCH_FIELD,
    RANK_FIELD,
    IntegrationConfig,
    LabelStudioClient,
    LabelStudioError,
    LabelValue,
    Mapping,
    MappingError,
    annotator_of,
    build_task_data,
    latest_annotation,
    prediction_result,
    resolve_mapping,
    result_to_label,
    shown_fields,
)
from service.queue import JobQueue
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store.models import Batch, Integration, Pool

log = logging.getLogger(__name__)

IMPORT_CHUNK = 500
EVENT_MEMORY = timedelta(days=30)  # how long an applied annotation event is remembered (duplicates)


def utcnow() -> datetime:
    return datetime.now(UTC)


class LabelStudioPlatform(AnnotationPlatform):
    """Label Studio as an annotation platform: tasks in a project, its ML-backend protocol, its webhooks."""

    kind = "labelstudio"
    title = "Label Studio"

    def push_batch(self, env: PlatformEnv, integration_id: str, batch_id: str) -> bool:
        return import_batch(env, integration_id, batch_id)

    def reconcile(
        self, env: PlatformEnv, integration_id: str, *, deadline: float | None = None, raise_errors: bool = False
    ) -> dict[str, int] | None:
        return reconcile(env, integration_id, deadline=deadline, raise_errors=raise_errors)

    def apply_event(self, env: PlatformEnv, integration_id: str, event: dict[str, Any]) -> str:
        return apply_annotation(env, integration_id, event)

    def handle_webhook(
        self,
        session: Session,
        queue: JobQueue,
        integration: Integration,
        payload: dict[str, Any],
        *,
        verified: bool,
        hint_interval_s: float = 60.0,
    ) -> dict[str, Any]:
        return web.handle_webhook(
            session, queue, integration, payload, verified=verified, hint_interval_s=hint_interval_s
        )

    def predict(
        self,
        session: Session,
        queue: JobQueue,
        settings: Settings,
        integration: Integration,
        tasks: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        return web.predict(session, queue, settings, integration, tasks)

    def health(self, session: Session, integration: Integration) -> dict[str, Any]:
        return web.view(session, integration)

    def describe_error(self, exc: BaseException) -> str:
        return _describe(exc)


class _Conn:
    """What a job needs of an integration, read in one short transaction."""

    def __init__(self, integration: Integration, pool: Pool, token: str) -> None:
        self.id = integration.id
        self.pool_id = pool.id
        self.tenant_id = pool.tenant_id
        self.task = pool.task
        self.classes = list(pool.classes or [])
        self.n_outputs = int(pool.n_outputs)
        self.url = integration.url
        self.project_id = int(integration.project_id)
        self.token = token
        self.config = IntegrationConfig.from_dict(integration.config or {})
        self.public_base = str((integration.config or {}).get("public_base") or "")
        stored = (integration.config or {}).get("mapping")
        self.mapping: Mapping | None = Mapping.from_dict(stored) if stored else None
        self.label_config = ""


def _load(env: PlatformEnv, integration_id: str) -> _Conn | None:
    with session_scope(env.sessionmaker) as s:
        integration = repo.get_integration_by_id(s, integration_id)
        if integration is None:
            return None
        pool = s.get(Pool, integration.pool_id)
        assert pool is not None
        token = crypto.decrypt(env.settings, integration.token_encrypted)
        return _Conn(integration, pool, token)


def _client(env: PlatformEnv, conn: _Conn) -> LabelStudioClient:
    return LabelStudioClient.from_settings(conn.url, conn.token, env.settings)


def _refresh_mapping(factory: sessionmaker[Session], conn: _Conn, ls: LabelStudioClient) -> Mapping:
    """Resolve the mapping against the project's current labeling config (it may have changed)."""
    project = ls.project(conn.project_id)
    conn.label_config = str(project.get("label_config") or "")
    mapping = resolve_mapping(conn.task, conn.classes, conn.n_outputs, conn.config, str(project.get("label_config")))
    if mapping != conn.mapping:
        with session_scope(factory) as s:
            row = repo.get_integration_by_id(s, conn.id, for_update=True)
            if row is not None:
                row.config = {**(row.config or {}), "mapping": mapping.to_dict()}
    conn.mapping = mapping
    return mapping


def _record(factory: sessionmaker[Session], integration_id: str, error: str | None, *, synced: bool = False) -> None:
    with session_scope(factory) as s:
        row = repo.get_integration_by_id(s, integration_id, for_update=True)
        if row is None:
            return
        now = utcnow()
        row.status = "error" if error else "ok"
        row.last_error = error
        row.updated_at = now
        if synced:
            row.last_synced_at = now


def _describe(exc: BaseException) -> str:
    if isinstance(exc, LabelStudioError | crypto.SecretKeyError | ServiceError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# Push a batch as tasks
# --------------------------------------------------------------------------------------------------


def _note_on_batch(factory: sessionmaker[Session], batch_id: str, integration_id: str, info: dict[str, Any]) -> None:
    with session_scope(factory) as s:
        batch = s.get(Batch, batch_id)
        if batch is None:
            return
        diagnostics = dict(batch.diagnostics or {})
        ls_info = dict(diagnostics.get("labelstudio") or {})
        ls_info[integration_id] = info
        diagnostics["labelstudio"] = ls_info
        batch.diagnostics = diagnostics
        if info.get("error"):
            batch.error = f"Label Studio import failed (integration {integration_id}): {info['error']}"


def import_batch(env: PlatformEnv, integration_id: str, batch_id: str) -> bool:
    """Import the batch's items not yet in the project; True when it went through."""
    factory = env.sessionmaker
    try:
        conn = _load(env, integration_id)
        if conn is None:
            return False
        with session_scope(factory) as s:
            batch = batches_repo.get_batch_by_id(s, batch_id)
            if batch is None or batch.status not in ("succeeded", "running") or not batch.item_ids:
                return False
            order = {ext: rank for rank, ext in enumerate(batch.item_ids, start=1)}
            rows = repo.items_of_batch(s, conn.pool_id, list(batch.item_ids or []))
            linked = repo.linked_item_ids(s, integration_id, [r[0] for r in rows])
            checkpoint_id = batch.checkpoint_id
        todo = [r for r in rows if r[0] not in linked]
        imported = 0
        with _client(env, conn) as ls:
            mapping = _refresh_mapping(factory, conn, ls)
            with_model = conn.config.predictions and checkpoint_id is not None
            predictions = _predictions(env, conn, [r[1] for r in todo]) if with_model and todo else {}
            base = conn.public_base or env.settings.public_url or ""
            shown = shown_fields(conn.label_config)
            for begin in range(0, len(todo), IMPORT_CHUNK):
                chunk = todo[begin : begin + IMPORT_CHUNK]
                tasks = []
                for _, ext, text, uri, data in chunk:
                    link = content.link_maker(env.settings, base, conn.pool_id, ext)
                    task_data = build_task_data(conn.config, ext, data, text, uri, link)
                    missing = sorted(shown - set(task_data))
                    if missing:
                        raise LabelStudioError(
                            f"item {ext!r} has no {missing[0]!r} for the labeling config to show: give items `data` "
                            f"with that key, map one with `data_map`, or set `data_field` to {missing[0]!r}",
                            kind="mapping",
                        )
                    task_data[BATCH_FIELD] = batch_id
                    task_data[RANK_FIELD] = order.get(ext, 0)
                    tasks.append(_task(mapping, task_data, predictions.get(ext)))
                task_ids = ls.import_tasks(conn.project_id, tasks)
                with session_scope(factory) as s:
                    repo.add_links(
                        s, integration_id, [(r[0], t) for r, t in zip(chunk, task_ids, strict=True)], batch_id, utcnow()
                    )
                imported += len(chunk)
            if with_model and imported and checkpoint_id is not None:
                _align_model_version(ls, conn.project_id, checkpoint_id)
            view: int | str | None = None
            if conn.config.next_batch_view:
                try:
                    view = _update_view(factory, conn, ls, batch_id)
                except LabelStudioError as exc:  # the tasks are in: a view that fails is a warning only
                    view = f"error: {exc.message}"
    except Exception as exc:
        message = _describe(exc)
        log.warning("Label Studio import of batch %s (integration %s) failed: %s", batch_id, integration_id, message)
        _record(factory, integration_id, message)
        _note_on_batch(factory, batch_id, integration_id, {"status": "error", "error": message})
        return False
    _record(factory, integration_id, None)
    info: dict[str, Any] = {"status": "ok", "imported": imported, "already_in_project": len(rows) - len(todo)}
    if isinstance(view, int):
        info["view_id"] = view
    elif view is not None:
        info["view_error"] = view
    _note_on_batch(factory, batch_id, integration_id, info)
    log.info("batch %s: %d task(s) imported into Label Studio project %d", batch_id, imported, conn.project_id)
    return True


def _align_model_version(ls: LabelStudioClient, project_id: int, checkpoint_id: str) -> None:
    """Make Label Studio's model versions the checkpoint our predictions carry: the project's (its
    prediction score column averages the predictions of that version; Label Studio had set it to the
    backend's title) and the backends' (listing them makes Label Studio ask /setup again). Best effort:
    the tasks are in either way."""
    try:
        ls.update_project(project_id, {"model_version": checkpoint_id})
        ls.refresh_ml_backends(project_id)
    except LabelStudioError as exc:
        log.warning("could not align the model version of project %d: %s", project_id, exc)


VIEW_TITLE = "bait: next batch"


def _update_view(factory: sessionmaker[Session], conn: _Conn, ls: LabelStudioClient, batch_id: str) -> int:
    """Point the Data Manager view "bait: next batch" at the batch: its unlabeled tasks by rank."""
    data = {
        "title": VIEW_TITLE,
        "filters": {
            "conjunction": "and",
            "items": [
                {
                    "filter": f"filter:tasks:data.{BATCH_FIELD}",
                    "operator": "equal",
                    "type": "String",
                    "value": batch_id,
                },
                {"filter": "filter:tasks:total_annotations", "operator": "equal", "type": "Number", "value": 0},
            ],
        },
        "ordering": [f"tasks:data.{RANK_FIELD}"],
    }
    with session_scope(factory) as s:
        row = repo.get_integration_by_id(s, conn.id)
        view_id = (row.state or {}).get("view_id") if row is not None else None
    if view_id is None:
        found = [v for v in ls.views(conn.project_id) if (v.get("data") or {}).get("title") == VIEW_TITLE]
        view_id = int(found[0]["id"]) if found else None
    try:
        new_id = ls.save_view(conn.project_id, view_id, data)
    except LabelStudioError as exc:
        if exc.kind != "not_found" or view_id is None:
            raise
        new_id = ls.save_view(conn.project_id, None, data)  # the user deleted it: make it again
    if new_id != view_id:
        with session_scope(factory) as s:
            repo.update_state(s, conn.id, view_id=new_id)
    return new_id


def _predictions(env: PlatformEnv, conn: _Conn, ext_ids: list[str]) -> dict[str, dict[str, Any]]:
    if not ext_ids:
        return {}
    out = env.predict(conn.pool_id, ext_ids)
    version = str(out["checkpoint_id"])
    return {p["item_id"]: {**p, "model_version": version} for p in out["predictions"]}


def _task(mapping: Mapping, data: dict[str, Any], prediction: dict[str, Any] | None) -> dict[str, Any]:
    task: dict[str, Any] = {"data": data}
    if prediction is not None:
        if "probs" in prediction:
            result = prediction_result(mapping, prediction.get("label"), None)
            score = max(prediction["probs"].values()) if prediction["probs"] else 0.0
        else:
            result = prediction_result(mapping, None, prediction.get("target"))
            score = 1.0
        task["predictions"] = [{"model_version": prediction["model_version"], "score": float(score), "result": result}]
    return task


# --------------------------------------------------------------------------------------------------
# Reconcile and annotation events
# --------------------------------------------------------------------------------------------------


def _same(value: Any, want: LabelValue) -> bool:
    if want.label is not None:
        return bool(value == want.label)
    return isinstance(value, list) and [float(v) for v in value] == want.target


def _write(s: Session, pool: Pool, item_ext: str, want: LabelValue, annotator: str, max_items: int) -> None:
    put_labels(
        s,
        pool,
        [LabelWrite(item_id=item_ext, label=want.label, target=want.target)],
        annotator=annotator,
        max_items=max_items,
    )


def reconcile(
    env: PlatformEnv, integration_id: str, deadline: float | None = None, raise_errors: bool = False
) -> dict[str, int] | None:
    """Make the pool's labels match the annotations in the project; returns counts (None: no integration).

    Counts: ``tasks``, ``written``, ``removed``, ``unchanged``, ``adopted`` (tasks carrying one of our item
    ids linked now), ``unknown`` (tasks carrying an id that is no item of the pool), ``ambiguous``
    (further tasks of an item that already has one), ``unmatched`` (annotated tasks we cannot match).
    """
    factory = env.sessionmaker
    counts = {
        "tasks": 0,
        "written": 0,
        "removed": 0,
        "adopted": 0,
        "unchanged": 0,
        "unknown": 0,
        "ambiguous": 0,
        "unmatched": 0,
    }
    errors: list[str] = []
    try:
        conn = _load(env, integration_id)
        if conn is None:
            return None
        with _client(env, conn) as ls:
            mapping = _refresh_mapping(factory, conn, ls)
            tasks = ls.tasks(conn.project_id, deadline=deadline)
        counts["tasks"] = len(tasks)
        with session_scope(factory) as s:
            pool = s.get(Pool, conn.pool_id)
            assert pool is not None
            links = repo.links(s, integration_id)
            unlinked = {
                int(t["id"]): (t.get("data") or {}).get(conn.config.id_field)
                for t in tasks
                if int(t["id"]) not in links
            }
            with_id = {t: str(v) for t, v in unlinked.items() if v is not None}
            known = repo.item_ids_by_external(s, pool.id, list(set(with_id.values()))) if with_id else {}
            already = repo.linked_item_ids(s, integration_id, list(known.values()))
            adopt = []
            for task_id, ext in sorted(with_id.items()):
                if ext not in known:
                    counts["unknown"] += 1
                elif known[ext] in already:
                    counts["ambiguous"] += 1
                else:
                    adopt.append((known[ext], task_id))
                    already.add(known[ext])
                    links[task_id] = (known[ext], ext)
            repo.add_links(s, integration_id, adopt, None, utcnow())
            counts["adopted"] = len(adopt)
            by_task = {int(t["id"]): t for t in tasks}
            counts["unmatched"] = sum(
                1 for t_id, t in by_task.items() if t_id not in links and latest_annotation(t.get("annotations") or [])
            )
            item_ids = [links[t][0] for t in by_task if t in links]
            current = repo.current_labels(s, item_ids)
            annotators = repo.last_annotators(s, item_ids)
            for task_id, task in by_task.items():
                if task_id not in links:
                    continue
                item_id, ext = links[task_id]
                status, value = current.get(item_id, ("unlabeled", None))
                annotation = latest_annotation(task.get("annotations") or [])
                try:
                    want = None if annotation is None else result_to_label(mapping, annotation.get("result") or [])
                except MappingError as exc:
                    errors.append(f"task {task_id} (item {ext!r}): {exc}")
                    continue
                if want is None:
                    if status == "labeled" and (annotators.get(item_id) or "").startswith("labelstudio"):
                        delete_label(s, pool, ext, annotator="labelstudio")
                        counts["removed"] += 1
                    else:
                        counts["unchanged"] += 1
                    continue
                if status == "labeled" and _same(value, want):
                    counts["unchanged"] += 1
                    continue
                assert annotation is not None
                _write(s, pool, ext, want, annotator_of(annotation), env.settings.max_items_per_request)
                counts["written"] += 1
            adoption = {k: counts[k] for k in ("adopted", "unknown", "ambiguous")}
            adoption["linked"] = len(links)
            repo.update_state(s, integration_id, adoption=adoption, unmatched_annotations=counts["unmatched"])
            repo.prune_events(s, integration_id, utcnow() - EVENT_MEMORY)
    except Exception as exc:
        message = _describe(exc)
        log.warning("reconcile of integration %s failed: %s", integration_id, message)
        _record(factory, integration_id, f"reconcile: {message}")
        if raise_errors:
            raise
        return counts
    error = None
    if errors:
        error = f"reconcile: {len(errors)} annotation(s) do not fit the mapping, e.g. {errors[0]}"
    _record(factory, integration_id, error, synced=True)
    log.info("reconcile of integration %s: %s", integration_id, counts)
    return counts


def _verified_event(env: PlatformEnv, conn: _Conn, event: dict[str, Any]) -> dict[str, Any] | None:
    """An unauthenticated hint made into an event from what Label Studio says (None: no such annotation)."""
    with _client(env, conn) as ls:
        annotation = ls.annotation(int(event["annotation_id"]))
    if annotation is None:
        return None
    task = annotation.get("task")
    task_id = task.get("id") if isinstance(task, dict) else task
    if task_id is None:
        return None
    return {
        "action": event.get("action"),
        "task_id": int(task_id),
        "task_data": {},
        "annotation": {
            k: annotation.get(k) for k in ("id", "result", "was_cancelled", "completed_by", "updated_at", "created_at")
        },
    }


def apply_annotation(env: PlatformEnv, integration_id: str, event: dict[str, Any]) -> str:
    """Write the label of one ``ANNOTATION_CREATED``/``UPDATED`` webhook; returns what happened (``written``
    when a label was written or changed)."""
    factory = env.sessionmaker
    try:
        conn = _load(env, integration_id)
        if conn is None:
            return "no integration"
        if event.get("verify"):
            verified = _verified_event(env, conn, event)
            if verified is None:
                return "no such annotation in Label Studio"
            event = verified
        mapping = conn.mapping
        if mapping is None:
            with _client(env, conn) as ls:
                mapping = _refresh_mapping(factory, conn, ls)
        annotation = event.get("annotation") or {}
        task_id = int(event["task_id"])
        with session_scope(factory) as s:
            pool = s.get(Pool, conn.pool_id)
            assert pool is not None
            if annotation.get("id") is not None and repo.seen_event(
                s, integration_id, int(annotation["id"]), str(annotation.get("updated_at") or ""), utcnow()
            ):
                return "duplicate"
            link = repo.link_for_task(s, integration_id, task_id)
            if link is None:
                ext = (event.get("task_data") or {}).get(conn.config.id_field)
                known = repo.item_ids_by_external(s, pool.id, [str(ext)]) if ext is not None else {}
                if not known or repo.linked_item_ids(s, integration_id, list(known.values())):
                    row = repo.lock_integration(s, integration_id)
                    if row is not None:
                        state = dict(row.state or {})
                        state["unmatched_annotations"] = int(state.get("unmatched_annotations") or 0) + 1
                        row.state = state
                    return "not our task"
                link = (known[str(ext)], str(ext))
                repo.add_links(s, integration_id, [(link[0], task_id)], None, utcnow())
            if annotation.get("was_cancelled"):
                return "skipped (cancelled annotation)"
            want = result_to_label(mapping, annotation.get("result") or [])
            if want is None:
                return "no value for the mapped control"
            status, value = repo.current_labels(s, [link[0]]).get(link[0], ("unlabeled", None))
            if status == "labeled" and _same(value, want):
                return "unchanged"
            _write(s, pool, link[1], want, annotator_of(annotation), env.settings.max_items_per_request)
    except Exception as exc:
        message = _describe(exc)
        log.warning("Label Studio webhook for integration %s failed: %s", integration_id, message)
        _record(factory, integration_id, f"webhook {event.get('action')}: {message}")
        return f"error: {message}"
    return "written"
