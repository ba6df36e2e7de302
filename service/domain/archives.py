"""Compressed request bodies, read under a budget of inflated bytes checked BEFORE inflating.

An .npz is a zip of .npy members: a few MB can declare gigabytes. :func:`read_npz` sums the sizes the
zip's central directory declares, parses each member's .npy header (shape and dtype: the bytes it will
hold) and refuses (413 ``payload_too_large``) when either passes the budget; then it reads exactly the
bytes the header promised and no more, so a member whose zip entry lies about its size is cut off at the
declared size (and is then a 400: it does not hold the array its header describes). Parquet is checked
row group by row group against the uncompressed sizes in its footer, and the decoded bytes are counted
as they are read (:func:`read_parquet_columns`).

These functions are CPU-bound: callers run them off the event loop (``run_in_threadpool``).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterable
from tokenize import TokenError
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.errors import BadRequest, InvalidFile, PayloadTooLarge

_READ_CHUNK = 8 * 2**20


def too_large(what: str, size: int, budget: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} inflates to {size:,} bytes, above the limit of {budget:,} bytes",
        {"limit_bytes": budget, "inflated_bytes": size},
    )


def read_npz(
    fileobj: IO[bytes],
    *,
    budget: int,
    names: Iterable[str] | None = None,
    allowed: Iterable[str] | None = None,
    error: type[BadRequest] = InvalidFile,
) -> dict[str, np.ndarray]:
    """The arrays of an .npz (``numpy.savez``), read without pickles and within ``budget`` inflated bytes.

    Args:
        fileobj: a seekable binary file holding the archive.
        budget: the most bytes all read arrays may inflate to together.
        names: the arrays to read (default: every array in the file).
        allowed: when given, an array not named here is an error (a typo in the client's names).
        error: the 400 raised for a malformed archive.

    Raises:
        PayloadTooLarge: the declared or the actual inflated size passes ``budget``.
        BadRequest (``error``): not a zip, a member that is not a .npy array, object arrays, a truncated member.
    """
    try:
        zf = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise error(f"not a readable .npz file (numpy.savez): {exc}") from exc
    with zf:
        members = {}
        for info in zf.infolist():
            if not info.filename.endswith(".npy"):
                raise error(f"the .npz holds {info.filename!r}, which is not a .npy array")
            members[info.filename[: -len(".npy")]] = info
        if allowed is not None:
            unknown = sorted(set(members) - set(allowed))
            if unknown:
                raise error(f"unknown array(s) {unknown} in the .npz; expected {', '.join(allowed)}")
        wanted = list(members) if names is None else [n for n in names if n in members]
        declared = sum(members[n].file_size for n in wanted)
        if declared > budget:
            raise too_large("the .npz", declared, budget)
        out: dict[str, np.ndarray] = {}
        used = 0
        for name in wanted:
            info = members[name]
            try:
                with zf.open(info) as fp:
                    out[name] = _read_npy(fp, name, budget - used, error)
            except (zipfile.BadZipFile, OSError, EOFError, ValueError, SyntaxError, TokenError) as exc:
                raise error(f"cannot read array {name!r} of the .npz: {exc}") from exc
            used += out[name].nbytes
    return out


def _read_npy(fp: IO[bytes], name: str, budget: int, error: type[BadRequest]) -> np.ndarray:
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp, max_header_size=10_000)
    elif version in ((2, 0), (3, 0)):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp, max_header_size=10_000)
    else:
        raise error(f"array {name!r}: unsupported .npy format version {version}")
    if dtype.hasobject:
        raise error(f"array {name!r} holds Python objects (pickles are refused); save strings as a str dtype")
    nbytes = math.prod(int(s) for s in shape) * dtype.itemsize  # Python ints: (2**40, 64) does not overflow
    if nbytes > budget:
        raise too_large(f"array {name!r} (shape {list(shape)}, {dtype})", nbytes, budget)
    buf = bytearray(nbytes)
    view = memoryview(buf)
    got = 0
    while got < nbytes:
        n = fp.readinto(view[got : got + _READ_CHUNK])  # type: ignore[attr-defined]
        if not n:
            raise error(f"array {name!r} is truncated: its header declares {nbytes} bytes, the file holds {got}")
        got += n
    arr = np.frombuffer(buf, dtype=dtype)
    return arr.reshape(shape, order="F" if fortran else "C")


def read_parquet_columns(fileobj: IO[bytes], columns: list[str], *, budget: int) -> pa.Table:
    """Columns of a Parquet file, row group by row group, within ``budget`` decoded bytes.

    Raises:
        PayloadTooLarge: the footer's uncompressed sizes of the columns, or the bytes actually decoded,
            pass ``budget``.
        InvalidFile: not a readable Parquet file, or a missing column.
    """
    try:
        pf = pq.ParquetFile(fileobj)
        names = pf.schema_arrow.names
        for name in columns:
            if name not in names:
                raise InvalidFile(f"Parquet file has no column {name!r} (columns: {names})", {"missing": name})
        meta = pf.metadata
        wanted = {i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] in columns}
        declared = sum(
            meta.row_group(g).column(i).total_uncompressed_size for g in range(meta.num_row_groups) for i in wanted
        )
        if declared > budget:
            raise too_large("the Parquet file", declared, budget)
        tables = []
        used = 0
        for g in range(meta.num_row_groups):
            table = pf.read_row_group(g, columns=columns)
            used += table.nbytes
            if used > budget:  # footers can lie: count what was really decoded
                raise too_large("the Parquet file", used, budget)
            tables.append(table)
    except (InvalidFile, PayloadTooLarge):
        raise
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise InvalidFile(f"not a readable Parquet file: {exc}") from exc
    if not tables:
        return pf.schema_arrow.empty_table().select(columns)
    return pa.concat_tables(tables)
