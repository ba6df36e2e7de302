"""The pool store (worker/pool_store.py): a pool's selectable rows as Parquet shards per content version, equal to
what the worker's reader loads, after any sequence of appends, deletes, re-uploads and split moves; a new version
is written from the previous one (an append writes only the new rows; deletes and rewrites leave a delta, compacted
past a fraction of the rows); a version is visible only once complete, and a writer killed before publishing leaves
the previous one readable; pruning never removes a file a kept manifest references; ``bait pools migrate-store``
writes every pool."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session, sessionmaker

from bait import cli
from service.config import Settings
from service.db import session_scope
from service.store import content as content_store
from service.store.models import Item, Pool
from tests.worker.factories import make_pool
from worker import pool_store
from worker.pool_data import PoolArrays, PoolDataError, load_pool


@pytest.fixture
def store_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(update={"pool_store": str(tmp_path / "store"), "pool_store_shard_rows": 16})


@pytest.fixture
def no_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prune as soon as a manifest is not among the newest two (no grace period)."""
    monkeypatch.setattr(pool_store, "PRUNE_GRACE_S", 0.0)


def _ensure(db: sessionmaker[Session], settings: Settings, pool_id: str) -> tuple[pool_store.Manifest, str]:
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return pool_store.ensure_version(s, settings, pool)


def _fresh(db: sessionmaker[Session], pool_id: str) -> PoolArrays:
    """The single-process reader's rows, read from the database (no cache)."""
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return load_pool(s, pool, datetime.now(UTC))


def _read_all(manifest: pool_store.Manifest) -> tuple[np.ndarray, list[str], np.ndarray]:
    """Every shard read as a Dask task reads it, concatenated in the manifest's order."""
    ids, exts, Xs = [np.empty(0, dtype=np.int64)], [], [np.empty((0, manifest.d), dtype=np.float32)]
    for shard in manifest.shards:
        i, e, X, nbytes = pool_store.read_shard(shard)
        assert 0 < nbytes <= shard.bytes and i.shape[0] == shard.rows == X.shape[0]
        assert int(i[0]) == shard.first_id and int(i[-1]) == shard.last_id and shard.lo <= shard.first_id
        assert shard.last_id <= shard.hi
        ids.append(i)
        exts.extend(e)
        Xs.append(X)
        ids_only, exts_only, empty, fewer = pool_store.read_shard(shard, embeddings=False)
        assert np.array_equal(ids_only, i) and exts_only == e and empty.shape == (shard.rows, 0) and fewer < nbytes
    return np.concatenate(ids), exts, np.concatenate(Xs)


def assert_store_is(manifest: pool_store.Manifest, fresh: PoolArrays) -> None:
    """The store's version yields the reader's rows: same ids, order, external ids and bit-exact embeddings."""
    ids, exts, X = _read_all(manifest)
    assert manifest.rows == fresh.n
    assert np.array_equal(ids, fresh.item_ids) and bool(np.all(np.diff(ids) > 0))
    assert exts == list(fresh.external_ids)
    assert X.dtype == np.float32 and np.array_equal(X, fresh.X)
    # the shards own contiguous, ascending id ranges
    for a, b in zip(manifest.shards, manifest.shards[1:], strict=False):
        assert b.lo == a.hi + 1


def _add(db: sessionmaker[Session], pool_id: str, names: list[str], d: int, seed: int, ids: list[int] | None = None):
    X = np.random.default_rng(seed).normal(size=(len(names), d)).astype(np.float32)
    now = datetime.now(UTC)
    rows: list[dict[str, Any]] = [
        {"pool_id": pool_id, "external_id": e, "embedding": x.tobytes(), "status": "unlabeled",
         "created_at": now, "updated_at": now}
        for e, x in zip(names, X, strict=True)
    ]  # fmt: skip
    if ids is not None:
        for row, i in zip(rows, ids, strict=True):
            row["id"] = i
    with session_scope(db) as s:
        s.execute(insert(Item), rows)


def _set(db: sessionmaker[Session], names: list[str], **values: Any) -> None:
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.external_id.in_(names)).values(**values))


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


# ------------------------------------------------------------------------------------------- a full version


def test_store_holds_the_rows_the_worker_reader_loads(db: sessionmaker[Session], store_settings: Settings) -> None:
    data = make_pool(db, n=70, d=5, n_labeled=7)
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and manifest.base_version is None
    assert manifest.rows == 70 and manifest.d == 5 and [s.rows for s in manifest.shards] == [16, 16, 16, 16, 6]
    assert all(s.deleted is None and s.upserts is None for s in manifest.shards)
    assert manifest.written["rows"] == 70 and manifest.written["files"] == 5
    assert_store_is(manifest, _fresh(db, data.pool_id))
    # an unchanged pool is served from the store as it is
    again, how = _ensure(db, store_settings, data.pool_id)
    assert how == "hit" and again == manifest


