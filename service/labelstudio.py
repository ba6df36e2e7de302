"""Label Studio: its HTTP API (httpx, with timeouts) and the mapping between its results and our labels.

Used by the web process (checking a new integration, the ML-backend routes) and by the worker jobs in
:mod:`service.domain.platforms.labelstudio` (import, reconcile, webhook events). Nothing here touches the database.

Authentication to Label Studio: a legacy token is sent as ``Authorization: Token <token>``; a personal
access token (a JWT refresh token, three dot-separated parts) is exchanged at ``/api/token/refresh`` for
a short-lived access token sent as ``Bearer``.

Mapping (``IntegrationConfig``), checked against the project's labeling config before anything is sent:

- classification: a ``<Choices>`` control; each Label Studio choice (``alias`` if set, else ``value``)
  maps to a class name (``choice_map``; identity by default) and every choice must map to a pool class.
- regression: a ``<Number>``, ``<Rating>`` or ``<TextArea>`` control; a TextArea holds the target's
  ``m`` numbers separated by commas or spaces, Number and Rating only fit one-output pools.
"""

from __future__ import annotations

import logging
import math
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Any

import httpx

from service.outbound import OutboundClient, OutboundError, OutboundPolicy, OutboundRefused, status_line

log = logging.getLogger(__name__)

CLASSIFICATION_CONTROLS = ("choices",)
REGRESSION_CONTROLS = ("number", "rating", "textarea")


