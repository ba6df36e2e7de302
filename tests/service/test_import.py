"""Import by reference (``POST /v1/pools/{pool}/items:import``) on both backends: a good dataset of several
files and row groups, corrupt files (the job fails naming the file and row, nothing written), hostile
sources (outside the tenant's folder, ``..``, a link out, object stores, a Parquet bomb), a newcomer's
mistakes and an attacker's requests."""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.imports import InvalidSource, open_source_file, resolve_source
from service.domain.jobs import recover_jobs
from service.store.attempts import opened, worker_name
from service.store.models import ImportJob, Item, Pool
from tests.conftest import RunJobs
from tests.service.conftest import assert_error, item_rows, make_pool, put_items
from tests.service.test_security_scopes import key_with

D = 8
Auth = dict[str, str]


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    root = tmp_path / "data"
    (root / "acme").mkdir(parents=True)  # the folder of tenant acme (the `auth` key's tenant)
    (root / "globex").mkdir()
    # Small record batches (several per file) and a small inflated-size limit, so the bomb stays small.
    return settings.model_copy(
        update={"data_root": root, "bulk_block_bytes": 4096, "import_max_bytes": 4 * 2**20, "import_max_files": 50}
    )


@pytest.fixture
def acme(settings: Settings) -> Path:
    assert settings.data_root is not None
    return settings.data_root / "acme"


def table(ids: list[str], emb: np.ndarray | list[Any], **extra: Any) -> pa.Table:
    columns: dict[str, Any] = {"id": pa.array(ids, pa.string())}
    columns["embedding"] = pa.array([list(map(float, row)) for row in emb], pa.list_(pa.float32()))
    for name, values in extra.items():
        columns[name] = values
    return pa.table(columns)


def write(path: Path, tbl: pa.Table, row_group_size: int = 16) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(tbl, path, row_group_size=row_group_size)
    return path


def dataset(folder: Path, files: int = 3, rows: int = 50, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """``files`` Parquet files of ``rows`` rows each (row groups of 16): ids and embeddings, in file order."""
    rng = np.random.default_rng(seed)
    all_ids: list[str] = []
    blocks = []
    for f in range(files):
        ids = [f"f{f}-r{r}" for r in range(rows)]
        emb = rng.standard_normal((rows, D)).astype(np.float32)
        write(folder / f"part-{f}.parquet", table(ids, emb))
        all_ids += ids
        blocks.append(emb)
    return all_ids, np.concatenate(blocks)


def start(client: TestClient, auth: Auth, pool_id: str, source: str) -> Any:
    return client.post(f"/v1/pools/{pool_id}/items:import", json={"source": source}, headers=auth)


def run_import(client: TestClient, auth: Auth, run_jobs: RunJobs, pool_id: str, source: str) -> dict[str, Any]:
    resp = start(client, auth, pool_id, source)
    assert resp.status_code == 202, resp.text
    job = resp.json()
    assert job["status"] == "queued" and job["source"] == source
    assert resp.headers["Location"] == f"/v1/pools/{pool_id}/imports/{job['id']}"

    def finished() -> bool:
        status = client.get(f"/v1/pools/{pool_id}/imports/{job['id']}", headers=auth).json()["status"]
        return status in ("succeeded", "failed")

    run_jobs(until=finished)
    out: dict[str, Any] = client.get(f"/v1/pools/{pool_id}/imports/{job['id']}", headers=auth).json()
    return out


def pool_version(db: sessionmaker[Session], pool_id: str) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(Pool.content_version).where(Pool.id == pool_id)).scalar_one())


def n_items(db: sessionmaker[Session], pool_id: str) -> int:
    return len(item_rows(db, pool_id))


# ------------------------------------------------------------------------------------------ a good dataset


