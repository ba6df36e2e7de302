"""A pool's items as arrays: one ``n x d`` float32 matrix, the labeled rows and their targets, the
rows held by other batches' live reservations.

Rows are ordered by item id, so row ``i`` of every array is the same item. Embeddings are stored as
float32 little-endian bytes; each chunk of rows is decoded with one ``numpy.frombuffer`` into a
preallocated matrix, so loading costs one pass over the bytes.

With a worker cache (:mod:`worker.pool_cache`) the ids and embeddings come from memory-mapped files at the
pool's content version (refreshed from the rows that changed); only the labeled and reserved rows are read
from the database per batch. A strategy that reads no embeddings (random) loads ids only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from service.store import batches as store
from service.store import content as content_store
from service.store.models import Pool
from worker.pool_cache import CacheDataError, CachedPool, PoolCache


class PoolDataError(ValueError):
    """The pool's rows cannot be turned into arrays (missing embeddings, labels of the wrong kind)."""


@dataclass
class PoolArrays:
    """Attributes:
    item_ids: ``(n,)`` int64 database ids, ascending.
    external_ids: ``n`` client ids (a list, or decoded on access from the cache).
    X: ``n x d`` float32 embeddings (memory-mapped when cached); ``n x 0`` when loaded without them.
    labeled: ``(n_L,)`` int64 rows with a label.
    y: ``(n_L,)`` int64 class indices, or ``n_L x m`` float32 regression targets.
    reserved: ``(n_R,)`` int64 rows under another batch's live reservation.
    cache: how the worker cache served it (``hit``, ``append``, ``merge``, ``cold``; ``uncached``; ``ids``:
        ids only, from the database), rows read from the database, and the content version.
    """

    item_ids: np.ndarray
    external_ids: Sequence[str]
    X: np.ndarray
    labeled: np.ndarray
    y: np.ndarray
    reserved: np.ndarray
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


def label_decoder(pool: Pool) -> Any:
    """``decode(stored label)``: a class index (classification) or a list of ``m`` floats (regression)."""
    if pool.task == "classification":
        classes = list(pool.classes or [])
        index = {c: i for i, c in enumerate(classes)}

        def decode_class(value: Any) -> Any:
            try:
                return index[value]
            except (KeyError, TypeError):
                raise PoolDataError(f"label {value!r} is not one of the pool's classes {classes}") from None

        return decode_class
    m = int(pool.n_outputs)

    def decode_target(value: Any) -> Any:
        target = value if isinstance(value, list) else [value]
        if len(target) != m or not all(isinstance(t, int | float) and not isinstance(t, bool) for t in target):
            raise PoolDataError(f"regression target {value!r} is not a list of {m} numbers")
        return [float(t) for t in target]

    return decode_target


def _raise_bad_embedding(rows: Any, d: int) -> None:
    for r in rows:
        if r[2] is None:
            raise PoolDataError(f"item {r[1]!r} has no stored embedding (data references are not encoded yet)")
        if len(r[2]) != 4 * d:
            raise PoolDataError(f"item {r[1]!r} has an embedding of {len(r[2]) // 4} values, expected {d}")


def load_pool(
    session: Session,
    pool: Pool,
    now: datetime,
    progress: Any = None,
    chunk: int = 8192,
    cache: PoolCache | None = None,
    embeddings: bool = True,
) -> PoolArrays:
    """Every selectable item of ``pool`` (embedding ready, train split).

    Args:
        session: an open session (one read transaction).
        pool: the pool row.
        now: reservations that end before ``now`` count as unlabeled.
        progress: optional ``callback(done, total)`` after each chunk.
        chunk: rows per fetch.
        cache: the worker's pool cache, or None to read every row from the database.
        embeddings: False when the caller reads no embeddings (random): from the cache when it holds the pool
            (refreshed from the changed rows), else ids only from the database, without the embedding bytes
            (``X`` is then ``n x 0``; the cache is not filled).

    Raises:
        PoolDataError: an item has no stored embedding, or one of the wrong size, or a bad label.
    """
    if cache is not None:
        try:
            cached = cache.load(session, pool.id, int(pool.embedding_dim), progress, cold=embeddings)
        except CacheDataError as exc:
            raise PoolDataError(str(exc)) from None
        if cached is not None:
            return _with_design(session, pool, now, cached)
    if not embeddings:
        return _load_ids(session, pool, now, chunk)
    data = _load_rows(session, pool, now, progress, chunk)
    data.cache = {"how": "uncached", "rows_read": data.n}
    return data


