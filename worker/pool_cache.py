"""A worker's local cache of pools: ids, external ids and float32 embeddings in memory-mapped files, keyed
by the pool's content version (``pools.content_version``, kept by the database's triggers, migration 0008).

A batch on an unchanged pool maps the files it has (no row of the pool is read from the database); a
changed pool is refreshed from the rows whose ``content_seq`` is above the cached version and the
tombstones of deleted rows; a pool not cached yet, or changed too much, is read once in full.

Layout under the cache folder (shared by every worker process of a host, e.g. several RQ workers)::

    locks/<pool id>.lock            flock: one writer per pool (never deleted, so every process locks one inode)
    locks/.evict                    flock: one evicting process at a time
    pools/<pool id>/current.json    {"entry", "version", "n", "d", "ext_bytes"}: replaced atomically (os.replace)
    pools/<pool id>/e-<uuid>/       X.f32 (n x d float32), ids.i64 (ascending), ext.bin + ext.off (utf-8 ids)
    pools/<pool id>/tmp-<uuid>/     an entry being written; renamed to e-<uuid> when complete

Safety:

- Readers take no lock: they read ``current.json`` (one atomic file) and map the first ``n`` rows of the
  entry it names. An entry's first ``n`` rows never change: new rows are appended past ``n`` and become
  visible with the next ``current.json``; updated or deleted rows make a new entry (written in a temporary
  folder, fsynced, renamed). A reader that still maps a replaced entry keeps its pages (unlink keeps an
  mmapped file alive); one that finds the entry gone re-reads ``current.json``.
- Writers of a pool hold its flock; a process that dies releases it. A crash mid-write leaves a ``tmp-``
  folder, or rows past ``n``, never a changed ``current.json``: the next writer removes the leftovers.
- Size: least recently used pools are removed (under their lock, skipped while another process writes them)
  until the cache holds at most ``max_bytes``; a pool larger than that is not cached at all.
- Versions: an entry whose version is above the database's (a restored backup) is dropped and reloaded.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np
from sqlalchemy.orm import Session

from service.store import content as store

log = logging.getLogger(__name__)

FORMAT = 1
_POOL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
INCREMENTAL_MAX_ROWS = 262_144  # above this many changed rows (or half the pool) a refresh reads the pool anew
LOCK_POLL_S = 0.2
_ROW_OVERHEAD = 8 + 8 + 24  # id, offset, a typical external id: bytes per row besides the embedding

Progress = Callable[[int, int], None]


class CacheDataError(ValueError):
    """A selectable row has no stored embedding, or one of the wrong size (the message names the item)."""


def check_embedding(external_id: str, blob: bytes | None, d: int) -> bytes:
    if blob is None:
        raise CacheDataError(f"item {external_id!r} has no stored embedding (data references are not encoded yet)")
    if len(blob) != 4 * d:
        raise CacheDataError(f"item {external_id!r} has an embedding of {len(blob) // 4} values, expected {d}")
    return bytes(blob)


class ExternalIds(Sequence[str]):
    """The pool's external ids, decoded on access from a utf-8 blob and ``n + 1`` offsets (memory-mapped)."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray) -> None:
        self._blob = blob
        self._off = offsets

    def __len__(self) -> int:
        return int(self._off.shape[0]) - 1

    @overload
    def __getitem__(self, i: int) -> str: ...

    @overload
    def __getitem__(self, i: slice) -> list[str]: ...

    def __getitem__(self, i: int | slice) -> str | list[str]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return bytes(self._blob[int(self._off[i]) : int(self._off[i + 1])]).decode()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, str):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


@dataclass
class CachedPool:
    """A pool's selectable rows, ascending by item id.

    Attributes:
        version: the pool's content version these arrays reflect.
        item_ids: ``(n,)`` int64 (memory-mapped).
        X: ``n x d`` float32, memory-mapped copy-on-write (writes stay in this process).
        external_ids: ``n`` client ids, decoded on access.
        how: ``hit`` (nothing read), ``append`` / ``merge`` (changed rows read), ``cold`` (read in full).
        rows_read: rows read from the database for this call.
    """

    version: int
    item_ids: np.ndarray
    X: np.ndarray
    external_ids: Sequence[str]
    how: str
    rows_read: int = 0
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.item_ids.shape[0])


