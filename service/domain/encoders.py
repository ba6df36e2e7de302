"""Encoders: uploaded TorchScript modules (per tenant, size-limited, stored in the database) and the
check of a pool's ``encoder`` config.

The web process never loads a module itself: an upload is checked for its size and zip magic, then
by :mod:`worker.torchscript_check` run as a sandboxed child process (:mod:`service.sandbox`: no
secrets in its environment, a temporary working folder, memory, CPU and wall-clock limits) which
loads it and checks every operator of every method against an allowlist of tensor operators. Only
a module that passes is stored.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import subprocess
import tempfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from service import catalog
from service.errors import Conflict, EncoderRejected, InvalidFile, NotFound, PayloadTooLarge, ValidationFailed
from service.sandbox import child_command, child_env
from service.store import embedding as repo
from service.store.models import EncoderModel, Pool

ZIP_MAGIC = b"PK\x03\x04"  # torch.jit.save writes a zip archive
MINILM_DIM = 384
ENCODER_KINDS = ("identity", "text-minilm", "torchscript")


def check_torchscript(data: bytes, *, timeout: float, memory_bytes: int) -> None:
    """Load ``data`` in a sandboxed child process and check its operators against the allowlist.

    Raises:
        InvalidFile: the bytes are not a TorchScript module this torch can load.
        EncoderRejected: an operator outside the allowlist (named, with the method it is in), or the
            check ran out of time or memory.
    """
    nonce = secrets.token_hex(16)  # the module cannot know it: its own prints cannot pose as the verdict
    cmd = child_command(
        catalog.TORCHSCRIPT_CHECK, nonce, "--memory-bytes", str(memory_bytes), "--cpu-seconds", str(math.ceil(timeout))
    )
    with tempfile.TemporaryDirectory(prefix="bait-check-") as tmp:
        out_path = Path(tmp) / "stdout"
        with open(out_path, "wb") as out, open(Path(tmp) / "stderr", "wb") as err:
            try:
                proc = subprocess.run(
                    cmd,
                    input=data,
                    stdout=out,
                    stderr=err,
                    cwd=tmp,
                    env=child_env(tmp),
                    timeout=timeout,
                    close_fds=True,
                    start_new_session=True,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                raise EncoderRejected(
                    f"the encoder could not be checked within {timeout:g} s (does loading it loop?)",
                    {"limit_seconds": timeout},
                ) from None
        lines = out_path.read_bytes()[-65536:].decode("utf-8", "replace").splitlines()
    verdicts = [line[len(nonce) :] for line in lines if line.startswith(nonce)]
    if proc.returncode != 0 or not verdicts:
        raise EncoderRejected(
            f"the encoder could not be checked: loading it ended the check process (exit status {proc.returncode}; "
            f"memory limit {memory_bytes} bytes)",
            {"exit_status": proc.returncode},
        )
    verdict = json.loads(verdicts[-1])
    if verdict.get("ok") is True:
        return
    if verdict.get("unloadable"):
        raise InvalidFile(f"not a TorchScript module torch can load: {str(verdict.get('message'))[:500]}")
    raise EncoderRejected(
        str(verdict.get("message")), {"operator": verdict.get("operator"), "where": verdict.get("where")}
    )


def store_encoder(
    session: Session,
    tenant_id: str,
    *,
    name: str,
    data: bytes,
    config: dict[str, Any],
    max_bytes: int,
    check_timeout: float = 120.0,
    check_memory_bytes: int = 8 * 2**30,
) -> EncoderModel:
    """Check an uploaded TorchScript module (:func:`check_torchscript`) and store it with its input config.

    Raises:
        PayloadTooLarge: more than ``max_bytes``.
        InvalidFile: empty, not a zip archive (``torch.jit.save`` output), or not loadable.
        EncoderRejected: an operator outside the allowlist; nothing is stored.
    """
    if len(data) > max_bytes:
        raise PayloadTooLarge(
            f"encoder of {len(data)} bytes is larger than the limit of {max_bytes} bytes", {"limit": max_bytes}
        )
    if not data.startswith(ZIP_MAGIC):
        raise InvalidFile("not a TorchScript file: expected the zip archive torch.jit.save writes")
    check_torchscript(data, timeout=check_timeout, memory_bytes=check_memory_bytes)
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
