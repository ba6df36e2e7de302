"""The pool store (worker/pool_store.py): a pool's selectable rows as Parquet shards per content version, equal to
what the worker's reader loads; a version is visible only once complete; old versions are pruned; the
``bait pools migrate-store`` command writes every pool."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from bait import cli
from service.config import Settings
from service.db import session_scope
from service.store.models import Item, Pool
from tests.worker.factories import make_pool
from worker import pool_store
from worker.pool_data import load_pool


@pytest.fixture
def store_settings(settings: Settings, tmp_path: Path) -> Settings:
    return settings.model_copy(update={"pool_store": str(tmp_path / "store"), "pool_store_shard_rows": 16})


def _ensure(db: sessionmaker[Session], settings: Settings, pool_id: str) -> tuple[pool_store.Manifest, str]:
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return pool_store.ensure_version(s, settings, pool)


def _read_all(manifest: pool_store.Manifest) -> tuple[np.ndarray, list[str], np.ndarray]:
    ids, exts, Xs = [], [], []
    for shard in manifest.shards:
        i, e, X, nbytes = pool_store.read_shard(shard.path)
        assert 0 < nbytes <= shard.bytes and i.shape[0] == shard.rows == X.shape[0]
        assert int(i[0]) == shard.first_id and int(i[-1]) == shard.last_id
        ids.append(i)
        exts.extend(e)
        Xs.append(X)
        ids_only, exts_only, empty, fewer = pool_store.read_shard(shard.path, embeddings=False)
        assert np.array_equal(ids_only, i) and exts_only == e and empty.shape == (shard.rows, 0) and fewer < nbytes
    return np.concatenate(ids), exts, np.concatenate(Xs)


def test_store_holds_the_rows_the_worker_reader_loads(db: sessionmaker[Session], store_settings: Settings) -> None:
    data = make_pool(db, n=70, d=5, n_labeled=7)
    manifest, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written"
    assert manifest.rows == 70 and manifest.d == 5 and [s.rows for s in manifest.shards] == [16, 16, 16, 16, 6]
    with session_scope(db) as s:
        pool = s.get(Pool, data.pool_id)
        assert pool is not None
        fresh = load_pool(s, pool, datetime.now(UTC))
    ids, exts, X = _read_all(manifest)
    assert np.array_equal(ids, fresh.item_ids) and np.all(np.diff(ids) > 0)
    assert exts == list(fresh.external_ids)
    assert X.dtype == np.float32 and np.array_equal(X, fresh.X)
    # an unchanged pool is served from the store as it is
    again, how = _ensure(db, store_settings, data.pool_id)
    assert how == "hit" and again == manifest


def test_a_changed_pool_gets_a_new_version_and_old_ones_are_pruned(
    db: sessionmaker[Session], store_settings: Settings
) -> None:
    data = make_pool(db, n=20, d=3, n_labeled=2)
    versions = []
    for step in range(3):
        manifest, how = _ensure(db, store_settings, data.pool_id)
        assert how == "written"
        versions.append(manifest.version)
        with session_scope(db) as s:  # a new embedding for one item: a new content version
            s.execute(
                update(Item)
                .where(Item.pool_id == data.pool_id, Item.external_id == "item-00003")
                .values(embedding=np.full(3, float(step + 10), dtype="<f4").tobytes())
            )
    manifest, _ = _ensure(db, store_settings, data.pool_id)
    versions.append(manifest.version)
    assert versions == sorted(set(versions))  # each change gave a newer version
    _ids, exts, X = _read_all(manifest)
    assert X[exts.index("item-00003")].tolist() == [12.0, 12.0, 12.0]
    root = pool_store.store_root(store_settings) / data.pool_id
    assert sorted(p.name for p in root.iterdir()) == [f"v{v}" for v in sorted(versions[-2:])]


def test_a_version_without_its_manifest_is_not_there(db: sessionmaker[Session], store_settings: Settings) -> None:
    data = make_pool(db, n=10, d=3, n_labeled=2)
    manifest, _ = _ensure(db, store_settings, data.pool_id)
    root = pool_store.store_root(store_settings)
    # a writer that crashed before its rename leaves a temporary folder: not a version
    crashed = root / data.pool_id / ".tmp-crashed"
    crashed.mkdir()
    (crashed / "part-00000.parquet").write_bytes(b"half a file")
    assert pool_store.read_manifest(root, data.pool_id, manifest.version + 1) is None
    (manifest.folder / pool_store.MANIFEST).unlink()
    assert pool_store.read_manifest(root, data.pool_id, manifest.version) is None
    rewritten, how = _ensure(db, store_settings, data.pool_id)
    assert how == "written" and rewritten.rows == 10 and (rewritten.folder / pool_store.MANIFEST).exists()


def test_a_corrupt_shard_is_named_in_the_error(tmp_path: Path) -> None:
    bad = tmp_path / "part-00000.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(pool_store.StoreError, match=r"part-00000\.parquet"):
        pool_store.read_shard(str(bad))


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
    assert "rows" in out.err  # the progress bars
    root = pool_store.store_root(store_settings)
    for pool_id in (a.pool_id, b.pool_id):
        (version,) = [p for p in (root / pool_id).iterdir()]
        meta = json.loads((version / pool_store.MANIFEST).read_text())
        assert meta["pool_id"] == pool_id and meta["d"] == 4
    assert cli.main(["pools", "migrate-store", "--quiet"]) == 0
    assert "already in the store" in capsys.readouterr().out
    assert cli.main(["pools", "migrate-store", "--pool", "nope"]) == 2
    assert "no pool with id nope" in capsys.readouterr().err
