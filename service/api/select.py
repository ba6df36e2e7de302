"""Routes: stateless selection (`POST /v1/select`, `GET /v1/select/{id}`).

The request is JSON (`{"strategy", "batch_size", "task", "embeddings", "probs"?, "labeled"?,
"reserved"?, "params"?}`) or multipart with an `.npz` file field `arrays` (arrays `embeddings`, optional
`probs`, `labeled`, `reserved`) and the other fields as form fields (`params` as a JSON string).
Small requests answer 200 with the selection; large ones 202 with a job to poll.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import IO, Any

import numpy as np
from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from service.config import Settings
from service.deps import SessionDep, TenantDep
from service.domain import archives, strategies
from service.domain import select as domain
from service.errors import ERROR_RESPONSES, UPLOAD_ERROR_RESPONSES, BadRequest, UnsupportedMediaType
from service.textcheck import find_bad_text

router = APIRouter(tags=["select"])

ARRAY_FIELDS = ("embeddings", "probs", "labeled", "reserved")


class StrategyOut(BaseModel):
    name: str
    tasks: list[str]
    summary: str
    params: dict[str, dict[str, Any]] = Field(
        description='name -> {"type", "default"}; every strategy also takes `seed`'
    )


_cold_start_doc = strategies.cold_start_doc  # (the field `strategies` shadows the module in the class body)
_defaults_doc = strategies.defaults_doc


class StrategyList(BaseModel):
    strategies: list[StrategyOut]
    cold_start: dict[str, Any] = Field(
        default_factory=_cold_start_doc,
        description="when a pool batch of a model-based strategy runs a model-free one instead (too few labels), "
        "and how to opt out",
    )
    defaults: dict[str, Any] = Field(
        default_factory=_defaults_doc,
        description="BAIT's default parameters and the rule that chose them on held-out data (docs/results/heldout)",
    )


class SelectOut(BaseModel):
    id: str
    status: str = Field(description="queued | running | succeeded | failed")
    strategy: str
    batch_size: int | None
    progress: dict[str, Any]
    indices: list[int] | None = Field(description="selected row indices, in pick order (once succeeded)")
    objective: float | None
    diagnostics: dict[str, Any] | None
    error: str | None
    error_type: str | None
    created_at: datetime
    finished_at: datetime | None


class SelectRequest(BaseModel):
    """The JSON form of POST /v1/select (documentation: the route parses the body itself, off the event loop)."""

    strategy: str = Field(description="a strategy name; see GET /v1/strategies")
    batch_size: int = Field(ge=1, description="number of rows to select")
    task: str = Field(default="classification", description="classification or regression")
    embeddings: list[list[float]] = Field(description="n x d matrix, one row per candidate")
    probs: list[list[float]] | None = Field(
        default=None, description="n x k class probabilities (classification strategies that use them)"
    )
    labeled: list[int] | None = Field(default=None, description="row indices already labeled (0-based)")
    reserved: list[int] | None = Field(default=None, description="row indices never to select")
    params: dict[str, Any] = Field(default_factory=dict, description="strategy parameters, plus `seed`")


_SELECT_EXAMPLE = {
    "strategy": "bait",
    "batch_size": 2,
    "task": "classification",
    "embeddings": [[0.1, 0.2], [0.4, -0.3], [1.0, 0.5], [-0.7, 0.9]],
    "probs": [[0.9, 0.1], [0.4, 0.6], [0.5, 0.5], [0.2, 0.8]],
    "labeled": [0],
    "params": {"seed": 0},
}

_SELECT_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "description": (
            "JSON (the arrays as nested lists), or multipart/form-data with an .npz file field `arrays` "
            "(numpy.savez: `embeddings` n x d, optional `probs` n x k, `labeled` and `reserved` 1-D int) and the "
            "other fields as form fields (`params` as a JSON string). The .npz may inflate to at most "
            "`max_select_inflated_bytes` (413 above it, checked before inflating)."
        ),
        "content": {
            "application/json": {
                "schema": SelectRequest.model_json_schema(),
                "example": _SELECT_EXAMPLE,
            },
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "arrays": {
                            "type": "string",
                            "format": "binary",
                            "description": ".npz with `embeddings`, optional `probs`, `labeled`, `reserved`",
                        },
                        "strategy": {"type": "string"},
                        "batch_size": {"type": "integer", "minimum": 1},
                        "task": {"type": "string", "enum": ["classification", "regression"]},
                        "params": {"type": "string", "description": 'JSON object, e.g. {"seed": 0}'},
                    },
                    "required": ["arrays", "strategy", "batch_size"],
                }
            },
        },
    }
}


def _load_npz(fileobj: IO[bytes], budget: int) -> dict[str, np.ndarray]:
    """The arrays of the request's .npz, within ``budget`` inflated bytes (checked before inflating)."""
    return archives.read_npz(fileobj, budget=budget, allowed=ARRAY_FIELDS, error=BadRequest)


def _check_text(fields: dict[str, Any]) -> None:
    found = find_bad_text(fields)
    if found is not None:
        path, problem = found
        raise BadRequest(f"{'.'.join(map(str, path))} {problem}", {"loc": list(path)}, code="invalid_string")


