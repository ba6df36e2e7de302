"""Bulk item files: .npz (arrays ``ids`` and ``embeddings``) and Parquet (``id`` + list<float> ``embedding``).

Both parse to ``(ids, embeddings)``: a list of ``n`` strings and an ``n x d`` float array. Every problem
with the file itself is an :class:`InvalidFile` (400) naming what is wrong; an unknown format is 415.
"""

from __future__ import annotations

from typing import IO, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from service.domain import archives
from service.errors import InvalidFile, UnsupportedMediaType

FileFormat = Literal["npz", "parquet"]
FORMATS: tuple[FileFormat, ...] = ("npz", "parquet")
DEFAULT_COLUMNS: dict[FileFormat, tuple[str, str]] = {"npz": ("ids", "embeddings"), "parquet": ("id", "embedding")}

_CONTENT_TYPES: dict[str, FileFormat] = {
    "application/x-npz": "npz",
    "application/zip": "npz",
    "application/vnd.apache.parquet": "parquet",
    "application/x-parquet": "parquet",
    "application/parquet": "parquet",
}


def detect_format(head: bytes, content_type: str | None, filename: str | None, explicit: str | None) -> FileFormat:
    """Pick the format: the ``format`` parameter, else the file's magic bytes, else its type or name."""
    if explicit is not None:
        if explicit not in FORMATS:
            raise UnsupportedMediaType(f"format must be one of {list(FORMATS)}, got {explicit!r}")
        return cast(FileFormat, explicit)
    if head.startswith(b"PK\x03\x04") or head.startswith(b"PK\x05\x06"):
        return "npz"
    if head.startswith(b"PAR1"):
        return "parquet"
    if head.startswith(b"\x93NUMPY"):
        raise UnsupportedMediaType(
            "a bare .npy holds no item ids: send an .npz with arrays `ids` (strings) and `embeddings` (n x d)"
        )
    ctype = (content_type or "").split(";")[0].strip().lower()
    name = (filename or "").lower()
    by_name = "npz" if name.endswith(".npz") else "parquet" if name.endswith(".parquet") else None
    hint = _CONTENT_TYPES.get(ctype) or by_name
    if hint is not None:
        raise InvalidFile(f"the body is not a valid {hint} file (its first bytes do not match the format)")
    raise UnsupportedMediaType(
        f"unsupported upload (content type {ctype or 'none'}): send an .npz or a Parquet file, "
        "as the raw body or as the multipart field `file`"
    )


def parse(
    fmt: FileFormat, fileobj: IO[bytes], id_column: str | None, embedding_column: str | None, max_inflated_bytes: int
) -> tuple[list[str], np.ndarray]:
    """``(ids, embeddings)`` of a bulk file, inflated within ``max_inflated_bytes`` (413 above it)."""
    default_ids, default_emb = DEFAULT_COLUMNS[fmt]
    ids_name, emb_name = id_column or default_ids, embedding_column or default_emb
    if fmt == "npz":
        return parse_npz(fileobj, ids_name, emb_name, max_inflated_bytes)
    return parse_parquet(fileobj, ids_name, emb_name, max_inflated_bytes)


def parse_npz(
    fileobj: IO[bytes], ids_name: str, emb_name: str, max_inflated_bytes: int
) -> tuple[list[str], np.ndarray]:
    """Read ``ids`` (1-D str array) and ``embeddings`` (2-D float32/float64 array) from an .npz; the sizes
    the archive declares are checked against ``max_inflated_bytes`` before anything is inflated."""
    arrays = archives.read_npz(fileobj, budget=max_inflated_bytes, names=[ids_name, emb_name])
    for name in (ids_name, emb_name):
        if name not in arrays:
            raise InvalidFile(f".npz has no array {name!r}", {"missing": name})
    ids_arr, emb = arrays[ids_name], arrays[emb_name]
    if ids_arr.ndim != 1:
        raise InvalidFile(f"array {ids_name!r} must be 1-D, got shape {list(ids_arr.shape)}")
    if ids_arr.dtype.kind == "U":
        ids = ids_arr.tolist()
    elif ids_arr.dtype.kind == "S":
        try:
            ids = [b.decode("utf-8") for b in ids_arr.tolist()]
        except UnicodeDecodeError as exc:
            raise InvalidFile(f"array {ids_name!r} holds bytes that are not UTF-8") from exc
    else:
        raise InvalidFile(f"array {ids_name!r} must hold strings, got dtype {ids_arr.dtype}")
    if emb.ndim != 2:
        raise InvalidFile(f"array {emb_name!r} must be 2-D (n x d), got shape {list(emb.shape)}")
    if emb.dtype not in (np.float32, np.float64) and emb.dtype.newbyteorder("=") not in (np.float32, np.float64):
        raise InvalidFile(f"array {emb_name!r} must be float32 or float64, got dtype {emb.dtype}")
    if emb.shape[0] != len(ids):
        raise InvalidFile(f"{len(ids)} ids but {emb.shape[0]} embedding rows")
    return ids, emb


