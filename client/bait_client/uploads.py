"""Splitting an upload into request bodies under the service's limits (no I/O but reading the caller's file).

Sources: an ``n x d`` numpy array with its ids, a pyarrow Table or pandas DataFrame (columns ``id``,
``embedding`` and optionally ``data``), or a file: Parquet (read a row batch at a time, so a file larger
than memory streams), ``.npy`` (memory-mapped; give ``ids``) or ``.npz`` (arrays ``ids``, ``embeddings``).

Each :class:`Piece` is a run of rows in the source's order, ``[begin, end)``; rows the caller asked to
skip (``start``, ids already stored) are left out of its body. Every row before a piece's ``begin`` has
been handed out in an earlier piece, which is what makes an upload resumable from the piece that failed.
"""

from __future__ import annotations

import io
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Our own cap on one request, below any sane service limit: a failed request costs at most this much to
# resend, and the progress bar moves at least every few seconds on a slow link.
DEFAULT_CHUNK_BYTES = 32 * 2**20
# Share of the service's limit a body is planned at (estimates of Parquet/npz overhead are rough; a piece
# that still comes out too large is halved before it is sent).
HEADROOM = 0.8


@dataclass
class Piece:
    """Rows ``[begin, end)`` of the source; ``rows``: how many of them go in the body (after skipping)."""

    begin: int
    end: int
    rows: int
    payload: Any  # (ids ndarray, embeddings ndarray) or a pyarrow Table

    def encode(self) -> tuple[bytes, str]:
        """The body and its format (``npz`` or ``parquet``)."""
        if isinstance(self.payload, tuple):
            ids, emb = self.payload
            buf = io.BytesIO()
            np.savez(buf, ids=ids, embeddings=emb)
            return buf.getvalue(), "npz"
        import pyarrow.parquet as pq

        buf = io.BytesIO()
        pq.write_table(self.payload, buf)
        return buf.getvalue(), "parquet"

    def halves(self) -> list[Piece]:
        """Two pieces of about half the rows each (a piece of one row cannot be split)."""
        if self.rows < 2:
            return [self]
        cut = self.rows // 2
        if isinstance(self.payload, tuple):
            ids, emb = self.payload
            first, second = (ids[:cut], emb[:cut]), (ids[cut:], emb[cut:])
        else:
            first, second = self.payload.slice(0, cut), self.payload.slice(cut)
        # Positions: the second half starts at its first row's place; without skips that is begin + cut.
        mid = self.begin + cut if self.end - self.begin == self.rows else self.begin
        return [Piece(self.begin, mid, cut, first), Piece(mid, self.end, self.rows - cut, second)]


class Source(ABC):
    """Rows to upload: their count, their ids, and pieces of them (one subclass per input kind)."""

    n: int
    row_bytes: float  # estimated bytes of one row in a body (inflated)

    @abstractmethod
    def all_ids(self) -> list[str]:
        """Every row's id, in upload order."""

    @abstractmethod
    def pieces(self, start: int, rows_per_piece: int, skip: set[str] | None) -> Iterator[Piece]:
        """The rows from ``start`` on, ``rows_per_piece`` at a time, without the ids in ``skip``."""


class ArraySource(Source):
    def __init__(self, X: np.ndarray, ids: Sequence[Any]) -> None:
        if X.ndim != 2:
            raise ValueError(f"embeddings must be an n x d array, not shape {X.shape}")
        if len(ids) != X.shape[0]:
            raise ValueError(f"give one id per row of the array: {len(ids)} ids for {X.shape[0]} rows")
        self.X = X
        self.ids = np.asarray([str(i) for i in ids])
        self.n = int(X.shape[0])
        id_bytes = self.ids.dtype.itemsize if self.n else 0
        self.row_bytes = float(X.shape[1] * X.dtype.itemsize + id_bytes)

    def all_ids(self) -> list[str]:
        return [str(i) for i in self.ids]

    def pieces(self, start: int, rows_per_piece: int, skip: set[str] | None) -> Iterator[Piece]:
        for begin in range(start, self.n, rows_per_piece):
            end = min(self.n, begin + rows_per_piece)
            ids, emb = self.ids[begin:end], self.X[begin:end]
            if skip:
                keep = np.fromiter((i not in skip for i in ids.tolist()), dtype=bool, count=end - begin)
                ids, emb = ids[keep], emb[keep]
            yield Piece(begin, end, len(ids), (ids, np.ascontiguousarray(emb)))


def _table_columns(table: Any, id_column: str, embedding_column: str) -> Any:
    missing = [c for c in (id_column, embedding_column) if c not in table.column_names]
    if missing:
        raise KeyError(f"the table has no column(s) {missing}; it has {table.column_names}")
    keep = [id_column, embedding_column] + (["data"] if "data" in table.column_names else [])
    table = table.select(keep)
    if id_column != "id" or embedding_column != "embedding":
        names = ["id", "embedding"] + (["data"] if "data" in keep else [])
        table = table.rename_columns(names)
    return table


