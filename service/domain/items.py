"""Items: validated upserts (JSON or bulk files) and cursor-paginated listings.

Every write is validated as a whole before anything is written: one bad row rejects the request.
"""

from __future__ import annotations

import base64
import binascii
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

import numpy as np
from sqlalchemy.orm import Session

from service.domain import ingest, item_data
from service.errors import (
    DuplicateId,
    InvalidCursor,
    InvalidEmbedding,
    InvalidId,
    NotFound,
    TooManyItems,
    ValidationFailed,
)
from service.store import embedding as embedding_repo
from service.store import items as items_repo
from service.store import quality as quality_repo
from service.store.embedding import EmbeddingInfo
from service.store.items import ItemRow
from service.store.models import Pool
from service.textcheck import id_problem

MAX_EXTERNAL_ID_LENGTH = 512
_SHOWN = 10  # offending ids listed in an error's details


def check_ids(ids: Sequence[str], what: str = "id") -> None:
    """Ids must be non-empty strings of at most 512 characters without control characters or `/` (see
    service/textcheck.py), each once per request."""
    bad = [i for i in ids if not isinstance(i, str) or not i or len(i) > MAX_EXTERNAL_ID_LENGTH]
    if bad:
        raise ValidationFailed(
            f"every {what} must be a non-empty string of at most {MAX_EXTERNAL_ID_LENGTH} characters "
            f"({len(bad)} are not, e.g. {str(bad[0])[:80]!r})",
            {"invalid": [str(b)[:80] for b in bad[:_SHOWN]]},
        )
    for i in ids:
        problem = id_problem(i)
        if problem is not None:
            raise InvalidId(f"{what} {i[:80]!r} {problem}", {"invalid": i[:80].encode("utf-8", "replace").decode()})
    if len(set(ids)) != len(ids):
        dupes = [i for i, c in Counter(ids).items() if c > 1]
        raise DuplicateId(
            f"{what}s must be unique within a request; repeated: {dupes[:_SHOWN]}", {"duplicates": dupes[:_SHOWN]}
        )


def check_embeddings(pool: Pool, ids: Sequence[str], emb: np.ndarray) -> np.ndarray:
    """Validate an ``n x d`` array against the pool; returns it as float32.

    Raises:
        InvalidEmbedding: wrong dimension, or a NaN/inf value (also one that overflows float32).
    """
    if emb.ndim != 2 or emb.shape[0] != len(ids):
        raise InvalidEmbedding(f"expected {len(ids)} embeddings of {pool.embedding_dim} values")
    if emb.shape[1] != pool.embedding_dim:
        raise InvalidEmbedding(
            f"embedding dimension: expected {pool.embedding_dim}, got {emb.shape[1]}",
            {"expected": pool.embedding_dim, "got": int(emb.shape[1])},
        )
    emb32 = np.asarray(emb, dtype=np.float32)
    finite = np.isfinite(emb32).all(axis=1)
    if not finite.all():
        rows = np.flatnonzero(~finite)
        bad = [ids[int(r)] for r in rows[:_SHOWN]]
        raise InvalidEmbedding(
            f"embeddings must be finite: {len(rows)} item(s) hold NaN or infinite values (or values beyond "
            f"float32 range), e.g. id {bad[0]!r}",
            {"ids": bad},
        )
    return emb32


def json_embeddings(pool: Pool, ids: Sequence[str], embeddings: Sequence[Sequence[float]]) -> np.ndarray:
    """JSON rows to an ``n x d`` array, naming the first row whose length is not the pool's dimension."""
    d = pool.embedding_dim
    for ext, row in zip(ids, embeddings, strict=True):
        if len(row) != d:
            raise InvalidEmbedding(
                f"item {ext!r}: embedding dimension: expected {d}, got {len(row)}",
                {"id": ext, "expected": d, "got": len(row)},
            )
    with np.errstate(over="ignore"):
        return np.asarray(embeddings, dtype=np.float64).reshape(len(ids), d)


def upsert_items(
    session: Session, pool: Pool, ids: Sequence[str], embeddings: Sequence[Sequence[float]], max_items: int
) -> tuple[int, int]:
    """Upsert JSON items by external id; returns ``(created, updated)``."""
    if len(ids) > max_items:
        raise TooManyItems(
            f"{len(ids)} items in one request; the limit is {max_items} (split the request or use the bulk upload)",
            {"limit": max_items, "got": len(ids)},
        )
    check_ids(ids)
    emb = check_embeddings(pool, ids, json_embeddings(pool, ids, embeddings))
    return items_repo.upsert_embeddings(session, pool.id, ids, emb, datetime.now(UTC))


