"""The pool store (issue 26): each pool's selectable rows as Parquet shards, versioned by the pool's content
version and written incrementally, read by the Dask workers of a distributed selection (:mod:`worker.distributed`).

Layout under ``BAIT_POOL_STORE`` (a local folder, ``file://``, or another filesystem's URL: :class:`Files`)::

    <pool id>/v<content version>.json          the manifest of a version (published last, atomically)
    <pool id>/d-v<version>-<hex>/part-00000.parquet   a full shard: item_id int64, external_id string,
                                                      embedding fixed_size_list<float32>[d]; ascending item ids
    <pool id>/d-v<version>-<hex>/up-00003.parquet     a shard's upserted rows (same columns): rows rewritten
                                                      since its full shard was written, or new among its ids
    <pool id>/d-v<version>-<hex>/del-00003.parquet    a shard's deleted ids (item_id int64)

A manifest lists the version's shards in item id order. Each shard owns a range of item ids (``lo``..``hi``:
the ranges are contiguous and ascending) and is one full file plus, optionally, a delta: the ids deleted from
the full file and the rows upserted into it (rewritten embeddings, rows back in the train split, ids inserted
below the newest). A reader (:func:`read_shard`, in every Dask task) drops the deleted and upserted ids from the
full file and merges the upserted rows in, in id order, and checks the count against the manifest: the shards,
concatenated, are exactly the rows the single-process reader (:func:`worker.pool_data.load_pool`) returns for
that version, in the same ascending item id order.

A new version is written from the previous one (:func:`plan`): the database says which ids changed since it
(``items.content_seq`` and the tombstones, migration 0008); a shard with no changed id is listed again as it is
(its files shared, not copied); a shard with changes gets a new cumulative delta (its full file shared); new rows
above the previous version's ids become new full shards. Only these files are written: an append writes only
the new rows. Compaction: a shard whose delta would exceed :data:`COMPACT_DELTA_FRACTION` of its full file's
rows is rewritten as a fresh full shard; when the version would have more than ``ceil(rows / shard_rows) +``
:data:`EXTRA_SHARDS` shards, runs of neighbouring shards that fit in one are rewritten as one.

Crash safety: files go into a fresh ``d-…`` folder (fsynced on a local disk) and the manifest is published last
(a local temporary file and ``os.replace``; one object written whole on an object store), so a reader sees a
complete version or none. Pruning (after each publish) keeps the :data:`KEEP_VERSIONS` newest manifests and any
published, or superseded, less than :data:`PRUNE_GRACE_S` ago (a selection or a writer may still read it); a
file is removed only when no kept manifest references it and it was referenced by a removed manifest or is older
than :data:`STALE_S` (a crashed writer's leftovers).

The rows are read from the database as the writer needs them (:class:`DatabaseRows`: the selectable rows, as the
single-process reader :func:`worker.pool_data.load_pool` defines them), one shard at a time, so a pool larger than
the writer's memory is written shard by shard, and the store holds exactly what a single-process batch would select
from. The database stays the source of truth for ids, labels, splits, reservations and status.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session
from tqdm import tqdm

from service.db import make_engine, make_sessionmaker, session_scope
from service.outbound import OutboundPolicy, OutboundRefused, resolve
from service.store import content as content_store
from service.store.models import Pool
from worker import context, pool_cache
from worker.pool_data import PoolDataError

log = logging.getLogger(__name__)

FORMAT = 2
KEEP_VERSIONS = 2  # the newest and the one before it (a selection may still read it)
PRUNE_GRACE_S = 900.0  # a manifest published, or superseded, this recently is kept as well
STALE_S = 3600.0  # an unreferenced file this old is a crashed writer's
COMPACT_DELTA_FRACTION = 0.25  # a shard's delta above this fraction of its full file's rows: rewrite the shard
EXTRA_SHARDS = 16  # shards above ceil(rows / shard_rows) + this: merge neighbours that fit in one shard
MIN_ID = -(2**63)
COLUMNS = ("item_id", "external_id", "embedding")
_MANIFEST = re.compile(r"v(\d+)\.json")

Progress = Callable[[int, int], None]


class StoreError(RuntimeError):
    """The pool store cannot be read or written (the message names the folder or shard)."""


# --------------------------------------------------------------------------------------------- filesystems

_FILESYSTEMS: dict[tuple[str, str, str], pafs.FileSystem] = {}


def _filesystem(scheme: str, netloc: str, query: str) -> pafs.FileSystem:
    """The filesystem of a store URL (cached per process): pyarrow's own (``s3://``, ``gs://``, ``hdfs://``,
    ``abfs://``), else fsspec's implementation of the scheme (e.g. ``s3fs``) when it is installed."""
    key = (scheme, netloc, query)
    found = _FILESYSTEMS.get(key)
    if found is not None:
        return found
    try:
        fs, _path = pafs.FileSystem.from_uri(f"{scheme}://{netloc}/" + (f"?{query}" if query else ""))
    except OSError as exc:  # e.g. an S3 bucket whose region cannot be resolved
        raise StoreError(f"the pool store {scheme}://{netloc} cannot be opened: {exc}") from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as native:
        try:
            import fsspec

            spec = fsspec.filesystem(scheme, **dict(parse_qsl(query)))
        except (ImportError, ValueError) as exc:
            raise StoreError(
                f"the pool store's filesystem {scheme}:// is not available: {native}; with fsspec: {exc}"
            ) from None
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(spec))
    _FILESYSTEMS[key] = fs
    return fs


def _resolve(location: str) -> tuple[pafs.FileSystem | None, str]:
    """``(filesystem, path in it)`` of a file's location; the filesystem is None for a local path."""
    if "://" not in location:
        return None, location
    parts = urlsplit(location)
    if parts.scheme == "file":
        return None, parts.path
    return _filesystem(parts.scheme, parts.netloc, parts.query), parts.netloc + parts.path


def display(location: str) -> str:
    """A location as messages show it (without a URL's query)."""
    return location.split("?", 1)[0]