def _parse_json(raw: bytes) -> domain.SelectInput:
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise BadRequest(f"body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("body must be a JSON object")
    unknown = sorted(set(body) - {"strategy", "batch_size", "task", "params", *ARRAY_FIELDS})
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown}")
    _check_text({k: body.get(k) for k in ("strategy", "task", "params")})
    arrays = {k: body[k] for k in ARRAY_FIELDS if body.get(k) is not None}
    return domain.SelectInput(
        strategy=body.get("strategy"),
        batch_size=body.get("batch_size"),
        task=body.get("task", "classification"),
        params=body.get("params") or {},
        arrays=arrays,
    )


def _parse_multipart(fileobj: IO[bytes], fields: dict[str, str], budget: int) -> domain.SelectInput:
    _check_text(dict(fields))
    unknown = sorted(set(fields) - {"strategy", "batch_size", "task", "params"})
    if unknown:
        raise BadRequest(f"unknown form field(s) {unknown}; expected strategy, batch_size, task, params")
    try:
        params = json.loads(fields.get("params") or "{}")
        size = int(fields["batch_size"]) if "batch_size" in fields else None
    except ValueError as exc:
        raise BadRequest(f"batch_size must be an integer and params a JSON object: {exc}") from exc
    _check_text({"params": params})
    return domain.SelectInput(
        strategy=fields.get("strategy"),
        batch_size=size,
        task=fields.get("task") or "classification",
        params=params,
        arrays=_load_npz(fileobj, budget),
    )


async def _parse(request: Request, settings: Settings) -> domain.SelectInput:
    """Read the body on the event loop (I/O only); parse, inflate and check it in a worker thread, so a
    large or hostile body never stalls other requests."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype == "application/json":
        return await run_in_threadpool(_parse_json, await request.body())
    if ctype == "multipart/form-data":
        form = await request.form(max_files=1, max_fields=10)
        upload = form.get("arrays")
        if upload is None or isinstance(upload, str):
            raise BadRequest("multipart requests need a file field `arrays` (.npz)")
        fields = {k: v for k, v in form.items() if k != "arrays" and isinstance(v, str)}
        fields.update({k: v for k, v in request.query_params.items() if k not in fields})
        return await run_in_threadpool(_parse_multipart, upload.file, fields, settings.max_select_inflated_bytes)
    raise UnsupportedMediaType("send application/json or multipart/form-data with an .npz file field `arrays`")


@router.post(
    "/v1/select",
    response_model=SelectOut,
    responses={**UPLOAD_ERROR_RESPONSES, 202: {"model": SelectOut, "description": "Large request: a job to poll"}},
    openapi_extra=_SELECT_BODY_DOC,
)
async def select(request: Request, response: Response, session: SessionDep, tenant: TenantDep) -> SelectOut:
    """Select `batch_size` rows of the given arrays. Answers 200 with `indices` when
    `n * d * max(k, 1) <= sync_select_max_cells` and the job ends within `sync_select_wait_seconds`;
    otherwise 202 and `GET /v1/select/{id}` until `status` is `succeeded` or `failed`."""
    settings: Settings = request.app.state.settings
    tenant_id = tenant.id
    await run_in_threadpool(session.rollback)  # end the key lookup's transaction before the long part
    inp = await _parse(request, settings)
    factory = request.app.state.sessionmaker
    job_id, sync = await run_in_threadpool(domain.submit, factory, request.app.state.queue, settings, tenant_id, inp)
    response.headers["Location"] = f"/v1/select/{job_id}"
    if sync:
        view = await run_in_threadpool(domain.wait, factory, tenant_id, job_id, settings.sync_select_wait_seconds)
        domain.raise_if_failed(view)
        if view["status"] == "succeeded":
            return SelectOut(**view)
    else:
        with_session = await run_in_threadpool(domain.wait, factory, tenant_id, job_id, 0.0)
        view = with_session
    response.status_code = status.HTTP_202_ACCEPTED
    return SelectOut(**view)


@router.get("/v1/select/{job_id}", response_model=SelectOut, responses=ERROR_RESPONSES)
def get_select(job_id: str, session: SessionDep, tenant: TenantDep) -> SelectOut:
    """A selection job: status, progress, and once succeeded its `indices`, `objective`, `diagnostics`."""
    return SelectOut(**domain.job_view(session, tenant.id, job_id))


@router.get("/v1/strategies", response_model=StrategyList, responses=ERROR_RESPONSES)
def list_strategies(_tenant: TenantDep) -> StrategyList:
    """The selection strategies: the tasks each supports and its parameters (for batches and /v1/select)."""
    out = []
    for name in strategies.names():
        spec = strategies.CATALOG[name]
        params = {
            k: {"type": p.annotation, "default": p.default}
            for k, p in spec.params.items()
            if k not in strategies.ARRAY_PARAMS
        }
        params["seed"] = {"type": "int | None", "default": None}
        out.append(StrategyOut(name=name, tasks=list(spec.tasks), summary=spec.summary, params=params))
    return StrategyList(strategies=out)
