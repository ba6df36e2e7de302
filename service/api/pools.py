"""Routes: pools (`/v1/pools`). Parse, authorise (tenant from the key), delegate to service.domain.pools."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from service import catalog
from service.api.schemas import (
    EmbeddingCounts,
    PoolCounts,
    PoolCreate,
    PoolList,
    PoolOut,
    PoolPatch,
    ValidationCounts,
)
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import embedding as embedding_domain
from service.domain import pools as pools_domain
from service.domain import store_arrivals
from service.errors import ERROR_RESPONSES
from service.queue import enqueue_on_commit

router = APIRouter(prefix="/v1/pools", tags=["pools"])


def pool_out(view: pools_domain.PoolView) -> PoolOut:
    p = view.pool
    return PoolOut(
        id=p.id,
        name=p.name,
        task=p.task,
        classes=p.classes,
        n_outputs=p.n_outputs,
        embedding_dim=p.embedding_dim,
        head=p.head,
        encoder=p.encoder,
        validation=p.validation,
        counts=PoolCounts(**{k: view.counts[k] for k in ("items", "unlabeled", "reserved", "labeled")}),
        validation_counts=ValidationCounts(
            items=view.counts.get("validation", 0), labeled=view.counts.get("validation_labeled", 0)
        ),
        embedding_counts=None
        if not p.encoder
        else EmbeddingCounts(**{k: view.counts.get(f"embedding_{k}", 0) for k in ("ready", "pending", "error")}),
        created_at=p.created_at,
    )


@router.post("", status_code=status.HTTP_201_CREATED, response_model=PoolOut, responses=ERROR_RESPONSES)
def create_pool(body: PoolCreate, session: SessionDep, tenant: TenantDep) -> PoolOut:
    """Create a pool: classification with named `classes`, or regression with `n_outputs` targets."""
    view = pools_domain.create_pool(
        session,
        tenant.id,
        name=body.name,
        task=body.task,
        classes=body.classes,
        n_outputs=body.n_outputs,
        embedding_dim=body.embedding_dim,
        head=body.head.model_dump(exclude_none=True),
        encoder=None if body.encoder is None else body.encoder.model_dump(exclude_none=True),
        validation=None if body.validation is None else body.validation.model_dump(),
    )
    return pool_out(view)


@router.get("", response_model=PoolList, responses=ERROR_RESPONSES)
def list_pools(session: SessionDep, tenant: TenantDep) -> PoolList:
    """The caller's pools, oldest first, with item counts by status."""
    return PoolList(pools=[pool_out(v) for v in pools_domain.list_pools(session, tenant.id)])


@router.get("/{pool}", response_model=PoolOut, responses=ERROR_RESPONSES)
def get_pool(pool: str, session: SessionDep, tenant: TenantDep) -> PoolOut:
    return pool_out(pools_domain.view_pool(session, tenant.id, pool))


@router.patch("/{pool}", response_model=PoolOut, responses=ERROR_RESPONSES)
def patch_pool(
    pool: str, body: PoolPatch, request: Request, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> PoolOut:
    """Change the pool's `validation` hold-out or its `encoder`. Items given by reference (uri/text) are
    embedded again with the new encoder by an embed job started after the change commits (until then they
    are pending and never selected); items posted with embeddings are untouched."""
    p = pools_domain.get_pool(session, tenant.id, pool)
    if "encoder" in body.model_fields_set:
        config = None if body.encoder is None else body.encoder.model_dump(exclude_none=True)
        before = p.encoder or None
        embedding_domain.set_encoder(session, request.app.state.queue, tenant.id, p, config)
        if (p.encoder or None) != before:  # items given by reference are pending until embedded again
            store_arrivals.write_on_commit(session, request.app.state.queue, settings, p.id)
    if "validation" in body.model_fields_set:
        p.validation = None if body.validation is None else body.validation.model_dump()
    session.flush()
    return pool_out(pools_domain.view_pool(session, tenant.id, pool))


@router.delete("/{pool}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response, responses=ERROR_RESPONSES)
def delete_pool(pool: str, request: Request, session: SessionDep, tenant: TenantDep) -> Response:
    """Delete a pool and everything in it (items, labels, batches, checkpoints, and its folder in the pool store,
    removed by a job once the deletion has committed)."""
    pool_id = pools_domain.delete_pool(session, tenant.id, pool)
    enqueue_on_commit(
        session, request.app.state.queue, catalog.DROP_POOL_STORE, f"drop-store-{pool_id}", pool_id=pool_id
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)
