"""Debian's R data packages, read without R: ``apt-get download`` + ``dpkg-deb -x`` into the cache,
then the ``.rda`` files or the package's lazy-load database (``data/Rdata.rdx`` + ``.rdb``) with the
PyPI package ``rdata``.

A lazy-load database is R's own format (``lazyLoadDBfetch``): ``Rdata.rdx`` is a gzip-compressed
serialised list whose ``variables`` entry maps each object's name to ``(offset, length)`` in
``Rdata.rdb``; each such chunk is a 4-byte big-endian uncompressed length, then (R >= 2.10) one type
byte and the compressed serialisation: ``'Z'`` raw LZMA2 (xz preset 9e), ``'2'`` bzip2, ``'1'`` zlib,
``'0'`` stored; without a type byte the chunk is zlib (the pre-2.10 format).
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import shutil
import struct
import subprocess
import tempfile
import warnings
import zlib
from pathlib import Path
from typing import Any

from bench.suite.spec import DatasetFetchError, cache_dir

R_LIBRARY = Path("usr/lib/R/site-library")


def package_root(package: str, *, root: Path | None = None) -> Path:
    """The unpacked tree of Debian package ``package`` (downloaded and unpacked on first use)."""
    base = (root or cache_dir()) / "debian"
    target = base / package
    if (target / ".complete").is_file():
        return target
    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        raise DatasetFetchError(f"{package}: needs Debian's apt-get and dpkg-deb to fetch it")
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        proc = subprocess.run(
            ["apt-get", "download", package], cwd=tmp, capture_output=True, text=True, check=False, timeout=600
        )
        debs = sorted(Path(tmp).glob(f"{package}_*.deb"))
        if proc.returncode != 0 or not debs:
            raise DatasetFetchError(
                f"`apt-get download {package}` failed ({proc.returncode}): {proc.stderr.strip()[-400:]}; "
                "run `apt-get update` first if the package lists are empty"
            )
        if target.exists():
            shutil.rmtree(target)
        unpack = Path(tmp) / "tree"
        subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(unpack)], check=True, timeout=600)
        (unpack / ".complete").write_text(debs[0].name + "\n")
        unpack.rename(target)
    return target


def r_library(package: str, r_name: str, *, root: Path | None = None) -> Path:
    """``usr/lib/R/site-library/<r_name>`` inside the unpacked Debian package."""
    path = package_root(package, root=root) / R_LIBRARY / r_name
    if not path.is_dir():
        raise DatasetFetchError(f"{package} has no R library {r_name!r} under {R_LIBRARY}")
    return path


def _convert(parsed: Any) -> Any:
    import rdata

    with warnings.catch_warnings():
        # rdata warns for classes it maps to a plain data.frame (tbl_df, tbl): that is what we want.
        warnings.simplefilter("ignore", UserWarning)
        return rdata.conversion.convert(parsed)


def read_rda(path: Path) -> dict[str, Any]:
    """Objects of an ``.rda``/``.RData`` file, converted to Python (data frames -> pandas)."""
    import rdata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parsed = rdata.parser.parse_file(path)
    out = _convert(parsed)
    return dict(out)


def decompress_chunk(chunk: bytes) -> bytes:
    """One object's serialisation from its chunk of a lazy-load ``.rdb`` (see the module docstring)."""
    if len(chunk) < 5:
        raise ValueError(f"lazy-load chunk of {len(chunk)} bytes is too short")
    (size,) = struct.unpack(">I", chunk[:4])
    kind = chunk[4:5]
    body = chunk[5:]
    if kind == b"Z":
        filters = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]
        out = lzma.decompress(body, format=lzma.FORMAT_RAW, filters=filters)
    elif kind == b"2":
        out = bz2.decompress(body)
    elif kind == b"1":
        out = zlib.decompress(body)
    elif kind == b"0":
        out = body
    else:
        out = zlib.decompress(chunk[4:])
    if len(out) != size:
        raise ValueError(f"lazy-load chunk decompressed to {len(out)} bytes, its header says {size}")
    return out


def lazy_load_index(rdx: Path) -> dict[str, tuple[int, int]]:
    """Object name -> (offset, length) in the ``.rdb``, from a lazy-load ``.rdx``."""
    import rdata

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        parsed = rdata.parser.parse_data(gzip.decompress(rdx.read_bytes()))
    index = _convert(parsed)
    variables = index["variables"]
    return {str(k): (int(v[0]), int(v[1])) for k, v in variables.items()}


def read_lazy_load(base: Path, names: list[str]) -> dict[str, Any]:
    """Objects ``names`` of the lazy-load database ``base.rdx``/``base.rdb``, converted to Python."""
    import rdata

    index = lazy_load_index(base.with_suffix(".rdx"))
    missing = [n for n in names if n not in index]
    if missing:
        raise DatasetFetchError(f"{base}: no object {missing}; it holds {sorted(index)}")
    out: dict[str, Any] = {}
    with base.with_suffix(".rdb").open("rb") as f:
        for name in names:
            offset, length = index[name]
            f.seek(offset)
            data = decompress_chunk(f.read(length))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                parsed = rdata.parser.parse_data(data)
            out[name] = _convert(parsed)
    return out
