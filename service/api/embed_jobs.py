"""Routes: embed jobs (`/v1/pools/{pool}/embed`): encoding a pool's items given by reference.

Jobs start by themselves after items with `uri`/`text` are upserted and after the pool's encoder
changes; ``POST`` starts one by hand (and retries items in error). ``GET`` polls the latest job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, Field

from service.api.schemas import Attempt
from service.deps import SessionDep, TenantDep
from service.domain import embedding as domain
from service.domain.pools import get_pool
from service.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/pools/{pool}/embed", tags=["embed jobs"])


class EmbedProgress(BaseModel):
    stage: str | None = Field(description="queued | load | embed | done")
    done: int
    total: int


class EmbedJobOut(BaseModel):
    id: str
    pool_id: str
    status: Literal["queued", "running", "succeeded", "failed", "cancelled"]
    progress: EmbedProgress
    counts: dict[str, Any] = Field(description="once finished: embedded, errors, skipped, total")
    error: str | None = Field(description="why the job failed (per-item errors are on the items)")
    attempts: int
    attempt_history: list[Attempt] = Field(description="every attempt, oldest first, with its outcome")
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class EmbedJobList(BaseModel):
    jobs: list[EmbedJobOut]


@router.post("", status_code=status.HTTP_202_ACCEPTED, response_model=EmbedJobOut, responses=ERROR_RESPONSES)
def start_embed(pool: str, request: Request, response: Response, session: SessionDep, tenant: TenantDep) -> EmbedJobOut:
    """Encode every pending item (items in error are retried); a job already waiting is reused."""
    p = get_pool(session, tenant.id, pool)
    job = domain.request_job(session, request.app.state.queue, p)
    session.flush()
    response.headers["Location"] = f"/v1/pools/{pool}/embed/{job.id}"
    return EmbedJobOut.model_validate(domain.job_view(job))


@router.get("", response_model=EmbedJobOut, responses=ERROR_RESPONSES)
def latest_embed(pool: str, session: SessionDep, tenant: TenantDep) -> EmbedJobOut:
    """The pool's latest embed job (404 if none ever ran)."""
    p = get_pool(session, tenant.id, pool)
    return EmbedJobOut.model_validate(domain.job_view(domain.get_job(session, p, None)))


@router.get("/jobs", response_model=EmbedJobList, responses=ERROR_RESPONSES)
def list_embed_jobs(
    pool: str, session: SessionDep, tenant: TenantDep, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> EmbedJobList:
    """The pool's embed jobs, newest first."""
    p = get_pool(session, tenant.id, pool)
    return EmbedJobList(
        jobs=[EmbedJobOut.model_validate(domain.job_view(j)) for j in domain.list_jobs(session, p, limit)]
    )


@router.get("/{job_id}", response_model=EmbedJobOut, responses=ERROR_RESPONSES)
def get_embed(pool: str, job_id: str, session: SessionDep, tenant: TenantDep) -> EmbedJobOut:
    p = get_pool(session, tenant.id, pool)
    return EmbedJobOut.model_validate(domain.job_view(domain.get_job(session, p, job_id)))