def test_a_corrupt_shard_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "part-00000.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(pool_store.StoreError, match=r"part-00000\.parquet"):
        pool_store.read_shard(str(bad))


# ------------------------------------------------------------------------------------------- incremental versions


def test_an_append_writes_only_the_new_rows(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None
) -> None:
    data = make_pool(db, n=70, d=5, n_labeled=7)
    first, _ = _ensure(db, store_settings, data.pool_id)
    root = Path(pool_store.store_root(store_settings)) / data.pool_id
    before = _files(root)
    _add(db, data.pool_id, [f"new-{i}" for i in range(5)], d=5, seed=1)
    second, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and second.base_version == first.version and second.rows == 75
    # the old shards are listed again by path (shared, not copied); one new shard holds the 5 new rows
    assert second.shards[:5] == first.shards
    assert second.shards[5].rows == 5 and second.shards[5].lo == first.shards[-1].hi + 1
    assert second.written == {"rows": 5, "deleted_ids": 0, "files": 1, "bytes": second.shards[5].bytes,
                              "shards_shared": 5}  # fmt: skip
    new_files = _files(root) - before
    assert {f for f in new_files if f.endswith(".parquet")} == {second.shards[5].path.removeprefix(f"{root}/")}
    assert sum((root / f).stat().st_size for f in new_files if f.endswith(".parquet")) == second.written["bytes"]
    assert second.written["bytes"] < first.written["bytes"] / 5
    assert_store_is(second, _fresh(db, data.pool_id))
    assert before <= _files(root)  # nothing of version 1 was removed (the newest two are kept)


class _ReadCounter:
    """Counts the rows the store's writer reads from the database, per query (the real queries run)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.per_query: list[int] = []
        self.ids_read = 0
        real_rows, real_by_id, real_ids = (
            content_store.selectable_rows, content_store.selectable_by_id, content_store.selectable_ids,
        )  # fmt: skip

        def rows(*args: Any, **kwargs: Any) -> Any:
            got = [r for part in real_rows(*args, **kwargs) for r in part]
            self.per_query.append(len(got))
            yield got

        def by_id(*args: Any, **kwargs: Any) -> Any:
            got = real_by_id(*args, **kwargs)
            self.per_query.append(len(got))
            return got

        def ids(*args: Any, **kwargs: Any) -> Any:
            for part in real_ids(*args, **kwargs):
                self.ids_read += len(part)
                yield part

        monkeypatch.setattr(content_store, "selectable_rows", rows)
        monkeypatch.setattr(content_store, "selectable_by_id", by_id)
        monkeypatch.setattr(content_store, "selectable_ids", ids)


def test_the_writer_reads_a_shard_at_a_time_and_an_append_reads_only_the_new_rows(
    db: sessionmaker[Session], store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer never holds the pool: a full version reads one shard's rows per query; the next version, after
    an append and a rewrite, reads the appended and rewritten rows only (and every id, 8 bytes a row)."""
    data = make_pool(db, n=70, d=5, n_labeled=7)
    reads = _ReadCounter(monkeypatch)
    first, _ = _ensure(db, store_settings, data.pool_id)
    assert reads.per_query == [16, 16, 16, 16, 6] and reads.ids_read == 70
    reads.per_query.clear()
    _add(db, data.pool_id, [f"new-{i}" for i in range(5)], d=5, seed=1)
    with session_scope(db) as s:
        one = s.scalars(select(Item).where(Item.pool_id == data.pool_id).order_by(Item.id).limit(1)).one()
        one.embedding = np.full(5, 3.0, np.float32).tobytes()
    second, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and second.base_version == first.version
    assert sorted(reads.per_query) == [1, 5]  # the rewritten row (a delta), the new rows (a fresh shard)
    assert_store_is(second, _fresh(db, data.pool_id))


