"""Route: the operator's limits (`GET /v1/limits`), so a client can size its requests under them
(bulk uploads split into chunks below `max_upload_bytes`, JSON requests below `max_items_per_request`)
instead of finding them by a 413 after sending."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, Field

from service.deps import SettingsDep, TenantDep
from service.errors import ERROR_RESPONSES

router = APIRouter(tags=["limits"])


class LimitsOut(BaseModel):
    max_json_bytes: int = Field(description="largest JSON request body")
    max_upload_bytes: int = Field(description="largest bulk upload body (.npz / Parquet)")
    max_upload_inflated_bytes: int = Field(description="largest size a bulk upload may inflate to")
    max_items_per_request: int = Field(description="items or labels in one JSON request")
    max_item_data_bytes: int = Field(description="largest `data` object of one item (compact JSON)")
    max_select_inflated_bytes: int = Field(description="largest size the .npz of a POST /v1/select may inflate to")
    sync_select_max_cells: int = Field(description="POST /v1/select answers synchronously up to n*d*max(k,1) cells")
    max_encoder_bytes: int = Field(description="largest TorchScript encoder upload")
    rate_limit: str = Field(description="requests per API key (`off`: none)")
    rate_limit_expensive: str = Field(description="requests per API key to expensive routes, on top (`off`: none)")


@router.get("/v1/limits", response_model=LimitsOut, responses=ERROR_RESPONSES)
def get_limits(_tenant: TenantDep, settings: SettingsDep) -> LimitsOut:
    """The size and rate limits this service enforces on every API key."""
    return LimitsOut(
        max_json_bytes=settings.max_json_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        max_upload_inflated_bytes=settings.max_upload_inflated_bytes,
        max_items_per_request=settings.max_items_per_request,
        max_item_data_bytes=settings.max_item_data_bytes,
        max_select_inflated_bytes=settings.max_select_inflated_bytes,
        sync_select_max_cells=settings.sync_select_max_cells,
        max_encoder_bytes=settings.max_encoder_bytes,
        rate_limit=settings.rate_limit,
        rate_limit_expensive=settings.rate_limit_expensive,
    )