class Files:
    """The store's root: a local folder (os calls, fsync), or a URL whose filesystem pyarrow (or fsspec) opens.

    Paths below the root are relative (``<pool id>/…``, ``/``-separated); :meth:`location` makes the string a
    Dask task carries (a local path, or ``scheme://bucket/key[?query]``).
    """

    def __init__(self, url: str | Path) -> None:
        raw = str(url)
        parts = urlsplit(raw)
        self.local = "://" not in raw or parts.scheme == "file"
        if self.local:
            self.base = str(Path(raw.removeprefix("file://")).expanduser().resolve())
            self.fs: pafs.FileSystem = pafs.LocalFileSystem()
            self._scheme = self._query = ""
        else:
            self._scheme, self._query = parts.scheme, parts.query
            self.fs = _filesystem(parts.scheme, parts.netloc, parts.query)
            self.base = (parts.netloc + parts.path).rstrip("/")

    @property
    def url(self) -> str:
        """The root as a URL this class opens again (an absolute folder when local)."""
        if self.local:
            return self.base
        return f"{self._scheme}://{self.base}" + (f"?{self._query}" if self._query else "")

    def path(self, rel: str) -> str:
        return f"{self.base}/{rel}"

    def location(self, rel: str) -> str:
        if self.local:
            return self.path(rel)
        return f"{self._scheme}://{self.path(rel)}" + (f"?{self._query}" if self._query else "")

    def write_table(self, rel: str, table: pa.Table) -> int:
        """Write a Parquet file (fsynced on a local disk); its size in bytes."""
        path = self.path(rel)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                pq.write_table(table, f, compression="zstd")
                f.flush()
                os.fsync(f.fileno())
            return os.path.getsize(path)
        with self.fs.open_output_stream(path) as out:
            pq.write_table(table, out, compression="zstd")
            size = int(out.tell())
        return size

    def read_ids(self, rel: str) -> np.ndarray:
        return _read_ids(self.location(rel))[0]

    def sync_folder(self, rel: str) -> None:
        if self.local and os.path.isdir(self.path(rel)):
            _fsync_dir(self.path(rel))

    def publish(self, rel: str, data: bytes) -> None:
        """Replace ``rel`` with ``data`` atomically: a reader sees the old file or the new one, whole."""
        path = self.path(rel)
        if self.local:
            folder = os.path.dirname(path)
            os.makedirs(folder, exist_ok=True)
            part = os.path.join(folder, f".{os.path.basename(path)}.{uuid.uuid4().hex}")
            with open(part, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
            _fsync_dir(folder)
            return
        with self.fs.open_output_stream(path) as out:  # an object store's object appears whole, once closed
            out.write(data)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            with self.fs.open_input_stream(self.path(rel)) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None
        except OSError as exc:
            if "not found" in str(exc).lower() or "does not exist" in str(exc).lower():
                return None
            raise

    def listing(self, rel: str, recursive: bool = True) -> list[tuple[str, float, bool]]:
        """``(path relative to the root, modified time, is a folder)`` of everything under ``rel``."""
        selector = pafs.FileSelector(self.path(rel), recursive=recursive, allow_not_found=True)
        out = []
        for info in self.fs.get_file_info(selector):
            mtime = info.mtime.timestamp() if info.mtime is not None else 0.0
            out.append((info.path[len(self.base) + 1 :], mtime, info.type == pafs.FileType.Directory))
        return out

    def exists(self, rels: Sequence[str]) -> list[bool]:
        infos = self.fs.get_file_info([self.path(r) for r in rels])
        return [i.type != pafs.FileType.NotFound for i in infos]

    def delete(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(self.path(rel))

    def delete_tree(self, rel: str) -> None:
        """Remove a folder and what it holds, as far as possible (a clean-up: a folder never made is fine)."""
        with contextlib.suppress(OSError):
            self.fs.delete_dir(self.path(rel))

    def remove_empty_folders(self, rel: str, older_than_s: float = 60.0) -> None:
        """Empty folders below ``rel`` (not one a writer made a moment ago and is about to fill)."""
        if not self.local:
            return  # an object store has no folders of its own
        now = time.time()
        for dirpath, _dirs, _files in sorted(os.walk(self.path(rel)), key=lambda w: -len(w[0])):
            if dirpath != self.path(rel):
                with contextlib.suppress(OSError):  # not empty, or gone
                    if now - os.stat(dirpath).st_mtime > older_than_s:
                        os.rmdir(dirpath)


_ROOTS: dict[str, Files] = {}


def files(root: str | Path) -> Files:
    """The :class:`Files` of a store root (cached per process)."""
    key = str(root)
    found = _ROOTS.get(key)
    if found is None:
        found = _ROOTS[key] = Files(key)
    return found


def store_root(settings: Any) -> str:
    """The store's root (``BAIT_POOL_STORE``): an absolute folder, or a URL of another filesystem (with its
    query; :func:`display` for messages). A URL that names a host (an ``endpoint_override``, an ``hdfs://``
    name node) is checked by the outbound guard first (:func:`check_store_host`), once per process."""
    url = files(str(settings.pool_store)).url
    check_store_host(url, OutboundPolicy.from_settings(settings))
    return url


_GUARDED: set[tuple[str, OutboundPolicy]] = set()


def store_host(url: str) -> tuple[str, int] | None:
    """The host (and port) a store URL sends requests to, when the URL names one: ``endpoint_override`` of an
    object store's query, or the ``netloc`` of ``hdfs://``; None for a local folder or a provider's own endpoint
    (``s3://bucket`` without an override is AWS)."""
    if "://" not in url:
        return None
    parts = urlsplit(url)
    if parts.scheme == "file":
        return None
    options = dict(parse_qsl(parts.query))
    endpoint = options.get("endpoint_override")
    if endpoint:
        scheme = options.get("scheme", "https")
        target = urlsplit(endpoint if "://" in endpoint else f"{scheme}://{endpoint}")
        return target.hostname or "", target.port or (443 if target.scheme == "https" else 80)
    if parts.scheme in ("hdfs", "viewfs"):
        return parts.hostname or "", parts.port or 8020
    return None


def check_store_host(url: str, policy: OutboundPolicy) -> None:
    """The store's host must pass the outbound guard, as every URL the service reaches does: an operator who
    points ``BAIT_POOL_STORE`` at an internal address allows it with ``BAIT_OUTBOUND_ALLOW``.

    Raises:
        StoreError: refused (the message names the settings; the address goes to the log only).
    """
    target = store_host(url)
    if target is None or (url, policy) in _GUARDED:
        return
    try:
        resolve(target[0], target[1], policy)
    except OutboundRefused as exc:
        log.warning("pool store %s refused by the outbound guard: %s", display(url), exc.message)
        raise StoreError(
            "the pool store's host is refused by the outbound guard (BAIT_POOL_STORE names an internal address not "
            "in BAIT_OUTBOUND_ALLOW, or a name that does not resolve); an operator must allow or change it"
        ) from None
    _GUARDED.add((url, policy))


def _fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pool_rel(pool_id: str) -> str:
    if not pool_cache._POOL_ID.fullmatch(pool_id):  # ids are ours; this only keeps a path inside the store
        raise StoreError(f"not a pool id: {pool_id!r}")
    return pool_id


# --------------------------------------------------------------------------------------------- manifests


@dataclass(frozen=True)
class Shard:
    """One shard of a version, what a Dask task reads: its full file (``path``), and its delta when it has one
    (``deleted``: a file of ids; ``upserts``: a file of rows), as locations (:meth:`Files.location`).

    ``rows`` is what the shard yields once the delta is applied, ``first_id``/``last_id`` its first and last item
    ids, ``bytes`` the size of its files; ``lo``/``hi`` the item id range it owns.
    """

    path: str
    rows: int
    first_id: int
    last_id: int
    bytes: int
    lo: int = MIN_ID
    hi: int = 2**63 - 1
    deleted: str | None = None
    upserts: str | None = None


@dataclass(frozen=True)
class Manifest:
    """A published version of a pool: ``d`` columns, ``rows`` in total, its shards in item id order.

    ``base_version`` is the version it was written from (None: written in full); ``written`` counts what its
    writer wrote (``rows``, ``deleted_ids``, ``files``, ``bytes``, ``shards_shared``).
    """

    pool_id: str
    version: int
    d: int
    rows: int
    shards: tuple[Shard, ...]
    location: str
    base_version: int | None = None
    written: dict[str, int] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def _manifest_rel(pool_id: str, version: int) -> str:
    return f"{_pool_rel(pool_id)}/v{int(version)}.json"


def _load_meta(fs: Files, pool_id: str, version: int) -> dict[str, Any] | None:
    raw = fs.read_bytes(_manifest_rel(pool_id, version))
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _manifest(fs: Files, meta: dict[str, Any]) -> Manifest:
    pool_id = str(meta["pool_id"])

    def loc(rel: str | None) -> str | None:
        return None if rel is None else fs.location(f"{pool_id}/{rel}")

    shards = tuple(
        Shard(
            path=fs.location(f"{pool_id}/{s['path']}"),
            rows=int(s["rows"]),
            first_id=int(s["first_id"]),
            last_id=int(s["last_id"]),
            bytes=int(s["bytes"]),
            lo=int(s["lo"]),
            hi=int(s["hi"]),
            deleted=loc(s.get("deleted")),
            upserts=loc(s.get("upserts")),
        )
        for s in meta["shards"]
    )
    version = int(meta["version"])
    return Manifest(
        pool_id,
        version,
        int(meta["d"]),
        int(meta["rows"]),
        shards,
        fs.location(_manifest_rel(pool_id, version)),
        None if meta.get("base_version") is None else int(meta["base_version"]),
        {k: int(v) for k, v in dict(meta.get("written") or {}).items()},
    )


def read_manifest(root: str | Path, pool_id: str, version: int) -> Manifest | None:
    """The published version ``version`` of the pool, or None when the store does not have it."""
    fs = files(root)
    meta = _load_meta(fs, pool_id, version)
    return None if meta is None else _manifest(fs, meta)


def _versions(fs: Files, pool_id: str) -> list[tuple[int, float]]:
    """``(version, modified time)`` of the pool's published manifests, newest first."""
    out = []
    for rel, mtime, is_dir in fs.listing(_pool_rel(pool_id), recursive=False):
        match = _MANIFEST.fullmatch(rel.split("/", 1)[1]) if "/" in rel else None
        if match and not is_dir:
            out.append((int(match.group(1)), mtime))
    return sorted(out, reverse=True)


def _base_meta(fs: Files, pool_id: str, version: int, d: int) -> dict[str, Any] | None:
    """The newest published version below ``version`` with ``d`` columns (what a new version is written from)."""
    for v, _mtime in _versions(fs, pool_id):
        if v >= version:
            continue
        meta = _load_meta(fs, pool_id, v)
        if meta is not None:
            return meta if int(meta["d"]) == d else None
    return None


# --------------------------------------------------------------------------------------------- reading


def _open(location: str) -> pq.ParquetFile:
    fs, path = _resolve(location)
    if fs is None:
        return pq.ParquetFile(path)
    return pq.ParquetFile(fs.open_input_file(path))


def _column_bytes(parquet: pq.ParquetFile, columns: Sequence[str]) -> int:
    meta = parquet.metadata
    return int(
        sum(
            meta.row_group(g).column(c).total_compressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema.split(".")[0] in columns
        )
    )


def _read_ids(location: str) -> tuple[np.ndarray, int]:
    """The ``item_id`` column of a shard, upserts or deleted-ids file, and the bytes read."""
    try:
        parquet = _open(location)
        table = parquet.read(columns=["item_id"])
        nbytes = _column_bytes(parquet, ["item_id"])
    except (OSError, pa.ArrowInvalid, KeyError) as exc:
        raise StoreError(f"pool store file {display(location)} cannot be read: {exc}") from None
    return table.column("item_id").to_numpy().astype(np.int64, copy=False), nbytes


def _read_rows(location: str, embeddings: bool) -> tuple[np.ndarray, list[str], np.ndarray, int]:
    columns = list(COLUMNS if embeddings else COLUMNS[:2])
    try:
        parquet = _open(location)
        names = parquet.schema_arrow.names
        if names != list(COLUMNS):
            raise StoreError(f"pool store shard {display(location)} has columns {names}, expected {', '.join(COLUMNS)}")
        table = parquet.read(columns=columns)
        nbytes = _column_bytes(parquet, columns)
    except (OSError, pa.ArrowInvalid) as exc:
        raise StoreError(f"pool store shard {display(location)} cannot be read: {exc}") from None
    ids = table.column("item_id").to_numpy().astype(np.int64, copy=False)
    external_ids = table.column("external_id").to_pylist()
    if not embeddings:
        return ids, external_ids, np.empty((len(table), 0), dtype=np.float32), nbytes
    emb = table.column("embedding").combine_chunks()
    d = emb.type.list_size
    X = emb.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(table), d)
    return ids, external_ids, X, nbytes


def read_shard(shard: Shard | str, embeddings: bool = True) -> tuple[np.ndarray, list[str], np.ndarray, int]:
    """One shard's rows: ``(item_ids (m,) int64 ascending, external ids, X m x d float32, bytes read)``.

    Args:
        shard: a manifest's shard (its full file with its delta applied), or the location of one Parquet file.
        embeddings: False reads the id columns only (``X`` is then ``m x 0``).

    Returns:
        The rows, and the compressed bytes of the column chunks read (the files' size when all are read).

    Raises:
        StoreError: a file is missing or not the store's, or the rows do not match the manifest (the message
            names the shard).
    """
    if isinstance(shard, str):
        return _read_rows(shard, embeddings)
    ids, external_ids, X, nbytes = _read_rows(shard.path, embeddings)
    if shard.deleted is not None or shard.upserts is not None:
        gone = np.empty(0, dtype=np.int64)
        if shard.deleted is not None:
            gone, n = _read_ids(shard.deleted)
            nbytes += n
        up_ids, up_X = np.empty(0, dtype=np.int64), X[:0]
        up_ext: list[str] = []
        if shard.upserts is not None:
            up_ids, up_ext, up_X, n = _read_rows(shard.upserts, embeddings)
            nbytes += n
        keep = ~np.isin(ids, np.union1d(gone, up_ids))
        kept = np.nonzero(keep)[0]
        ids = np.concatenate([ids[kept], up_ids])
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        X = np.concatenate([X[kept], up_X])[order]
        merged = [external_ids[int(i)] for i in kept] + list(up_ext)
        external_ids = [merged[int(i)] for i in order]
    if ids.shape[0] != shard.rows or (ids.size and (ids[0] != shard.first_id or ids[-1] != shard.last_id)):
        raise StoreError(
            f"pool store shard {display(shard.path)} yields {ids.shape[0]} rows, its manifest says {shard.rows}"
        )
    if ids.size > 1 and not bool(np.all(np.diff(ids) > 0)):
        raise StoreError(f"pool store shard {display(shard.path)} has item ids out of order or repeated")
    return ids, external_ids, X, nbytes


# --------------------------------------------------------------------------------------------- planning


@dataclass
class Planned:
    """One shard of the version being written: rows ``a:b`` of the new rows, owning ids ``lo..hi``.

    ``keep``: the previous version's entry, listed again as it is. ``base``: the previous entry whose full file
    stays, with a new delta (``deleted`` ids, ``upserts``: positions in the new rows). Neither: a fresh full shard.
    """

    lo: int
    hi: int
    a: int
    b: int
    keep: dict[str, Any] | None = None
    base: dict[str, Any] | None = None
    deleted: np.ndarray | None = None
    upserts: np.ndarray | None = None

    @property
    def fresh(self) -> bool:
        return self.keep is None and self.base is None

    @property
    def rows(self) -> int:
        return self.b - self.a


def plan(
    previous: Sequence[dict[str, Any]],
    item_ids: np.ndarray,
    changed: np.ndarray,
    shard_rows: int,
    read_ids: Callable[[str], np.ndarray],
) -> list[Planned]:
    """The shards of a new version with rows ``item_ids`` (ascending), written from the previous version's
    shard entries (empty: everything is written anew).

    Args:
        previous: the previous manifest's ``shards`` (relative paths).
        item_ids: the new version's item ids, ascending.
        changed: sorted item ids that may differ from the previous version (inserted, updated, deleted since it);
            a superset is fine, a missing id is not (ids above the previous version's are found without it).
        shard_rows: rows per fresh shard.
        read_ids: ``relative path -> item ids`` of a file of the previous version (its full shards and upserts).
    """
    n = int(item_ids.shape[0])
    out: list[Planned] = []
    top: int | None = None
    if previous:
        los = np.asarray([int(e["lo"]) for e in previous], dtype=np.int64)
        his = np.asarray([int(e["hi"]) for e in previous], dtype=np.int64)
        starts = np.searchsorted(item_ids, los, "left")
        stops = np.searchsorted(item_ids, his, "right")
        c_lo = np.searchsorted(changed, los, "left")
        c_hi = np.searchsorted(changed, his, "right")
        for i, entry in enumerate(previous):
            a, b = int(starts[i]), int(stops[i])
            p = Planned(int(los[i]), int(his[i]), a, b)
            same = (
                c_hi[i] == c_lo[i]
                and b - a == int(entry["rows"])
                and b > a
                and int(item_ids[a]) == int(entry["first_id"])
                and int(item_ids[b - 1]) == int(entry["last_id"])
            )
            if same:
                p.keep = entry
            elif b > a:
                _plan_delta(p, entry, item_ids, changed[c_lo[i] : c_hi[i]], read_ids)
            out.append(p)
        top = int(his[-1])
    first = 0 if top is None else int(np.searchsorted(item_ids, top, "right"))
    lo = MIN_ID if top is None else top + 1
    for a in range(first, n, shard_rows):
        b = min(a + shard_rows, n)
        out.append(Planned(lo, int(item_ids[b - 1]), a, b))
        lo = int(item_ids[b - 1]) + 1
    out = _drop_empty(out)
    if len(out) > math.ceil(n / shard_rows) + EXTRA_SHARDS:
        out = _merge_neighbours(out, shard_rows)
    return _split_large(out, item_ids, shard_rows)


def _plan_delta(
    p: Planned, entry: dict[str, Any], item_ids: np.ndarray, changed: np.ndarray, read_ids: Callable[[str], np.ndarray]
) -> None:
    """A changed shard: its cumulative delta against its full file, or a fresh full shard when the delta is large."""
    target = item_ids[p.a : p.b]
    base_ids = read_ids(str(entry["path"]))
    hot = changed
    if entry.get("upserts"):
        hot = np.union1d(hot, read_ids(str(entry["upserts"])))
    deleted = np.setdiff1d(base_ids, target, assume_unique=True)
    up = ~np.isin(target, base_ids, assume_unique=True) | np.isin(target, hot)
    n_delta = int(deleted.shape[0]) + int(up.sum())
    if n_delta > COMPACT_DELTA_FRACTION * max(int(base_ids.shape[0]), 1):
        return  # fresh
    p.base = entry
    p.deleted = deleted
    p.upserts = p.a + np.nonzero(up)[0]


def _drop_empty(planned: list[Planned]) -> list[Planned]:
    """Shards left without rows go; their id range joins the next shard's (the previous one's when last)."""
    out: list[Planned] = []
    carry: int | None = None  # the lo of dropped shards, handed to the next kept one
    for p in planned:
        if p.rows == 0:
            carry = p.lo if carry is None else carry
            continue
        if carry is not None:
            p.lo, carry = carry, None
        out.append(p)
    if carry is not None and out:
        out[-1].hi = planned[-1].hi
    return out


def _merge_neighbours(planned: list[Planned], shard_rows: int) -> list[Planned]:
    """Runs of neighbouring shards whose rows fit in one shard become one fresh shard."""
    out: list[Planned] = []
    group: list[Planned] = []

    def flush() -> None:
        if len(group) == 1:
            out.append(group[0])
        elif group:
            out.append(Planned(group[0].lo, group[-1].hi, group[0].a, group[-1].b))
        group.clear()

    for p in planned:
        if group and sum(g.rows for g in group) + p.rows > shard_rows:
            flush()
        group.append(p)
    flush()
    return out


def _split_large(planned: list[Planned], item_ids: np.ndarray, shard_rows: int) -> list[Planned]:
    """A fresh shard above ``shard_rows`` rows (a rewritten shard that grew) is split."""
    out: list[Planned] = []
    for p in planned:
        if not p.fresh or p.rows <= shard_rows:
            out.append(p)
            continue
        lo = p.lo
        for a in range(p.a, p.b, shard_rows):
            b = min(a + shard_rows, p.b)
            hi = p.hi if b == p.b else int(item_ids[b - 1])
            out.append(Planned(lo, hi, a, b))
            lo = hi + 1
    return out


# --------------------------------------------------------------------------------------------- writing


def _table(ids: np.ndarray, external_ids: Sequence[str], X: np.ndarray) -> pa.Table:
    d = int(X.shape[1])
    block = np.ascontiguousarray(X, dtype=np.float32)  # m x d
    return pa.table(
        {
            "item_id": pa.array(np.asarray(ids, dtype=np.int64)),
            "external_id": pa.array(list(external_ids), type=pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), d),
        },
        schema=schema(d),
    )


