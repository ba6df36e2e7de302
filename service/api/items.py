"""Routes: items. JSON upsert, bulk file upload (.npz / Parquet), paginated listing, one item."""

from __future__ import annotations

import tempfile
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.api.schemas import ItemOut, ItemPage, ItemsUpsert, UpsertResult
from service.config import tenant_data_root
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import embedding as embedding_domain
from service.domain import ingest, item_data, store_arrivals
from service.domain import items as items_domain
from service.domain import quality as quality_domain
from service.domain.pools import get_pool
from service.errors import ERROR_RESPONSES, UPLOAD_ERROR_RESPONSES, ErrorBody, InvalidFile
from service.store.embedding import EmbeddingInfo
from service.store.items import ItemRow
from service.store.models import Pool

router = APIRouter(prefix="/v1/pools", tags=["items"])

UPLOAD_RESPONSES: dict[int | str, dict[str, Any]] = {
    **UPLOAD_ERROR_RESPONSES,
    415: {"model": ErrorBody, "description": "Not an .npz or Parquet file"},
}
# Bodies above this stay in memory while they stream in; larger ones spill to a temporary file.
_SPOOL_IN_MEMORY_BYTES = 64 * 2**20

_BULK_BODY_DOC = {
    "requestBody": {
        "required": True,
        "description": (
            "An .npz with arrays `ids` (n strings) and `embeddings` (n x d float32/float64), or a Parquet "
            "file with a string column `id` and a list<float> column `embedding`; optionally item content as "
            "JSON strings (.npz: a string array `data`; Parquet: a string column `data`); as the raw body "
            "(any Content-Type, e.g. application/octet-stream) or as the multipart/form-data field `file`."
        ),
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {"file": {"type": "string", "format": "binary"}},
                    "required": ["file"],
                }
            },
        },
    }
}


def item_out(
    pool: Pool, row: ItemRow, include_embedding: bool, info: EmbeddingInfo | None = None, split: str = "train"
) -> ItemOut:
    fields: dict[str, Any] = {
        "split": split,
        "id": row.external_id,
        "status": row.status,
        "batch_id": row.batch_id,
        "reserved_until": row.reserved_until,
        "labeled_at": row.labeled_at,
    }
    if pool.task == "classification":
        fields["label"] = row.label
    else:
        fields["target"] = row.label
    if include_embedding:
        fields["embedding"] = None if row.embedding is None else np.frombuffer(row.embedding, dtype="<f4").tolist()
    # Embedding state is shown for items given by reference (or not ready); plain items keep their shape.
    if info is not None and (info.uri is not None or info.has_text or info.status != "ready"):
        fields["embedding_status"] = info.status
        if info.uri is not None:
            fields["uri"] = info.uri
        if info.status == "error":
            fields["embedding_error"] = info.error
        if info.source is not None:
            fields["embedding_source"] = info.source
    if row.data is not None:
        fields["data"] = row.data
    # Only the fields set here are sent (label or target by the pool's task; embedding on request).
    return ItemOut(**fields)