@dataclass(frozen=True)
class _Entry:
    path: Path
    version: int
    n: int
    d: int
    ext_bytes: int


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Atomically replace ``path`` with ``data`` (write a temporary file, fsync, rename, fsync the folder)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class _EntryWriter:
    """Appends rows to the four files of an entry, starting at row ``n`` (past a crashed append's leftovers)."""

    def __init__(self, path: Path, d: int, n: int = 0, ext_bytes: int = 0) -> None:
        self.path, self.d, self.n, self.ext_bytes = path, d, n, ext_bytes
        mode = "r+b" if n or (path / "X.f32").exists() else "wb"
        self._files = {name: open(path / name, mode) for name in ("X.f32", "ids.i64", "ext.bin", "ext.off")}  # noqa: SIM115 (open across write() calls; close() fsyncs them)
        self._files["X.f32"].seek(4 * d * n)
        self._files["ids.i64"].seek(8 * n)
        self._files["ext.bin"].seek(ext_bytes)
        self._files["ext.off"].seek(8 * (n + 1) if n else 0)
        if not n:
            self._files["ext.off"].write(np.zeros(1, dtype="<i8").tobytes())

    def write(self, ids: np.ndarray, X: bytes | np.ndarray, external_ids: Sequence[str]) -> None:
        encoded = [e.encode() for e in external_ids]
        lengths = np.fromiter((len(e) for e in encoded), dtype=np.int64, count=len(encoded))
        self.write_raw(ids, X, b"".join(encoded), lengths)

    def write_raw(self, ids: np.ndarray, X: bytes | np.ndarray, ext_blob: bytes, lengths: np.ndarray) -> None:
        """Rows given as bytes: ``X`` (float32), the external ids' utf-8 bytes back to back and their lengths."""
        m = int(ids.shape[0])
        raw = X if isinstance(X, bytes) else np.ascontiguousarray(X, dtype="<f4").tobytes()
        assert len(raw) == 4 * self.d * m and lengths.shape == (m,)
        offsets = self.ext_bytes + np.cumsum(lengths)
        self._files["X.f32"].write(raw)
        self._files["ids.i64"].write(np.ascontiguousarray(ids, dtype="<i8").tobytes())
        self._files["ext.bin"].write(ext_blob)
        self._files["ext.off"].write(offsets.astype("<i8").tobytes())
        self.n += m
        self.ext_bytes = int(offsets[-1]) if m else self.ext_bytes

    def close(self) -> None:
        """Flush and fsync every file (before the entry becomes visible)."""
        for f in self._files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()