def test_a_shard_handed_over_in_parts_is_decoded_part_by_part_into_the_same_store(
    db: sessionmaker[Session], store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database hands a shard's rows over in parts (3 rows here, 8,192 by default): each part is decoded into
    the shard's one array as it comes, and the store equals the reader's rows; a part that runs past the shard's
    ids (a row that appeared meanwhile) publishes nothing."""
    data = make_pool(db, n=40, d=6, n_labeled=4)
    real_rows = content_store.selectable_rows
    parts: list[int] = []

    def small_parts(session: Session, pool_id: str, lo: int, hi: int, chunk: int = 8192) -> Any:
        for part in real_rows(session, pool_id, lo, hi, chunk=3):
            parts.append(len(part))
            yield part

    monkeypatch.setattr(content_store, "selectable_rows", small_parts)
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and len(parts) > manifest.rows // 3 and max(parts) == 3
    assert_store_is(manifest, _fresh(db, data.pool_id))

    def one_too_many(session: Session, pool_id: str, lo: int, hi: int, chunk: int = 8192) -> Any:
        rows = [r for part in real_rows(session, pool_id, lo, hi) for r in part]
        yield [*rows, (rows[-1][0] + 1000, "intruder", rows[-1][2])]

    monkeypatch.setattr(content_store, "selectable_rows", one_too_many)
    with session_scope(db) as s:
        pool = s.get(Pool, data.pool_id)
        assert pool is not None
        rows = pool_store.DatabaseRows(s, data.pool_id, 1, 6)
        with pytest.raises(pool_store.PoolMoved):
            rows.block(0, min(16, rows.item_ids.shape[0]))


def test_rows_that_change_while_a_version_is_written_are_never_published_mixed(
    db: sessionmaker[Session], store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An upload that commits while the writer reads: the version the writer started is not published with rows
    of two states; the writer starts again and publishes the new version, equal to the reader's rows."""
    data = make_pool(db, n=40, d=5, n_labeled=0)
    real_block = pool_store.DatabaseRows.block
    calls = {"n": 0}

    def block_then_upload(self: pool_store.DatabaseRows, a: int, b: int) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:  # mid-version, another writer commits a rewrite of a row already read and an append
            with session_scope(db) as s:
                first = s.scalars(select(Item).where(Item.pool_id == data.pool_id).order_by(Item.id).limit(1)).one()
                first.embedding = np.full(5, 7.0, np.float32).tobytes()
            _add(db, data.pool_id, ["late-0", "late-1"], d=5, seed=3)
        return real_block(self, a, b)

    monkeypatch.setattr(pool_store.DatabaseRows, "block", block_then_upload)
    with session_scope(db) as s:
        started = content_store.content_version(s, data.pool_id)
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and manifest.version != started and manifest.rows == 42
    assert pool_store.read_manifest(pool_store.store_root(store_settings), data.pool_id, int(started or 0)) is None
    fresh = _fresh(db, data.pool_id)
    assert_store_is(manifest, fresh)
    assert np.array_equal(fresh.X[0], np.full(5, 7.0, np.float32))


def test_a_pool_that_never_settles_fails_with_a_message_and_publishes_nothing(
    db: sessionmaker[Session], store_settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = make_pool(db, n=20, d=5, n_labeled=0)
    counter = {"n": 0}
    real_block = pool_store.DatabaseRows.block

    def always_moving(self: pool_store.DatabaseRows, a: int, b: int) -> Any:
        counter["n"] += 1
        _add(db, data.pool_id, [f"busy-{counter['n']}"], d=5, seed=counter["n"])
        return real_block(self, a, b)

    monkeypatch.setattr(pool_store.DatabaseRows, "block", always_moving)
    with pytest.raises(pool_store.StoreError, match="changed while each of 4 store versions was written"):
        _ensure(db, store_settings, data.pool_id)
    root = Path(pool_store.store_root(store_settings)) / data.pool_id
    assert not list(root.glob("v*.json")) and not list(root.rglob("*.parquet"))


def test_a_row_without_a_valid_embedding_is_named_and_nothing_is_published(
    db: sessionmaker[Session], store_settings: Settings
) -> None:
    data = make_pool(db, n=20, d=5, n_labeled=0)
    _add(db, data.pool_id, ["short-one"], d=4, seed=1)  # 4 values in a pool of 5
    with pytest.raises(PoolDataError, match="'short-one' has an embedding of 4 values, expected 5"):
        _ensure(db, store_settings, data.pool_id)
    root = Path(pool_store.store_root(store_settings)) / data.pool_id
    assert not list(root.glob("v*.json")) and not list(root.rglob("*.parquet"))


def test_deletes_and_rewrites_leave_a_delta_that_readers_apply(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None
) -> None:
    data = make_pool(db, n=70, d=5, n_labeled=7)
    first, _ = _ensure(db, store_settings, data.pool_id)
    with session_scope(db) as s:
        s.execute(delete(Item).where(Item.external_id.in_(["item-00003", "item-00040"])))
    _set(db, ["item-00020"], embedding=np.full(5, 9.0, dtype="<f4").tobytes())  # a re-upload
    _set(db, ["item-00050"], split="validation")  # leaves the selectable rows
    second, _ = _ensure(db, store_settings, data.pool_id)
    assert second.base_version == first.version and second.rows == 70 - 3
    written = second.written
    assert written["rows"] == 1 and written["deleted_ids"] == 3 and written["shards_shared"] == 5
    with_delta = [s for s in second.shards if s.deleted or s.upserts]
    assert len(with_delta) == 4 and all(s.path in {f.path for f in first.shards} for s in second.shards)
    fresh = _fresh(db, data.pool_id)
    assert_store_is(second, fresh)
    assert fresh.X[list(fresh.external_ids).index("item-00020")].tolist() == [9.0] * 5
    # back into the train split, and another rewrite of the same row: the shard's delta is cumulative
    _set(db, ["item-00050"], split="train")
    _set(db, ["item-00020"], embedding=np.full(5, 3.0, dtype="<f4").tobytes())
    third, _ = _ensure(db, store_settings, data.pool_id)
    # item-00020, and item-00050 (a changed row: the store does not read the embeddings back to compare)
    assert third.base_version == second.version and third.written == {**third.written, "rows": 2, "files": 2}
    assert_store_is(third, _fresh(db, data.pool_id))


def test_a_shard_whose_delta_outgrows_the_fraction_is_rewritten_in_full(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None
) -> None:
    data = make_pool(db, n=64, d=4, n_labeled=0)
    first, _ = _ensure(db, store_settings, data.pool_id)
    # 5 of the first shard's 16 rows rewritten: more than COMPACT_DELTA_FRACTION (a quarter)
    _set(db, [f"item-{i:05d}" for i in range(5)], embedding=np.zeros(4, dtype="<f4").tobytes())
    # 3 of the second's: a delta
    _set(db, [f"item-{i:05d}" for i in range(16, 19)], embedding=np.ones(4, dtype="<f4").tobytes())
    second, _ = _ensure(db, store_settings, data.pool_id)
    s0, s1 = second.shards[:2]
    assert s0.path not in {s.path for s in first.shards} and s0.deleted is None and s0.upserts is None
    assert s1.path == first.shards[1].path and s1.upserts is not None
    assert second.written["rows"] == 16 + 3
    assert_store_is(second, _fresh(db, data.pool_id))


def test_many_small_appends_are_merged_past_the_shard_limit(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pool_store, "EXTRA_SHARDS", 2)
    data = make_pool(db, n=32, d=3, n_labeled=0)
    manifest, _ = _ensure(db, store_settings, data.pool_id)
    counts = [len(manifest.shards)]
    for step in range(4):
        _add(db, data.pool_id, [f"a{step}-{i}" for i in range(3)], d=3, seed=step)
        manifest, _ = _ensure(db, store_settings, data.pool_id)
        counts.append(len(manifest.shards))
        assert_store_is(manifest, _fresh(db, data.pool_id))
    # 2 full shards; each append adds a small one until there are ceil(44/16) + 2 = 5: then the small ones merge
    assert counts == [2, 3, 4, 5, 3] and manifest.shards[2].rows == 12


def test_a_shard_left_empty_goes_and_its_ids_join_a_neighbour(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None
) -> None:
    data = make_pool(db, n=48, d=3, n_labeled=0)
    first, _ = _ensure(db, store_settings, data.pool_id)
    with session_scope(db) as s:  # the whole middle shard, and the last one
        s.execute(delete(Item).where(Item.external_id.in_([f"item-{i:05d}" for i in range(16, 48)])))
    second, _ = _ensure(db, store_settings, data.pool_id)
    assert len(second.shards) == 1 and second.shards[0].hi == first.shards[-1].hi
    assert_store_is(second, _fresh(db, data.pool_id))
    # an item re-inserted with a freed id lands in the surviving shard's delta
    freed = first.shards[1].first_id
    _add(db, data.pool_id, ["back"], d=3, seed=5, ids=[freed])
    third, _ = _ensure(db, store_settings, data.pool_id)
    assert len(third.shards) == 1 and third.shards[0].upserts is not None
    assert_store_is(third, _fresh(db, data.pool_id))


# ------------------------------------------------------------------------------------------- the invariant

D = 3
OPS = st.lists(
    st.tuples(
        st.sampled_from(["append", "delete", "reupload", "split_out", "split_in", "pending", "reinsert", "write"]),
        st.integers(min_value=1, max_value=12),
        st.integers(min_value=0, max_value=2**31),
    ),
    min_size=1,
    max_size=10,
)


@hsettings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS, n0=st.integers(min_value=1, max_value=40), shard_rows=st.sampled_from([3, 7, 16]))
def test_after_any_changes_the_newest_version_yields_the_readers_rows(
    db: sessionmaker[Session],
    store_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    ops: list[tuple[str, int, int]],
    n0: int,
    shard_rows: int,
) -> None:
    """Property: after any sequence of appends, deletes, re-uploads, split and status moves and re-inserted ids,
    each new version (written from the previous one, through the worker cache) yields exactly what
    ``load_pool`` reads from the database, in the same order; the version before it stays readable (pruning
    keeps it, and every file it references)."""
    monkeypatch.setattr(pool_store, "PRUNE_GRACE_S", 0.0)
    monkeypatch.setattr(pool_store, "EXTRA_SHARDS", 1)
    cfg = store_settings.model_copy(update={"pool_store_shard_rows": shard_rows})
    data = make_pool(db, n=n0, d=D, n_labeled=0, name=f"prop-{np.random.default_rng().integers(1 << 60)}")
    previous: tuple[pool_store.Manifest, PoolArrays] | None = None
    counter = 0
    for op, k, seed in ops:
        rng = np.random.default_rng(seed)
        with session_scope(db) as s:
            rows = s.execute(
                select(Item.id, Item.external_id, Item.split, Item.embedding_status).where(Item.pool_id == data.pool_id)
            ).all()
        names = [r[1] for r in rows]
        pick = [str(x) for x in rng.choice(names, size=min(k, len(names)), replace=False)] if names else []
        if op == "append":
            _add(db, data.pool_id, [f"n{counter}-{i}" for i in range(k)], d=D, seed=seed)
            counter += 1
        elif op == "delete" and pick:
            with session_scope(db) as s:
                s.execute(delete(Item).where(Item.pool_id == data.pool_id, Item.external_id.in_(pick)))
        elif op == "reupload" and pick:
            for name in pick:
                _set(db, [name], embedding=rng.normal(size=D).astype("<f4").tobytes())
        elif op == "split_out" and pick:
            _set(db, pick, split="validation")
        elif op == "split_in":
            _set(db, [r[1] for r in rows if r[2] != "train"][:k], split="train")
            _set(db, [r[1] for r in rows if r[3] != "ready"][:k], embedding_status="ready")
        elif op == "pending" and pick:
            _set(db, pick, embedding_status="pending")
        elif op == "reinsert" and rows:  # a new item with an id below the newest (a freed or a fresh gap id)
            used = {int(r[0]) for r in rows}
            gaps = [i for i in range(min(used), max(used)) if i not in used][:k]
            if gaps:
                _add(db, data.pool_id, [f"r{counter}-{i}" for i in gaps], d=D, seed=seed, ids=gaps)
                counter += 1
        if op != "write" and rng.random() < 0.3:
            continue  # several changes between two versions
        manifest, _ = _ensure(db, cfg, data.pool_id)
        fresh = _fresh(db, data.pool_id)
        assert_store_is(manifest, fresh)
        if previous is not None and previous[0].version != manifest.version:
            kept = pool_store.read_manifest(cfg.pool_store, data.pool_id, previous[0].version)
            assert kept is not None  # the newest two are kept, with every file they reference
            assert_store_is(kept, previous[1])
        previous = (manifest, fresh)


@hsettings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(min_value=0, max_value=60), max_size=8),  # ids to delete (when present)
            st.lists(st.integers(min_value=0, max_value=60), max_size=8),  # ids to upsert (insert or rewrite)
            st.integers(min_value=0, max_value=9),  # new ids appended above the newest
            st.lists(st.integers(min_value=0, max_value=80), max_size=4),  # unchanged ids also said to change
        ),
        min_size=1,
        max_size=6,
    ),
    n0=st.integers(min_value=0, max_value=30),
    shard_rows=st.integers(min_value=1, max_value=9),
    extra=st.integers(min_value=0, max_value=3),
    fraction=st.sampled_from([0.0, 0.25, 1.0, 10.0]),
)
def test_plan_and_readers_keep_the_rows_for_any_changes_without_a_database(
    tmp_path_factory: pytest.TempPathFactory,
    steps: list[tuple[list[int], list[int], int, list[int]]],
    n0: int,
    shard_rows: int,
    extra: int,
    fraction: float,
) -> None:
    """The same property on the store alone, with many more cases: random deletes, upserts and appends, a
    superset of changed ids (unchanged ids said to change too), every shard size, merge limit and compaction
    fraction."""
    root = tmp_path_factory.mktemp("plan")
    old = (pool_store.EXTRA_SHARDS, pool_store.COMPACT_DELTA_FRACTION)
    pool_store.EXTRA_SHARDS, pool_store.COMPACT_DELTA_FRACTION = extra, fraction
    try:
        rng = np.random.default_rng(len(steps) * 1000 + n0)
        rows = {i * 2: (f"e{i * 2}", rng.normal(size=2).astype(np.float32)) for i in range(n0)}
        version = 1
        manifest = _write_rows(root, version, rows, shard_rows, None)
        for gone, upsert, appended, noise in steps:
            for i in gone:
                rows.pop(i, None)
            for i in upsert:
                rows[i] = (f"u{version}-{i}", rng.normal(size=2).astype(np.float32))
            top = max(rows, default=0)
            for j in range(appended):
                rows[top + 100 + j] = (f"a{version}-{j}", rng.normal(size=2).astype(np.float32))
            changed = np.asarray(sorted({*gone, *upsert, *noise}), dtype=np.int64)
            version += 1
            manifest = _write_rows(root, version, rows, shard_rows, pool_store.Changes(version - 1, changed))
            assert manifest.base_version == version - 1
    finally:
        pool_store.EXTRA_SHARDS, pool_store.COMPACT_DELTA_FRACTION = old