class PoolMoved(RuntimeError):
    """The pool's rows changed while a version was being written (nothing was published; write it again)."""


class Rows(ABC):
    """The rows of the version being written: ``item_ids`` (ascending), and the rows the plan needs, read on demand.

    :func:`_write` asks for contiguous runs of rows (a fresh shard) and for scattered rows (a delta's upserts);
    :meth:`unchanged` is asked last, before the manifest is published.
    """

    item_ids: np.ndarray
    d: int

    @abstractmethod
    def block(self, a: int, b: int) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        """Ids, external ids and embeddings of rows ``a:b``."""

    @abstractmethod
    def take(self, positions: np.ndarray) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        """Ids, external ids and embeddings of the rows at ``positions`` (ascending)."""

    def unchanged(self) -> bool:
        """Whether the rows handed out are still the version's (checked before publishing)."""
        return True


class ArrayRows(Rows):
    """Rows held in memory: ``n x d`` float32 ``X`` beside ascending ``item_ids``."""

    def __init__(self, item_ids: np.ndarray, external_ids: Sequence[str], X: np.ndarray) -> None:
        self.item_ids = np.asarray(item_ids, dtype=np.int64)
        self.external_ids = external_ids
        self.X = X
        self.d = int(X.shape[1])

    def block(self, a: int, b: int) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        return self.item_ids[a:b], list(self.external_ids[a:b]), self.X[a:b]

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        return self.item_ids[positions], [self.external_ids[int(i)] for i in positions], self.X[positions]


