"""The pool store (issue 26): each pool's selectable rows as Parquet shards, one folder per content version,
read by the Dask workers of a distributed selection (:mod:`worker.distributed`).

Layout under ``BAIT_POOL_STORE`` (a local folder, or one named by ``file://``)::

    <pool id>/v<content version>/part-00000.parquet   item_id int64, external_id string,
                                                      embedding fixed_size_list<float32>[d]; ascending item ids
    <pool id>/v<content version>/manifest.json        {"format", "pool_id", "version", "d", "rows",
                                                       "shards": [{"path", "rows", "first_id", "last_id", "bytes"}]}
    <pool id>/.tmp-<uuid>/                            a version being written

A version is written in a temporary folder (shards, then ``manifest.json`` through a temporary file and
``os.replace``), fsynced, and renamed to ``v<version>`` as a whole: a reader that finds
``v<version>/manifest.json`` sees the complete version, never half of it. Rows are ascending by item id across
the shards (shard ``i`` holds the rows before shard ``i + 1``), the order of the single-process path's rows.

The rows come from the worker's own reader (:func:`worker.pool_data.load_pool`, through the worker cache when
there is one), so the store holds exactly what a single-process batch would select from. The database stays the
source of truth for ids, labels, splits, reservations and status. Older versions are pruned once a newer one is
published (the one before it is kept, for a distributed selection still reading it).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import select
from sqlalchemy.orm import Session
from tqdm import tqdm

from service.db import make_engine, make_sessionmaker, session_scope
from service.store import content as content_store
from service.store.models import Pool
from worker import pool_cache
from worker.pool_data import load_pool

log = logging.getLogger(__name__)

FORMAT = 1
MANIFEST = "manifest.json"
KEEP_VERSIONS = 2  # the newest and the one before it (a selection may still read it)
STALE_TMP_S = 3600.0  # a temporary folder this old is a crashed writer's

Progress = Callable[[int, int], None]


class StoreError(RuntimeError):
    """The pool store cannot be read or written (the message names the folder or shard)."""


@dataclass(frozen=True)
class Shard:
    """One Parquet file of a version: its absolute ``path``, ``rows``, its first and last item ids, ``bytes``."""

    path: str
    rows: int
    first_id: int
    last_id: int
    bytes: int


@dataclass(frozen=True)
class Manifest:
    """A published version of a pool: ``d`` columns, ``rows`` in total, its shards in item id order."""

    pool_id: str
    version: int
    d: int
    rows: int
    shards: tuple[Shard, ...]
    folder: Path

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def store_root(settings: Any) -> Path:
    """The store's folder (``BAIT_POOL_STORE``: a path, or a ``file://`` URL), absolute."""
    raw = str(settings.pool_store)
    return Path(raw.removeprefix("file://")).expanduser().resolve()


def _pool_dir(root: Path, pool_id: str) -> Path:
    if not pool_cache._POOL_ID.fullmatch(pool_id):  # ids are ours; this only keeps a path inside the store
        raise StoreError(f"not a pool id: {pool_id!r}")
    return root / pool_id


def schema(d: int) -> pa.Schema:
    return pa.schema(
        [
            ("item_id", pa.int64()),
            ("external_id", pa.string()),
            ("embedding", pa.list_(pa.float32(), d)),
        ]
    )


def read_manifest(root: Path, pool_id: str, version: int) -> Manifest | None:
    """The published version ``version`` of the pool, or None when the store does not have it."""
    folder = _pool_dir(root, pool_id) / f"v{int(version)}"
    try:
        meta = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    if meta.get("format") != FORMAT:
        return None
    shards = tuple(
        Shard(str(folder / s["path"]), int(s["rows"]), int(s["first_id"]), int(s["last_id"]), int(s["bytes"]))
        for s in meta["shards"]
    )
    return Manifest(str(meta["pool_id"]), int(meta["version"]), int(meta["d"]), int(meta["rows"]), shards, folder)


COLUMNS = ("item_id", "external_id", "embedding")