def test_good_dataset_imports_every_row_and_is_selectable(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, acme: Path
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    ids, emb = dataset(acme / "ds", files=3, rows=50)
    before = pool_version(db, pool["id"])

    job = run_import(client, auth, run_jobs, pool["id"], f"file://{acme}/ds/")
    assert job["status"] == "succeeded", job["error"]
    assert job["progress"] == {"stage": "done", "done": 150, "total": 150}
    assert job["rows_imported"] == 150
    assert job["counts"] == {"files": 3, "rows": 150, "created": 150, "updated": 0}
    assert job["attempts"] == 1 and job["finished_at"] is not None
    assert [a["outcome"] for a in job["attempt_history"]] == ["succeeded"]

    rows = item_rows(db, pool["id"])
    assert len(rows) == 150
    for i in (0, 49, 50, 149):
        assert rows[ids[i]].embedding == emb[i].astype("<f4").tobytes()
    after = pool_version(db, pool["id"])
    assert after > before
    if db.kw["bind"].dialect.name == "postgresql":  # one transaction: one version (SQLite stamps per row)
        assert after == before + 1

    # listed, and the items are selectable by a batch
    listed = client.get(f"/v1/pools/{pool['id']}/imports", headers=auth).json()["imports"]
    assert [j["id"] for j in listed] == [job["id"]]
    resp = client.post(f"/v1/pools/{pool['id']}/batches", json={"size": 10, "strategy": "random"}, headers=auth)
    assert resp.status_code == 202, resp.text
    run_jobs()
    batch = client.get(f"/v1/pools/{pool['id']}/batches/{resp.json()['id']}", headers=auth).json()
    assert batch["status"] == "succeeded", batch["error"]
    assert len(batch["item_ids"]) == 10 and set(batch["item_ids"]) <= set(ids)


def test_glob_data_split_and_existing_ids_update_like_the_bulk_upload(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, acme: Path
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    old = np.ones((2, D), np.float32)
    put_items(client, auth, pool["id"], ["a", "b"], old)
    labeled = client.put(
        f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "label": "cat"}]}, headers=auth
    )
    assert labeled.status_code == 200, labeled.text
    emb = np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)
    data = pa.array([json.dumps({"text": "hello"}), None, None, json.dumps({"n": 3})], pa.string())
    split = pa.array([None, "validation", None, "train"], pa.string())
    write(acme / "g" / "part-a.parquet", table(["a", "b", "c", "d"], emb, data=data, split=split))
    write(acme / "g" / "other.parquet", table(["zzz"], emb[:1]))  # not matched by the glob

    job = run_import(client, auth, run_jobs, pool["id"], f"file://{acme}/g/part-*.parquet")
    assert job["status"] == "succeeded", job["error"]
    assert job["counts"] == {"files": 1, "rows": 4, "created": 2, "updated": 2}
    rows = item_rows(db, pool["id"])
    assert set(rows) == {"a", "b", "c", "d"}
    assert rows["a"].embedding == emb[0].tobytes() and rows["a"].status == "labeled"  # label stays
    assert rows["a"].data == {"text": "hello"} and rows["d"].data == {"n": 3}
    assert rows["b"].split == "validation" and rows["a"].split == "train" and rows["c"].split == "train"


def _stale_running_import(db: sessionmaker[Session], pool_id: str, source: str, stage: str) -> str:
    """An import row left running by attempt 1, its heartbeat 30 s old (as a dead worker leaves it)."""
    now = datetime.now(UTC)
    with session_scope(db) as s:
        job = ImportJob(
            pool_id=pool_id, source=source, status="running", progress_stage=stage,
            attempts=1, attempt_history=opened(None, 1, now - timedelta(seconds=40), worker_name()),
            created_at=now - timedelta(seconds=60), started_at=now - timedelta(seconds=40),
            heartbeat_at=now - timedelta(seconds=30),
        )  # fmt: skip
        s.add(job)
        s.flush()
        return str(job.id)


def test_a_sweep_that_waits_for_an_import_s_commit_never_requeues_the_finished_import(
    client: TestClient, auth: Auth, db: sessionmaker[Session], acme: Path, settings: Settings
) -> None:
    """On SQLite an import holds the only write lock for its whole write (12 minutes at 10^7 rows), so its heartbeat
    goes stale. A recovery sweep that read the row as running before the import committed, then waited for the
    lock, must not re-queue the import once it has succeeded (it did: the import then ran a second time)."""
    pool = make_pool(client, auth, embedding_dim=D)
    job_id = _stale_running_import(db, pool["id"], f"file://{acme}/ds/", "write")
    quick = settings.model_copy(update={"job_stale_seconds": 1.0})
    reports: list[Any] = []
    writer = db()
    try:  # the import's last transaction: rows written, the job marked succeeded, not committed yet
        writer.execute(
            update(ImportJob).where(ImportJob.id == job_id).values(status="succeeded", finished_at=datetime.now(UTC))
        )
        sweeper = threading.Thread(
            target=lambda: reports.append(recover_jobs(db, client.app.state.queue, quick, assume_dead=False))  # type: ignore[attr-defined]
        )
        sweeper.start()
        time.sleep(1.0)  # the sweep has started and waits for the write lock (SQLite) or the row lock (PostgreSQL)
        writer.commit()
    finally:
        writer.close()
    sweeper.join(60)
    assert not sweeper.is_alive() and reports and reports[0].requeued == []
    out = client.get(f"/v1/pools/{pool['id']}/imports/{job_id}", headers=auth).json()
    assert out["status"] == "succeeded" and out["attempts"] == 1