class DatabaseRows(Rows):
    """A pool's selectable rows read from the database as the writer needs them, never the whole pool at once.

    The ids are read first (``8 n`` bytes); a fresh shard reads its id range, a delta its upserted ids. Every read
    is checked against the ids read first, and the pool's content version is read again before publishing: the
    version is published only when no change committed while it was read (content versions move with every change
    to a selectable row), so its rows are the database's at that version. Otherwise :class:`PoolMoved`.
    """

    def __init__(self, session: Session, pool_id: str, version: int, d: int) -> None:
        self.session = session
        self.pool_id = pool_id
        self.version = int(version)
        self.d = int(d)
        parts = [
            np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
            for rows in content_store.selectable_ids(session, pool_id)
        ]
        self.item_ids = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)

    def _fill(self, rows: Sequence[Any], expected: np.ndarray, out: np.ndarray, names: list[str]) -> None:
        """Check ``rows`` (``(id, external id, embedding)``) against ``expected`` ids and write their embeddings
        into ``out`` (``len(rows) x d``) and their external ids onto ``names``."""
        ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
        if ids.shape != expected.shape or not np.array_equal(ids, expected):
            raise PoolMoved(f"pool {self.pool_id}: its rows changed while version {self.version} was written")
        blobs = [r[2] for r in rows]
        for r, blob in zip(rows, blobs, strict=True):
            if blob is None or len(blob) != 4 * self.d:
                got = "no stored embedding" if blob is None else f"an embedding of {len(blob) // 4} values"
                raise PoolDataError(f"item {r[1]!r} has {got}, expected {self.d}")
        if blobs:
            out[:] = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), self.d)
        names.extend(str(r[1]) for r in rows)

    def _decode(self, rows: Sequence[Any], expected: np.ndarray) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        X = np.empty((len(rows), self.d), dtype=np.float32)
        names: list[str] = []
        self._fill(rows, expected, X, names)
        return expected, names, X

    def block(self, a: int, b: int) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        """Rows ``a:b``, decoded chunk by chunk as the database hands them over into one ``(b - a) x d`` array, so
        a shard's embeddings are held once (not also as one bytes object per row)."""
        expected = self.item_ids[a:b]
        X = np.empty((expected.shape[0], self.d), dtype=np.float32)
        names: list[str] = []
        done = 0
        for part in content_store.selectable_rows(self.session, self.pool_id, int(expected[0]), int(expected[-1])):
            if done + len(part) > expected.shape[0]:
                raise PoolMoved(f"pool {self.pool_id}: its rows changed while version {self.version} was written")
            self._fill(part, expected[done : done + len(part)], X[done : done + len(part)], names)
            done += len(part)
        if done != expected.shape[0]:
            raise PoolMoved(f"pool {self.pool_id}: its rows changed while version {self.version} was written")
        return expected, names, X

    def take(self, positions: np.ndarray) -> tuple[np.ndarray, Sequence[str], np.ndarray]:
        expected = self.item_ids[positions]
        return self._decode(content_store.selectable_by_id(self.session, self.pool_id, expected.tolist()), expected)

    def unchanged(self) -> bool:
        return content_store.content_version(self.session, self.pool_id) == self.version


