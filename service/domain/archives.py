"""Compressed request bodies, read under a budget of inflated bytes checked BEFORE inflating.

An .npz is a zip of .npy members: a few MB can declare gigabytes. :func:`read_npz` sums the sizes the
zip's central directory declares, parses each member's .npy header (shape and dtype: the bytes it will
hold) and refuses (413 ``payload_too_large``) when either passes the budget; then it reads exactly the
bytes the header promised and no more, so a member whose zip entry lies about its size is cut off at the
declared size (and is then a 400: it does not hold the array its header describes). (Parquet uploads are
checked against their footer and the decoded bytes as they stream: :class:`service.domain.ingest.ParquetBulkFile`.)
:func:`read_npy_header` is the one .npy header parser of every upload path.

These functions are CPU-bound: callers run them off the event loop (``run_in_threadpool``).
"""

from __future__ import annotations

import math
import zipfile
from collections.abc import Iterable
from tokenize import TokenError
from typing import IO, Any

import numpy as np

from service.errors import BadRequest, InvalidFile, PayloadTooLarge

_READ_CHUNK = 8 * 2**20


def too_large(what: str, size: int, budget: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"{what} inflates to {size:,} bytes, above the limit of {budget:,} bytes",
        {"limit_bytes": budget, "inflated_bytes": size},
    )


def open_npz(
    fileobj: IO[bytes], error: type[BadRequest] = InvalidFile
) -> tuple[zipfile.ZipFile, dict[str, zipfile.ZipInfo]]:
    """The archive of an .npz and its members by array name (every member must be a .npy array).

    Raises:
        BadRequest (``error``): not a zip, or a member that is not a .npy array.
    """
    try:
        zf = zipfile.ZipFile(fileobj)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise error(f"not a readable .npz file (numpy.savez): {exc}") from exc
    members: dict[str, zipfile.ZipInfo] = {}
    for info in zf.infolist():
        if not info.filename.endswith(".npy"):
            zf.close()
            raise error(f"the .npz holds {info.filename!r}, which is not a .npy array")
        members[info.filename[: -len(".npy")]] = info
    return zf, members


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
    zf, members = open_npz(fileobj, error)
    with zf:
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


def read_npy_header(
    fp: IO[bytes], name: str, error: type[BadRequest] = InvalidFile
) -> tuple[tuple[int, ...], bool, np.dtype[Any]]:
    """``(shape, fortran_order, dtype)`` of an .npy member, read from its header alone: the one parser of
    .npy headers for every upload (a header is at most 10,000 bytes; object arrays, which would unpickle,
    are refused).

    Raises:
        BadRequest (``error``): not an .npy header, an unsupported format version, or object arrays.
    """
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp, max_header_size=10_000)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp, max_header_size=10_000)
        else:
            raise error(f"array {name!r}: unsupported .npy format version {version}")
    except (ValueError, SyntaxError, TokenError, OSError, EOFError, zipfile.BadZipFile) as exc:
        # a malformed header dict fails in numpy's tokenizer or literal_eval, not only with ValueError
        raise error(f"cannot read array {name!r} of the .npz: {exc}") from exc
    if dtype.hasobject:
        raise error(f"array {name!r} holds Python objects (pickles are refused); save strings as a str dtype")
    return tuple(int(s) for s in shape), bool(fortran), dtype


def npy_nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes an array of ``shape`` and ``dtype`` holds (Python ints: (2**40, 64) does not overflow)."""
    return math.prod(shape) * dtype.itemsize


def _read_npy(fp: IO[bytes], name: str, budget: int, error: type[BadRequest]) -> np.ndarray:
    shape, fortran, dtype = read_npy_header(fp, name, error)
    nbytes = npy_nbytes(shape, dtype)
    if nbytes > budget:
        raise too_large(f"array {name!r} (shape {list(shape)}, {dtype})", nbytes, budget)
    # np.empty, not bytearray: bytearray(n) zeroes (and first-touches) every page while holding the GIL,
    # 0.2 s for 300 MiB on a quiet machine and seconds on a busy one, stalling every other request's thread;
    # here the pages are touched chunk by chunk as they are filled, with the GIL free between chunks.
    buf = np.empty(nbytes, dtype=np.uint8)
    view = buf.data
    got = 0
    while got < nbytes:
        n = fp.readinto(view[got : got + _READ_CHUNK])  # type: ignore[attr-defined]
        if not n:
            raise error(f"array {name!r} is truncated: its header declares {nbytes} bytes, the file holds {got}")
        got += n
    arr = buf.view(dtype)
    return arr.reshape(shape, order="F" if fortran else "C")
