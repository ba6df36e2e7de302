"""Routes: labels. Write many at once, delete one, read an item's label history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from service.api.schemas import LabelEvent, LabelHistory, LabelsPut, LabelsResult
from service.deps import RetryOnConflict, SessionDep, SettingsDep, TenantDep
from service.domain import labels as labels_domain
from service.domain.pools import get_pool
from service.errors import ERROR_RESPONSES

router = APIRouter(prefix="/v1/pools", tags=["labels"], route_class=RetryOnConflict)


@router.put("/{pool}/labels", response_model=LabelsResult, responses=ERROR_RESPONSES)
def put_labels(
    pool: str, body: LabelsPut, session: SessionDep, tenant: TenantDep, settings: SettingsDep
) -> LabelsResult:
    """Label items: `label` (a class name) on classification pools, `target` (n_outputs numbers) on
    regression pools. Relabeling overwrites the current label; every write is kept in the history.
    Labeling a reserved item releases its reservation."""
    p = get_pool(session, tenant.id, pool)
    writes = [
        labels_domain.LabelWrite(
            item_id=w.item_id,
            label=w.label,
            target=None if w.target is None else [float(v) for v in w.target],
            annotator=w.annotator,
        )
        for w in body.labels
    ]
    n = labels_domain.put_labels(session, p, writes, annotator=body.annotator, max_items=settings.max_items_per_request)
    return LabelsResult(labeled=n)


@router.delete(
    "/{pool}/labels/{item_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=ERROR_RESPONSES,
)
def delete_label(
    pool: str,
    item_id: str,
    session: SessionDep,
    tenant: TenantDep,
    annotator: Annotated[str | None, Query(max_length=200, description="who removed it (history)")] = None,
) -> Response:
    """Remove an item's label: the item is unlabeled again (selectable); the history keeps the removal."""
    p = get_pool(session, tenant.id, pool)
    labels_domain.delete_label(session, p, item_id, annotator=annotator)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get("/{pool}/labels/{item_id}/history", response_model=LabelHistory, responses=ERROR_RESPONSES)
def label_history(pool: str, item_id: str, session: SessionDep, tenant: TenantDep) -> LabelHistory:
    """Every label write and removal of one item, oldest first."""
    p = get_pool(session, tenant.id, pool)
    rows = labels_domain.label_history(session, p, item_id)
    return LabelHistory(
        item_id=item_id,
        history=[
            LabelEvent(value=r.value, annotator=r.annotator, deleted=bool(r.deleted), created_at=r.created_at)
            for r in rows
        ],
    )
