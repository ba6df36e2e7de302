"""Encoders: uploaded TorchScript modules (per tenant, size-limited, stored in the database) and the
check of a pool's ``encoder`` config.

The web process never loads a module: an upload is checked for its size and for the zip archive
magic bytes TorchScript files start with; the worker loads it (and reports a module it cannot load
as the embed job's error).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.errors import Conflict, InvalidFile, NotFound, PayloadTooLarge, ValidationFailed
from service.store import embedding as repo
from service.store.models import EncoderModel, Pool

ZIP_MAGIC = b"PK\x03\x04"  # torch.jit.save writes a zip archive
MINILM_DIM = 384
ENCODER_KINDS = ("identity", "text-minilm", "torchscript")


def store_encoder(
    session: Session, tenant_id: str, *, name: str, data: bytes, config: dict[str, Any], max_bytes: int
) -> EncoderModel:
    """Store an uploaded TorchScript module with its input config.

    Raises:
        PayloadTooLarge: more than ``max_bytes``.
        InvalidFile: empty, or not a zip archive (``torch.jit.save`` output).
    """
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"encoder of {len(data)} bytes is larger than the limit of {max_bytes} bytes", {"limit": max_bytes}
        )
    if not data.startswith(ZIP_MAGIC):
        raise InvalidFile("not a TorchScript file: expected the zip archive torch.jit.save writes")
    model = EncoderModel(
        tenant_id=tenant_id,
        name=name,
        kind="torchscript",
        config=config,
        data=data,
        size_bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        created_at=datetime.now(UTC),
    )
    return repo.add_encoder(session, model)


def get_encoder(session: Session, tenant_id: str, encoder_id: str) -> EncoderModel:
    model = repo.get_encoder(session, tenant_id, encoder_id)
    if model is None:
        raise NotFound(f"encoder {encoder_id!r} not found")
    return model


def list_encoders(session: Session, tenant_id: str) -> Sequence[Any]:
    return repo.list_encoders(session, tenant_id)


def delete_encoder(session: Session, tenant_id: str, encoder_id: str) -> None:
    """Delete an uploaded encoder no pool uses (Conflict, naming the pools, otherwise)."""
    model = get_encoder(session, tenant_id, encoder_id)
    users = repo.pools_using_encoder(session, tenant_id, model.id)
    if users:
        raise Conflict(f"encoder {encoder_id!r} is used by pool(s) {users[:10]}; change their encoder first", users)
    repo.delete_encoder(session, model.id)


def check_pool_encoder(session: Session, tenant_id: str, config: dict[str, Any] | None, embedding_dim: int) -> None:
    """A pool's encoder config must name a known kind whose output fits the pool.

    Raises:
        ValidationFailed: text-minilm on a pool whose dimension is not 384; an uploaded model whose
            declared ``output_dim`` differs from the pool's.
        NotFound: ``model_id`` is not one of the tenant's encoders.
    """
    if config is None:
        return
    kind = config.get("kind")
    if kind not in ENCODER_KINDS:
        raise ValidationFailed(f"unknown encoder kind {kind!r}; one of {list(ENCODER_KINDS)}")
    if kind == "text-minilm" and embedding_dim != MINILM_DIM:
        raise ValidationFailed(
            f"the text-minilm encoder produces {MINILM_DIM} values; the pool's embedding_dim is {embedding_dim}",
            {"expected": MINILM_DIM, "got": embedding_dim},
        )
    if kind == "torchscript":
        model = get_encoder(session, tenant_id, str(config.get("model_id")))
        out_dim = (model.config or {}).get("output_dim")
        if out_dim is not None and int(out_dim) != embedding_dim:
            raise ValidationFailed(
                f"encoder {model.id!r} produces {out_dim} values; the pool's embedding_dim is {embedding_dim}",
                {"expected": embedding_dim, "got": out_dim},
            )


def accepts_text(pool: Pool) -> bool:
    return bool(pool.encoder) and (pool.encoder or {}).get("kind") == "text-minilm"
