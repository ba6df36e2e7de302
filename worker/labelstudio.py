"""Label Studio jobs: import a batch's items as tasks, reconcile annotations back into labels, apply one
annotation webhook.

- :func:`batch_finished` (called by the batch job once its result is committed): for each Label Studio
  integration of the pool, :func:`import_batch` then :func:`reconcile`.
- :func:`import_batch`: the batch's items that have no task yet in the project become tasks
  (``task.data`` = ``{id_field: item id, data_field: item text, else its uri, else its id}``)
  (``POST /api/projects/{id}/import?return_task_ids=true``), with the pool model's prediction as a
  pre-annotation when configured; a :class:`~service.store.models.TaskLink` per task (unique per
  integration and item) makes re-imports no-ops. Links are committed right after each import call.
- :func:`reconcile`: reads every task of the project with its annotations (``GET /api/tasks``) and makes
  our labels match: a label written or updated where Label Studio has an annotation, removed where the
  annotation is gone and the label came from Label Studio. Tasks carrying one of our item ids but no
  link (an import whose links were lost) are adopted. So a lost webhook loses no label.
- :func:`apply_annotation`: an ``ANNOTATION_CREATED``/``UPDATED`` webhook, queued by the web process.

Failures (unreachable, token rejected, mapping that no longer fits) are written to the integration
(``status: error``, ``last_error``) and, for an import, to the batch (``error`` and
``diagnostics.labelstudio``), never dropped silently. All HTTP goes through
:class:`service.labelstudio.LabelStudioClient` with timeouts.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service import crypto
from service.db import session_scope
from service.domain.labels import LabelWrite, delete_label, put_labels
from service.errors import ServiceError
from service.labelstudio import (
    IntegrationConfig,
    LabelStudioClient,
    LabelStudioError,
    LabelValue,
    Mapping,
    MappingError,
    annotator_of,
    latest_annotation,
    prediction_result,
    resolve_mapping,
    result_to_label,
)
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store.models import Batch, Integration, Pool
from worker import context

log = logging.getLogger(__name__)

IMPORT_CHUNK = 500


def utcnow() -> datetime:
    return datetime.now(UTC)


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
        stored = (integration.config or {}).get("mapping")
        self.mapping: Mapping | None = Mapping.from_dict(stored) if stored else None


def _load(factory: sessionmaker[Session], integration_id: str) -> _Conn | None:
    env = context.env()
    with session_scope(factory) as s:
        integration = repo.get_integration_by_id(s, integration_id)
        if integration is None:
            return None
        pool = s.get(Pool, integration.pool_id)
        assert pool is not None
        token = crypto.decrypt(env.settings, integration.token_encrypted)
        return _Conn(integration, pool, token)


def _client(conn: _Conn) -> LabelStudioClient:
    return LabelStudioClient.from_settings(conn.url, conn.token, context.env().settings)


def _refresh_mapping(factory: sessionmaker[Session], conn: _Conn, ls: LabelStudioClient) -> Mapping:
    """Resolve the mapping against the project's current labeling config (it may have changed)."""
    project = ls.project(conn.project_id)
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


