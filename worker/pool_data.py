"""A pool's items as arrays: one ``n x d`` float32 matrix, the labeled rows and their targets, the
rows held by other batches' live reservations.

Rows are ordered by item id, so row ``i`` of every array is the same item. Embeddings are stored as
float32 little-endian bytes; each chunk of rows is decoded with one ``numpy.frombuffer`` into a
preallocated matrix, so loading costs one pass over the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from service.store import batches as store
from service.store.models import Pool


class PoolDataError(ValueError):
    """The pool's rows cannot be turned into arrays (missing embeddings, labels of the wrong kind)."""


@dataclass
class PoolArrays:
    """Attributes:
    item_ids: ``(n,)`` int64 database ids, ascending.
    external_ids: ``n`` client ids.
    X: ``n x d`` float32 embeddings.
    labeled: ``(n_L,)`` int64 rows with a label.
    y: ``(n_L,)`` int64 class indices, or ``n_L x m`` float32 regression targets.
    reserved: ``(n_R,)`` int64 rows under another batch's live reservation.
    """

    item_ids: np.ndarray
    external_ids: list[str]
    X: np.ndarray
    labeled: np.ndarray
    y: np.ndarray
    reserved: np.ndarray

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


def load_pool(session: Session, pool: Pool, now: datetime, progress: Any = None, chunk: int = 8192) -> PoolArrays:
    """Read every item of ``pool``.

    Args:
        session: an open session (one read transaction).
        pool: the pool row.
        now: reservations that end before ``now`` count as unlabeled.
        progress: optional ``callback(done, total)`` after each chunk.
        chunk: rows per fetch.

    Raises:
        PoolDataError: an item has no stored embedding, or one of the wrong size, or a bad label.
    """
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
    y: np.ndarray
    if pool.task == "classification":
        y = np.asarray(targets, dtype=np.int64)
    else:
        y = np.asarray(targets, dtype=np.float32).reshape(len(targets), int(pool.n_outputs))
    return PoolArrays(
        item_ids=item_ids,
        external_ids=external_ids,
        X=X,
        labeled=np.asarray(labeled, dtype=np.int64),
        y=y,
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
