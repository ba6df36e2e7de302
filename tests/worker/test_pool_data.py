"""Loading a pool into arrays: exact embeddings in id order, labels, live vs expired reservations."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.store.models import Item, Pool
from tests.worker.factories import make_pool, reserve
from worker.pool_data import PoolDataError, load_pool


def _load(db: sessionmaker[Session], pool_id: str, chunk: int = 7) -> object:
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return load_pool(s, pool, datetime.now(UTC), chunk=chunk)


def test_load_pool_gives_exact_arrays_labels_and_live_reservations(db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=40, d=5, n_labeled=6)
    reserve(db, pool.pool_id, pool.external_ids[10:13], seconds=3600)
    reserve(db, pool.pool_id, pool.external_ids[20:22], seconds=-5)  # expired: unlabeled again
    seen: list[tuple[int, int]] = []
    with session_scope(db) as s:
        p = s.get(Pool, pool.pool_id)
        assert p is not None
        data = load_pool(s, p, datetime.now(UTC), progress=lambda done, total: seen.append((done, total)), chunk=7)
    assert data.X.dtype == np.float32 and np.array_equal(data.X, pool.X)  # bit-exact, chunked
    assert data.external_ids == pool.external_ids
    assert np.all(np.diff(data.item_ids) > 0)
    assert data.labeled.tolist() == list(range(6)) and data.y.tolist() == pool.y[:6].tolist()
    assert data.reserved.tolist() == [10, 11, 12]
    assert seen[-1] == (40, 40) and len(seen) == 6  # one report per chunk of 7


def test_load_pool_rejects_item_without_embedding(db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=10, d=3, n_labeled=2)
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00004").values(embedding=None, uri="s3://x"))
    with pytest.raises(PoolDataError, match="item 'item-00004' has no stored embedding"):
        _load(db, pool.pool_id)


def test_load_pool_rejects_unknown_class_label(db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=10, d=3, n_labeled=2)
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00001").values(label="dog"))
    with pytest.raises(PoolDataError, match=r"label 'dog' is not one of the pool's classes \['ant', 'bee', 'cat'\]"):
        _load(db, pool.pool_id)