def upsert_file(
    session: Session,
    pool: Pool,
    fileobj: IO[bytes],
    *,
    fmt: ingest.FileFormat,
    id_column: str | None,
    embedding_column: str | None,
    max_inflated_bytes: int,
    split: str | None = None,
    data_column: str | None = None,
    max_data_bytes: int = 64 * 2**10,
    data_root: Path | None = None,
    block_bytes: int = ingest.BLOCK_BYTES,
) -> tuple[int, int]:
    """Upsert the items of an .npz or Parquet file (with their content when the file has a ``data``
    column); returns ``(created, updated)``. With ``split``, every item of the file is put in that split
    (``train`` | ``validation``).

    The file streams in blocks of about ``block_bytes``: each block is validated (ids, duplicates across
    the whole file, dimension, finite values, content) and written before the next is read, all in the
    caller's transaction, so memory stays bounded and a bad row anywhere (block 7 of 50) is a 4xx that
    leaves nothing written once the transaction rolls back.
    """
    bulk = ingest.open_file(
        fmt,
        fileobj,
        id_column=id_column,
        embedding_column=embedding_column,
        data_column=data_column,
        max_inflated_bytes=max_inflated_bytes,
    )
    if not bulk.n:
        raise ingest.InvalidFile("the file holds no items")
    seen: set[str] = set()
    now = datetime.now(UTC)
    with items_repo.BulkUpsert(session, pool.id, now) as writer:
        for block in bulk.blocks(block_bytes, pool.embedding_dim):
            checked = check_block(pool, block, seen, max_data_bytes, data_root)
            write_block(session, pool, writer, checked, split, now)
    return writer.created, writer.updated


SPLITS = ("train", "validation")


@dataclass(frozen=True)
class CheckedBlock:
    """A block of a bulk file whose every row passed :func:`check_block`: what :func:`write_block` writes."""

    block: ingest.Block
    embeddings: np.ndarray  # m x d float32, finite
    data: list[dict[str, Any] | None] | None


def check_block(
    pool: Pool, block: ingest.Block, seen: set[str], max_data_bytes: int, data_root: Path | None
) -> CheckedBlock:
    """Validate one block of a bulk file (ids, duplicates across every block so far: ``seen`` is updated,
    dimension, finite values, content, per-row split values); raises the 4xx error of the first problem."""
    check_ids(block.ids)
    again = [i for i in block.ids if i in seen]
    if again:
        raise DuplicateId(
            f"ids must be unique within a request; repeated: {again[:_SHOWN]} (first seen before row "
            f"{block.start} of the file)",
            {"duplicates": again[:_SHOWN]},
        )
    seen.update(block.ids)
    with np.errstate(over="ignore"):
        emb32 = check_embeddings(pool, block.ids, block.embeddings)
    datas = item_data.parse_json_strings(block.ids, block.data, max_data_bytes, data_root) if block.data else None
    if block.split is not None:
        bad = [(e, v) for e, v in zip(block.ids, block.split, strict=True) if v is not None and v not in SPLITS]
        if bad:
            raise ValidationFailed(
                f"split must be one of {list(SPLITS)} (or empty: unchanged); item {bad[0][0]!r} has {bad[0][1]!r}",
                {"ids": [e for e, _ in bad[:_SHOWN]]},
            )
    return CheckedBlock(block, emb32, datas)


def write_block(
    session: Session,
    pool: Pool,
    writer: items_repo.BulkUpsert,
    checked: CheckedBlock,
    split: str | None,
    now: datetime,
) -> None:
    """Upsert a checked block in the caller's transaction: embeddings, then the split (``split`` for every
    row, else the block's per-row values where given), then the content."""
    block = checked.block
    writer.write(block.ids, checked.embeddings)
    by_split: dict[str, list[str]] = {}
    if split is not None:
        by_split[split] = list(block.ids)
    elif block.split is not None:
        for ext, value in zip(block.ids, block.split, strict=True):
            if value is not None:
                by_split.setdefault(value, []).append(ext)
    for value, exts in by_split.items():
        ids = list(items_repo.internal_ids(session, pool.id, exts).values())
        quality_repo.set_split(session, pool.id, ids, value, now)
    if checked.data is not None:
        store_data(session, pool, [(e, d) for e, d in zip(block.ids, checked.data, strict=True) if d is not None])


def store_data(session: Session, pool: Pool, values: Sequence[tuple[str, dict[str, Any] | None]]) -> None:
    """Write validated item content ``(external id, data)`` of items that exist (just upserted)."""
    items_repo.set_data(session, pool.id, [(e, d) for e, d in values if d is not None], datetime.now(UTC))


# ------------------------------------------------------------------------------------------- listing


def encode_cursor(internal_id: int) -> str:
    return base64.urlsafe_b64encode(f"i{internal_id}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("i"):
            raise ValueError(raw)
        return int(raw[1:])
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise InvalidCursor("cursor is not one this service returned; start again without it") from exc


def list_items(
    session: Session,
    pool: Pool,
    *,
    status: str | None,
    cursor: str | None,
    limit: int,
    include_embedding: bool,
    embedding_status: str | None = None,
) -> tuple[list[ItemRow], str | None]:
    """One page of items in upload order, filtered by effective status (and embedding status); and the
    next page's cursor."""
    after = decode_cursor(cursor) if cursor else None
    rows = items_repo.page_items(
        session,
        pool.id,
        now=datetime.now(UTC),
        status=status,
        after=after,
        limit=limit + 1,
        include_embedding=include_embedding,
        embedding_status=embedding_status,
    )
    more = len(rows) > limit
    rows = rows[:limit]
    return rows, (encode_cursor(rows[-1].internal_id) if more else None)


def embedding_info(session: Session, rows: Sequence[ItemRow]) -> dict[int, EmbeddingInfo]:
    """Reference and embedding state of listed items (uri, embedding_status, error, source)."""
    return embedding_repo.embedding_info(session, [r.internal_id for r in rows])


def get_item(session: Session, pool: Pool, external_id: str) -> ItemRow:
    row = items_repo.get_item(session, pool.id, external_id, now=datetime.now(UTC))
    if row is None:
        raise NotFound(f"item {external_id!r} not found in pool {pool.id!r}")
    return row
