"""The pool store written as items arrive (issue 26, ``BAIT_POOL_STORE_ON_ARRIVAL``): after an upload (JSON or
bulk), an import, a split move or an embed job commits, a job (``worker.pool_store.write_arrived``) writes the
pool's current content version, from the previous one (an append writes only the new rows); off (``false``, or
``auto`` without a Dask scheduler) nothing is written; another tenant's key writes nothing; a deleted pool leaves
no folder; a failed import enqueues nothing; a store that cannot be written fails the store job, never the upload.
Both backends: SQLite + the in-process runner, PostgreSQL + RQ."""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import delete
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.store import content as content_store
from service.store.models import Item, Pool
from tests.conftest import RunJobs
from tests.service.conftest import item_rows, make_pool, put_items
from tests.service.test_import import dataset, run_import, table, write
from tests.worker.test_pool_store import _add, assert_store_is
from worker import context, pool_store
from worker.pool_data import PoolArrays, load_pool

D = 8
Auth = dict[str, str]


@pytest.fixture
def on_arrival() -> str:
    """BAIT_POOL_STORE_ON_ARRIVAL of the test (parametrized by some)."""
    return "true"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path, on_arrival: str) -> Settings:
    """The api's and the workers' settings (run_jobs configures RQ's worker with this object): one store, small
    shards, the tenant acme's data folder for imports and references."""
    root = tmp_path / "data"
    (root / "acme").mkdir(parents=True)
    return settings.model_copy(
        update={
            "pool_store": str(tmp_path / "store"),
            "pool_store_shard_rows": 16,
            "pool_store_on_arrival": on_arrival,
            "data_root": root,
            "bulk_block_bytes": 4096,
        }
    )


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, D)).astype(np.float32)


def version(db: sessionmaker[Session], pool_id: str) -> int:
    with session_scope(db) as s:
        v = content_store.content_version(s, pool_id)
    assert v is not None
    return v


def fresh(db: sessionmaker[Session], pool_id: str) -> PoolArrays:
    """The single-process reader's rows (no cache)."""
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        return load_pool(s, pool, datetime.now(UTC))


def current_manifest(db: sessionmaker[Session], settings: Settings, pool_id: str) -> pool_store.Manifest:
    """The store's manifest of the pool's current content version (it must be there)."""
    v = version(db, pool_id)
    manifest = pool_store.read_manifest(pool_store.store_root(settings), pool_id, v)
    assert manifest is not None, f"the store has no version {v} of pool {pool_id}"
    return manifest


def bulk(client: TestClient, auth: Auth, pool_id: str, ids: list[str], emb: np.ndarray) -> Any:
    buf = io.BytesIO()
    np.savez(buf, ids=np.array(ids), embeddings=emb)
    return client.post(
        f"/v1/pools/{pool_id}/items:bulk",
        content=buf.getvalue(),
        headers={**auth, "Content-Type": "application/octet-stream"},
    )


def stats(folder: Path) -> dict[str, tuple[int, int]]:
    """``relative path -> (size, mtime_ns)`` of every Parquet file under a pool's folder."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*.parquet")}


# ------------------------------------------------------------------------------------------- a newcomer


def test_uploads_write_the_store_as_items_arrive_and_an_append_writes_only_new_shards(
    client: TestClient, auth: Auth, db: sessionmaker[Session], settings: Settings, run_jobs: RunJobs
) -> None:
    assert settings.store_on_arrival
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    folder = Path(pool_store.store_root(settings)) / pool

    # a first upload (JSON): the job writes the whole pool, the rows the worker's reader loads
    put_items(client, auth, pool, [f"a{i}" for i in range(40)], rows(40, 0))
    run_jobs()
    first = current_manifest(db, settings, pool)
    assert first.base_version is None and first.rows == 40 and first.written["rows"] == 40
    assert_store_is(first, fresh(db, pool))
    before = stats(folder)
    assert len(before) == first.written["files"] == len(first.shards)

    # an append (bulk file): only new shard files; none of the first version's files rewritten
    resp = bulk(client, auth, pool, [f"b{i}" for i in range(20)], rows(20, 1))
    assert resp.status_code == 200, resp.text
    run_jobs()
    second = current_manifest(db, settings, pool)
    assert second.version > first.version and second.base_version == first.version
    assert second.rows == 60 and second.written["rows"] == 20 and second.written["deleted_ids"] == 0
    assert second.shards[: len(first.shards)] == first.shards  # listed again, shared
    after = stats(folder)
    assert {k: after[k] for k in before} == before  # same size, same mtime: not rewritten
    new = set(after) - set(before)
    assert len(new) == second.written["files"] >= 1
    assert sum(after[k][0] for k in new) == second.written["bytes"]
    assert_store_is(second, fresh(db, pool))

    # a split move takes rows out of the store (a delta of deleted ids, no rows written)
    resp = client.patch(
        f"/v1/pools/{pool}/items", json={"item_ids": ["a1", "a2", "b3"], "split": "validation"}, headers=auth
    )
    assert resp.status_code == 200 and resp.json()["moved"] == 3, resp.text
    run_jobs()
    third = current_manifest(db, settings, pool)
    assert third.rows == 57 and third.written["rows"] == 0 and third.written["deleted_ids"] == 3
    assert_store_is(third, fresh(db, pool))


def test_rows_that_arrive_while_the_job_writes_are_written_by_the_same_job(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: RunJobs,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A second upload that commits while the job writes (its own job is not enqueued twice under the same id):
    the job writes again, so the newest version is in the store when it ends."""
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    put_items(client, auth, pool, [f"a{i}" for i in range(20)], rows(20, 0))
    run_jobs()
    real = pool_store.ensure_version
    calls: list[int] = []

    def and_meanwhile(session: Session, s: Any, p: Pool, progress: Any = None) -> Any:
        out = real(session, s, p, progress)
        if not calls:  # items commit while the first pass writes (straight into the database: no job of theirs)
            _add(db, pool, [f"late{i}" for i in range(5)], d=D, seed=3)
        calls.append(out[0].version)
        return out

    monkeypatch.setattr(pool_store, "ensure_version", and_meanwhile)
    with caplog.at_level(logging.INFO, logger="worker.pool_store"):
        put_items(client, auth, pool, [f"b{i}" for i in range(3)], rows(3, 1))
        run_jobs()
    assert len(calls) == 2 and calls[1] > calls[0]
    newest = current_manifest(db, settings, pool)
    assert newest.version == calls[1] and newest.rows == 28
    assert_store_is(newest, fresh(db, pool))
    assert "(pass 2)" in caplog.text