def schema(d: int) -> pa.Schema:
    return pa.schema(
        [
            ("item_id", pa.int64()),
            ("external_id", pa.string()),
            ("embedding", pa.list_(pa.float32(), d)),
        ]
    )


def _referenced(meta: dict[str, Any]) -> set[str]:
    """The files a manifest references (relative to its pool's folder)."""
    out: set[str] = set()
    for s in meta["shards"]:
        out.add(str(s["path"]))
        for key in ("deleted", "upserts"):
            if s.get(key):
                out.add(str(s[key]))
    return out


@dataclass(frozen=True)
class Changes:
    """What changed since a published version: ``ids``, sorted item ids inserted, updated or deleted after
    ``base_version`` (a superset is fine; ids above the base's newest need not be listed)."""

    base_version: int
    ids: np.ndarray


def write_version(
    root: str | Path,
    pool_id: str,
    version: int,
    item_ids: np.ndarray,
    external_ids: Sequence[str],
    X: np.ndarray,
    shard_rows: int,
    progress: Progress | None = None,
    changes: Changes | None = None,
    newest: int | None = None,
) -> Manifest:
    """Publish rows (ascending ``item_ids``, ``n x d`` float32 ``X``) as version ``version`` of the pool.

    With ``changes``, the version is written from ``changes.base_version`` (:func:`plan`: only new and changed
    rows are written); without them, or when that version is gone or has another width, in full. When another
    writer published the same version first, its copy is kept and returned. Older versions are pruned afterwards
    (:func:`prune`; ``newest``: the database's content version, when known).
    """
    return write_rows(
        root, pool_id, version, ArrayRows(item_ids, external_ids, X), shard_rows, progress, changes, newest
    )