def test_an_import_whose_worker_died_is_requeued_and_runs_again(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, acme: Path, settings: Settings
) -> None:
    """A dead attempt wrote no item (one transaction at the end): the recovery sweep re-queues it and the
    next attempt imports everything once."""
    pool = make_pool(client, auth, embedding_dim=D)
    dataset(acme / "ds", files=2, rows=20)
    job_id = _stale_running_import(db, pool["id"], f"file://{acme}/ds/", "validate")
    quick = settings.model_copy(update={"job_stale_seconds": 1.0})
    report = recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    assert report.requeued == [job_id]

    def finished() -> bool:
        return client.get(f"/v1/pools/{pool['id']}/imports/{job_id}", headers=auth).json()["status"] == "succeeded"

    run_jobs(until=finished)
    out = client.get(f"/v1/pools/{pool['id']}/imports/{job_id}", headers=auth).json()
    assert out["attempts"] == 2 and out["rows_imported"] == 40
    assert [a["outcome"] for a in out["attempt_history"]] == ["worker_lost", "succeeded"]
    assert n_items(db, pool["id"]) == 40


# --------------------------------------------------------------------------------------- corrupt datasets


def _second_file_with(acme: Path, problem: str) -> None:
    """Three good files, the second (part-1.parquet) broken at row 37."""
    dataset(acme / "bad", files=3, rows=50)
    path = acme / "bad" / "part-1.parquet"
    ids = [f"f1-r{r}" for r in range(50)]
    emb: list[Any] = [list(v) for v in np.random.default_rng(2).standard_normal((50, D))]
    if problem == "truncated":
        raw = path.read_bytes()
        path.write_bytes(raw[: len(raw) // 2])
        return
    if problem == "not_parquet":
        path.write_bytes(b"id,embedding\nx,1 2 3\n" * 20)
        return
    if problem == "wrong_dim":
        emb[37] = emb[37][:-1]
    elif problem == "nan":
        emb[37][3] = float("nan")
    elif problem == "duplicate":
        ids[37] = "f0-r5"  # an id of the first file
    elif problem == "long_id":
        ids[37] = "x" * 600
    elif problem == "bad_split":
        write(path, table(ids, emb, split=pa.array(["train"] * 37 + ["test"] + ["train"] * 12)))
        return
    elif problem == "id_type":
        tbl = table(ids, emb).set_column(0, "id", pa.array(range(50), pa.int64()))
        write(path, tbl)
        return
    write(path, table(ids, emb))


@pytest.mark.parametrize(
    ("problem", "fragments"),
    [
        ("truncated", ["bad/part-1.parquet", "not a readable Parquet file"]),
        ("not_parquet", ["bad/part-1.parquet", "not a readable Parquet file"]),
        ("wrong_dim", ["bad/part-1.parquet", "row 37", "ragged"]),
        ("nan", ["bad/part-1.parquet, row 37", "finite"]),
        ("duplicate", ["bad/part-1.parquet, row 37", "f0-r5"]),
        ("long_id", ["bad/part-1.parquet, row 37", "512"]),
        ("bad_split", ["bad/part-1.parquet, row 37", "split", "'test'"]),
        ("id_type", ["bad/part-1.parquet", "column 'id' must be strings, got int64"]),
    ],
)
def test_a_bad_file_fails_the_job_naming_file_and_row_and_writes_nothing(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    acme: Path,
    problem: str,
    fragments: list[str],
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    put_items(client, auth, pool["id"], ["keep"], np.zeros((1, D), np.float32))
    before = pool_version(db, pool["id"])
    _second_file_with(acme, problem)

    job = run_import(client, auth, run_jobs, pool["id"], f"file://{acme}/bad")
    assert job["status"] == "failed"
    for fragment in fragments:
        assert fragment in job["error"], (fragment, job["error"])
    assert str(acme) not in job["error"]  # the server's absolute paths are never shown
    assert job["rows_imported"] == 0 and job["counts"] == {}
    assert set(item_rows(db, pool["id"])) == {"keep"}  # zero items written, nothing half-visible
    assert pool_version(db, pool["id"]) == before


def test_wrong_dimension_throughout_a_file_names_its_first_row(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, acme: Path
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    dataset(acme / "dim", files=1, rows=10)
    write(acme / "dim" / "part-9.parquet", table(["w0", "w1"], np.zeros((2, D + 1))))
    job = run_import(client, auth, run_jobs, pool["id"], f"file://{acme}/dim/")
    assert job["status"] == "failed"
    assert "dim/part-9.parquet, row 0: embedding dimension: expected 8, got 9" in job["error"]
    assert n_items(db, pool["id"]) == 0


# ---------------------------------------------------------------------------------------- hostile sources


def test_hostile_sources_are_refused_before_anything_is_written(
    client: TestClient, auth: Auth, db: sessionmaker[Session], acme: Path, settings: Settings
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    assert settings.data_root is not None
    globex = settings.data_root / "globex"
    dataset(globex / "secret", files=1, rows=5)
    dataset(acme / "ds", files=1, rows=5)
    (acme / "links").mkdir()
    os.symlink(globex / "secret" / "part-0.parquet", acme / "links" / "part-0.parquet")
    os.symlink(globex / "secret", acme / "dirlink")

    cases = [
        (f"file://{globex}/secret/", "outside this tenant's data folder"),  # another tenant's folder
        ("file:///etc/passwd", "outside this tenant's data folder"),
        (f"file://{acme}/../globex/secret/", "outside this tenant's data folder"),  # ../ traversal
        (f"file://{acme}/ds/%2e%2e/%2e%2e/globex/secret", "outside this tenant's data folder"),
        (f"file://{acme}/links/", "symbolic link out of this tenant's data folder"),
        (f"file://{acme}/links/*.parquet", "symbolic link out of this tenant's data folder"),
        (f"file://{acme}/dirlink/", "outside this tenant's data folder"),
        ("s3://bucket/prefix/*.parquet", "BAIT_TENANT_IMPORT_URLS"),  # no object-store prefix assigned
        ("gs://bucket/prefix/*.parquet", "gs:// sources are not supported"),
        ("https://example.com/ds.parquet", "https:// sources are not supported"),
        ("ds/part-0.parquet", "file:///absolute/path"),
        (f"file://otherhost{acme}/ds/", "with a host"),
        (f"file://{acme}/*/part-0.parquet", "only be in the last part"),
        (f"file://{acme}/nothing-here/", "nothing at nothing-here"),
        (f"file://{acme}/ds/*.csv", "no Parquet files found"),
    ]
    for source, fragment in cases:
        err = assert_error(start(client, auth, pool["id"], source), 400, "invalid_source", fragment)
        assert str(globex) not in err["message"]
    with session_scope(db) as s:
        assert s.execute(select(Item)).first() is None
    assert client.get(f"/v1/pools/{pool['id']}/imports", headers=auth).json()["imports"] == []


def test_a_tenant_without_a_data_folder_is_told_so(
    limited_client: Any, auth: Auth, db: sessionmaker[Session], acme: Path
) -> None:
    c = limited_client(data_root=None)
    pool = make_pool(c, auth, embedding_dim=D)
    assert_error(start(c, auth, pool["id"], f"file://{acme}/ds/"), 400, "invalid_source", "BAIT_DATA_ROOT")


def test_too_many_files_are_refused(client: TestClient, auth: Auth, acme: Path) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    for i in range(51):
        write(acme / "many" / f"p{i:03d}.parquet", table([f"i{i}"], np.zeros((1, D))))
    assert_error(start(client, auth, pool["id"], f"file://{acme}/many/"), 400, "invalid_source", "more than 50 files")


@pytest.mark.parametrize(("dictionary", "stage"), [(False, "open"), (True, "validate")])
def test_a_parquet_bomb_fails_the_job_within_the_limits(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    acme: Path,
    dictionary: bool,
    stage: str,
) -> None:
    """2,000 rows of 4 KB of `data` each: 8 MB inflated (the limit is 4 MB), a few KB on disk. Written plainly,
    the footer declares the 8 MB and the job fails before reading a row; dictionary-encoded, the footer
    understates it and the job fails as the batches decode, past the limit and not much further."""
    pool = make_pool(client, auth, embedding_dim=D)
    dataset(acme / "bomb", files=1, rows=10)
    n = 2000
    big = pa.table({"id": [f"b{i}" for i in range(n)], "embedding": pa.array([[0.0] * D] * n, pa.list_(pa.float32()))})
    big = big.append_column("data", pa.array(["{" + " " * 4000 + "}"] * n, pa.string()))
    path = acme / "bomb" / "part-1.parquet"
    pq.write_table(big, path, row_group_size=1000, use_dictionary=dictionary, compression="zstd")
    assert path.stat().st_size < 200_000

    job = run_import(client, auth, run_jobs, pool["id"], f"file://{acme}/bomb/")
    assert job["status"] == "failed"
    assert "bomb/part-1.parquet" in job["error"] and "BAIT_IMPORT_MAX_BYTES" in job["error"], job["error"]
    assert "more than the limit of 4,194,304 bytes" in job["error"]
    assert job["progress"]["stage"] == stage
    assert n_items(db, pool["id"]) == 0


def test_the_job_opens_a_file_swapped_for_a_link_after_the_check_never(acme: Path, settings: Settings) -> None:
    """TOCTOU: the job resolves the source again and opens each file without following links."""
    assert settings.data_root is not None
    dataset(acme / "t", files=1, rows=3)
    outside = settings.data_root / "globex" / "x.parquet"
    write(outside, table(["s"], np.zeros((1, D))))
    (file,) = resolve_source(f"file://{acme}/t/", acme, 10)
    Path(file.path).unlink()
    os.symlink(outside, file.path)
    with pytest.raises(InvalidSource, match="cannot open it"):
        open_source_file(file, acme)
    with pytest.raises(InvalidSource, match="symbolic link out"):
        resolve_source(f"file://{acme}/t/", acme, 10)


# -------------------------------------------------------------------------- newcomers' and attackers' errors


def test_newcomer_mistakes_get_actionable_errors(client: TestClient, auth: Auth, acme: Path) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    url = f"/v1/pools/{pool['id']}/items:import"
    missing = client.post(url, json={}, headers=auth)
    assert missing.status_code == 422 and "source" in missing.text
    unknown = client.post(url, json={"source": f"file://{acme}/x", "format": "csv"}, headers=auth)
    assert unknown.status_code == 422 and "format" in unknown.text
    text = client.post(url, content=f"file://{acme}/x", headers={**auth, "Content-Type": "text/plain"})
    assert text.status_code == 422, text.text
    assert_error(start(client, auth, "no-such-pool", f"file://{acme}/x"), 404, "not_found")
    assert_error(client.get(f"/v1/pools/{pool['id']}/imports/nope", headers=auth), 404, "not_found", "import")


def test_another_tenant_gets_404_and_a_key_without_the_upload_scope_403(
    client: TestClient,
    auth: Auth,
    other_auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    acme: Path,
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    dataset(acme / "ds", files=1, rows=5)
    source = f"file://{acme}/ds/"
    job = run_import(client, auth, run_jobs, pool["id"], source)
    assert job["status"] == "succeeded", job["error"]

    assert_error(start(client, other_auth, pool["id"], source), 404, "not_found")
    assert_error(client.get(f"/v1/pools/{pool['id']}/imports/{job['id']}", headers=other_auth), 404, "not_found")
    assert_error(client.get(f"/v1/pools/{pool['id']}/imports", headers=other_auth), 404, "not_found")
    read_only = key_with(db, ("read", "label"))
    assert_error(start(client, read_only, pool["id"], source), 403, "insufficient_scope", "select")
    assert client.get(f"/v1/pools/{pool['id']}/imports/{job['id']}", headers=read_only).status_code == 200
    assert n_items(db, pool["id"]) == 5