@router.post("/{pool}/items", response_model=UpsertResult, response_model_exclude_none=True, responses=ERROR_RESPONSES)
def upsert_items(
    pool: str, body: ItemsUpsert, request: Request, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> UpsertResult:
    """Insert or update items by external id (idempotent). Re-sending an id replaces its embedding only;
    its label, status and history stay.

    Items may be given by `uri` or `text` instead of `embedding`: the pool's encoder turns them into
    embeddings in an embed job started after the request commits (`embed_job_id`; poll
    `GET /v1/pools/{pool}/embed`). Until then they are `pending` and never selected."""
    p = get_pool(session, tenant.id, pool)
    items_domain.check_ids([it.id for it in body.items])
    item_data.check_data(
        [it.id for it in body.items],
        [it.data for it in body.items],
        settings.max_item_data_bytes,
        tenant_data_root(settings, tenant.name),
    )
    direct = [it for it in body.items if it.embedding is not None]
    refs = [it for it in body.items if it.embedding is None]
    created = updated = 0
    job_id: str | None = None
    # the pool store's copy changes with embeddings given, split moves, and references re-sent (ready again later)
    store_changes = bool(direct) or any(it.split is not None for it in body.items)
    if direct:
        created, updated = items_domain.upsert_items(
            session,
            p,
            [it.id for it in direct],
            [it.embedding or [] for it in direct],
            settings.max_items_per_request,
        )
    if refs:
        c, u, job_id = embedding_domain.upsert_references(
            session,
            request.app.state.queue,
            p,
            [it.id for it in refs],
            [it.uri for it in refs],
            [it.text for it in refs],
            settings.max_items_per_request,
        )
        created, updated = created + c, updated + u
        store_changes = store_changes or u > 0
    for split in ("train", "validation"):
        chosen = [it.id for it in body.items if it.split == split]
        if chosen:
            quality_domain.move_items(session, p, chosen, split)
    items_domain.store_data(session, p, [(it.id, it.data) for it in body.items if it.data is not None])
    if store_changes:
        store_arrivals.write_on_commit(session, request.app.state.queue, settings, p.id)
    return UpsertResult(created=created, updated=updated, embed_job_id=job_id)


@router.post(
    "/{pool}/items:bulk",
    response_model=UpsertResult,
    response_model_exclude_none=True,
    responses=UPLOAD_RESPONSES,
    openapi_extra=_BULK_BODY_DOC,
)
async def bulk_upload(
    pool: str,
    request: Request,
    session: SessionDep,
    tenant: TenantDep,
    settings: SettingsDep,
    file_format: Annotated[
        Literal["npz", "parquet"] | None, Query(alias="format", description="default: from the file's magic bytes")
    ] = None,
    id_column: Annotated[
        str | None, Query(max_length=200, description="ids array/column (default `ids` in .npz, `id` in Parquet)")
    ] = None,
    embedding_column: Annotated[
        str | None,
        Query(max_length=200, description="embeddings array/column (`embeddings` in .npz, `embedding` in Parquet)"),
    ] = None,
    split: Annotated[
        Literal["train", "validation"] | None,
        Query(description="put every item of the file in this split (omitted: new items train, others unchanged)"),
    ] = None,
    data_column: Annotated[
        str | None,
        Query(
            max_length=200,
            description="item content: a string column/array of JSON objects, one per item (default `data`, "
            "optional; null or empty string: no data)",
        ),
    ] = None,
) -> UpsertResult:
    """Upsert many items from one file (same semantics as the JSON upsert). The key and the pool are
    checked before the body is read; the body is limited to `max_upload_bytes` while it streams."""
    p = await run_in_threadpool(get_pool, session, tenant.id, pool)
    content_type = request.headers.get("content-type", "")
    filename: str | None = None
    if content_type.lower().startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=10)
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise InvalidFile("multipart upload without a file field named `file`")
        fileobj: Any = upload.file
        filename = upload.filename
        content_type = upload.content_type or ""
    else:
        fileobj = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY_BYTES)  # noqa: SIM115 (closed below)
        async for chunk in request.stream():
            fileobj.write(chunk)
    try:
        fileobj.seek(0)
        head = fileobj.read(8)
        fileobj.seek(0)
        fmt = ingest.detect_format(head, content_type, filename, file_format)
        created, updated = await run_in_threadpool(
            items_domain.upsert_file,
            session,
            p,
            fileobj,
            fmt=fmt,
            id_column=id_column,
            embedding_column=embedding_column,
            max_inflated_bytes=settings.max_upload_inflated_bytes,
            split=split,
            data_column=data_column,
            max_data_bytes=settings.max_item_data_bytes,
            data_root=tenant_data_root(settings, tenant.name),
            block_bytes=settings.bulk_block_bytes,
        )
    finally:
        fileobj.close()
    store_arrivals.write_on_commit(session, request.app.state.queue, settings, p.id)
    return UpsertResult(created=created, updated=updated)


@router.get("/{pool}/items", response_model=ItemPage, response_model_exclude_unset=True, responses=ERROR_RESPONSES)
def list_items(
    pool: str,
    session: SessionDep,
    tenant: TenantDep,
    status: Annotated[
        Literal["unlabeled", "reserved", "labeled"] | None,
        Query(description="effective status: an expired reservation counts as unlabeled"),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=200, description="`next_cursor` of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    include_embedding: bool = False,
    embedding_status: Annotated[
        Literal["ready", "pending", "error"] | None,
        Query(description="items given by reference: pending (not encoded yet) or error (see embedding_error)"),
    ] = None,
) -> ItemPage:
    """Items in upload order, one page at a time; `next_cursor` is null on the last page."""
    p = get_pool(session, tenant.id, pool)
    rows, next_cursor = items_domain.list_items(
        session,
        p,
        status=status,
        cursor=cursor,
        limit=limit,
        include_embedding=include_embedding,
        embedding_status=embedding_status,
    )
    info = items_domain.embedding_info(session, rows)
    splits = quality_domain.splits(session, [r.internal_id for r in rows])
    return ItemPage(
        items=[
            item_out(p, r, include_embedding, info.get(r.internal_id), splits.get(r.internal_id, "train")) for r in rows
        ],
        next_cursor=next_cursor,
    )


@router.get(
    "/{pool}/items/{item_id}", response_model=ItemOut, response_model_exclude_unset=True, responses=ERROR_RESPONSES
)
def get_item(
    pool: str, item_id: str, session: SessionDep, tenant: TenantDep, include_embedding: bool = False
) -> ItemOut:
    p = get_pool(session, tenant.id, pool)
    row = items_domain.get_item(session, p, item_id)
    info = items_domain.embedding_info(session, [row])
    split = quality_domain.splits(session, [row.internal_id]).get(row.internal_id, "train")
    return item_out(p, row, include_embedding, info.get(row.internal_id), split)