def write_rows(
    root: str | Path,
    pool_id: str,
    version: int,
    source: Rows,
    shard_rows: int,
    progress: Progress | None = None,
    changes: Changes | None = None,
    newest: int | None = None,
) -> Manifest:
    """:func:`write_version` with the rows read from ``source`` as the plan needs them.

    Raises:
        PoolMoved: ``source`` changed while the version was written (nothing was published).
    """
    fs = files(root)
    d = source.d
    base = None
    if changes is not None:
        base = _load_meta(fs, pool_id, changes.base_version)
        if base is not None and int(base["d"]) != d:
            base = None
    ids = np.unique(np.asarray(changes.ids if changes is not None else [], dtype=np.int64))
    meta = _write(fs, pool_id, version, source, shard_rows, progress, ids, base)
    prune(root, pool_id, newest=None if newest is None else max(int(newest), int(version)))  # never this one
    if meta is not None and not all(fs.exists([f"{pool_id}/{r}" for r in sorted(_referenced(meta))])):
        # a concurrent pruner removed a file this version shares (its writer took longer than PRUNE_GRACE_S)
        log.warning("pool store: pool %s version %d lost a shared file; writing it in full", pool_id, version)
        _write(fs, pool_id, version, source, shard_rows, progress, ids, None, True)
    published = read_manifest(root, pool_id, version)
    if published is None:
        raise StoreError(f"pool store version {display(fs.location(_manifest_rel(pool_id, version)))} vanished")
    return published


def _write(
    fs: Files,
    pool_id: str,
    version: int,
    source: Rows,
    shard_rows: int,
    progress: Progress | None,
    changed: np.ndarray,
    base: dict[str, Any] | None,
    replace_published: bool = False,
) -> dict[str, Any] | None:
    """Write the files of a version and publish its manifest; the manifest, or None when one was there."""
    pool = _pool_rel(pool_id)
    item_ids = source.item_ids
    n = int(item_ids.shape[0])
    previous = list(base["shards"]) if base is not None else []
    planned = plan(previous, np.asarray(item_ids), changed, shard_rows, lambda rel: fs.read_ids(f"{pool}/{rel}"))
    folder = f"d-v{int(version)}-{uuid.uuid4().hex[:12]}"
    total = sum(p.rows for p in planned if p.fresh) + sum(len(p.upserts) for p in planned if p.upserts is not None)
    written = {"rows": 0, "deleted_ids": 0, "files": 0, "bytes": 0, "shards_shared": 0}
    entries: list[dict[str, Any]] = []

    def put(name: str, table: pa.Table) -> tuple[str, int]:
        size = fs.write_table(f"{pool}/{folder}/{name}", table)
        written["files"] += 1
        written["bytes"] += size
        return f"{folder}/{name}", size

    try:
        for index, p in enumerate(planned):
            entry: dict[str, Any] = {
                "rows": p.rows,
                "first_id": int(item_ids[p.a]),
                "last_id": int(item_ids[p.b - 1]),
                "lo": p.lo,
                "hi": p.hi,
            }
            if p.keep is not None:
                entry.update({k: p.keep.get(k) for k in ("path", "bytes", "base_bytes", "deleted", "upserts")})
                written["shards_shared"] += 1
            elif p.base is not None:
                entry.update(path=p.base["path"], base_bytes=int(p.base["base_bytes"]), deleted=None, upserts=None)
                size = int(p.base["base_bytes"])
                if p.deleted is not None and p.deleted.size:
                    del_table = pa.table({"item_id": pa.array(p.deleted, type=pa.int64())})
                    entry["deleted"], extra = put(f"del-{index:05d}.parquet", del_table)
                    written["deleted_ids"] += int(p.deleted.shape[0])
                    size += extra
                if p.upserts is not None and p.upserts.size:
                    entry["upserts"], extra = put(f"up-{index:05d}.parquet", _table(*source.take(p.upserts)))
                    written["rows"] += int(p.upserts.shape[0])
                    size += extra
                entry["bytes"] = size
                written["shards_shared"] += 1
            else:
                entry["path"], size = put(f"part-{index:05d}.parquet", _table(*source.block(p.a, p.b)))
                entry.update(bytes=size, base_bytes=size, deleted=None, upserts=None)
                written["rows"] += p.rows
            entries.append(entry)
            if progress is not None and total:
                progress(written["rows"], total)
        if sum(e["rows"] for e in entries) != n:
            raise StoreError(f"pool store: the plan of pool {pool_id} version {version} lost rows (a bug)")
        fs.sync_folder(f"{pool}/{folder}")
        meta = {
            "format": FORMAT,
            "pool_id": pool_id,
            "version": int(version),
            "d": source.d,
            "rows": n,
            "base_version": None if base is None else int(base["version"]),
            "written": written,
            "shards": entries,
            "created_at": datetime.now(UTC).isoformat(),
        }
        rel = _manifest_rel(pool_id, version)
        if not source.unchanged():
            raise PoolMoved(f"pool {pool_id}: its rows changed while version {version} was written")
        if not replace_published and _load_meta(fs, pool_id, version) is not None:
            fs.delete_tree(f"{pool}/{folder}")  # another writer published this version first: keep its copy
            return None
        fs.publish(rel, json.dumps(meta).encode())  # last: a version without its manifest is never seen
    except BaseException:
        fs.delete_tree(f"{pool}/{folder}")
        raise
    return meta


