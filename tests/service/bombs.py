"""Hostile archives for the input-limit tests, built in a few MB without ever compressing gigabytes.

A raw-deflate block stream ended by ``Z_FULL_FLUSH`` holds no back-references to earlier data and ends on
a byte boundary, so the compressed form of 1 MiB of zeros can be repeated N times to make a valid stream of
N MiB of zeros (closed by an empty final block). The zip around it is written by hand with ``struct``.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np

MIB = 2**20
_ZERO_CHUNK: bytes | None = None
_FINAL_BLOCK = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)  # an empty final block


def _zero_chunk() -> bytes:
    global _ZERO_CHUNK
    if _ZERO_CHUNK is None:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        _ZERO_CHUNK = c.compress(b"\0" * MIB) + c.flush(zlib.Z_FULL_FLUSH)
    return _ZERO_CHUNK


def _raw(data: bytes) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FULL_FLUSH)


def npy_header(shape: tuple[int, ...], dtype: str = "<f4") -> bytes:
    """A version 1.0 .npy header (magic, length, dict padded to a multiple of 64)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": dtype, "fortran_order": False, "shape": shape})
    return buf.getvalue()


class Member:
    """One .npy member: a header, then ``zero_mib`` MiB of zeros (deflated) or ``raw`` stored bytes."""

    def __init__(
        self,
        name: str,
        header: bytes,
        zero_mib: int = 0,
        *,
        tail: bytes = b"",
        declared_size: int | None = None,
        correct_crc: bool = True,
    ) -> None:
        self.name = name.encode()
        self.size = len(header) + zero_mib * MIB + len(tail)
        self.declared_size = self.size if declared_size is None else declared_size
        chunk = _zero_chunk()
        self.data = _raw(header) + chunk * zero_mib + (_raw(tail) if tail else b"") + _FINAL_BLOCK
        crc = 0
        if correct_crc:
            crc = zlib.crc32(header)
            zeros = b"\0" * MIB
            for _ in range(zero_mib):
                crc = zlib.crc32(zeros, crc)
            crc = zlib.crc32(tail, crc)
        self.crc = crc & 0xFFFFFFFF


def zip_bytes(members: list[Member]) -> bytes:
    """A zip (deflate, no zip64: each member below 4 GiB) of the members, written by hand."""
    out = io.BytesIO()
    central = io.BytesIO()
    for m in members:
        offset = out.tell()
        out.write(
            struct.pack(
                "<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0x21, m.crc, len(m.data), m.declared_size, len(m.name), 0
            )
        )
        out.write(m.name)
        out.write(m.data)
        central.write(
            struct.pack(
                "<4s6H3L5H2L",
                b"PK\x01\x02",
                20,
                20,
                0,
                8,
                0,
                0x21,
                m.crc,
                len(m.data),
                m.declared_size,
                len(m.name),
                0,
                0,
                0,
                0,
                0,
                offset,
            )
        )
        central.write(m.name)
    cd = central.getvalue()
    cd_offset = out.tell()
    out.write(cd)
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(members), len(members), len(cd), cd_offset, 0))
    return out.getvalue()


def zeros_npz(
    name: str, rows: int, cols: int, *, extra: dict[str, np.ndarray] | None = None, correct_crc: bool = True
) -> bytes:
    """An .npz whose array ``name`` is a ``rows x cols`` float32 of zeros (rows*cols*4 a multiple of 1 MiB),
    plus ``extra`` arrays stored as they are. A bomb (refused before it is read) may skip the CRC."""
    nbytes = rows * cols * 4
    assert nbytes % MIB == 0, "rows * cols * 4 must be a whole number of MiB"
    members = [Member(f"{name}.npy", npy_header((rows, cols)), nbytes // MIB, correct_crc=correct_crc)]
    for key, arr in (extra or {}).items():
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        raw = buf.getvalue()
        members.append(Member(f"{key}.npy", raw, 0))
    return zip_bytes(members)


def bomb_npz(name: str = "embeddings", gib: float = 3.9, extra: dict[str, np.ndarray] | None = None) -> bytes:
    """About ``gib`` GiB of zeros (one float32 matrix of 1024 columns) in a few MB."""
    rows = int(gib * 1024) * 256  # 256 rows of 1024 float32 = 1 MiB
    return zeros_npz(name, rows, 1024, extra=extra, correct_crc=False)