def _write_rows(
    root: Path, version: int, rows: dict[int, tuple[str, np.ndarray]], shard_rows: int, changes: Any
) -> pool_store.Manifest:
    ids = np.asarray(sorted(rows), dtype=np.int64)
    exts = [rows[int(i)][0] for i in ids]
    X = np.asarray([rows[int(i)][1] for i in ids], dtype=np.float32).reshape(len(ids), 2)
    manifest = pool_store.write_version(root, "p1", version, ids, exts, X, shard_rows, changes=changes)
    got_ids, got_exts, got_X = _read_all(manifest)
    assert np.array_equal(got_ids, ids) and got_exts == exts and np.array_equal(got_X, X)
    assert all(s.rows <= shard_rows or not (s.deleted is None and s.upserts is None) for s in manifest.shards)
    return manifest


# ------------------------------------------------------------------------------------------- crashes and pruning


def _crashing_writer(root: str, rows: int, at: str) -> None:
    """A child process: write version 3 (an append and a rewrite over version 2) and die by SIGKILL at ``at``."""
    ids = np.arange(1, rows + 1, dtype=np.int64)
    X = np.full((rows, 2), 3.0, dtype=np.float32)
    exts = [f"e{i}" for i in ids]

    def die(*_args: Any) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    if at == "publish":
        pool_store.Files.publish = die  # type: ignore[assignment,method-assign]
    else:
        calls = {"n": 0}
        real = pool_store.Files.write_table

        def write_then_die(self: pool_store.Files, rel: str, table: Any) -> int:
            calls["n"] += 1
            if calls["n"] == 2:  # the second file, half written
                with open(self.path(rel), "wb") as f:
                    f.write(b"PAR1 half a shard")
                die()
            return real(self, rel, table)

        pool_store.Files.write_table = write_then_die  # type: ignore[method-assign]
    changes = pool_store.Changes(2, np.asarray([1, 2], dtype=np.int64))
    pool_store.write_version(root, "p1", 3, ids, exts, X, 4, changes=changes)