def _filter_table(table: Any, skip: set[str] | None) -> Any:
    if not skip:
        return table
    import pyarrow as pa

    keep = [i not in skip for i in table.column("id").to_pylist()]
    return table.filter(pa.array(keep, type=pa.bool_()))


class TableSource(Source):
    """A pyarrow Table (a pandas DataFrame is converted to one)."""

    def __init__(self, table: Any, id_column: str = "id", embedding_column: str = "embedding") -> None:
        self.table = _table_columns(table, id_column, embedding_column)
        self.n = int(self.table.num_rows)
        self.row_bytes = float(self.table.nbytes) / max(1, self.n)

    def all_ids(self) -> list[str]:
        return [str(i) for i in self.table.column("id").to_pylist()]

    def pieces(self, start: int, rows_per_piece: int, skip: set[str] | None) -> Iterator[Piece]:
        for begin in range(start, self.n, rows_per_piece):
            end = min(self.n, begin + rows_per_piece)
            part = _filter_table(self.table.slice(begin, end - begin), skip)
            yield Piece(begin, end, part.num_rows, part)


class ParquetFileSource(Source):
    """A Parquet file read one row batch at a time (a file larger than memory streams through)."""

    def __init__(self, path: Path, id_column: str = "id", embedding_column: str = "embedding") -> None:
        import pyarrow.parquet as pq

        self.path = path
        self.file = pq.ParquetFile(path)
        names = self.file.schema_arrow.names
        missing = [c for c in (id_column, embedding_column) if c not in names]
        if missing:
            raise KeyError(f"{path} has no column(s) {missing}; it has {names}")
        self.columns = [id_column, embedding_column] + (["data"] if "data" in names else [])
        self.id_column, self.embedding_column = id_column, embedding_column
        meta = self.file.metadata
        self.n = int(meta.num_rows)
        wanted = [names.index(c) for c in self.columns]
        inflated = sum(
            meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups) for i in wanted
        )
        self.row_bytes = float(inflated) / max(1, self.n)

    def all_ids(self) -> list[str]:
        return [str(i) for i in self.file.read(columns=[self.id_column]).column(0).to_pylist()]

    def pieces(self, start: int, rows_per_piece: int, skip: set[str] | None) -> Iterator[Piece]:
        import pyarrow as pa

        position = 0
        for batch in self.file.iter_batches(batch_size=rows_per_piece, columns=self.columns):
            begin, position = position, position + batch.num_rows
            if position <= start:
                continue
            table = _table_columns(pa.Table.from_batches([batch]), self.id_column, self.embedding_column)
            if begin < start:
                table, begin = table.slice(start - begin), start
            part = _filter_table(table, skip)
            yield Piece(begin, position, part.num_rows, part)


def source_of(
    data: Any,
    ids: Sequence[Any] | None,
    *,
    id_column: str = "id",
    embedding_column: str = "embedding",
) -> Source:
    """The :class:`Source` of what the caller handed to ``upload``.

    Raises:
        ValueError: an array without one id per row.
        KeyError: a table or file without the id/embedding columns.
        TypeError: something else.
    """
    if isinstance(data, (str, Path)):
        path = Path(data)
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            return ParquetFileSource(path, id_column, embedding_column)
        if suffix == ".npy":
            if ids is None:
                raise ValueError(f"{path} holds only embeddings: give ids=")
            return ArraySource(np.load(path, mmap_mode="r"), ids)
        if suffix == ".npz":  # arrays `ids` and `embeddings`, as the service's bulk format
            with np.load(path) as z:
                return ArraySource(z["embeddings"], list(ids) if ids is not None else z["ids"].tolist())
        raise TypeError(f"{path}: upload reads .parquet, .npy and .npz files")
    if isinstance(data, np.ndarray):
        if ids is None:
            raise ValueError("give one id per row of the array (ids=...)")
        return ArraySource(data, ids)
    module = type(data).__module__
    if module.startswith("pandas"):
        import pyarrow as pa

        missing = [c for c in (id_column, embedding_column) if c not in data.columns]
        if missing:
            raise KeyError(f"the DataFrame has no column(s) {missing}; it has {list(data.columns)}")
        columns = [id_column, embedding_column] + (["data"] if "data" in data.columns else [])  # data: JSON strings
        return TableSource(pa.Table.from_pandas(data[columns], preserve_index=False), id_column, embedding_column)
    if module.startswith("pyarrow"):
        return TableSource(data, id_column, embedding_column)
    raise TypeError(
        "upload takes a numpy array, a pandas DataFrame, a pyarrow Table or a .parquet/.npy/.npz path, "
        f"not {type(data)}"
    )


def rows_per_piece(source: Source, body_limit: int, chunk_bytes: int) -> int:
    """Rows per piece so that a body stays under ``HEADROOM`` of ``min(body_limit, chunk_bytes)``."""
    target = HEADROOM * min(body_limit, chunk_bytes)
    return max(1, int(target // max(1.0, source.row_bytes)))
