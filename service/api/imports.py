"""Routes: import by reference (``POST /v1/pools/{pool}/items:import``) and its jobs (``.../imports``).

The dataset stays where it is (a Parquet file, folder or glob under the tenant's data folder, or under an
object-store prefix the operator assigned to the tenant): the request
is checked and a job is queued; a worker reads the files and writes every row in one transaction at the
end (see :mod:`service.domain.imports` and :mod:`worker.import_job`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from service.api.schemas import Attempt, RequestModel
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import imports as domain
from service.domain.pools import get_pool
from service.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/pools", tags=["items"])


class ImportRequest(RequestModel):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {"source": "file:///srv/bait-data/acme/embeddings/*.parquet"},
                {"source": "s3://datasets/acme/embeddings/"},
            ]
        },
    )
    source: str = Field(
        min_length=1,
        max_length=4096,
        description="file:///absolute/path under the tenant's data folder, or s3://bucket/key under an object-store "
        "prefix the operator assigned to the tenant (no query string: the endpoint is the operator's setting): one "
        ".parquet file, a folder (every *.parquet under it) or a glob in the last part (.../part-*.parquet). Columns: "
        "`id` (string), `embedding` (list<float> of the pool's embedding_dim), optional `data` (JSON object strings) "
        "and `split` (train | validation; null: unchanged). Other schemes (gs://, https://, ...) are not supported.",
    )


class ImportProgress(BaseModel):
    stage: str | None = Field(description="queued | load | open (files) | validate (rows) | write (rows) | done")
    done: int
    total: int


class ImportJobOut(BaseModel):
    id: str
    pool_id: str
    source: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: ImportProgress
    rows_imported: int = Field(description="rows written (0 until the job succeeds: all appear at once)")
    counts: dict[str, Any] = Field(description="once succeeded: files, rows, created, updated")
    error: str | None = Field(
        description="why the job failed: the file (relative to the data folder or the object-store prefix) and row"
    )
    attempts: int
    attempt_history: list[Attempt] = Field(description="every attempt, oldest first, with its outcome")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class ImportJobList(BaseModel):
    imports: list[ImportJobOut]


@router.post(
    "/{pool}/items:import",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=ImportJobOut,
    responses=ERROR_RESPONSES,
)
def import_items(
    pool: str,
    body: ImportRequest,
    request: Request,
    response: Response,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
) -> ImportJobOut:
    """Import a Parquet dataset by reference, as a job (poll `GET /v1/pools/{pool}/imports/{id}`).

    The source is checked now (400 `invalid_source`, nothing written); the job reads it again. Same
    semantics as the bulk upload: an id the pool has already gets the file's embedding (and data and
    split where given), its label, status and history stay. A bad row fails the job naming the file and
    row, and nothing is written: the rows appear in one transaction when the job succeeds."""
    p = get_pool(session, tenant.id, pool)
    job = domain.request_import(session, request.app.state.queue, p, body.source, tenant.name, settings)
    session.flush()
    response.headers["Location"] = f"/v1/pools/{pool}/imports/{job.id}"
    return ImportJobOut.model_validate(domain.job_view(job))


@router.get("/{pool}/imports", response_model=ImportJobList, responses=ERROR_RESPONSES)
def list_imports(
    pool: str, session: SessionDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> ImportJobList:
    """The pool's imports, newest first."""
    p = get_pool(session, tenant.id, pool)
    return ImportJobList(
        imports=[ImportJobOut.model_validate(domain.job_view(j)) for j in domain.list_jobs(session, p, limit)]
    )


@router.get("/{pool}/imports/{import_id}", response_model=ImportJobOut, responses=ERROR_RESPONSES)
def get_import(pool: str, import_id: str, session: SessionDep, tenant: TenantDep) -> ImportJobOut:
    """One import: status, progress, rows imported, and the error of a failed one."""
    p = get_pool(session, tenant.id, pool)
    return ImportJobOut.model_validate(domain.job_view(domain.get_job(session, p, import_id)))