@pytest.mark.parametrize("at", ["shard", "publish"])
def test_a_writer_killed_before_publishing_leaves_the_previous_version_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> None:
    root = tmp_path / "store"
    ids = np.arange(1, 21, dtype=np.int64)
    X = np.arange(40, dtype=np.float32).reshape(20, 2)
    exts = [f"e{i}" for i in ids]
    pool_store.write_version(root, "p1", 1, ids, exts, X, 4)
    X2 = X.copy()
    X2[5] = -1.0
    v2 = pool_store.write_version(root, "p1", 2, ids, exts, X2, 4, changes=pool_store.Changes(1, np.asarray([6])))
    child = multiprocessing.get_context("fork").Process(target=_crashing_writer, args=(str(root), 26, at))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert pool_store.read_manifest(root, "p1", 3) is None  # no version 3: its manifest was never published
    leftovers = [p for p in (root / "p1").glob("d-v3-*/*") if p.is_file()]
    assert leftovers  # the dead writer's files are there, named by no manifest
    # every reader still sees version 2 whole; pruning (even of everything stale at once) keeps its files
    monkeypatch.setattr(pool_store, "PRUNE_GRACE_S", 0.0)
    pool_store.prune(root, "p1", keep=1, stale_s=0.0)
    assert not any(p.exists() for p in leftovers)
    again = pool_store.read_manifest(root, "p1", 2)
    assert again == v2
    got_ids, got_exts, got_X = _read_all(v2)
    assert np.array_equal(got_ids, ids) and got_exts == exts and np.array_equal(got_X, X2)
    # and the next writer writes version 3 from it
    v3 = pool_store.write_version(
        root, "p1", 3, np.arange(1, 27), [f"e{i}" for i in range(1, 27)], np.full((26, 2), 3.0, np.float32), 4,
        changes=pool_store.Changes(2, np.asarray([1, 2])),
    )  # fmt: skip
    assert v3.base_version == 2 and _read_all(v3)[0].tolist() == list(range(1, 27))


