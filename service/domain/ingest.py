"""Bulk item files: .npz (arrays ``ids`` and ``embeddings``) and Parquet (``id`` + list<float> ``embedding``).

Both are read as a stream of :class:`Block` s (ids, an ``m x d`` float array, optional content strings) of
about :data:`BLOCK_BYTES`, so a 10^6 x 768 file (3 GB) is never held in memory: the caller validates and
writes block by block inside one transaction. Every problem with the file itself is an
:class:`InvalidFile` (400) naming what is wrong; an unknown format is 415; a file that declares (or
decodes to) more than the inflated-size budget is 413, checked before inflating where the file says its
sizes.
"""

from __future__ import annotations

import contextlib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any, Literal, Protocol, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from service.domain import archives
from service.errors import InvalidFile, PayloadTooLarge, UnsupportedMediaType

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


# Rows read, validated and written at a time: about this many bytes of embeddings (and ids, content).
BLOCK_BYTES = 32 * 2**20
_READ_CHUNK = 8 * 2**20


@dataclass(frozen=True)
class Block:
    """Consecutive rows of a bulk file: ``start`` is the file row of the first one."""

    start: int
    ids: list[str]
    embeddings: np.ndarray  # m x d, float32 or float64 (any byte order)
    data: list[str | None] | None  # JSON strings (None: no content), when the file has a data column
    split: list[str | None] | None = None  # per-row split (None: unchanged), when read from a split column


class BulkFile(Protocol):
    """A bulk file whose structure (names, types, shapes, declared sizes) was checked when it was opened;
    its rows are read block by block, so memory stays bounded whatever the file's size."""

    n: int  # rows (items) the file declares

    def blocks(self, block_bytes: int = BLOCK_BYTES, dim: int = 0) -> Iterator[Block]:
        """Rows in blocks of about ``block_bytes`` (``dim``: the expected embedding dimension, sizes the
        blocks of formats whose rows' sizes are not known before decoding them)."""
        ...


def open_file(
    fmt: FileFormat,
    fileobj: IO[bytes],
    *,
    id_column: str | None,
    embedding_column: str | None,
    data_column: str | None,
    max_inflated_bytes: int,
) -> BulkFile:
    """Open an .npz or Parquet bulk file: everything about the file but its values is checked here (a 400
    naming the problem; 413 when it declares more than ``max_inflated_bytes`` inflated bytes).

    The ``data`` array/column (item content as JSON strings) is read when present; asked for by name
    (``data_column``) it must exist.
    """
    default_ids, default_emb = DEFAULT_COLUMNS[fmt]
    ids_name, emb_name = id_column or default_ids, embedding_column or default_emb
    data_name, data_required = data_column or "data", data_column is not None
    if fmt == "npz":
        return NpzFile(fileobj, ids_name, emb_name, data_name, data_required, max_inflated_bytes)
    return ParquetBulkFile(fileobj, ids_name, emb_name, data_name, data_required, max_inflated_bytes)


# ---------------------------------------------------------------------------------------------- .npz


@dataclass
class _Member:
    name: str
    info: zipfile.ZipInfo
    shape: tuple[int, ...]
    fortran: bool
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return archives.npy_nbytes(self.shape, self.dtype)


def _strings(arr: np.ndarray, name: str) -> list[str]:
    if arr.dtype.kind == "U":
        return cast(list[str], arr.tolist())
    try:
        return [b.decode("utf-8") for b in arr.tolist()]
    except UnicodeDecodeError as exc:
        raise InvalidFile(f"array {name!r} holds bytes that are not UTF-8") from exc