@pytest.mark.parametrize("on_arrival", ["false", "auto"])
def test_with_the_setting_off_nothing_is_written_on_arrival(
    client: TestClient, auth: Auth, db: sessionmaker[Session], settings: Settings, run_jobs: RunJobs, acme_data: Path
) -> None:
    """``false``, and ``auto`` without a Dask scheduler: uploads, imports and split moves leave the store alone
    (the pool's next batch on a cluster writes it)."""
    assert not settings.store_on_arrival and settings.dask_scheduler is None
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    put_items(client, auth, pool, [f"a{i}" for i in range(20)], rows(20, 0))
    assert bulk(client, auth, pool, ["b0", "b1"], rows(2, 1)).status_code == 200
    dataset(acme_data / "ds", files=1, rows=10)
    assert run_import(client, auth, run_jobs, pool, f"file://{acme_data}/ds/")["status"] == "succeeded"
    move = client.patch(f"/v1/pools/{pool}/items", json={"item_ids": ["a0"], "split": "validation"}, headers=auth)
    assert move.status_code == 200 and move.json()["moved"] == 1, move.text
    run_jobs()
    assert len(item_rows(db, pool)) == 32
    assert pool_store.pool_folders(pool_store.store_root(settings)) == []
    assert not Path(settings.pool_store).exists() or not any(Path(settings.pool_store).iterdir())


def test_the_setting_is_auto_true_or_false_and_auto_follows_the_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Settings(pool_store_on_arrival="auto").store_on_arrival is False
    assert Settings(pool_store_on_arrival="auto", dask_scheduler="tcp://127.0.0.1:8786").store_on_arrival is True
    assert Settings(pool_store_on_arrival="false", dask_scheduler="tcp://127.0.0.1:8786").store_on_arrival is False
    assert Settings(pool_store_on_arrival=" TRUE ").store_on_arrival is True
    assert Settings().pool_store_on_arrival == "auto"
    monkeypatch.setenv("BAIT_POOL_STORE_ON_ARRIVAL", "sometimes")
    with pytest.raises(ValidationError, match="BAIT_POOL_STORE_ON_ARRIVAL must be auto, true or false"):
        Settings()
    monkeypatch.setenv("BAIT_POOL_STORE_ON_ARRIVAL", "off")
    assert Settings().store_on_arrival is False


# ------------------------------------------------------------------------------------------- imports and embeds


@pytest.fixture
def acme_data(settings: Settings) -> Path:
    assert settings.data_root is not None
    return settings.data_root / "acme"