def parse_parquet(
    fileobj: IO[bytes], id_col: str, emb_col: str, max_inflated_bytes: int
) -> tuple[list[str], np.ndarray]:
    """Read a string ``id`` column and a list<float> ``embedding`` column (all rows of one length), row
    group by row group within ``max_inflated_bytes`` decoded bytes."""
    table = archives.read_parquet_columns(fileobj, [id_col, emb_col], budget=max_inflated_bytes)
    ids_col = table.column(id_col)
    if not (pa.types.is_string(ids_col.type) or pa.types.is_large_string(ids_col.type)):
        raise InvalidFile(f"column {id_col!r} must be strings, got {ids_col.type}")
    if ids_col.null_count:
        raise InvalidFile(f"column {id_col!r} has {ids_col.null_count} null ids")
    col = table.column(emb_col)
    typ = col.type
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
        raise InvalidFile(f"column {emb_col!r} must be a list of floats, got {typ}")
    if not pa.types.is_floating(typ.value_type) or pa.types.is_float16(typ.value_type):
        raise InvalidFile(f"column {emb_col!r} must hold float32 or float64 values, got {typ.value_type}")
    if col.null_count:
        raise InvalidFile(f"column {emb_col!r} has {col.null_count} null embeddings")
    n = len(col)
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False) if n else np.zeros(0, dtype=np.int64)
    d = int(lengths[0]) if n else 0
    if n and (lengths != d).any():
        bad = int(np.flatnonzero(lengths != d)[0])
        raise InvalidFile(
            f"column {emb_col!r} is ragged: row 0 has {d} values, row {bad} has {int(lengths[bad])}",
            {"row": bad},
        )
    values = pc.list_flatten(arr)
    if values.null_count:
        raise InvalidFile(f"column {emb_col!r} has null values inside embeddings")
    emb = values.to_numpy(zero_copy_only=False).reshape(n, d)
    return ids_col.to_pylist(), emb


def parse_data_strings(
    fmt: FileFormat, fileobj: IO[bytes], data_column: str | None, n: int, max_inflated_bytes: int
) -> list[str | None] | None:
    """Item content as JSON strings, one per item: the ``data`` column (Parquet, strings, null: none) or
    array (.npz, 1-D strings, empty: none). ``None`` when the file has none and none was asked for. Read
    like the embeddings: within ``max_inflated_bytes``, checked before inflating (413 above it).

    Raises:
        InvalidFile: the column/array asked for is missing, not strings, or not one per item.
        PayloadTooLarge: the column would inflate above ``max_inflated_bytes``.
    """
    name = data_column or "data"
    if fmt == "npz":
        arrays = archives.read_npz(fileobj, budget=max_inflated_bytes, names=[name])
        if name not in arrays:
            if data_column is not None:
                raise InvalidFile(f".npz has no array {name!r}", {"missing": name})
            return None
        arr = arrays[name]
        if arr.ndim != 1 or arr.shape[0] != n:
            raise InvalidFile(f"array {name!r} must be 1-D with one JSON string per item ({n}), got {list(arr.shape)}")
        if arr.dtype.kind == "U":
            return [s or None for s in arr.tolist()]
        if arr.dtype.kind == "S":
            try:
                return [b.decode("utf-8") or None for b in arr.tolist()]
            except UnicodeDecodeError as exc:
                raise InvalidFile(f"array {name!r} holds bytes that are not UTF-8") from exc
        raise InvalidFile(f"array {name!r} must hold JSON strings, got dtype {arr.dtype}")
    try:
        names = pq.ParquetFile(fileobj).schema_arrow.names
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InvalidFile(f"not a readable Parquet file: {exc}") from exc
    if name not in names:
        if data_column is not None:
            raise InvalidFile(f"Parquet file has no column {name!r} (columns: {names})")
        return None
    fileobj.seek(0)
    col = archives.read_parquet_columns(fileobj, [name], budget=max_inflated_bytes).column(name)
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InvalidFile(f"column {name!r} must hold JSON strings, got {col.type}")
    if len(col) != n:
        raise InvalidFile(f"column {name!r} has {len(col)} rows for {n} items")
    return cast(list[str | None], col.to_pylist())
