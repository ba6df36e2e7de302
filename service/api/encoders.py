"""Routes: uploaded encoders (`/v1/encoders`): TorchScript modules a pool's ``encoder`` can name.

``POST`` takes multipart/form-data: the module as field `file` (what ``torch.jit.save`` writes), an
optional `name`, and an optional `config` (JSON, :class:`TorchScriptInputConfig`: how the worker
decodes inputs for it). The module is stored in the database, per tenant, up to
``BAIT_MAX_ENCODER_BYTES``, once a sandboxed child process has checked every operator of every
method against the allowlist of tensor operators (400 ``encoder_rejected`` naming the operator
otherwise). Needs a key with the ``admin`` scope.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response, status
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from service.api.schemas import EncoderList, EncoderOut, TorchScriptInputConfig
from service.deps import SessionDep, SettingsDep, TenantDep
from service.domain import encoders as domain
from service.errors import ERROR_RESPONSES, InvalidFile, PayloadTooLarge, ValidationFailed

router = APIRouter(prefix="/v1/encoders", tags=["encoders"])

UPLOAD_PATH = r"^/v1/encoders$"  # body limit: the upload limit (the route enforces max_encoder_bytes)

_UPLOAD_DOC = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "torch.jit.save output"},
                        "name": {"type": "string", "maxLength": 200},
                        "config": {
                            "type": "string",
                            "description": 'JSON, e.g. {"input": "image", "image_mode": "L", "image_size": [28, 28], '
                            '"mean": [0.1307], "std": [0.3081], "output_dim": 64}',
                        },
                    },
                    "required": ["file"],
                }
            }
        },
    }
}


def encoder_out(row: Any) -> EncoderOut:
    return EncoderOut(
        id=row.id,
        name=row.name,
        kind=row.kind,
        config=dict(row.config or {}),
        size_bytes=int(row.size_bytes),
        sha256=row.sha256,
        created_at=row.created_at,
    )


def parse_config(raw: Any) -> dict[str, Any]:
    if raw is None or raw == "":
        return TorchScriptInputConfig().model_dump()
    if not isinstance(raw, str):
        raise ValidationFailed("`config` must be a JSON text field")
    try:
        return TorchScriptInputConfig.model_validate(json.loads(raw)).model_dump()
    except json.JSONDecodeError as exc:
        raise ValidationFailed(f"`config` is not valid JSON: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise ValidationFailed(f"config.{where}: {first.get('msg')}" if where else str(first.get("msg"))) from None


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=EncoderOut,
    responses=ERROR_RESPONSES,
    openapi_extra=_UPLOAD_DOC,
)
async def upload_encoder(request: Request, session: SessionDep, tenant: TenantDep, settings: SettingsDep) -> EncoderOut:
    """Upload a TorchScript encoder (multipart: `file`, optional `name` and `config`)."""
    limit = settings.max_encoder_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit + 64 * 1024:
        raise PayloadTooLarge(f"encoder upload larger than the limit of {limit} bytes", {"limit": limit})
    if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        raise InvalidFile("upload the module as multipart/form-data with the field `file`")
    form = await request.form(max_files=1, max_fields=10)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise InvalidFile("multipart upload without a file field named `file`")
    try:
        data = await upload.read(limit + 1)
    finally:
        await upload.close()
    if len(data) > limit:
        raise PayloadTooLarge(f"encoder upload larger than the limit of {limit} bytes", {"limit": limit})
    name_field = form.get("name")
    name = (name_field if isinstance(name_field, str) and name_field else upload.filename or "encoder")[:200]
    config = parse_config(form.get("config"))
    row = await run_in_threadpool(
        domain.store_encoder,
        session,
        tenant.id,
        name=name,
        data=data,
        config=config,
        max_bytes=limit,
        check_timeout=settings.encoder_check_timeout_seconds,
        check_memory_bytes=settings.encoder_memory_bytes,
    )
    return encoder_out(row)


@router.get("", response_model=EncoderList, responses=ERROR_RESPONSES)
def list_encoders(session: SessionDep, tenant: TenantDep) -> EncoderList:
    """The caller's uploaded encoders (without their bytes), oldest first."""
    return EncoderList(encoders=[encoder_out(r) for r in domain.list_encoders(session, tenant.id)])


@router.get("/{encoder_id}", response_model=EncoderOut, responses=ERROR_RESPONSES)
def get_encoder(encoder_id: str, session: SessionDep, tenant: TenantDep) -> EncoderOut:
    return encoder_out(domain.get_encoder(session, tenant.id, encoder_id))


@router.delete(
    "/{encoder_id}", status_code=status.HTTP_204_NO_CONTENT, response_class=Response, responses=ERROR_RESPONSES
)
def delete_encoder(encoder_id: str, session: SessionDep, tenant: TenantDep) -> Response:
    """Delete an encoder (409 while a pool uses it)."""
    domain.delete_encoder(session, tenant.id, encoder_id)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