class NpzFile:
    """An .npz read member by member in row blocks: each member is inflated as it is read (never whole),
    exactly the bytes its .npy header declares, against the inflated-size budget checked up front."""

    def __init__(
        self, fileobj: IO[bytes], ids_name: str, emb_name: str, data_name: str, data_required: bool, budget: int
    ) -> None:
        self.zf, infos = archives.open_npz(fileobj)
        for name in (ids_name, emb_name):
            if name not in infos:
                raise InvalidFile(f".npz has no array {name!r}", {"missing": name})
        if data_required and data_name not in infos:
            raise InvalidFile(f".npz has no array {data_name!r}", {"missing": data_name})
        names = [ids_name, emb_name] + ([data_name] if data_name in infos else [])
        declared = sum(infos[n].file_size for n in names)
        if declared > budget:
            raise archives.too_large("the .npz", declared, budget)
        self.members: dict[str, _Member] = {}
        used = 0
        for name in names:
            with self._open(infos[name]) as fp:
                shape, fortran, dtype = archives.read_npy_header(fp, name)
            member = _Member(name, infos[name], shape, fortran, dtype)
            if member.nbytes > budget - used:
                raise archives.too_large(f"array {name!r} (shape {list(shape)}, {dtype})", member.nbytes, budget)
            used += member.nbytes
            self.members[name] = member
        ids, emb = self.members[ids_name], self.members[emb_name]
        data = self.members.get(data_name)
        if len(ids.shape) != 1:
            raise InvalidFile(f"array {ids_name!r} must be 1-D, got shape {list(ids.shape)}")
        if ids.dtype.kind not in "US":
            raise InvalidFile(f"array {ids_name!r} must hold strings, got dtype {ids.dtype}")
        if len(emb.shape) != 2:
            raise InvalidFile(f"array {emb_name!r} must be 2-D (n x d), got shape {list(emb.shape)}")
        if emb.dtype.newbyteorder("=") not in (np.float32, np.float64):
            raise InvalidFile(f"array {emb_name!r} must be float32 or float64, got dtype {emb.dtype}")
        self.n = ids.shape[0]
        if emb.shape[0] != self.n:
            raise InvalidFile(f"{self.n} ids but {emb.shape[0]} embedding rows")
        if data is not None:
            if len(data.shape) != 1 or data.shape[0] != self.n:
                raise InvalidFile(
                    f"array {data_name!r} must be 1-D with one JSON string per item ({self.n}), got {list(data.shape)}"
                )
            if data.dtype.kind not in "US":
                raise InvalidFile(f"array {data_name!r} must hold JSON strings, got dtype {data.dtype}")
        self.ids, self.emb, self.data = ids, emb, data
        self.d = emb.shape[1]

    def _open(self, info: zipfile.ZipInfo) -> IO[bytes]:
        try:
            return self.zf.open(info)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as exc:
            raise InvalidFile(f"cannot read {info.filename!r} of the .npz: {exc}") from exc

    def blocks(self, block_bytes: int = BLOCK_BYTES, dim: int = 0) -> Iterator[Block]:
        members = [m for m in (self.ids, self.emb, self.data) if m is not None]
        row_bytes = sum(m.nbytes // max(self.n, 1) for m in members) or 1
        rows = max(1, block_bytes // row_bytes)
        with contextlib.ExitStack() as stack:
            streams: dict[str, IO[bytes]] = {}
            for member in members:
                fp = stack.enter_context(self._open(member.info))
                archives.read_npy_header(fp, member.name)  # past the header: the values follow
                streams[member.name] = fp
            # A column-major matrix cannot be cut into rows as it streams: it is read whole (within the budget).
            whole: np.ndarray | None = None
            if self.emb.fortran:
                whole = self._read(streams[self.emb.name], self.emb, self.emb.nbytes).reshape(self.emb.shape, order="F")
            for start in range(0, self.n, rows):
                count = min(rows, self.n - start)
                ids = _strings(self._take(streams, self.ids, count), self.ids.name)
                if whole is not None:
                    emb = whole[start : start + count]
                else:
                    emb = self._take(streams, self.emb, count * self.d).reshape(count, self.d)
                data = None
                if self.data is not None:
                    data = [v or None for v in _strings(self._take(streams, self.data, count), self.data.name)]
                yield Block(start, ids, emb, data)
            for member in members:
                self._finish(streams[member.name], member)

    def _take(self, streams: dict[str, IO[bytes]], member: _Member, values: int) -> np.ndarray:
        return self._read(streams[member.name], member, values * member.dtype.itemsize)

    def _read(self, fp: IO[bytes], member: _Member, nbytes: int) -> np.ndarray:
        buf = bytearray(nbytes)
        view = memoryview(buf)
        got = 0
        try:
            while got < nbytes:
                n = fp.readinto(view[got : got + _READ_CHUNK])  # type: ignore[attr-defined]
                if not n:
                    raise InvalidFile(
                        f"array {member.name!r} is truncated: its header declares {member.nbytes} bytes, "
                        "the file holds fewer"
                    )
                got += n
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise InvalidFile(f"cannot read array {member.name!r} of the .npz: {exc}") from exc
        return np.frombuffer(buf, dtype=member.dtype)

    def _finish(self, fp: IO[bytes], member: _Member) -> None:
        """Read to the member's end, so its CRC is checked (a corrupted archive is a 400, not data)."""
        try:
            while fp.read(_READ_CHUNK):
                pass
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            raise InvalidFile(f"cannot read array {member.name!r} of the .npz: {exc}") from exc


# ------------------------------------------------------------------------------------------- Parquet


class ParquetBulkFile:
    """A Parquet file read in record batches (``iter_batches`` over a buffered stream without pre-buffering,
    never a whole row group at once); the footer's uncompressed sizes are checked up front and the decoded
    bytes counted as they are read, both against the inflated-size budget."""

    def __init__(
        self,
        fileobj: IO[bytes],
        id_col: str,
        emb_col: str,
        data_col: str,
        data_required: bool,
        budget: int,
        split_col: str | None = None,
    ) -> None:
        try:
            # pre_buffer (pyarrow's default) caches every column chunk read so far: memory grows with the
            # file (3.6 GB of api RSS for 10^6 x 768); a buffered stream keeps it to a batch.
            self.pf = pq.ParquetFile(fileobj, buffer_size=_READ_CHUNK, pre_buffer=False)
            schema = self.pf.schema_arrow
            meta = self.pf.metadata
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InvalidFile(f"not a readable Parquet file: {exc}") from exc
        names = schema.names
        for name in (id_col, emb_col):
            if name not in names:
                raise InvalidFile(f"Parquet file has no column {name!r} (columns: {names})", {"missing": name})
        if data_required and data_col not in names:
            raise InvalidFile(f"Parquet file has no column {data_col!r} (columns: {names})")
        self.split_col = split_col if split_col is not None and split_col in names else None
        self.columns = [id_col, emb_col] + ([data_col] if data_col in names else [])
        self.columns += [self.split_col] if self.split_col is not None else []
        wanted = {i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in self.columns}
        declared = sum(
            meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups) for i in wanted
        )
        if declared > budget:
            raise archives.too_large("the Parquet file", declared, budget)
        self.declared = declared  # uncompressed bytes of the columns read, as the footer states them
        id_type = schema.field(id_col).type
        if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type)):
            raise InvalidFile(f"column {id_col!r} must be strings, got {id_type}")
        typ = schema.field(emb_col).type
        if not (pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)):
            raise InvalidFile(f"column {emb_col!r} must be a list of floats, got {typ}")
        if not pa.types.is_floating(typ.value_type) or pa.types.is_float16(typ.value_type):
            raise InvalidFile(f"column {emb_col!r} must hold float32 or float64 values, got {typ.value_type}")
        if data_col in names:
            data_type = schema.field(data_col).type
            if not (pa.types.is_string(data_type) or pa.types.is_large_string(data_type)):
                raise InvalidFile(f"column {data_col!r} must hold JSON strings, got {data_type}")
        if self.split_col is not None:
            split_type = schema.field(self.split_col).type
            if pa.types.is_dictionary(split_type):
                split_type = split_type.value_type
            if not (pa.types.is_string(split_type) or pa.types.is_large_string(split_type)):
                raise InvalidFile(f"column {self.split_col!r} must hold strings (train | validation), got {split_type}")
        self.id_col, self.emb_col = id_col, emb_col
        self.data_col = data_col if data_col in names else None
        self.budget = budget
        self.n = int(meta.num_rows)

    def blocks(self, block_bytes: int = BLOCK_BYTES, dim: int = 0) -> Iterator[Block]:
        meta = self.pf.metadata
        footer = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) // max(self.n, 1)
        # The footer can understate rows (dictionary/RLE encoding): a row is at least dim float32 values.
        row_bytes = max(1, footer, 4 * dim + 16)
        rows = max(1, min(block_bytes // row_bytes, 1 << 20))
        used = 0
        start = 0
        d: int | None = None
        try:
            for batch in self.pf.iter_batches(batch_size=rows, columns=self.columns, use_threads=False):
                used += batch.nbytes
                if used > self.budget:  # footers can lie: count what was really decoded
                    raise archives.too_large("the Parquet file", used, self.budget)
                m = batch.num_rows
                if not m:
                    continue
                ids_col = batch.column(self.id_col)
                if ids_col.null_count:
                    raise InvalidFile(f"column {self.id_col!r} has {ids_col.null_count} null ids")
                col = batch.column(self.emb_col)
                if col.null_count:
                    raise InvalidFile(f"column {self.emb_col!r} has {col.null_count} null embeddings")
                lengths = pc.list_value_length(col).to_numpy(zero_copy_only=False)
                if d is None:
                    d = int(lengths[0])
                if (lengths != d).any():
                    bad = start + int(np.flatnonzero(lengths != d)[0])
                    raise InvalidFile(
                        f"column {self.emb_col!r} is ragged: row 0 has {d} values, row {bad} has "
                        f"{int(lengths[bad - start])}",
                        {"row": bad},
                    )
                values = pc.list_flatten(col)
                if values.null_count:
                    raise InvalidFile(f"column {self.emb_col!r} has null values inside embeddings")
                emb = values.to_numpy(zero_copy_only=False).reshape(m, d)
                data = None
                if self.data_col is not None:
                    data = [v or None for v in batch.column(self.data_col).to_pylist()]
                split = None
                if self.split_col is not None:
                    split = [v or None for v in batch.column(self.split_col).to_pylist()]
                yield Block(start, cast(list[str], ids_col.to_pylist()), emb, data, split)
                start += m
        except (InvalidFile, PayloadTooLarge):
            raise
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InvalidFile(f"not a readable Parquet file: {exc}") from exc