def _describe(exc: Exception) -> str:
    if isinstance(exc, LabelStudioError | crypto.SecretKeyError | ServiceError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# After a batch
# --------------------------------------------------------------------------------------------------


def batch_finished(batch_id: str) -> None:
    """Import a succeeded batch into every Label Studio project its pool is connected to, then reconcile."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        batch = batches_repo.get_batch_by_id(s, batch_id)
        if batch is None or batch.status != "succeeded":
            return
        integration_ids = repo.pool_integration_ids(s, batch.pool_id)
    for integration_id in integration_ids:
        if import_batch(integration_id, batch_id):
            reconcile(integration_id)


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


def import_batch(integration_id: str, batch_id: str) -> bool:
    """Import the batch's items not yet in the project; True when it went through."""
    env = context.env()
    factory = env.sessionmaker
    try:
        conn = _load(factory, integration_id)
        if conn is None:
            return False
        with session_scope(factory) as s:
            batch = batches_repo.get_batch_by_id(s, batch_id)
            if batch is None or batch.status != "succeeded":
                return False
            rows = repo.items_of_batch(s, conn.pool_id, list(batch.item_ids or []))
            linked = repo.linked_item_ids(s, integration_id, [r[0] for r in rows])
            with_model = batch.checkpoint_id is not None
        todo = [r for r in rows if r[0] not in linked]
        imported = 0
        with _client(conn) as ls:
            mapping = _refresh_mapping(factory, conn, ls)
            predictions = _predictions(conn, [r[1] for r in todo]) if conn.config.predictions and with_model else {}
            for begin in range(0, len(todo), IMPORT_CHUNK):
                chunk = todo[begin : begin + IMPORT_CHUNK]
                tasks = [
                    _task(conn.config, mapping, ext, text, uri, predictions.get(ext)) for _, ext, text, uri in chunk
                ]
                task_ids = ls.import_tasks(conn.project_id, tasks)
                with session_scope(factory) as s:
                    repo.add_links(
                        s, integration_id, [(r[0], t) for r, t in zip(chunk, task_ids, strict=True)], batch_id, utcnow()
                    )
                imported += len(chunk)
    except Exception as exc:
        message = _describe(exc)
        log.warning("Label Studio import of batch %s (integration %s) failed: %s", batch_id, integration_id, message)
        _record(factory, integration_id, message)
        _note_on_batch(factory, batch_id, integration_id, {"status": "error", "error": message})
        return False
    _record(factory, integration_id, None)
    _note_on_batch(
        factory,
        batch_id,
        integration_id,
        {"status": "ok", "imported": imported, "already_in_project": len(rows) - len(todo)},
    )
    log.info("batch %s: %d task(s) imported into Label Studio project %d", batch_id, imported, conn.project_id)
    return True


def _predictions(conn: _Conn, ext_ids: list[str]) -> dict[str, dict[str, Any]]:
    if not ext_ids:
        return {}
    from worker.jobs import predict

    out = predict(conn.pool_id, ext_ids)
    version = str(out["checkpoint_id"])
    return {p["item_id"]: {**p, "model_version": version} for p in out["predictions"]}


def _task(
    config: IntegrationConfig,
    mapping: Mapping,
    ext: str,
    text: str | None,
    uri: str | None,
    prediction: dict[str, Any] | None,
) -> dict[str, Any]:
    data: dict[str, Any] = {config.id_field: ext}
    # The item's inline text, else its data reference; an item given only by embedding shows its id.
    data[config.data_field] = text if text is not None else uri if uri is not None else ext
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
# Reconcile and webhook events
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


def reconcile(integration_id: str) -> dict[str, int] | None:
    """Make the pool's labels match the annotations in the project; returns counts (None: no integration)."""
    env = context.env()
    factory = env.sessionmaker
    counts = {"tasks": 0, "written": 0, "removed": 0, "adopted": 0, "unchanged": 0}
    errors: list[str] = []
    try:
        conn = _load(factory, integration_id)
        if conn is None:
            return None
        with _client(conn) as ls:
            mapping = _refresh_mapping(factory, conn, ls)
            tasks = ls.tasks(conn.project_id)
        counts["tasks"] = len(tasks)
        with session_scope(factory) as s:
            pool = s.get(Pool, conn.pool_id)
            assert pool is not None
            links = repo.links(s, integration_id)
            # adopt tasks that carry one of our item ids but have no link (an import whose links were lost)
            unlinked = {
                int(t["id"]): str((t.get("data") or {}).get(conn.config.id_field))
                for t in tasks
                if int(t["id"]) not in links and (t.get("data") or {}).get(conn.config.id_field) is not None
            }
            if unlinked:
                known = repo.item_ids_by_external(s, pool.id, list(set(unlinked.values())))
                already = repo.linked_item_ids(s, integration_id, list(known.values()))
                adopt = []
                for task_id, ext in sorted(unlinked.items()):
                    if ext in known and known[ext] not in already:
                        adopt.append((known[ext], task_id))
                        already.add(known[ext])
                        links[task_id] = (known[ext], ext)
                repo.add_links(s, integration_id, adopt, None, utcnow())
                counts["adopted"] = len(adopt)
            by_task = {int(t["id"]): t for t in tasks}
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
    except Exception as exc:
        message = _describe(exc)
        log.warning("reconcile of integration %s failed: %s", integration_id, message)
        _record(factory, integration_id, f"reconcile: {message}")
        return counts
    error = None
    if errors:
        error = f"reconcile: {len(errors)} annotation(s) do not fit the mapping, e.g. {errors[0]}"
    _record(factory, integration_id, error, synced=True)
    log.info("reconcile of integration %s: %s", integration_id, counts)
    return counts


def apply_annotation(integration_id: str, event: dict[str, Any]) -> str:
    """Write the label of one ``ANNOTATION_CREATED``/``UPDATED`` webhook; returns what happened."""
    env = context.env()
    factory = env.sessionmaker
    try:
        conn = _load(factory, integration_id)
        if conn is None:
            return "no integration"
        mapping = conn.mapping
        if mapping is None:
            with _client(conn) as ls:
                mapping = _refresh_mapping(factory, conn, ls)
        annotation = event.get("annotation") or {}
        task_id = int(event["task_id"])
        with session_scope(factory) as s:
            pool = s.get(Pool, conn.pool_id)
            assert pool is not None
            link = repo.link_for_task(s, integration_id, task_id)
            if link is None:
                ext = (event.get("task_data") or {}).get(conn.config.id_field)
                known = repo.item_ids_by_external(s, pool.id, [str(ext)]) if ext is not None else {}
                if not known or repo.linked_item_ids(s, integration_id, list(known.values())):
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