def test_a_successful_import_writes_the_store_and_a_failed_one_nothing(
    client: TestClient, auth: Auth, db: sessionmaker[Session], settings: Settings, run_jobs: RunJobs, acme_data: Path
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    dataset(acme_data / "ds", files=2, rows=25)
    job = run_import(client, auth, run_jobs, pool, f"file://{acme_data}/ds/")
    assert job["status"] == "succeeded", job
    manifest = current_manifest(db, settings, pool)
    assert manifest.rows == 50 and manifest.written["rows"] == 50
    assert_store_is(manifest, fresh(db, pool))

    # a failed import (a file of the wrong width) writes no rows and enqueues no store job: a pool not yet in
    # the store stays out of it
    other = make_pool(client, auth, embedding_dim=D, name="other")["id"]
    dataset(acme_data / "bad", files=1, rows=10)
    write(acme_data / "bad" / "part-9.parquet", table(["w0", "w1"], np.zeros((2, D + 1))))
    assert run_import(client, auth, run_jobs, other, f"file://{acme_data}/bad/")["status"] == "failed"
    run_jobs()
    assert pool_store.pool_folders(pool_store.store_root(settings)) == [pool]


def test_an_embed_job_writes_the_rows_it_made_ready(
    client: TestClient, auth: Auth, db: sessionmaker[Session], settings: Settings, run_jobs: RunJobs, acme_data: Path
) -> None:
    pool = make_pool(client, auth, embedding_dim=D, encoder={"kind": "identity"})["id"]
    vectors = rows(12, 5)
    items = []
    for i in range(12):
        np.save(acme_data / f"v{i}.npy", vectors[i])
        items.append({"id": f"v{i}", "uri": f"file://{acme_data}/v{i}.npy"})
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    assert resp.status_code == 200 and resp.json()["embed_job_id"], resp.text

    def embedded() -> bool:
        return bool(client.get(f"/v1/pools/{pool}/embed", headers=auth).json()["status"] == "succeeded")

    run_jobs(until=embedded)
    manifest = current_manifest(db, settings, pool)
    assert manifest.rows == 12
    assert_store_is(manifest, fresh(db, pool))


# ------------------------------------------------------------------------------------------- an attacker, a deletion


def test_another_tenant_cannot_make_the_store_write_a_pool_it_does_not_own(
    client: TestClient,
    auth: Auth,
    other_auth: Auth,
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: RunJobs,
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    put_items(client, auth, pool, [f"a{i}" for i in range(20)], rows(20, 0))
    run_jobs()
    folder = Path(pool_store.store_root(settings)) / pool
    written = stats(folder)
    manifests = sorted(p.name for p in folder.glob("v*.json"))
    v = version(db, pool)

    body = {"items": [{"id": "evil", "embedding": [0.0] * D}]}
    assert client.post(f"/v1/pools/{pool}/items", json=body, headers=other_auth).status_code == 404
    assert bulk(client, other_auth, pool, ["evil"], rows(1, 9)).status_code == 404
    move = {"item_ids": ["a0"], "split": "validation"}
    assert client.patch(f"/v1/pools/{pool}/items", json=move, headers=other_auth).status_code == 404
    assert client.patch(f"/v1/pools/{pool}", json={"encoder": None}, headers=other_auth).status_code == 404
    imp = {"source": "file:///etc/"}
    assert client.post(f"/v1/pools/{pool}/items:import", json=imp, headers=other_auth).status_code == 404
    assert not client.app.state.queue.is_pending(f"store-{pool}")  # type: ignore[attr-defined]
    run_jobs()
    assert version(db, pool) == v and "evil" not in item_rows(db, pool)
    assert stats(folder) == written and sorted(p.name for p in folder.glob("v*.json")) == manifests
    assert pool_store.pool_folders(pool_store.store_root(settings)) == [pool]


def test_the_job_of_a_deleted_pool_writes_nothing_and_leaves_no_folder(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: RunJobs,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    root = pool_store.store_root(settings)
    context.configure(settings)  # the job below runs in this thread, as an RQ worker runs it
    # deleted before its job runs: nothing written, and the folder of its earlier versions goes
    gone = make_pool(client, auth, embedding_dim=D, name="gone")["id"]
    put_items(client, auth, gone, [f"a{i}" for i in range(20)], rows(20, 0))
    run_jobs()
    assert pool_store.pool_folders(root) == [gone]
    with session_scope(db) as s:
        s.execute(delete(Item).where(Item.pool_id == gone))
        s.execute(delete(Pool).where(Pool.id == gone))
    pool_store.write_arrived(gone)
    assert pool_store.pool_folders(root) == []

    # deleted while the job writes it (its own drop job may have run already): the folder is removed after
    late = make_pool(client, auth, embedding_dim=D, name="late")["id"]
    real = pool_store.ensure_version

    def deleted_meanwhile(session: Session, s: Any, p: Pool, progress: Any = None) -> Any:
        out = real(session, s, p, progress)
        with session_scope(db) as other:
            other.execute(delete(Item).where(Item.pool_id == late))
            other.execute(delete(Pool).where(Pool.id == late))
        return out

    monkeypatch.setattr(pool_store, "ensure_version", deleted_meanwhile)  # before the upload: its job may start
    put_items(client, auth, late, [f"a{i}" for i in range(20)], rows(20, 0))
    run_jobs()  # the upload's own store job
    assert pool_store.pool_folders(root) == []


def test_a_store_that_cannot_be_written_fails_the_store_job_never_the_upload(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: RunJobs,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the store's folder would be")
    monkeypatch.setattr(settings, "pool_store", str(blocker / "store"))  # the api and the workers share this object
    pool = make_pool(client, auth, embedding_dim=D)["id"]
    with caplog.at_level(logging.INFO, logger="worker.pool_store"):
        put_items(client, auth, pool, [f"a{i}" for i in range(10)], rows(10, 0))
        run_jobs()
    assert len(item_rows(db, pool)) == 10  # the upload committed; only the store job failed
    assert f"writing pool {pool} on arrival failed" in caplog.text
    assert blocker.read_text().startswith("a file")