class LabelStudioError(Exception):
    """A call to Label Studio failed; ``kind`` is unreachable | refused | auth | not_found | rejected | mapping |
    timeout."""

    def __init__(self, message: str, kind: str = "rejected", status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind
        self.status_code = status_code


class MappingError(LabelStudioError):
    """The integration's mapping does not fit the project's labeling config or a result."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="mapping")


# --------------------------------------------------------------------------------------------------
# HTTP client
# --------------------------------------------------------------------------------------------------


def _log_foreign_error(r: httpx.Response, method: str, path: str) -> None:
    """Label Studio's explanation goes to the operator's log only: a tenant sees the status line."""
    log.info("Label Studio answered %s on %s %s: %r", r.status_code, method, path, r.content[:500])


def _looks_like_jwt(token: str) -> bool:
    return token.count(".") == 2 and all(token.split("."))


class LabelStudioClient:
    """A small synchronous client of the endpoints we use (projects, import, tasks, annotations, views)."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout: float = 30.0,
        policy: OutboundPolicy | None = None,
        max_bytes: int = 32 * 2**20,
    ):
        self.url = url.rstrip("/")
        self.token = token
        # Every call goes through the outbound guard (service.outbound): internal addresses refused unless
        # the operator allowlist names them, each redirect re-checked, time and answer size capped.
        self._http = OutboundClient(policy or OutboundPolicy(), timeout=timeout, max_bytes=max_bytes)
        self._auth: str | None = None

    @classmethod
    def from_settings(cls, url: str, token: str, settings: Any) -> LabelStudioClient:
        return cls(
            url,
            token,
            timeout=float(settings.labelstudio_timeout_seconds),
            policy=OutboundPolicy.from_settings(settings),
            max_bytes=int(settings.outbound_max_response_bytes),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LabelStudioClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _authorization(self) -> str:
        if self._auth is None:
            if _looks_like_jwt(self.token):
                r = self._send("POST", "/api/token/refresh", json={"refresh": self.token}, auth=False)
                access = (
                    r.json().get("access") if r.headers.get("content-type", "").startswith("application/json") else None
                )
                if not access:
                    raise LabelStudioError("Label Studio did not exchange the personal access token", kind="auth")
                self._auth = f"Bearer {access}"
            else:
                self._auth = f"Token {self.token}"
        return self._auth

    def _send(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": self._authorization()} if auth else {}
        try:
            r = self._http.request(method, self.url + path, headers=headers, **kwargs)
        except OutboundRefused as exc:
            raise LabelStudioError(f"Label Studio at {self.url}: {exc.message}", kind="refused") from exc
        except OutboundError as exc:
            raise LabelStudioError(
                f"Label Studio at {self.url} is unreachable ({method} {path}): {exc.message}", kind="unreachable"
            ) from exc
        if r.status_code in (401, 403):
            raise LabelStudioError(
                f"Label Studio rejected the API token ({r.status_code} on {method} {path}): check the token and that "
                "its user may access the project",
                kind="auth",
                status_code=r.status_code,
            )
        if r.status_code == 404:
            raise LabelStudioError(f"Label Studio answered 404 on {method} {path}", kind="not_found", status_code=404)
        if r.status_code >= 300:
            _log_foreign_error(r, method, path)
            raise LabelStudioError(
                f"Label Studio answered {status_line(r.status_code)} on {method} {path}",
                kind="rejected",
                status_code=r.status_code,
            )
        return r

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self._send(method, path, **kwargs)
        try:
            return r.json()
        except ValueError as exc:
            raise LabelStudioError(
                f"Label Studio answered {method} {path} with something other than JSON (is {self.url} Label Studio?)"
            ) from exc

    def project(self, project_id: int) -> dict[str, Any]:
        """The project (``label_config`` among its fields)."""
        try:
            body = self._json("GET", f"/api/projects/{project_id}/")
        except LabelStudioError as exc:
            if exc.kind == "not_found":
                raise LabelStudioError(
                    f"Label Studio has no project {project_id} (or the token cannot see it)",
                    kind="not_found",
                    status_code=404,
                ) from exc
            raise
        if not isinstance(body, dict) or "label_config" not in body:
            raise LabelStudioError(
                f"unexpected answer to GET /api/projects/{project_id}/ (is {self.url} Label Studio?)"
            )
        return body

    def import_tasks(self, project_id: int, tasks: list[dict[str, Any]]) -> list[int]:
        """Create tasks (with optional predictions); returns their ids, in order."""
        body = self._json("POST", f"/api/projects/{project_id}/import", params={"return_task_ids": "true"}, json=tasks)
        ids = body.get("task_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list) or len(ids) != len(tasks):
            raise LabelStudioError(f"Label Studio's import answered without {len(tasks)} task ids")
        return [int(i) for i in ids]

    def tasks(self, project_id: int, page_size: int = 100, deadline: float | None = None) -> list[dict[str, Any]]:
        """Every task of the project with its data and annotations (paged through ``GET /api/tasks``).

        Raises:
            LabelStudioError: ``kind="timeout"`` when ``deadline`` (``time.monotonic()``) passes first.
        """
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            if deadline is not None and time.monotonic() > deadline:
                raise LabelStudioError(
                    f"reading the project's tasks ran past its time budget after {len(out)} task(s)", kind="timeout"
                )
            try:
                body = self._json(
                    "GET",
                    "/api/tasks/",
                    params={"project": project_id, "page": page, "page_size": page_size, "fields": "all"},
                )
            except LabelStudioError as exc:
                if exc.kind == "not_found" and page > 1:  # past the last page
                    break
                raise
            rows = body.get("tasks", []) if isinstance(body, dict) else body
            if not isinstance(rows, list):
                raise LabelStudioError("unexpected answer to GET /api/tasks/ (not a list of tasks)")
            out.extend(rows)
            total = body.get("total") if isinstance(body, dict) else None
            if len(rows) < page_size or (isinstance(total, int) and len(out) >= total):
                break
            page += 1
        return out

    def annotation(self, annotation_id: int) -> dict[str, Any] | None:
        """One annotation as Label Studio has it now (None: it no longer exists)."""
        try:
            body = self._json("GET", f"/api/annotations/{annotation_id}/")
        except LabelStudioError as exc:
            if exc.kind == "not_found":
                return None
            raise
        return body if isinstance(body, dict) else None

    def task(self, task_id: int) -> dict[str, Any] | None:
        try:
            body = self._json("GET", f"/api/tasks/{task_id}/")
        except LabelStudioError as exc:
            if exc.kind == "not_found":
                return None
            raise
        return body if isinstance(body, dict) else None

    def update_project(self, project_id: int, fields: dict[str, Any]) -> dict[str, Any]:
        body = self._json("PATCH", f"/api/projects/{project_id}/", json=fields)
        return body if isinstance(body, dict) else {}

    def refresh_ml_backends(self, project_id: int) -> list[dict[str, Any]]:
        """Listing a project's ML backends makes Label Studio call their /health and /setup again, which
        updates each backend's model_version to what /setup answers (our latest checkpoint)."""
        body = self._json("GET", "/api/ml/", params={"project": project_id})
        return list(body) if isinstance(body, list) else []

    def views(self, project_id: int) -> list[dict[str, Any]]:
        body = self._json("GET", "/api/dm/views/", params={"project": project_id})
        return list(body) if isinstance(body, list) else []

    def save_view(self, project_id: int, view_id: int | None, data: dict[str, Any]) -> int:
        """Create (``view_id`` None) or replace a Data Manager view; returns its id."""
        body = {"project": project_id, "data": data}
        if view_id is None:
            out = self._json("POST", "/api/dm/views/", json=body)
        else:
            out = self._json("PUT", f"/api/dm/views/{view_id}/", json=body)
        if not isinstance(out, dict) or "id" not in out:
            raise LabelStudioError(f"Label Studio answered the view request without an id: {str(out)[:300]}")
        return int(out["id"])


# --------------------------------------------------------------------------------------------------
# Labeling config and mapping
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Control:
    tag: str  # lowercased: choices | number | rating | textarea | labels ...
    name: str
    to_name: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class ParsedConfig:
    controls: tuple[Control, ...]
    objects: dict[str, str]  # object tag name -> the task.data field it shows ("text" for value="$text")


def parse_label_config(xml: str) -> ParsedConfig:
    try:
        root = ET.fromstring(xml)
    except ET.ParseError as exc:
        raise MappingError(f"the project's labeling config is not valid XML: {exc}") from exc
    controls: list[Control] = []
    objects: dict[str, str] = {}
    for el in root.iter():
        tag = el.tag.lower()
        name = el.get("name")
        to_name = el.get("toName")
        value = el.get("value", "")
        if name and to_name:
            choices = tuple(
                (c.get("alias") or c.get("value") or "") for c in el.iter() if c.tag.lower() in ("choice", "label")
            )
            controls.append(Control(tag=tag, name=name, to_name=to_name.split(",")[0], choices=choices))
        elif name and value.startswith("$"):
            objects[name] = value[1:]
    return ParsedConfig(controls=tuple(controls), objects=objects)


@dataclass(frozen=True)
class IntegrationConfig:
    """What the user chose when connecting (stored in ``Integration.config``)."""

    id_field: str = "item_id"
    data_field: str = "text"
    from_name: str | None = None
    choice_map: dict[str, str] | None = None
    predictions: bool = True
    batch_size: int = 10
    strategy: str = "bait"
    data_map: dict[str, str] | None = None  # item data key -> task data key, where they differ
    auto_batch: dict[str, Any] | None = None  # {"size", "when", "n", "stop_when_recommended"}
    next_batch_view: bool = True  # keep a Data Manager view "bait: next batch"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> IntegrationConfig:
        known = {k: d[k] for k in cls.__dataclass_fields__ if k in d}
        return cls(**known)

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


@dataclass(frozen=True)
class Mapping:
    """A resolved mapping: the control that carries the label and how its values translate."""

    task: str  # classification | regression
    control: str  # choices | number | rating | textarea
    from_name: str
    to_name: str
    n_outputs: int
    to_class: dict[str, str] = field(default_factory=dict)  # LS choice -> class name
    to_choice: dict[str, str] = field(default_factory=dict)  # class name -> LS choice

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "control": self.control,
            "from_name": self.from_name,
            "to_name": self.to_name,
            "n_outputs": self.n_outputs,
            "to_class": self.to_class,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Mapping:
        to_class = dict(d.get("to_class") or {})
        return cls(
            task=d["task"],
            control=d["control"],
            from_name=d["from_name"],
            to_name=d["to_name"],
            n_outputs=int(d["n_outputs"]),
            to_class=to_class,
            to_choice={v: k for k, v in to_class.items()},
        )


def resolve_mapping(
    task: str,
    classes: list[str] | None,
    n_outputs: int,
    config: IntegrationConfig,
    label_config: str,
    data_keys: set[str] | None = None,
) -> Mapping:
    """Check the integration's mapping against the project's labeling config.

    Raises:
        MappingError: saying what does not fit (no such control, wrong control type, unknown choices...).
    """
    parsed = parse_label_config(label_config)
    wanted = CLASSIFICATION_CONTROLS if task == "classification" else REGRESSION_CONTROLS
    if config.from_name is not None:
        found = [c for c in parsed.controls if c.name == config.from_name]
        if not found:
            names = [c.name for c in parsed.controls]
            raise MappingError(f"the labeling config has no control named {config.from_name!r} (it has {names})")
        control = found[0]
        if control.tag not in wanted:
            raise MappingError(
                f"control {control.name!r} is a <{control.tag}>; a {task} pool needs one of "
                + ", ".join(f"<{w}>" for w in wanted)
            )
    else:
        fitting = [c for c in parsed.controls if c.tag in wanted]
        if len(fitting) != 1:
            what = "no" if not fitting else f"{len(fitting)}"
            raise MappingError(
                f"the labeling config has {what} control(s) of type "
                + "/".join(f"<{w}>" for w in wanted)
                + f" for a {task} pool; "
                + ("add one" if not fitting else "name the one to use in `from_name`")
            )
        control = fitting[0]
    shown = parsed.objects.get(control.to_name)
    provided = {config.data_field, config.id_field, *task_keys(config, data_keys or set())}
    if shown is not None and data_keys is not None and shown not in provided:
        raise MappingError(
            f"the labeling config shows ${shown} in {control.to_name!r}, but no task will carry it: the item's "
            f"text/uri goes to ${config.data_field} and item data has the key(s) {sorted(data_keys)[:20]}; set "
            f"`data_field` to {shown!r}, give items `data` with a {shown!r} key, or map one with `data_map`"
        )
    if task == "classification":
        pool_classes = list(classes or [])
        cmap = config.choice_map or {}
        to_class = {choice: cmap.get(choice, choice) for choice in control.choices}
        unknown = sorted(c for c, k in to_class.items() if k not in pool_classes)
        if unknown:
            raise MappingError(
                f"choice(s) {unknown} of control {control.name!r} map to no class of the pool (classes: "
                f"{pool_classes}); rename them or give a `choice_map`"
            )
        unreachable = sorted(set(pool_classes) - set(to_class.values()))
        if unreachable:
            raise MappingError(
                f"class(es) {unreachable} of the pool have no choice in control {control.name!r} "
                f"(choices: {list(control.choices)})"
            )
        return Mapping(
            task=task,
            control=control.tag,
            from_name=control.name,
            to_name=control.to_name,
            n_outputs=len(pool_classes),
            to_class=to_class,
            to_choice={v: k for k, v in to_class.items()},
        )
    if control.tag in ("number", "rating") and n_outputs != 1:
        raise MappingError(
            f"a <{control.tag}> holds one number but the pool has {n_outputs} outputs: use a <TextArea> with "
            "comma-separated values"
        )
    return Mapping(task=task, control=control.tag, from_name=control.name, to_name=control.to_name, n_outputs=n_outputs)


def task_keys(config: IntegrationConfig, data_keys: set[str]) -> set[str]:
    """The task.data keys that item data with ``data_keys`` becomes (after ``data_map``)."""
    dmap = config.data_map or {}
    return {dmap.get(k, k) for k in data_keys}


def shown_fields(label_config: str) -> set[str]:
    """Every task.data field the labeling config shows (``$field`` of its object tags)."""
    return set(parse_label_config(label_config).objects.values())


BATCH_FIELD = "bait_batch"
RANK_FIELD = "bait_rank"


def build_task_data(
    config: IntegrationConfig,
    ext: str,
    data: dict[str, Any] | None,
    text: str | None,
    uri: str | None,
    link: Any,
) -> dict[str, Any]:
    """``task.data`` of an item: its data (keys renamed by ``data_map``), its text or uri in ``data_field``
    when the data does not set that key, and our item id in ``id_field``.

    ``file://`` values (in data or the uri) are replaced by ``link(key, value)``: a signed URL of ours
    through which Label Studio shows the file; http(s) URLs pass through unchanged.
    """
    dmap = config.data_map or {}
    out: dict[str, Any] = {}
    for key, value in (data or {}).items():
        out[dmap.get(key, key)] = link(key, value) if isinstance(value, str) and value.startswith("file://") else value
    if config.data_field not in out:
        if text is not None:
            out[config.data_field] = text
        elif uri is not None:
            out[config.data_field] = link(None, uri) if uri.startswith("file://") else uri
        elif not data:
            out[config.data_field] = ext  # nothing else to show: at least the id
    out[config.id_field] = ext
    return out


@dataclass(frozen=True)
class LabelValue:
    label: str | None = None
    target: list[float] | None = None


_NUMBER_SPLIT = re.compile(r"[,\s;]+")


def result_to_label(mapping: Mapping, result: list[dict[str, Any]]) -> LabelValue | None:
    """Our label in an annotation's ``result``; None when the annotation has no value for our control.

    Raises:
        MappingError: a value that does not fit (an unknown choice, a non-number, the wrong length).
    """
    for r in result or []:
        if r.get("from_name") != mapping.from_name:
            continue
        value = r.get("value") or {}
        if mapping.control == "choices":
            chosen = value.get("choices") or []
            if not chosen:
                continue
            if chosen[0] not in mapping.to_class:
                raise MappingError(f"choice {chosen[0]!r} maps to no class of the pool")
            return LabelValue(label=mapping.to_class[chosen[0]])
        if mapping.control in ("number", "rating"):
            v = value.get(mapping.control)
            if v is None:
                continue
            return LabelValue(target=[_finite(v)])
        if mapping.control == "textarea":
            texts = value.get("text") or []
            if not texts:
                continue
            parts = [p for p in _NUMBER_SPLIT.split(str(texts[0]).strip()) if p]
            nums = [_finite(p) for p in parts]
            if len(nums) != mapping.n_outputs:
                raise MappingError(f"text {texts[0]!r} holds {len(nums)} number(s); the pool has {mapping.n_outputs}")
            return LabelValue(target=nums)
    return None


def _finite(v: Any) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError) as exc:
        raise MappingError(f"{v!r} is not a number") from exc
    if not math.isfinite(x):
        raise MappingError(f"{v!r} is not a finite number")
    return x


def prediction_result(mapping: Mapping, label: str | None, target: list[float] | None) -> list[dict[str, Any]]:
    """A Label Studio ``result`` list carrying our prediction for the mapped control."""
    base = {"from_name": mapping.from_name, "to_name": mapping.to_name, "type": mapping.control}
    if mapping.control == "choices":
        if label is None or label not in mapping.to_choice:
            return []
        return [{**base, "value": {"choices": [mapping.to_choice[label]]}}]
    if target is None:
        return []
    if mapping.control == "number":
        return [{**base, "value": {"number": target[0]}}]
    if mapping.control == "rating":
        return [{**base, "value": {"rating": round(target[0])}}]
    return [{**base, "value": {"text": [", ".join(f"{v:.6g}" for v in target)]}}]


def latest_annotation(annotations: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The annotation that holds a task's label: the most recently updated one not cancelled (skipped)."""
    live = [a for a in annotations or [] if not a.get("was_cancelled")]
    if not live:
        return None
    return max(live, key=lambda a: (str(a.get("updated_at") or a.get("created_at") or ""), int(a.get("id") or 0)))


def annotator_of(annotation: dict[str, Any]) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("email") or who.get("id")
    return f"labelstudio:{who}" if who is not None else "labelstudio"