def read_shard(path: str, embeddings: bool = True) -> tuple[np.ndarray, list[str], np.ndarray, int]:
    """One shard's rows: ``(item_ids (m,) int64, external ids, X m x d float32, bytes read)``.

    Args:
        path: the shard's file.
        embeddings: False reads the id columns only (``X`` is then ``m x 0``).

    Returns:
        The rows, and the compressed bytes of the column chunks read (the whole file's size when all are).

    Raises:
        StoreError: the file is missing or not a shard of the store (the message names it).
    """
    columns = list(COLUMNS if embeddings else COLUMNS[:2])
    try:
        parquet = pq.ParquetFile(path)
        names = parquet.schema_arrow.names
        if names != list(COLUMNS):
            raise StoreError(f"pool store shard {path} has columns {names}, expected {', '.join(COLUMNS)}")
        table = parquet.read(columns=columns)
        meta = parquet.metadata
        nbytes = sum(
            meta.row_group(g).column(c).total_compressed_size
            for g in range(meta.num_row_groups)
            for c in range(meta.num_columns)
            if meta.row_group(g).column(c).path_in_schema.split(".")[0] in columns
        )
    except (OSError, pa.ArrowInvalid) as exc:
        raise StoreError(f"pool store shard {path} cannot be read: {exc}") from None
    ids = table.column("item_id").to_numpy().astype(np.int64, copy=False)
    external_ids = table.column("external_id").to_pylist()
    if not embeddings:
        return ids, external_ids, np.empty((len(table), 0), dtype=np.float32), int(nbytes)
    emb = table.column("embedding").combine_chunks()
    d = emb.type.list_size
    X = emb.values.to_numpy(zero_copy_only=False).astype(np.float32, copy=False).reshape(len(table), d)
    return ids, external_ids, X, int(nbytes)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_version(
    root: Path,
    pool_id: str,
    version: int,
    item_ids: np.ndarray,
    external_ids: Sequence[str],
    X: np.ndarray,
    shard_rows: int,
    progress: Progress | None = None,
) -> Manifest:
    """Publish rows (ascending ``item_ids``, ``n x d`` float32 ``X``) as version ``version`` of the pool.

    Written in a temporary folder and renamed as a whole; when another writer published the same version first,
    its copy is kept and returned. Older versions are pruned afterwards.
    """
    pool_dir = _pool_dir(root, pool_id)
    pool_dir.mkdir(parents=True, exist_ok=True)
    final = pool_dir / f"v{int(version)}"
    n, d = int(X.shape[0]), int(X.shape[1])
    tmp = pool_dir / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    shards: list[dict[str, Any]] = []
    try:
        for index, start in enumerate(range(0, max(n, 1), shard_rows)):
            stop = min(start + shard_rows, n)
            if stop <= start:
                break
            rows = np.ascontiguousarray(X[start:stop], dtype=np.float32)  # m x d
            table = pa.table(
                {
                    "item_id": pa.array(np.asarray(item_ids[start:stop], dtype=np.int64)),
                    "external_id": pa.array(list(external_ids[start:stop]), type=pa.string()),
                    "embedding": pa.FixedSizeListArray.from_arrays(pa.array(rows.reshape(-1)), d),
                },
                schema=schema(d),
            )
            name = f"part-{index:05d}.parquet"
            pq.write_table(table, tmp / name, compression="zstd")
            with open(tmp / name, "rb") as f:
                os.fsync(f.fileno())
            shards.append(
                {
                    "path": name,
                    "rows": stop - start,
                    "first_id": int(item_ids[start]),
                    "last_id": int(item_ids[stop - 1]),
                    "bytes": os.path.getsize(tmp / name),
                }
            )
            if progress is not None:
                progress(stop, n)
        meta = {
            "format": FORMAT,
            "pool_id": pool_id,
            "version": int(version),
            "d": d,
            "rows": n,
            "shards": shards,
            "created_at": datetime.now(UTC).isoformat(),
        }
        part = tmp / f".{MANIFEST}.{uuid.uuid4().hex}"
        with open(part, "w") as f:
            json.dump(meta, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, tmp / MANIFEST)  # written last: a folder without it is never a version
        _fsync_dir(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # the folder exists: another writer published this version first, or it is damaged
            if read_manifest(root, pool_id, version) is None:  # damaged (its manifest is gone): replace it
                shutil.rmtree(final, ignore_errors=True)
                os.rename(tmp, final)
            else:
                shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(pool_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    prune(root, pool_id)
    published = read_manifest(root, pool_id, version)
    if published is None:
        raise StoreError(f"pool store version {final} vanished after it was written")
    return published


def prune(root: Path, pool_id: str, keep: int = KEEP_VERSIONS) -> list[str]:
    """Remove all but the ``keep`` newest published versions, and stale temporary folders. Returns what went."""
    pool_dir = _pool_dir(root, pool_id)
    if not pool_dir.exists():
        return []
    versions = sorted(
        (int(p.name[1:]), p) for p in pool_dir.iterdir() if p.name[1:].isdigit() and p.name.startswith("v")
    )
    removed: list[str] = []
    for _v, path in versions[: max(len(versions) - keep, 0)]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path.name)
    now = time.time()
    for path in pool_dir.iterdir():
        if path.name.startswith(".tmp-") and now - path.stat().st_mtime > STALE_TMP_S:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path.name)
    return removed


def drop(root: Path, pool_id: str) -> None:
    """Remove every version of a pool (e.g. the pool was deleted)."""
    shutil.rmtree(_pool_dir(root, pool_id), ignore_errors=True)


def ensure_version(
    session: Session, settings: Any, pool: Pool, progress: Progress | None = None
) -> tuple[Manifest, str]:
    """The store's copy of the pool at its current content version, written first when missing.

    The rows are read with the worker's reader (:func:`worker.pool_data.load_pool`, from the worker cache when
    it has the pool). Returns the manifest and how it was served: ``hit`` (already there) or ``written``.

    Raises:
        LookupError: the pool is gone.
        worker.pool_data.PoolDataError: a selectable row without a valid embedding.
    """
    root = store_root(settings)
    version = content_store.content_version(session, pool.id)
    if version is None:
        raise LookupError(f"pool {pool.id} does not exist")
    found = read_manifest(root, pool.id, version)
    if found is not None and found.d == int(pool.embedding_dim):
        return found, "hit"
    cache = pool_cache.for_settings(settings)
    data = load_pool(session, pool, datetime.now(UTC), progress=progress, cache=cache)
    # The cache reports the version its rows reflect; read uncached, the rows are the version read above (or
    # newer, when items arrived meanwhile: the next batch then writes that version).
    version = int(data.cache.get("version", version))
    manifest = write_version(
        root, pool.id, version, data.item_ids, data.external_ids, data.X, int(settings.pool_store_shard_rows), progress
    )
    log.info(
        "pool store: pool %s version %d written (%d rows, %d shards)", pool.id, version, data.n, len(manifest.shards)
    )
    return manifest, "written"


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
        lines.append(
            f"pool {pool_id} ({name}): version {manifest.version}, {manifest.rows} rows in {len(manifest.shards)} "
            f"shard(s), {manifest.bytes} bytes ({'already in the store' if how == 'hit' else 'written'})"
        )
    return lines
