"""The worker's pool cache (worker/pool_cache.py) and the content version the database keeps for it
(migration 0008): a cached load equals an uncached one after inserts, updates, deletes and split moves;
an unchanged pool is served without reading its rows; several processes share the folder; a writer
killed mid-write leaves no corrupt entry; least recently used pools go first; the cache can be off."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.store import content as content_store
from service.store.models import Item, Pool
from tests.worker.factories import make_pool, reserve
from worker import pool_cache
from worker.pool_cache import PoolCache
from worker.pool_data import PoolArrays, PoolDataError, load_pool

D = 6


def _load(
    db: sessionmaker[Session], pool_id: str, cache: PoolCache | None, embeddings: bool = True, chunk: int = 7
) -> PoolArrays:
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return load_pool(s, pool, datetime.now(UTC), cache=cache, embeddings=embeddings, chunk=chunk)


def assert_same(cached: PoolArrays, fresh: PoolArrays) -> None:
    """The cached load is the uncached one: same rows in the same order, bit-exact."""
    assert np.array_equal(np.asarray(cached.item_ids), fresh.item_ids)
    assert list(cached.external_ids) == list(fresh.external_ids)
    assert cached.X.dtype == np.float32 and np.array_equal(np.asarray(cached.X), fresh.X)
    assert cached.labeled.tolist() == fresh.labeled.tolist() and cached.y.tolist() == fresh.y.tolist()
    assert cached.reserved.tolist() == fresh.reserved.tolist()


def add_items(db: sessionmaker[Session], pool_id: str, names: list[str], seed: int) -> np.ndarray:
    X = np.random.default_rng(seed).normal(size=(len(names), D)).astype(np.float32)
    now = datetime.now(UTC)
    with session_scope(db) as s:
        s.execute(
            insert(Item),
            [
                {"pool_id": pool_id, "external_id": e, "embedding": x.tobytes(), "status": "unlabeled",
                 "created_at": now, "updated_at": now}
                for e, x in zip(names, X, strict=True)
            ],
        )  # fmt: skip
    return X


def version(db: sessionmaker[Session], pool_id: str) -> int:
    with session_scope(db) as s:
        v = content_store.content_version(s, pool_id)
    assert v is not None
    return v


@pytest.fixture
def cache(tmp_path: Path) -> PoolCache:
    return PoolCache(tmp_path / "cache", max_bytes=2**30, chunk=5)


# ------------------------------------------------------------------------------- the database's version


def test_writes_of_cached_content_bump_the_version_and_label_writes_do_not(db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=10, d=D, n_labeled=2)
    v0 = version(db, pool.pool_id)
    assert v0 > 0  # the inserts bumped it
    reserve(db, pool.pool_id, pool.external_ids[3:5], seconds=60)
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00006").values(status="labeled", label="ant"))
    assert version(db, pool.pool_id) == v0  # labels and reservations are not cached content
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00007").values(embedding=np.zeros(D, "<f4").tobytes()))
        seq = s.execute(select(Item.content_seq).where(Item.external_id == "item-00007")).scalar_one()
    v1 = version(db, pool.pool_id)
    assert v1 > v0 and seq == v1
    with session_scope(db) as s:
        s.execute(delete(Item).where(Item.external_id == "item-00008"))
    v2 = version(db, pool.pool_id)
    with session_scope(db) as s:
        assert content_store.tombstones(s, pool.pool_id, v1) == [(_item_id(s, pool.pool_id, 8, deleted=True), v2)]


def _item_id(s: Session, pool_id: str, i: int, deleted: bool = False) -> int:
    if deleted:  # the neighbours' ids bracket it
        before = s.execute(select(Item.id).where(Item.external_id == f"item-{i - 1:05d}")).scalar_one()
        return int(before) + 1
    return int(s.execute(select(Item.id).where(Item.external_id == f"item-{i:05d}")).scalar_one())


def test_a_second_writer_of_the_pool_waits_so_versions_follow_commit_order(
    db: sessionmaker[Session], engine: Any
) -> None:
    """PostgreSQL: the first stamping statement locks the pool row until commit; SQLite has one writer."""
    pool = make_pool(db, n=3, d=D, n_labeled=0)
    v0 = version(db, pool.pool_id)
    first = make_sessionmaker(engine)()
    now = datetime.now(UTC)
    row = {"pool_id": pool.pool_id, "embedding": np.zeros(D, "<f4").tobytes(), "status": "unlabeled",
           "created_at": now, "updated_at": now}  # fmt: skip
    first.execute(insert(Item), [{**row, "external_id": "a1"}])
    first.execute(insert(Item), [{**row, "external_id": "a2"}])  # same transaction: same version on PostgreSQL
    done = threading.Event()

    def second() -> None:
        with session_scope(db) as s:
            s.execute(insert(Item), [{**row, "external_id": "b1"}])
        done.set()

    thread = threading.Thread(target=second)
    thread.start()
    time.sleep(0.5)
    assert not done.is_set()  # waits for the first writer (pool row lock; SQLite's write lock)
    assert version(db, pool.pool_id) == v0  # nothing committed yet
    first.commit()
    first.close()
    thread.join(30)
    assert done.is_set()
    with session_scope(db) as s:
        seqs = dict(s.execute(select(Item.external_id, Item.content_seq).where(Item.pool_id == pool.pool_id)).all())
    assert v0 < seqs["a1"] <= seqs["a2"] < seqs["b1"] == version(db, pool.pool_id)


# ------------------------------------------------------------------------------- refresh correctness


def test_cold_load_then_hits_read_no_rows(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=23, d=D, n_labeled=4)
    reserve(db, pool.pool_id, pool.external_ids[10:12], seconds=3600)
    first = _load(db, pool.pool_id, cache)
    assert first.cache["how"] == "cold" and first.cache["rows_read"] == 23
    assert_same(first, _load(db, pool.pool_id, None))
    again = _load(db, pool.pool_id, cache)
    assert again.cache["how"] == "hit" and again.cache["rows_read"] == 0
    assert_same(again, _load(db, pool.pool_id, None))
    assert isinstance(again.X, np.memmap)


def test_labels_and_reservations_are_read_fresh_on_a_hit(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=12, d=D, n_labeled=2)
    _load(db, pool.pool_id, cache)
    reserve(db, pool.pool_id, pool.external_ids[5:7], seconds=3600)
    reserve(db, pool.pool_id, pool.external_ids[8:9], seconds=-5)  # expired
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00003").values(status="labeled", label="cat"))
    hit = _load(db, pool.pool_id, cache)
    assert hit.cache["how"] == "hit"
    assert hit.labeled.tolist() == [0, 1, 3] and hit.y.tolist()[-1] == 2 and hit.reserved.tolist() == [5, 6]
    assert_same(hit, _load(db, pool.pool_id, None))


def test_new_items_are_appended_in_place(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=15, d=D, n_labeled=3)
    cold = _load(db, pool.pool_id, cache)
    add_items(db, pool.pool_id, ["new-1", "new-2", "new-3"], seed=1)
    warm = _load(db, pool.pool_id, cache)
    assert warm.cache["how"] == "append" and warm.cache["rows_read"] == 3 and warm.X.shape == (18, D)
    assert_same(warm, _load(db, pool.pool_id, None))
    assert np.array_equal(np.asarray(cold.X), pool.X)  # a reader of the old version still sees its rows
    assert len(list((cache.root / "pools" / pool.pool_id).glob("e-*"))) == 1


def test_updated_embeddings_make_a_patched_copy(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=15, d=D, n_labeled=3)
    cold = _load(db, pool.pool_id, cache)
    new = np.full(D, 7.0, dtype="<f4")
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00004").values(embedding=new.tobytes()))
    add_items(db, pool.pool_id, ["after-1", "after-2"], seed=7)  # appended behind the rewritten rows
    warm = _load(db, pool.pool_id, cache)
    assert warm.cache["how"] == "patch" and warm.cache["rows_read"] == 3 and warm.n == 17
    assert np.array_equal(np.asarray(warm.X)[4], new)
    assert_same(warm, _load(db, pool.pool_id, None))
    assert np.array_equal(np.asarray(cold.X)[4], pool.X[4])  # the old entry's mapping is unchanged
    assert len(list((cache.root / "pools" / pool.pool_id).glob("e-*"))) == 1  # the old entry is gone
    add_items(db, pool.pool_id, ["zz-new"], seed=8)
    with session_scope(db) as s:  # a new row and an update, with a row inserted below the cached ids: a merge
        s.execute(update(Item).where(Item.external_id == "item-00001").values(embedding=new.tobytes()))
        s.execute(text("UPDATE items SET id = id - 1000 WHERE external_id = 'zz-new'"))
    merged = _load(db, pool.pool_id, cache)
    assert merged.cache["how"] == "merge" and np.asarray(merged.item_ids)[0] < np.asarray(warm.item_ids)[0]
    assert_same(merged, _load(db, pool.pool_id, None))


def test_deleted_items_and_split_or_status_moves_leave_the_cache(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=20, d=D, n_labeled=3)
    _load(db, pool.pool_id, cache)
    with session_scope(db) as s:
        s.execute(delete(Item).where(Item.external_id.in_(["item-00005", "item-00019"])))
        s.execute(update(Item).where(Item.external_id == "item-00007").values(split="validation"))
        s.execute(update(Item).where(Item.external_id == "item-00009").values(embedding_status="pending"))
    add_items(db, pool.pool_id, ["late-ü", "ça-2"], seed=2)  # merged in with multi-byte ids
    warm = _load(db, pool.pool_id, cache)
    assert warm.cache["how"] == "merge" and warm.n == 20 - 4 + 2
    gone = {"item-00005", "item-00019", "item-00007", "item-00009"}
    assert not gone & set(warm.external_ids)
    assert_same(warm, _load(db, pool.pool_id, None))
    with session_scope(db) as s:  # and back into the train split: it returns
        s.execute(update(Item).where(Item.external_id == "item-00007").values(split="train"))
    back = _load(db, pool.pool_id, cache)
    assert "item-00007" in set(back.external_ids) and back.cache["rows_read"] == 1
    assert_same(back, _load(db, pool.pool_id, None))


def test_many_changes_reload_the_pool_in_full(
    db: sessionmaker[Session], cache: PoolCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    pool = make_pool(db, n=10, d=D, n_labeled=2)
    _load(db, pool.pool_id, cache)
    monkeypatch.setattr(pool_cache, "INCREMENTAL_MAX_ROWS", 4)
    add_items(db, pool.pool_id, [f"more-{i}" for i in range(5)], seed=3)
    warm = _load(db, pool.pool_id, cache)
    assert warm.cache["how"] == "cold" and warm.n == 15
    assert_same(warm, _load(db, pool.pool_id, None))


def test_an_entry_newer_than_the_database_or_of_another_width_is_reloaded(
    db: sessionmaker[Session], cache: PoolCache
) -> None:
    pool = make_pool(db, n=10, d=D, n_labeled=2)
    _load(db, pool.pool_id, cache)
    current = cache.root / "pools" / pool.pool_id / "current.json"
    meta = json.loads(current.read_text())
    current.write_text(json.dumps({**meta, "version": meta["version"] + 1000}))  # e.g. a restored backup
    again = _load(db, pool.pool_id, cache)
    assert again.cache["how"] == "cold" and again.cache["version"] == meta["version"]
    assert_same(again, _load(db, pool.pool_id, None))
    current.write_text(json.dumps({**meta, "d": D + 1}))
    assert _load(db, pool.pool_id, cache).cache["how"] == "cold"


def test_a_bad_embedding_is_reported_as_by_the_uncached_loader(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=10, d=D, n_labeled=2)
    _load(db, pool.pool_id, cache)
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id == "item-00004").values(embedding=b"\0" * 8))
    with pytest.raises(PoolDataError, match="item 'item-00004' has an embedding of 2 values, expected 6"):
        _load(db, pool.pool_id, cache)
    fresh = make_pool(db, n=10, d=D, n_labeled=2, name="other")
    with session_scope(db) as s:
        s.execute(
            update(Item).where(Item.pool_id == fresh.pool_id, Item.external_id == "item-00002").values(embedding=None)
        )
    with pytest.raises(PoolDataError, match="item 'item-00002' has no stored embedding"):
        _load(db, fresh.pool_id, cache)
    assert not list((cache.root / "pools" / fresh.pool_id).glob("*"))  # nothing half-written was left


# ------------------------------------------------------------------------------- ids only, disabled


def test_ids_only_loads_read_no_embeddings_and_use_a_cached_entry(db: sessionmaker[Session], cache: PoolCache) -> None:
    pool = make_pool(db, n=12, d=D, n_labeled=2)
    ids = _load(db, pool.pool_id, cache, embeddings=False)
    assert ids.cache["how"] == "ids" and ids.X.shape == (12, 0)
    assert list(ids.external_ids) == pool.external_ids and ids.labeled.tolist() == [0, 1]
    assert not (cache.root / "pools" / pool.pool_id).exists()  # an ids-only load fills nothing
    _load(db, pool.pool_id, cache)
    assert _load(db, pool.pool_id, cache, embeddings=False).cache["how"] == "hit"
    add_items(db, pool.pool_id, ["one-more"], seed=6)  # a cached pool is refreshed from the changed rows
    assert _load(db, pool.pool_id, cache, embeddings=False).cache["how"] == "append"


def test_the_cache_is_off_without_a_folder_or_with_zero_size(tmp_path: Path) -> None:
    assert pool_cache.for_settings(Settings(worker_cache_dir="")) is None
    assert pool_cache.for_settings(Settings(worker_cache_dir=tmp_path, worker_cache_max_gb=0)) is None
    on = pool_cache.for_settings(Settings(worker_cache_dir=tmp_path, worker_cache_max_gb=1))
    assert on is not None and on.root == tmp_path and on.max_bytes == 2**30


def test_without_a_cache_every_load_reads_the_pool(db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=9, d=D, n_labeled=2)
    assert _load(db, pool.pool_id, None).cache == {"how": "uncached", "rows_read": 9}


def test_a_pool_larger_than_the_cache_is_read_uncached(db: sessionmaker[Session], tmp_path: Path) -> None:
    pool = make_pool(db, n=50, d=D, n_labeled=2)
    small = PoolCache(tmp_path / "small", max_bytes=1000)
    data = _load(db, pool.pool_id, small)
    assert data.cache["how"] == "uncached" and not (small.root / "pools" / pool.pool_id).exists()


# ------------------------------------------------------------------------------- size


def test_least_recently_used_pools_are_evicted_first(db: sessionmaker[Session], tmp_path: Path) -> None:
    pools = [make_pool(db, n=200, d=16, n_labeled=2, name=f"p{i}", seed=i) for i in range(3)]
    probe = PoolCache(tmp_path / "probe", max_bytes=2**30)
    _load(db, pools[0].pool_id, probe)
    one = probe.usage()[pools[0].pool_id][0]
    cache = PoolCache(tmp_path / "lru", max_bytes=int(2.5 * one))
    _load(db, pools[0].pool_id, cache)
    time.sleep(0.02)
    _load(db, pools[1].pool_id, cache)
    time.sleep(0.02)
    assert _load(db, pools[0].pool_id, cache).cache["how"] == "hit"  # pool 0 is now the most recently used
    time.sleep(0.02)
    _load(db, pools[2].pool_id, cache)
    assert set(cache.usage()) == {pools[0].pool_id, pools[2].pool_id}  # pool 1 was the least recently used
    assert _load(db, pools[1].pool_id, cache).cache["how"] == "cold"
    assert sum(size for size, _ in cache.usage().values()) <= cache.max_bytes


# ------------------------------------------------------------------------------- processes


def _child_load(database_url: str, root: str, pool_id: str, out: Any, slow_s: float) -> None:
    settings = Settings(database_url=database_url)
    factory = make_sessionmaker(make_engine(settings))
    cache = PoolCache(Path(root), 2**30, chunk=5)
    if slow_s:  # hold the writer's lock a while, so that the other process has to wait for it
        original = pool_cache._EntryWriter.write

        def slow(self: Any, *args: Any) -> None:
            time.sleep(slow_s)
            original(self, *args)

        pool_cache._EntryWriter.write = slow  # type: ignore[method-assign]
    data = _load(factory, pool_id, cache)
    out.put((data.cache["how"], np.asarray(data.X).tobytes(), list(data.external_ids)))


def test_two_processes_load_a_pool_once_and_agree(db: sessionmaker[Session], database_url: str, tmp_path: Path) -> None:
    pool = make_pool(db, n=30, d=D, n_labeled=2)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    root = str(tmp_path / "shared")
    procs = [ctx.Process(target=_child_load, args=(database_url, root, pool.pool_id, out, s)) for s in (0.05, 0.0)]
    procs[0].start()
    time.sleep(0.5)
    procs[1].start()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert sorted(how for how, _, _ in results) == ["cold", "hit"]  # the second waited for the first's entry
    assert results[0][1:] == results[1][1:]
    assert np.array_equal(np.frombuffer(results[0][1], dtype=np.float32).reshape(30, D), pool.X)


def _child_crash(database_url: str, root: str, pool_id: str, ready: Any, where: str) -> None:
    """Load, and stop dead at ``where`` (the parent SIGKILLs this process there)."""
    settings = Settings(database_url=database_url)
    factory = make_sessionmaker(make_engine(settings))
    cache = PoolCache(Path(root), 2**30, chunk=5)

    def hang(*_args: Any, **_kwargs: Any) -> None:
        ready.set()
        time.sleep(600)

    if where == "publish":  # every file written and fsynced, not yet renamed / published
        pool_cache._write_json = hang  # type: ignore[assignment]
    else:  # mid-write: after the first chunk
        original = pool_cache._EntryWriter.write

        def half(self: Any, *args: Any) -> None:
            original(self, *args)
            hang()

        pool_cache._EntryWriter.write = half  # type: ignore[method-assign]
    _load(factory, pool_id, cache)


@pytest.mark.parametrize("where", ["write", "publish"])
def test_a_writer_killed_mid_write_leaves_no_corrupt_entry(
    db: sessionmaker[Session], database_url: str, tmp_path: Path, where: str
) -> None:
    pool = make_pool(db, n=20, d=D, n_labeled=2)
    root = tmp_path / "crash"
    cache = PoolCache(root, 2**30, chunk=5)
    _load(db, pool.pool_id, cache)  # version v cached
    add_items(db, pool.pool_id, [f"add-{i}" for i in range(8)], seed=4)  # an append is due
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_child_crash, args=(database_url, str(root), pool.pool_id, ready, where))
    proc.start()
    assert ready.wait(120)
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join(30)
    survivor = PoolCache(root, 2**30, chunk=5)
    meta = json.loads((root / "pools" / pool.pool_id / "current.json").read_text())
    assert meta["n"] == 20  # the old entry, as it was
    warm = _load(db, pool.pool_id, survivor)  # the lock died with the process; the append is redone
    assert warm.cache["how"] == "append" and warm.n == 28
    assert_same(warm, _load(db, pool.pool_id, None))


def test_a_cold_writer_killed_mid_write_leaves_only_a_temporary_folder(
    db: sessionmaker[Session], database_url: str, tmp_path: Path
) -> None:
    pool = make_pool(db, n=20, d=D, n_labeled=2)
    root = tmp_path / "crash-cold"
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_child_crash, args=(database_url, str(root), pool.pool_id, ready, "write"))
    proc.start()
    assert ready.wait(120)
    os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join(30)
    pool_dir = root / "pools" / pool.pool_id
    assert not (pool_dir / "current.json").exists() and [p.name[:4] for p in pool_dir.iterdir()] == ["tmp-"]
    warm = _load(db, pool.pool_id, PoolCache(root, 2**30, chunk=5))
    assert warm.cache["how"] == "cold"
    assert_same(warm, _load(db, pool.pool_id, None))
    assert [p.name[:2] for p in pool_dir.iterdir() if p.is_dir()] == ["e-"]  # the leftover is gone


# ------------------------------------------------------------------------------- through a batch job


def test_batches_use_the_cache_and_random_reads_no_embeddings(
    client: TestClient, db: sessionmaker[Session], auth: dict[str, str], run_jobs: Any, settings: Settings
) -> None:
    pool = make_pool(db, n=60, d=D, n_labeled=6)

    def batch(strategy: str) -> dict[str, Any]:
        r = client.post(
            f"/v1/pools/{pool.pool_id}/batches",
            headers=auth,
            json={"size": 3, "strategy": strategy, "params": {"seed": 1}},
        )
        assert r.status_code == 202, r.text
        run_jobs()
        got = client.get(f"/v1/pools/{pool.pool_id}/batches/{r.json()['id']}", headers=auth).json()
        assert got["status"] == "succeeded", got
        return dict(got["diagnostics"]["pool_cache"])

    assert batch("random")["how"] == "ids"  # nothing cached yet, and random does not fill it
    assert batch("margin")["how"] == "cold"
    assert batch("margin")["how"] == "hit"
    assert batch("random")["how"] == "hit"
    add_items(db, pool.pool_id, ["fresh"], seed=5)
    warm = batch("entropy")
    assert warm["how"] == "append" and warm["rows_read"] == 1
    assert Path(str(settings.worker_cache_dir), "pools", pool.pool_id, "current.json").exists()


def test_a_deleted_pool_cascades_without_tombstones_and_leaves_the_cache(
    db: sessionmaker[Session], cache: PoolCache
) -> None:
    pool = make_pool(db, n=5, d=D, n_labeled=1)
    _load(db, pool.pool_id, cache)
    with session_scope(db) as s:
        s.execute(delete(Pool).where(Pool.id == pool.pool_id))
    with session_scope(db) as s:
        assert s.execute(text("SELECT count(*) FROM item_tombstones")).scalar_one() == 0
        assert content_store.content_version(s, pool.pool_id) is None
        assert cache.load(s, pool.pool_id, D) is None
    assert not (cache.root / "pools" / pool.pool_id).exists()