# --------------------------------------------------------------------------------------------- pruning


def prune(
    root: str | Path,
    pool_id: str,
    keep: int = KEEP_VERSIONS,
    grace_s: float | None = None,
    stale_s: float | None = None,
    newest: int | None = None,
) -> list[str]:
    """Remove the manifests no longer kept and the files no kept manifest references. Returns what went.

    Kept: the ``keep`` newest manifests, and any published, or superseded, less than ``grace_s`` ago; not one
    above ``newest`` (the database's content version: a manifest above it, older than ``grace_s``, was written
    before the database was restored from a backup). A file goes when no kept manifest references it and a removed
    manifest did, or it is older than ``stale_s`` (a crashed writer's). A kept manifest that cannot be read keeps
    every file.
    """
    grace = PRUNE_GRACE_S if grace_s is None else grace_s
    stale = STALE_S if stale_s is None else stale_s
    fs = files(root)
    pool = _pool_rel(pool_id)
    now = time.time()
    listing = fs.listing(pool)
    versions = _versions(fs, pool_id)
    kept: list[int] = []
    dropped = [v for v, mtime in versions if newest is not None and v > newest and now - mtime >= grace]
    successor_mtime: float | None = None
    for v, mtime in versions:
        if v in dropped:
            continue
        recent = now - mtime < grace or (successor_mtime is not None and now - successor_mtime < grace)
        (kept if len(kept) < keep or recent else dropped).append(v)
        successor_mtime = mtime
    referenced: set[str] = set()
    readable = True
    for v in kept:
        meta = _load_meta(fs, pool_id, v)
        if meta is None:
            readable = False
            continue
        referenced |= _referenced(meta)
    released: set[str] = set()
    for v in dropped:
        meta = _load_meta(fs, pool_id, v)
        if meta is not None:
            released |= _referenced(meta)
    removed: list[str] = []
    for v in dropped:  # manifests first: no manifest ever names a removed file
        fs.delete(_manifest_rel(pool_id, v))
        removed.append(f"v{v}.json")
    for rel, mtime, is_dir in listing:
        name = rel.split("/", 1)[1] if "/" in rel else ""
        if is_dir:
            continue
        top = name.split("/", 1)[0]
        if top.startswith("d-") and readable and name not in referenced:
            if name in released or now - mtime > stale:
                fs.delete(rel)
                removed.append(name)
        elif top.startswith(".v") and now - mtime > stale:  # a crashed publish's temporary manifest
            fs.delete(rel)
            removed.append(name)
    for rel, mtime, is_dir in listing:  # folders of the first store format (v<version>/manifest.json)
        name = rel.split("/", 1)[1] if "/" in rel else ""
        if is_dir and re.fullmatch(r"v\d+|\.tmp-[0-9a-f]+", name) and (versions or now - mtime > stale):
            fs.delete_tree(rel)
            removed.append(name)
    fs.remove_empty_folders(pool)
    return removed


def drop(root: str | Path, pool_id: str) -> None:
    """Remove every version of a pool (e.g. the pool was deleted)."""
    files(root).delete_tree(_pool_rel(pool_id))


def pool_folders(root: str | Path) -> list[str]:
    """The pool ids that have a folder in the store (its top-level folders named like a pool id)."""
    fs = files(root)
    selector = pafs.FileSelector(fs.base, recursive=False, allow_not_found=True)
    names = [i.base_name for i in fs.fs.get_file_info(selector) if i.type == pafs.FileType.Directory]
    return sorted(n for n in names if pool_cache._POOL_ID.fullmatch(n))


def sweep_deleted(settings: Any, session: Session) -> list[str]:
    """Remove the store's folders of pools the database no longer has: a deleted pool's embeddings must not
    outlive it. Runs when a pool is deleted (:func:`drop_deleted_pool`, a job the delete enqueues) and when a
    worker starts (a delete whose job was lost). Returns the pool ids removed."""
    root = store_root(settings)
    ids = pool_folders(root)
    if not ids:
        return []
    alive = set(session.scalars(select(Pool.id).where(Pool.id.in_(ids))))
    gone = [i for i in ids if i not in alive]
    for pool_id in gone:
        drop(root, pool_id)
        log.info("pool store: removed the folder of deleted pool %s", pool_id)
    return gone


def sweep_at_start(settings: Any, factory: Any) -> list[str]:
    """:func:`sweep_deleted` when a worker starts; a store that cannot be read is logged, not raised (the worker
    must start; the next start or delete tries again)."""
    try:
        with session_scope(factory) as s:
            return sweep_deleted(settings, s)
    except Exception:
        log.exception("pool store: the sweep of deleted pools failed")
        return []