def test_pruning_never_removes_a_file_a_kept_manifest_references(tmp_path: Path) -> None:
    root = tmp_path / "store"
    ids = np.arange(1, 41, dtype=np.int64)
    rows = {int(i): np.full(2, float(i), dtype=np.float32) for i in ids}

    def write(version: int, changed: list[int]) -> pool_store.Manifest:
        keys = np.asarray(sorted(rows), dtype=np.int64)
        X = np.stack([rows[int(i)] for i in keys])
        changes = None if version == 1 else pool_store.Changes(version - 1, np.asarray(changed, dtype=np.int64))
        return pool_store.write_version(root, "p1", version, keys, [f"e{i}" for i in keys], X, 8, changes=changes)

    manifests = [write(1, [])]
    for v in range(2, 7):
        rows[int(v)] = np.full(2, -float(v), dtype=np.float32)  # a rewrite in the first shard each time
        rows[100 + v] = np.full(2, 100.0 + v, dtype=np.float32)  # and an append
        manifests.append(write(v, [v]))
    # within the grace period nothing is removed
    assert sorted(p.name for p in (root / "p1").glob("v*.json")) == [f"v{v}.json" for v in range(1, 7)]
    removed = pool_store.prune(root, "p1", keep=2, grace_s=0.0)
    assert {f"v{v}.json" for v in range(1, 5)} <= set(removed)
    kept = {f"v{v}.json" for v in (5, 6)}
    assert {p.name for p in (root / "p1").glob("v*.json")} == kept
    referenced: set[str] = set()
    for name in kept:
        meta = json.loads((root / "p1" / name).read_text())
        for s in meta["shards"]:
            referenced |= {s["path"], *(s[k] for k in ("deleted", "upserts") if s.get(k))}
    on_disk = {str(p.relative_to(root / "p1")) for p in (root / "p1").glob("d-*/*")}
    assert referenced <= on_disk  # every file of a kept manifest is there
    assert on_disk == referenced  # and the files only removed manifests named are gone
    # version 1's full shards are still shared by version 6, so they stayed
    assert {s.path for s in manifests[0].shards[1:]} <= {s.path for s in manifests[-1].shards}
    for m in manifests[-2:]:
        assert _read_all(m)[0].shape[0] == m.rows