def _with_design(session: Session, pool: Pool, now: datetime, cached: CachedPool) -> PoolArrays:
    """The cached rows with the labels and live reservations as they are now (the labeled and reserved rows
    only are read)."""
    decode = label_decoder(pool)
    ids = np.asarray(cached.item_ids)
    rows = content_store.design(session, pool.id)  # ordered by id, as the cached rows are
    design_ids = np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))
    pos = np.searchsorted(ids, design_ids)
    # rows added after the cached version are not in this batch's pool
    found = (
        (pos < ids.shape[0]) & (ids[np.minimum(pos, max(ids.shape[0] - 1, 0))] == design_ids) if ids.size else pos < 0
    )
    labeled: list[int] = []
    targets: list[Any] = []
    reserved: list[int] = []
    for i, (_iid, status, until, label) in enumerate(rows):
        if not found[i]:
            continue
        if status == "labeled":
            labeled.append(int(pos[i]))
            targets.append(decode(label))
        elif until is not None and until >= now:
            reserved.append(int(pos[i]))
    return PoolArrays(
        item_ids=ids,
        external_ids=cached.external_ids,
        X=cached.X,
        labeled=np.asarray(labeled, dtype=np.int64),
        y=_targets(pool, targets),
        reserved=np.asarray(reserved, dtype=np.int64),
        cache={"how": cached.how, "rows_read": cached.rows_read, "version": cached.version, **cached.timings},
    )


def _targets(pool: Pool, targets: list[Any]) -> np.ndarray:
    if pool.task == "classification":
        return np.asarray(targets, dtype=np.int64)
    return np.asarray(targets, dtype=np.float32).reshape(len(targets), int(pool.n_outputs))


def _load_ids(session: Session, pool: Pool, now: datetime, chunk: int) -> PoolArrays:
    """Ids and external ids of the selectable rows, without their embeddings (``X`` is ``n x 0``)."""
    ids: list[np.ndarray] = []
    external_ids: list[str] = []
    for rows in content_store.iter_selectable(session, pool.id, chunk, embeddings=False):
        ids.append(np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)))
        external_ids.extend(r[1] for r in rows)
    item_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
    empty = np.empty((item_ids.shape[0], 0), dtype=np.float32)
    cached = CachedPool(-1, item_ids, empty, external_ids, "ids", int(item_ids.shape[0]))
    data = _with_design(session, pool, now, cached)
    data.cache = {"how": "ids", "rows_read": data.n}
    return data


def _load_rows(session: Session, pool: Pool, now: datetime, progress: Any, chunk: int) -> PoolArrays:
    d = int(pool.embedding_dim)
    expected = store.count_items(session, pool.id)
    X = np.empty((expected, d), dtype=np.float32)
    item_ids = np.empty(expected, dtype=np.int64)
    external_ids: list[str] = []
    labeled: list[int] = []
    targets: list[Any] = []
    reserved: list[int] = []
    decode = label_decoder(pool)
    row = 0
    for rows in store.iter_pool_rows(session, pool.id, chunk):
        m = len(rows)
        if row + m > X.shape[0]:  # items added since the count: grow
            X = np.concatenate([X, np.empty((row + m - X.shape[0], d), dtype=np.float32)])
            item_ids = np.concatenate([item_ids, np.empty(row + m - item_ids.shape[0], dtype=np.int64)])
        ids, exts, blobs, statuses, untils, labels = zip(*rows, strict=True)
        try:
            joined = b"".join(blobs)
        except TypeError:
            joined = b""
        if len(joined) != 4 * d * m:
            _raise_bad_embedding(rows, d)
        X[row : row + m] = np.frombuffer(joined, dtype="<f4").reshape(m, d)
        item_ids[row : row + m] = ids
        external_ids.extend(exts)
        for i, status in enumerate(statuses):
            if status == "unlabeled":
                continue
            if status == "labeled":
                labeled.append(row + i)
                targets.append(decode(labels[i]))
            elif status == "reserved" and untils[i] is not None and untils[i] >= now:
                reserved.append(row + i)
        row += m
        if progress is not None:
            progress(row, max(expected, row))
    X = X[:row]
    item_ids = item_ids[:row]
    return PoolArrays(
        item_ids=item_ids,
        external_ids=external_ids,
        X=X,
        labeled=np.asarray(labeled, dtype=np.int64),
        y=_targets(pool, targets),
        reserved=np.asarray(reserved, dtype=np.int64),
    )


def current_design(
    session: Session, pool_id: str, item_ids: np.ndarray, now: datetime
) -> tuple[np.ndarray, np.ndarray]:
    """Rows (positions in ``item_ids``) that are labeled, and that are under a live reservation, now.

    Used to re-run a selection after a concurrent batch reserved some of the chosen items.
    """
    rows = store.design_rows(session, pool_id, now)
    ids = np.asarray([r[0] for r in rows], dtype=np.int64)
    is_labeled = np.asarray([r[1] == "labeled" for r in rows], dtype=bool)
    pos = np.searchsorted(item_ids, ids)
    pos_ok = (pos < item_ids.shape[0]) & (item_ids[np.minimum(pos, item_ids.shape[0] - 1)] == ids)
    return np.sort(pos[pos_ok & is_labeled]), np.sort(pos[pos_ok & ~is_labeled])