class PoolCache:
    """The cache folder ``root``, at most ``max_bytes`` of entries (see the module docstring)."""

    def __init__(self, root: Path, max_bytes: int, chunk: int = 8192) -> None:
        self.root = Path(root)
        self.max_bytes = int(max_bytes)
        self.chunk = chunk
        (self.root / "locks").mkdir(parents=True, exist_ok=True)
        (self.root / "pools").mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------------------------------ paths

    def _pool_dir(self, pool_id: str) -> Path:
        if not _POOL_ID.fullmatch(pool_id):
            raise ValueError(f"not a pool id: {pool_id!r}")
        return self.root / "pools" / pool_id

    @contextmanager
    def _lock(self, name: str, wait: Callable[[], None] | None = None, block: bool = True) -> Iterator[bool]:
        """flock ``locks/<name>`` (polled so that ``wait()`` may raise, e.g. a cancelled batch); yields
        False without waiting when ``block`` is False and another process holds it."""
        fd = os.open(self.root / "locks" / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        raise
                    if not block:
                        yield False
                        return
                    if wait is not None:
                        wait()
                    time.sleep(LOCK_POLL_S)
            try:
                yield True
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # ------------------------------------------------------------------------------------------ reading

    def _current(self, pool_id: str) -> _Entry | None:
        pool_dir = self._pool_dir(pool_id)
        try:
            with open(pool_dir / "current.json") as f:
                meta = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        if meta.get("format") != FORMAT:
            return None
        return _Entry(
            pool_dir / meta["entry"], int(meta["version"]), int(meta["n"]), int(meta["d"]), int(meta["ext_bytes"])
        )

    def _open(self, entry: _Entry, how: str, rows_read: int = 0) -> CachedPool:
        n, d = entry.n, entry.d
        if n == 0:
            X = np.empty((0, d), dtype=np.float32)
            ids = np.empty(0, dtype=np.int64)
            blob = np.empty(0, dtype=np.uint8)
        else:
            X = np.memmap(entry.path / "X.f32", dtype="<f4", mode="c", shape=(n, d))
            ids = np.memmap(entry.path / "ids.i64", dtype="<i8", mode="r", shape=(n,))
            blob = (
                np.memmap(entry.path / "ext.bin", dtype=np.uint8, mode="r", shape=(entry.ext_bytes,))
                if entry.ext_bytes
                else np.empty(0, dtype=np.uint8)
            )
        off = np.memmap(entry.path / "ext.off", dtype="<i8", mode="r", shape=(n + 1,))
        return CachedPool(entry.version, ids, X, ExternalIds(blob, off), how, rows_read)

    def _try_open(self, pool_id: str, how: str, rows_read: int = 0) -> tuple[_Entry, CachedPool] | None:
        """The current entry mapped, or None (none, or replaced and removed meanwhile twice in a row)."""
        for _ in range(2):
            entry = self._current(pool_id)
            if entry is None:
                return None
            try:
                return entry, self._open(entry, how, rows_read)
            except (FileNotFoundError, ValueError):  # replaced (and removed) after we read current.json
                continue
        return None

    def _touch(self, pool_id: str) -> None:
        with suppress(FileNotFoundError):
            os.utime(self._pool_dir(pool_id) / "current.json")

    def load(
        self, session: Session, pool_id: str, d: int, progress: Progress | None = None, cold: bool = True
    ) -> CachedPool | None:
        """The pool's selectable rows at the content version committed now.

        Args:
            cold: whether to read the whole pool when it is not cached (or changed too much); when False, such a
                call returns None instead (a caller that needs only ids reads those more cheaply itself).

        Returns None when the pool does not exist or would not fit in the cache (the caller reads it uncached).

        Raises:
            CacheDataError: a selectable row without embedding or with one of the wrong size.
        """
        t0 = time.perf_counter()
        version = store.content_version(session, pool_id)
        if version is None:  # the pool was deleted: so are its files
            if self._pool_dir(pool_id).exists():
                self.drop(pool_id)
            return None
        opened = self._try_open(pool_id, "hit")
        if opened is not None and opened[0].version == version and opened[0].d == d:
            self._touch(pool_id)
            opened[1].timings["cache"] = time.perf_counter() - t0
            return opened[1]
        wait = None if progress is None else (lambda: progress(0, 0))
        with self._lock(f"{pool_id}.lock", wait):
            result = self._load_locked(session, pool_id, d, version, progress, cold)
        if result is not None:
            self._touch(pool_id)
            self.evict(keep=pool_id)
            result.timings["cache"] = time.perf_counter() - t0
        return result

    # ------------------------------------------------------------------------------------------ writing

    def _load_locked(
        self, session: Session, pool_id: str, d: int, version: int, progress: Progress | None, cold: bool
    ) -> CachedPool | None:
        # Another process may have refreshed it while we waited: compare with the version committed now.
        version = store.content_version(session, pool_id) or version
        opened = self._try_open(pool_id, "hit")
        if opened is not None and opened[0].version == version and opened[0].d == d:
            return opened[1]
        entry = None if opened is None else opened[0]
        self._remove_leftovers(self._pool_dir(pool_id), entry)
        if entry is not None and entry.d == d and entry.version < version:
            changed = store.count_changed(session, pool_id, entry.version)
            if changed <= min(INCREMENTAL_MAX_ROWS, max(entry.n // 2, 1024)):
                return self._refresh(session, pool_id, entry, version, changed)
        if not cold:
            return None
        return self._cold(session, pool_id, d, version, progress, store.count_selectable(session, pool_id))

    def _remove_leftovers(self, pool_dir: Path, keep: _Entry | None) -> None:
        """Under the pool's lock: temporary folders of crashed writers, entries no longer current."""
        if not pool_dir.exists():
            return
        for child in pool_dir.iterdir():
            if child.is_dir() and (keep is None or child != keep.path):
                shutil.rmtree(child, ignore_errors=True)
            elif child.name.startswith(".current.json."):
                child.unlink(missing_ok=True)

    def _publish(self, pool_dir: Path, entry_name: str, version: int, n: int, d: int, ext_bytes: int) -> _Entry:
        meta = {"format": FORMAT, "entry": entry_name, "version": version, "n": n, "d": d, "ext_bytes": ext_bytes}
        _write_json(pool_dir / "current.json", meta)
        return _Entry(pool_dir / entry_name, version, n, d, ext_bytes)

    def _cold(
        self, session: Session, pool_id: str, d: int, version: int, progress: Progress | None, total: int
    ) -> CachedPool | None:
        if total and total * (4 * d + _ROW_OVERHEAD) > self.max_bytes:
            log.info(
                "pool %s: %d rows x %d do not fit the worker cache (%d bytes); reading it uncached",
                pool_id,
                total,
                d,
                self.max_bytes,
            )
            return None
        pool_dir = self._pool_dir(pool_id)

        def fill(writer: _EntryWriter) -> None:
            for rows in store.iter_selectable(session, pool_id, self.chunk):
                ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
                exts = [r[1] for r in rows]
                blobs = [r[2] for r in rows]
                try:
                    joined = b"".join(blobs)
                except TypeError:
                    joined = b""
                if len(joined) != 4 * d * len(rows):
                    for e, b in zip(exts, blobs, strict=True):
                        check_embedding(e, b, d)
                writer.write(ids, joined, exts)
                if progress is not None:
                    progress(writer.n, max(total, writer.n))

        entry = self._new_entry(pool_dir, d, version, fill)
        return self._open(entry, "cold", entry.n)

    def _new_entry(self, pool_dir: Path, d: int, version: int, fill: Callable[[_EntryWriter], None]) -> _Entry:
        """Write a new entry with ``fill`` in a ``tmp-`` folder (removed if ``fill`` raises), rename it into
        place, publish it as current, and remove the entries it replaces."""
        tmp = pool_dir / f"tmp-{uuid.uuid4().hex}"
        tmp.mkdir(parents=True)
        writer = _EntryWriter(tmp, d)
        try:
            fill(writer)
        except BaseException:
            writer.close()
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        writer.close()
        name = f"e-{uuid.uuid4().hex}"
        os.rename(tmp, pool_dir / name)
        _fsync_dir(pool_dir)
        entry = self._publish(pool_dir, name, version, writer.n, d, writer.ext_bytes)
        self._remove_leftovers(pool_dir, entry)
        return entry

    def _refresh(self, session: Session, pool_id: str, entry: _Entry, version: int, changed: int) -> CachedPool:
        """Apply the rows changed after ``entry.version`` and the tombstones: append in place when only new
        rows with ids above the cached ones came; otherwise write a merged entry."""
        d = entry.d
        latest: dict[int, tuple[int, bool, str, bytes | None]] = {}  # id -> (seq, selectable, external id, blob)
        rows_read = 0
        for rows in store.iter_changed(session, pool_id, entry.version, self.chunk):
            rows_read += len(rows)
            for iid, ext, blob, selectable, seq in rows:
                latest[int(iid)] = (int(seq), bool(selectable), str(ext), blob)
        removed: set[int] = set()
        for iid, seq in store.tombstones(session, pool_id, entry.version):
            row = latest.get(iid)
            if row is None or row[0] < seq:  # deleted after its last change (ids may be reused on SQLite)
                latest.pop(iid, None)
                removed.add(iid)
        upsert_ids = np.asarray(sorted(i for i, r in latest.items() if r[1]), dtype=np.int64)
        removed.update(i for i, r in latest.items() if not r[1])
        blobs = [check_embedding(latest[int(i)][2], latest[int(i)][3], d) for i in upsert_ids]
        new_X = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(blobs), d)
        new_ext = [latest[int(i)][2] for i in upsert_ids]

        old = self._open(entry, "hit")
        old_ids = np.asarray(old.item_ids)
        removed_arr = np.asarray(sorted(removed), dtype=np.int64)
        touched = np.concatenate([removed_arr, upsert_ids])
        present = np.isin(touched, old_ids) if old_ids.size else np.zeros(touched.shape, dtype=bool)
        pool_dir = self._pool_dir(pool_id)
        if not present.any() and (old_ids.size == 0 or upsert_ids.size == 0 or upsert_ids[0] > old_ids[-1]):
            writer = _EntryWriter(entry.path, d, entry.n, entry.ext_bytes)
            writer.write(upsert_ids, new_X, new_ext)
            writer.close()
            published = self._publish(pool_dir, entry.path.name, version, writer.n, d, writer.ext_bytes)
            return self._open(published, "append", rows_read)
        patched = self._patch(pool_dir, entry, old, removed_arr, upsert_ids, new_X, new_ext, version)
        if patched is not None:
            return self._open(patched, "patch", rows_read)

        keep = ~np.isin(old_ids, touched)
        kept_pos = np.nonzero(keep)[0]
        final_ids = np.concatenate([old_ids[kept_pos], upsert_ids])
        order = np.argsort(final_ids, kind="stable")
        n_kept = kept_pos.shape[0]
        # External ids, gathered without decoding: the old blob and the new ids' bytes back to back.
        old_off = np.asarray(np.memmap(entry.path / "ext.off", dtype="<i8", mode="r", shape=(entry.n + 1,)))
        old_blob = np.fromfile(entry.path / "ext.bin", dtype=np.uint8, count=entry.ext_bytes)
        new_encoded = [e.encode() for e in new_ext]
        new_len = np.fromiter((len(e) for e in new_encoded), dtype=np.int64, count=len(new_encoded))
        blob = np.concatenate([old_blob, np.frombuffer(b"".join(new_encoded), dtype=np.uint8)])
        starts = np.concatenate([old_off[kept_pos], entry.ext_bytes + np.cumsum(new_len) - new_len])
        lengths = np.concatenate([old_off[kept_pos + 1] - old_off[kept_pos], new_len])

        def merge(writer: _EntryWriter) -> None:
            step = 65536
            for a in range(0, order.shape[0], step):
                src = order[a : a + step]
                from_old = src < n_kept
                X = np.empty((src.shape[0], d), dtype=np.float32)
                X[from_old] = old.X[kept_pos[src[from_old]]]
                X[~from_old] = new_X[src[~from_old] - n_kept]
                L = lengths[src]
                out_start = np.cumsum(L) - L
                index = np.arange(int(L.sum()), dtype=np.int64) + np.repeat(starts[src] - out_start, L)
                writer.write_raw(final_ids[src], X, blob[index].tobytes(), L)

        published = self._new_entry(pool_dir, d, version, merge)
        return self._open(published, "merge", rows_read)

    def _patch(
        self,
        pool_dir: Path,
        entry: _Entry,
        old: CachedPool,
        removed: np.ndarray,
        upsert_ids: np.ndarray,
        new_X: np.ndarray,
        new_ext: list[str],
        version: int,
    ) -> _Entry | None:
        """Only new embeddings for cached rows (same external ids), and new rows above the cached ids: a new
        entry that is a kernel-side copy of the old files with those rows rewritten (and the new rows appended).
        None when the change needs a merge (rows removed, external ids changed, new rows among the old ones)."""
        old_ids = np.asarray(old.item_ids)
        if removed.size and np.isin(removed, old_ids).any():
            return None
        pos = np.searchsorted(old_ids, upsert_ids)
        present = (pos < old_ids.shape[0]) & (old_ids[np.minimum(pos, old_ids.shape[0] - 1)] == upsert_ids)
        if not present.all() and upsert_ids[~present][0] < old_ids[-1]:
            return None
        updates = np.nonzero(present)[0]
        if any(old.external_ids[int(pos[i])] != new_ext[int(i)] for i in updates):
            return None
        tmp = pool_dir / f"tmp-{uuid.uuid4().hex}"
        tmp.mkdir()
        try:
            for name in ("X.f32", "ids.i64", "ext.bin", "ext.off"):
                size = {"X.f32": 4 * entry.d * entry.n, "ids.i64": 8 * entry.n, "ext.bin": entry.ext_bytes}.get(
                    name, 8 * (entry.n + 1)
                )
                with open(entry.path / name, "rb") as src, open(tmp / name, "wb") as dst:
                    copied = 0
                    while copied < size:  # in the kernel (copy_file_range), no pass through this process
                        copied += os.copy_file_range(src.fileno(), dst.fileno(), size - copied)
            with open(tmp / "X.f32", "r+b") as f:
                row_bytes = 4 * entry.d
                for i in updates:
                    f.seek(int(pos[i]) * row_bytes)
                    f.write(np.ascontiguousarray(new_X[i], dtype="<f4").tobytes())
            writer = _EntryWriter(tmp, entry.d, entry.n, entry.ext_bytes)
            fresh = np.nonzero(~present)[0]
            writer.write(upsert_ids[fresh], new_X[fresh], [new_ext[int(i)] for i in fresh])
            writer.close()
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        name = f"e-{uuid.uuid4().hex}"
        os.rename(tmp, pool_dir / name)
        _fsync_dir(pool_dir)
        published = self._publish(pool_dir, name, version, writer.n, entry.d, writer.ext_bytes)
        self._remove_leftovers(pool_dir, published)
        return published

    # ------------------------------------------------------------------------------------------ size

    def usage(self) -> dict[str, tuple[int, float]]:
        """``{pool id: (bytes on disk, last use as a UNIX time)}`` of every cached pool."""
        out: dict[str, tuple[int, float]] = {}
        for pool_dir in (self.root / "pools").iterdir():
            size = 0
            for dirpath, _dirs, files in os.walk(pool_dir):
                for name in files:
                    with suppress(FileNotFoundError):
                        size += os.stat(os.path.join(dirpath, name)).st_blocks * 512
            try:
                used = os.stat(pool_dir / "current.json").st_mtime
            except FileNotFoundError:
                used = 0.0
            out[pool_dir.name] = (size, used)
        return out

    def evict(self, keep: str | None = None) -> list[str]:
        """Remove least recently used pools (never ``keep``, never one another process is writing) until the
        cache holds at most ``max_bytes``. Returns the pools removed."""
        removed: list[str] = []
        with self._lock(".evict", block=False) as locked:
            if not locked:
                return removed  # another process is evicting
            usage = self.usage()
            total = sum(size for size, _ in usage.values())
            for pool_id, (size, _used) in sorted(usage.items(), key=lambda kv: kv[1][1]):
                if total <= self.max_bytes:
                    break
                if pool_id == keep or not _POOL_ID.fullmatch(pool_id):
                    continue
                with self._lock(f"{pool_id}.lock", block=False) as got:
                    if not got:
                        continue
                    shutil.rmtree(self._pool_dir(pool_id), ignore_errors=True)
                total -= size
                removed.append(pool_id)
                log.info("worker cache: evicted pool %s (%d bytes)", pool_id, size)
        return removed

    def drop(self, pool_id: str) -> None:
        """Remove a pool's entries (e.g. the pool was deleted)."""
        with self._lock(f"{pool_id}.lock"):
            shutil.rmtree(self._pool_dir(pool_id), ignore_errors=True)


_CACHES: dict[tuple[str, int], PoolCache] = {}


def for_settings(settings: Any) -> PoolCache | None:
    """The process's cache for ``settings`` (``worker_cache_dir``, ``worker_cache_max_gb``), None when disabled."""
    root = getattr(settings, "worker_cache_dir", None)
    max_gb = float(getattr(settings, "worker_cache_max_gb", 0) or 0)
    if root is None or max_gb <= 0:
        return None
    key = (str(root), int(max_gb * 2**30))
    cache = _CACHES.get(key)
    if cache is None:
        cache = _CACHES[key] = PoolCache(Path(root), key[1])
    return cache