def test_a_missing_manifest_means_no_version_and_is_written_again(
    db: sessionmaker[Session], store_settings: Settings
) -> None:
    data = make_pool(db, n=10, d=3, n_labeled=2)
    manifest, _ = _ensure(db, store_settings, data.pool_id)
    root = Path(pool_store.store_root(store_settings))
    Path(manifest.location).unlink()
    assert pool_store.read_manifest(root, data.pool_id, manifest.version) is None
    rewritten, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and rewritten.rows == 10 and Path(rewritten.location).exists()
    assert rewritten.base_version is None


def test_a_store_of_the_first_format_is_replaced(db: sessionmaker[Session], store_settings: Settings) -> None:
    data = make_pool(db, n=10, d=3, n_labeled=2)
    root = Path(pool_store.store_root(store_settings))
    legacy = root / data.pool_id / "v1"
    legacy.mkdir(parents=True)
    (legacy / "manifest.json").write_text(json.dumps({"format": 1, "shards": []}))
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and manifest.base_version is None and not legacy.exists()
    assert_store_is(manifest, _fresh(db, data.pool_id))


def test_migrate_store_command_writes_every_pool(
    db: sessionmaker[Session],
    store_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a = make_pool(db, n=30, d=4, n_labeled=3, name="a")
    b = make_pool(db, n=5, d=4, n_labeled=1, name="b")
    monkeypatch.setattr(cli, "get_settings", lambda: store_settings)
    assert cli.main(["pools", "migrate-store"]) == 0
    out = capsys.readouterr()
    assert f"pool {a.pool_id} (a): version" in out.out and "30 rows in 2 shard(s)" in out.out
    assert f"pool {b.pool_id} (b): version" in out.out and "5 rows in 1 shard(s)" in out.out
    assert "written in full" in out.out
    assert "rows" in out.err  # the progress bars
    root = Path(pool_store.store_root(store_settings))
    for pool_id in (a.pool_id, b.pool_id):
        (manifest,) = [p for p in (root / pool_id).glob("v*.json")]
        meta = json.loads(manifest.read_text())
        assert meta["pool_id"] == pool_id and meta["d"] == 4
    assert cli.main(["pools", "migrate-store", "--quiet"]) == 0
    assert "already in the store" in capsys.readouterr().out
    _add(db, a.pool_id, ["late"], d=4, seed=3)
    assert cli.main(["pools", "migrate-store", "--quiet", "--pool", a.pool_id]) == 0
    line = capsys.readouterr().out
    assert "31 rows in 3 shard(s)" in line and ": 1 rows, 0 deleted ids)" in line
    assert cli.main(["pools", "migrate-store", "--pool", "nope"]) == 2
    assert "no pool with id nope" in capsys.readouterr().err


def test_the_store_setting_takes_a_folder_or_a_url_without_credentials(tmp_path: Path) -> None:
    assert Settings(pool_store=str(tmp_path / "s")).pool_store == str(tmp_path / "s")
    assert Settings(pool_store=f"file://{tmp_path}/s").pool_store == str(tmp_path / "s")
    assert Settings(pool_store="s3://bucket/prefix/").pool_store == "s3://bucket/prefix"
    with pytest.raises(ValueError, match="must not carry credentials"):
        Settings(pool_store="s3://KEY:SECRET@bucket/prefix")
    with pytest.raises(ValueError, match="BAIT_POOL_STORE must be"):
        Settings(pool_store="s3://")


def test_versions_above_the_database_s_are_dropped_after_a_restore(
    db: sessionmaker[Session], store_settings: Settings, no_grace: None
) -> None:
    """A store written before the database was restored from a backup holds versions above the database's: they
    go when the pool's version is next written (they are never the newest two kept for ever)."""
    data = make_pool(db, n=20, d=3, n_labeled=0)
    root = pool_store.store_root(store_settings)
    ids = np.arange(10**6, 10**6 + 4, dtype=np.int64)
    for v in (10**9, 10**9 + 1):
        pool_store.write_version(root, data.pool_id, v, ids, [str(i) for i in ids], np.zeros((4, 3), np.float32), 16)
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and manifest.base_version is None  # not written from the stale ones
    assert pool_store.read_manifest(root, data.pool_id, 10**9) is None
    assert sorted(p.name for p in (Path(root) / data.pool_id).glob("v*.json")) == [f"v{manifest.version}.json"]
    on_disk = {str(p) for p in (Path(root) / data.pool_id).glob("d-*/*.parquet")}
    assert on_disk == {s.path for s in manifest.shards}  # the stale versions' files went with them
    assert_store_is(manifest, _fresh(db, data.pool_id))


def test_a_deleted_pool_leaves_nothing_in_the_store(
    db: sessionmaker[Session],
    settings: Settings,
    tmp_path: Path,
    auth: dict[str, str],
    other_auth: dict[str, str],
    run_jobs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deleting a pool removes its folder from the store (a job after the commit); another tenant's key cannot;
    a folder whose deletion job was lost goes when a worker starts; other pools' folders stay."""
    from fastapi.testclient import TestClient

    from service.main import create_app

    # the api and the worker (run_jobs configures RQ's with this object) share the store, as in a deployment
    monkeypatch.setattr(settings, "pool_store", str(tmp_path / "store"))
    store_settings = settings

    gone, kept, lost = (make_pool(db, n=40, d=4, n_labeled=4, name=name) for name in ("gone", "kept", "lost"))
    for data in (gone, kept, lost):
        _ensure(db, store_settings, data.pool_id)
    root = pool_store.store_root(store_settings)
    assert pool_store.pool_folders(root) == sorted([gone.pool_id, kept.pool_id, lost.pool_id])
    with TestClient(create_app(store_settings)) as app:
        assert app.delete(f"/v1/pools/{gone.pool_id}", headers=other_auth).status_code == 404
        run_jobs(app_client=app)
        assert gone.pool_id in pool_store.pool_folders(root)  # not the other tenant's to delete
        assert app.delete(f"/v1/pools/{gone.pool_id}", headers=auth).status_code == 204
        run_jobs(app_client=app)
        assert pool_store.pool_folders(root) == sorted([kept.pool_id, lost.pool_id])
    # a pool deleted with no job to follow (e.g. the queue lost it): the next worker start removes its folder
    with session_scope(db) as s:
        s.execute(delete(Item).where(Item.pool_id == lost.pool_id))
        s.execute(delete(Pool).where(Pool.id == lost.pool_id))
    assert pool_store.sweep_at_start(store_settings, db) == [lost.pool_id]
    assert pool_store.pool_folders(root) == [kept.pool_id]
    manifest, how = _ensure(db, store_settings, kept.pool_id)
    assert how == "hit"
    assert_store_is(manifest, _fresh(db, kept.pool_id))