def drop_deleted_pool(pool_id: str) -> None:
    """The job a pool's deletion enqueues: remove its folder from the store, once the pool is gone from the
    database (a pool that still exists, e.g. a delete that rolled back, keeps its folder)."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        if s.get(Pool, pool_id) is not None:
            return
    drop(store_root(env.settings), pool_id)


# --------------------------------------------------------------------------------------------- the service's side


WRITE_ATTEMPTS = 4  # writes of one version that found the pool changed under them before giving up


def ensure_version(
    session: Session, settings: Any, pool: Pool, progress: Progress | None = None
) -> tuple[Manifest, str]:
    """The store's copy of the pool at its current content version, written first when missing.

    The rows are read from the database as the writer needs them (:class:`DatabaseRows`: the ids, then each fresh
    shard's id range and each delta's upserted ids), never the whole pool at once, so a pool far larger than the
    process's memory is written shard by shard; the ids that changed since the newest published version come from
    the database, so only new and changed rows are read and written (:func:`write_rows`). When rows change while
    the version is written, nothing is published and the then-current version is written instead (at most
    :data:`WRITE_ATTEMPTS` times). Returns the manifest and how it was served: ``hit`` (already there) or
    ``written``.

    Raises:
        LookupError: the pool is gone.
        worker.pool_data.PoolDataError: a selectable row without a valid embedding.
        StoreError: the pool changed under every attempt.
    """
    root = store_root(settings)
    fs = files(root)
    d = int(pool.embedding_dim)
    for _attempt in range(WRITE_ATTEMPTS):
        version = content_store.content_version(session, pool.id)
        if version is None:
            raise LookupError(f"pool {pool.id} does not exist")
        found = read_manifest(root, pool.id, version)
        if found is not None and found.d == d:
            return found, "hit"
        source = DatabaseRows(session, pool.id, version, d)
        changes = None
        base = _base_meta(fs, pool.id, version, d)
        if base is not None:
            top = max((int(s["hi"]) for s in base["shards"]), default=None)
            ids = content_store.changed_ids(session, pool.id, int(base["version"]), top)
            changes = Changes(int(base["version"]), np.asarray(ids, dtype=np.int64))
        try:
            manifest = write_rows(
                root, pool.id, version, source, int(settings.pool_store_shard_rows), progress, changes, newest=version
            )
        except PoolMoved as exc:
            log.info("pool store: %s; writing the new version", exc)
            continue
        log.info(
            "pool store: pool %s version %d written from %s (%d rows, %d shards; %d rows and %d deleted ids written)",
            pool.id,
            version,
            "scratch" if manifest.base_version is None else f"version {manifest.base_version}",
            manifest.rows,
            len(manifest.shards),
            manifest.written.get("rows", 0),
            manifest.written.get("deleted_ids", 0),
        )
        return manifest, "written"
    raise StoreError(
        f"pool {pool.id} changed while each of {WRITE_ATTEMPTS} store versions was written; try again when its "
        "uploads have settled"
    )


def migrate_all(settings: Any, pool_ids: Sequence[str] | None = None, progress_bars: bool = True) -> list[str]:
    """``bait pools migrate-store``: write the store's copy of every pool (or of ``pool_ids``) at its current
    content version, one progress bar per pool. Returns one line per pool."""
    factory = make_sessionmaker(make_engine(settings))
    with session_scope(factory) as s:
        query = select(Pool.id, Pool.name).order_by(Pool.created_at, Pool.id)
        if pool_ids:
            query = query.where(Pool.id.in_(list(pool_ids)))
        pools = [(str(i), str(n)) for i, n in s.execute(query).all()]
    missing = sorted(set(pool_ids or ()) - {p for p, _ in pools})
    if missing:
        raise LookupError(f"no pool with id {', '.join(missing)}")
    lines: list[str] = []
    for pool_id, name in pools:
        with tqdm(total=0, unit="rows", desc=f"{name} ({pool_id})", disable=not progress_bars, leave=True) as bar:

            def advance(done: int, total: int, bar: Any = bar) -> None:
                if total and bar.total != total:
                    bar.total = total
                bar.update(done - bar.n)

            with session_scope(factory) as s:
                pool = s.get(Pool, pool_id)
                if pool is None:  # deleted meanwhile
                    continue
                manifest, how = ensure_version(s, settings, pool, advance)
        if how == "hit":
            what = "already in the store"
        elif manifest.base_version is None:
            what = "written in full"
        else:
            what = (
                f"written from version {manifest.base_version}: {manifest.written.get('rows', 0)} rows, "
                f"{manifest.written.get('deleted_ids', 0)} deleted ids"
            )
        lines.append(
            f"pool {pool_id} ({name}): version {manifest.version}, {manifest.rows} rows in {len(manifest.shards)} "
            f"shard(s), {manifest.bytes} bytes ({what})"
        )
    return lines


# --------------------------------------------------------------------------------------------- written as items arrive

ARRIVAL_PASSES = 3  # a store job writes again while items keep arriving, this many times at most


def write_arrived(pool_id: str) -> None:
    """The job an arrival enqueues (``BAIT_POOL_STORE_ON_ARRIVAL``, :mod:`service.domain.store_arrivals`): write
    the pool's current content version to the store, from the previous version (:func:`ensure_version`: only the
    new and changed rows), so the pool's next batch on the cluster finds it written.

    Items that arrive while it writes move the content version again; their own job is not enqueued while this
    one runs (one job id per pool), so it writes again, :data:`ARRIVAL_PASSES` times at most, until the version
    it wrote is the pool's current one. A pool that is gone (deleted before or while it ran) leaves nothing: no
    write, and its folder (one written meanwhile included) is removed. Errors are logged and raised (the job
    fails; the upload that enqueued it has committed already and is not affected).
    """
    env = context.env()
    settings, factory = env.settings, env.sessionmaker
    try:
        root = store_root(settings)
        for attempt in range(1, ARRIVAL_PASSES + 1):
            with session_scope(factory) as s:
                pool = s.get(Pool, pool_id)
                if pool is None:
                    drop(root, pool_id)  # nothing of a deleted pool stays (its own drop job does the same)
                    log.info("pool store: pool %s is gone; nothing written", pool_id)
                    return
                try:
                    manifest, how = ensure_version(s, settings, pool)
                except LookupError:  # deleted while it was read
                    manifest, how = None, "gone"
            with session_scope(factory) as s:
                current = content_store.content_version(s, pool_id)
            if current is None:  # deleted while it was written: its drop job may have run already
                drop(root, pool_id)
                log.info("pool store: pool %s was deleted while it was written; its folder removed", pool_id)
                return
            if manifest is None:
                continue
            log.info(
                "pool store: pool %s version %d on arrival (pass %d): %s, %d rows in %d shard(s); wrote %d rows, "
                "%d deleted ids, %d files, %d bytes",
                pool_id,
                manifest.version,
                attempt,
                "already there" if how == "hit" else "written",
                manifest.rows,
                len(manifest.shards),
                manifest.written.get("rows", 0) if how == "written" else 0,
                manifest.written.get("deleted_ids", 0) if how == "written" else 0,
                manifest.written.get("files", 0) if how == "written" else 0,
                manifest.written.get("bytes", 0) if how == "written" else 0,
            )
            if manifest.version >= current:
                return
        log.info(
            "pool store: pool %s kept changing while it was written (%d passes); its next arrival or batch writes "
            "the newest version",
            pool_id,
            ARRIVAL_PASSES,
        )
    except Exception:
        log.exception("pool store: writing pool %s on arrival failed", pool_id)
        raise
