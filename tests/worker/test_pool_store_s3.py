"""The pool store on an object store (``BAIT_POOL_STORE=s3://…``): a real S3 endpoint on 127.0.0.1 (moto's server
mode, a dev dependency), spoken to by pyarrow's own S3 client with credentials from the environment. Versions are
written incrementally and pruned by reference there as on a local folder, and a batch on a Dask cluster whose
workers read their shards from the bucket picks what the single-process batch picks."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.main import create_app
from tests.moto_s3 import moto_server
from tests.worker.factories import make_pool
from tests.worker.test_distributed import POOL, _batch, _change_pool, _local_picks, _settings, _wait, start_cluster
from tests.worker.test_pool_store import _read_all
from worker import pool_store

BUCKET = "bait-store"


@pytest.fixture
def s3_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with an empty bucket; the store's URL (credentials in the environment)."""
    with moto_server(tmp_path / "moto.log", monkeypatch) as port:
        query = f"endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
        admin, _ = pafs.FileSystem.from_uri(f"s3://{BUCKET}/?{query}&allow_bucket_creation=true")
        admin.create_dir(BUCKET)
        yield f"s3://{BUCKET}/store?{query}"


def _objects(url: str) -> set[str]:
    fs = pool_store.files(url)
    return {rel for rel, _mtime, is_dir in fs.listing("p1") if not is_dir}


def test_versions_on_s3_are_incremental_and_pruned_by_reference(s3_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pool_store, "PRUNE_GRACE_S", 0.0)
    rng = np.random.default_rng(3)
    rows = {i: (f"e{i}", rng.normal(size=4).astype(np.float32)) for i in range(1, 51)}

    def write(version: int, changed: list[int]) -> pool_store.Manifest:
        ids = np.asarray(sorted(rows), dtype=np.int64)
        X = np.stack([rows[int(i)][1] for i in ids])
        exts = [rows[int(i)][0] for i in ids]
        changes = None if version == 1 else pool_store.Changes(version - 1, np.asarray(changed, dtype=np.int64))
        manifest = pool_store.write_version(s3_url, "p1", version, ids, exts, X, 16, changes=changes)
        got_ids, got_exts, got_X = _read_all(manifest)  # as a Dask task reads it: from the bucket
        assert np.array_equal(got_ids, ids) and got_exts == exts and np.array_equal(got_X, X)
        return manifest

    first = write(1, [])
    assert first.shards[0].path.startswith(f"s3://{BUCKET}/store/p1/d-v1-") and first.written["rows"] == 50
    for i in range(51, 56):  # an append: one new object of 5 rows
        rows[i] = (f"e{i}", rng.normal(size=4).astype(np.float32))
    second = write(2, [])
    assert second.written["rows"] == 5 and second.written["files"] == 1 and second.shards[:4] == first.shards
    rows.pop(7)  # a delete and a re-upload: a delta
    rows[20] = ("e20", np.zeros(4, dtype=np.float32))
    third = write(3, [7, 20])
    assert third.written == {**third.written, "rows": 1, "deleted_ids": 1, "files": 2}
    # version 1 is pruned; its full shards are still referenced by version 3, so they stay
    assert pool_store.read_manifest(s3_url, "p1", 1) is None
    objects = _objects(s3_url)
    assert {"p1/v2.json", "p1/v3.json"} <= objects and "p1/v1.json" not in objects
    kept = {s.path.split("?")[0].removeprefix(f"s3://{BUCKET}/store/") for s in third.shards}
    assert kept <= objects
    # a message never shows the URL's query
    with pytest.raises(pool_store.StoreError) as err:
        pool_store.read_shard(third.shards[0].path.replace("part-", "nope-"))
    assert "endpoint_override" not in str(err.value) and f"s3://{BUCKET}/store/p1/" in str(err.value)


def test_a_cluster_batch_reads_its_shards_from_s3(
    s3_url: str, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    expected = _local_picks(settings, db, auth, ["entropy"], **POOL)
    cluster = start_cluster(tmp_path)  # its workers inherit the credentials from this process's environment
    try:
        dask_settings = _settings(settings, tmp_path / "unused", dask_scheduler=cluster.address)
        # the store's endpoint (127.0.0.1) passes the outbound guard only as the operator allows it
        dask_settings = dask_settings.model_copy(update={"pool_store": s3_url, "outbound_allow": "127.0.0.1"})
        with TestClient(create_app(dask_settings)) as app:
            data = make_pool(db, name="dask-s3", **POOL)
            batch = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, "entropy"))
            assert batch["status"] == "succeeded", batch["error"]
            sel: dict[str, Any] = batch["diagnostics"]["selection"]
            assert sel["engine"] == "dask" and sel["tasks"] == 10 and sel["bytes_read"]["shards"] > 0
            assert batch["item_ids"] == expected["entropy"]
            assert "endpoint_override" not in str(batch["diagnostics"])
            _change_pool(db, data.pool_id)  # the next version is written from this one, in the bucket
            again = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, "entropy", 6))
            assert again["status"] == "succeeded", again["error"]
            version = int(again["diagnostics"]["selection"]["store_version"])
            manifest = pool_store.read_manifest(s3_url, data.pool_id, version)
            assert manifest is not None and manifest.base_version == int(sel["store_version"])
            assert manifest.written["shards_shared"] >= 9
    finally:
        for p in [*cluster.workers, cluster.scheduler]:
            cluster.stop(p, signal.SIGKILL)


def test_a_store_on_an_address_the_outbound_guard_refuses_fails_the_batch_and_names_the_settings(
    s3_url: str, settings: Settings, db: sessionmaker[Session], auth: dict[str, str], tmp_path: Path
) -> None:
    """``BAIT_POOL_STORE`` goes through the outbound guard like every URL the service reaches: an endpoint on an
    internal address not in ``BAIT_OUTBOUND_ALLOW`` (here 127.0.0.1) is refused before any request, and the batch
    fails with a message that names the settings, never the address."""
    assert pool_store.store_host(s3_url) == ("127.0.0.1", int(s3_url.split("127.0.0.1:")[1].split("&")[0]))
    assert pool_store.store_host("s3://bucket/prefix") is None and pool_store.store_host(str(tmp_path)) is None
    assert pool_store.store_host("hdfs://namenode.internal:9000/store") == ("namenode.internal", 9000)
    refusing = settings.model_copy(update={"pool_store": s3_url, "outbound_allow": ""})
    with pytest.raises(pool_store.StoreError, match="BAIT_POOL_STORE names an internal address") as err:
        pool_store.store_root(refusing)
    assert "127.0.0.1" not in str(err.value)
    allowed = refusing.model_copy(update={"outbound_allow": "127.0.0.1"})
    assert pool_store.store_root(allowed).startswith(f"s3://{BUCKET}/store")
    cluster = start_cluster(tmp_path)
    try:
        dask_settings = _settings(settings, tmp_path / "unused", dask_scheduler=cluster.address)
        dask_settings = dask_settings.model_copy(update={"pool_store": s3_url, "outbound_allow": ""})
        with TestClient(create_app(dask_settings)) as app:
            data = make_pool(db, name="dask-s3-refused", **POOL)
            batch = _wait(app, dask_settings, auth, data.pool_id, _batch(app, auth, data.pool_id, "entropy"))
            assert batch["status"] == "failed" and "outbound guard" in batch["error"]
            assert "127.0.0.1" not in batch["error"]
        assert not any(o.startswith(f"{data.pool_id}/") for o in _objects(s3_url))  # nothing was written
    finally:
        for p in [*cluster.workers, cluster.scheduler]:
            cluster.stop(p, signal.SIGKILL)
