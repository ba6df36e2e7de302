"""Import by reference from an object store (``s3://``) against a real S3 endpoint on 127.0.0.1 (moto's server
mode, a dev dependency), read by pyarrow's own S3 client with credentials from the environment: a good dataset
(a folder and a glob), corrupt objects (the job fails naming object and row, nothing written), Parquet bombs,
hostile sources (another prefix, a sibling prefix, ``..``, a query string, credentials, an unassigned tenant,
another tenant's key), an object replaced while the job reads it, and an endpoint the outbound guard refuses."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.imports import InvalidSource, ObjectOrigin, origin_for
from service.outbound import OutboundPolicy
from service.store.models import ImportJob, Item
from tests.conftest import RunJobs, make_key
from tests.e2e.procs import free_port
from tests.moto_s3 import moto_server
from tests.service.conftest import assert_error, item_rows, make_pool, put_items
from tests.service.test_import import D, n_items, pool_version, run_import, start, table
from worker import context
from worker import import_job as import_job_module

Auth = dict[str, str]
BUCKET = "bait-import"


class S3:
    """The moto server: its endpoint and a filesystem to write the test's objects with."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        self.fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}", scheme="http", region="us-east-1", allow_bucket_creation=True
        )

    def write(self, key: str, tbl: pa.Table, row_group_size: int = 16, **kwargs: Any) -> str:
        pq.write_table(tbl, f"{BUCKET}/{key}", filesystem=self.fs, row_group_size=row_group_size, **kwargs)
        return key

    def put(self, key: str, data: bytes) -> None:
        with self.fs.open_output_stream(f"{BUCKET}/{key}") as out:
            out.write(data)

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(f"{BUCKET}/{key}") as f:
            data: bytes = f.read()
        return data

    def dataset(self, prefix: str, files: int = 3, rows: int = 50, seed: int = 0) -> tuple[list[str], np.ndarray]:
        """``files`` objects ``<prefix>/part-<f>.parquet`` of ``rows`` rows (row groups of 16), in key order."""
        rng = np.random.default_rng(seed)
        all_ids: list[str] = []
        blocks = []
        for f in range(files):
            ids = [f"f{f}-r{r}" for r in range(rows)]
            emb = rng.standard_normal((rows, D)).astype(np.float32)
            self.write(f"{prefix}/part-{f}.parquet", table(ids, emb))
            all_ids += ids
            blocks.append(emb)
        return all_ids, np.concatenate(blocks)


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3]:
    """A moto S3 server on 127.0.0.1 with one bucket (credentials in the environment, as the service takes them)."""
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    env = pytest.MonkeyPatch()
    try:
        with moto_server(log_path, env) as port:
            s3 = S3(port)
            s3.fs.create_dir(BUCKET)
            yield s3
    finally:
        env.undo()


@pytest.fixture
def s3(s3_server: S3) -> Iterator[S3]:
    """The server with an empty bucket for each test."""
    yield s3_server
    s3_server.fs.delete_dir_contents(BUCKET)


@pytest.fixture
def settings(settings: Settings, s3_server: S3) -> Settings:
    # acme may import from s3://bait-import/acme/, globex from s3://bait-import/globex/; the endpoint is on
    # 127.0.0.1, which the outbound guard lets through only because the operator allowed it.
    return settings.model_copy(
        update={
            "tenant_import_urls": {"acme": [f"s3://{BUCKET}/acme/"], "globex": [f"s3://{BUCKET}/globex/"]},
            "import_s3_endpoint": s3_server.endpoint,
            "import_s3_region": "us-east-1",
            "outbound_allow": "127.0.0.1",
            "bulk_block_bytes": 4096,
            "import_max_bytes": 4 * 2**20,
            "import_max_files": 50,
        }
    )


def assert_no_endpoint(message: str, s3: S3) -> None:
    assert "127.0.0.1" not in message and str(s3.port) not in message, message


# ------------------------------------------------------------------------------------------ a good dataset


def test_a_folder_of_objects_imports_every_row_in_key_order(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, s3: S3
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    ids, emb = s3.dataset("acme/ds", files=3, rows=50)
    nested = np.full((2, D), 0.5, np.float32)
    s3.write("acme/ds/more/part-9.parquet", table(["n0", "n1"], nested))  # sub-folders too
    s3.put("acme/ds/_SUCCESS", b"")  # skipped: Spark's markers, hidden objects, `_` folders
    s3.write("acme/ds/.hidden.parquet", table(["hidden"], nested[:1]))
    s3.write("acme/ds/_tmp/part-0.parquet", table(["tmp"], nested[:1]))
    s3.put("acme/ds/notes.txt", b"not parquet")
    s3.write("acme", table(["prefix-named-object"], nested[:1]))  # beside the prefix acme/, not under it
    before = pool_version(db, pool["id"])

    job = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/ds/")
    assert job["status"] == "succeeded", job["error"]
    assert job["counts"] == {"files": 4, "rows": 152, "created": 152, "updated": 0}
    assert job["progress"] == {"stage": "done", "done": 152, "total": 152} and job["rows_imported"] == 152
    rows = item_rows(db, pool["id"])
    assert set(rows) == set(ids) | {"n0", "n1"}
    for i in (0, 49, 50, 149):
        assert rows[ids[i]].embedding == emb[i].astype("<f4").tobytes()
    assert rows["n1"].embedding == nested[1].tobytes()
    assert pool_version(db, pool["id"]) > before

    # the folder named without its trailing `/`, and the assigned prefix itself: the same objects
    again = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/ds")
    assert again["status"] == "succeeded", again["error"]
    assert again["counts"] == {"files": 4, "rows": 152, "created": 0, "updated": 152}
    whole = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme")
    assert whole["status"] == "succeeded" and whole["counts"]["files"] == 4, whole["error"]
    assert "prefix-named-object" not in item_rows(db, pool["id"])

    # the items are selectable by a batch
    resp = client.post(f"/v1/pools/{pool['id']}/batches", json={"size": 10, "strategy": "random"}, headers=auth)
    assert resp.status_code == 202, resp.text
    run_jobs()
    batch = client.get(f"/v1/pools/{pool['id']}/batches/{resp.json()['id']}", headers=auth).json()
    assert batch["status"] == "succeeded" and len(batch["item_ids"]) == 10, batch["error"]


def test_a_glob_and_a_single_object_import_what_they_name(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, s3: S3
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    emb = np.random.default_rng(1).standard_normal((4, D)).astype(np.float32)
    data = pa.array(['{"text": "hello"}', None, None, '{"n": 3}'], pa.string())
    split = pa.array([None, "validation", None, "train"], pa.string())
    s3.write("acme/g/part-a.parquet", table(["a", "b", "c", "d"], emb, data=data, split=split))
    s3.write("acme/g/part-b.parquet", table(["e"], emb[:1]))
    s3.write("acme/g/other.parquet", table(["zzz"], emb[:1]))  # not matched by the glob

    job = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/g/part-*.parquet")
    assert job["status"] == "succeeded", job["error"]
    assert job["counts"] == {"files": 2, "rows": 5, "created": 5, "updated": 0}
    rows = item_rows(db, pool["id"])
    assert set(rows) == {"a", "b", "c", "d", "e"}
    assert rows["a"].embedding == emb[0].tobytes() and rows["a"].data == {"text": "hello"}
    assert rows["b"].split == "validation" and rows["d"].data == {"n": 3}

    one = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/g/other.parquet")
    assert one["status"] == "succeeded" and one["counts"]["files"] == 1, one["error"]
    assert "zzz" in item_rows(db, pool["id"])


# --------------------------------------------------------------------------------------- corrupt datasets


@pytest.mark.parametrize(
    ("problem", "fragments"),
    [
        ("truncated", ["bad/part-1.parquet", "not a readable Parquet file"]),
        ("ragged", ["bad/part-1.parquet", "row 37", "ragged"]),
        ("nan", ["bad/part-1.parquet, row 37", "finite"]),
        ("duplicate", ["bad/part-1.parquet, row 37", "f0-r5"]),
    ],
)
def test_a_corrupt_object_fails_the_job_naming_object_and_row_and_writes_nothing(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    s3: S3,
    problem: str,
    fragments: list[str],
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    put_items(client, auth, pool["id"], ["keep"], np.zeros((1, D), np.float32))
    before = pool_version(db, pool["id"])
    s3.dataset("acme/bad", files=3, rows=50)
    ids = [f"f1-r{r}" for r in range(50)]
    emb: list[Any] = [list(v) for v in np.random.default_rng(2).standard_normal((50, D))]
    if problem == "truncated":
        raw = s3.get("acme/bad/part-1.parquet")
        s3.put("acme/bad/part-1.parquet", raw[: len(raw) // 2])
    else:
        if problem == "ragged":
            emb[37] = emb[37][:-1]
        elif problem == "nan":
            emb[37][3] = float("nan")
        else:
            ids[37] = "f0-r5"  # an id of the first object
        s3.write("acme/bad/part-1.parquet", table(ids, emb))

    job = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/bad/")
    assert job["status"] == "failed"
    for fragment in fragments:
        assert fragment in job["error"], (fragment, job["error"])
    assert "acme/bad" not in job["error"]  # named relative to the assigned prefix
    assert_no_endpoint(job["error"], s3)
    assert job["rows_imported"] == 0 and job["counts"] == {}
    assert set(item_rows(db, pool["id"])) == {"keep"}  # zero items written, nothing half-visible
    assert pool_version(db, pool["id"]) == before


@pytest.mark.parametrize(("dictionary", "stage"), [(False, "open"), (True, "validate")])
def test_a_parquet_bomb_in_the_bucket_fails_the_job_within_the_limits(
    client: TestClient, auth: Auth, db: sessionmaker[Session], run_jobs: RunJobs, s3: S3, dictionary: bool, stage: str
) -> None:
    """8 MB inflated (the limit is 4 MB), a few KB stored: plainly written, the footer declares it and the job
    fails before reading a row; dictionary-encoded, the footer understates it and the job fails as it decodes."""
    pool = make_pool(client, auth, embedding_dim=D)
    s3.dataset("acme/bomb", files=1, rows=10)
    n = 2000
    big = pa.table({"id": [f"b{i}" for i in range(n)], "embedding": pa.array([[0.0] * D] * n, pa.list_(pa.float32()))})
    big = big.append_column("data", pa.array(["{" + " " * 4000 + "}"] * n, pa.string()))
    s3.write("acme/bomb/part-1.parquet", big, row_group_size=1000, use_dictionary=dictionary, compression="zstd")
    assert len(s3.get("acme/bomb/part-1.parquet")) < 200_000

    job = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/bomb/")
    assert job["status"] == "failed"
    assert "bomb/part-1.parquet" in job["error"] and "BAIT_IMPORT_MAX_BYTES" in job["error"], job["error"]
    assert "more than the limit of 4,194,304 bytes" in job["error"]
    assert job["progress"]["stage"] == stage
    assert n_items(db, pool["id"]) == 0


def test_an_object_replaced_while_the_job_reads_it_fails_the_import(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    s3: S3,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The ``open`` stage records each object's size, ETag and Last-Modified; one that differs when the job
    opens it again fails the job, and nothing is written."""
    pool = make_pool(client, auth, embedding_dim=D)
    s3.dataset("acme/swap", files=2, rows=20)
    real_open_all = import_job_module._open_all

    def open_then_swap(*args: Any, **kwargs: Any) -> Any:
        opened = real_open_all(*args, **kwargs)
        s3.write("acme/swap/part-1.parquet", table([f"x{i}" for i in range(20)], np.ones((20, D))))
        return opened

    monkeypatch.setattr(import_job_module, "_open_all", open_then_swap)
    job = run_import(client, auth, run_jobs, pool["id"], f"s3://{BUCKET}/acme/swap/")
    assert job["status"] == "failed"
    assert "swap/part-1.parquet: the file changed while it was imported" in job["error"], job["error"]
    assert n_items(db, pool["id"]) == 0


# ---------------------------------------------------------------------------------------- hostile sources


def test_hostile_sources_are_refused_before_anything_is_written(
    client: TestClient, auth: Auth, db: sessionmaker[Session], s3: S3
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    s3.dataset("acme/ds", files=1, rows=5)
    s3.dataset("globex/secret", files=1, rows=5)
    s3.dataset("acme-evil/ds", files=1, rows=5)  # a sibling of acme's prefix
    b = f"s3://{BUCKET}"
    cases = [
        (f"{b}/globex/secret/", "outside the object-store prefixes assigned to this tenant"),  # another prefix
        (f"{b}/acme-evil/ds/", "outside the object-store prefixes"),  # s3://b/acme does not admit acme-evil
        (f"{b}/acme-evil/*.parquet", "outside the object-store prefixes"),
        (f"{b}/", "outside the object-store prefixes"),  # the whole bucket
        ("s3://another-bucket/acme/ds/", "outside the object-store prefixes"),
        (f"{b}/acme/../globex/secret/", "`..` segments"),
        (f"{b}/acme/%2e%2e/globex/secret/", "`..` segments"),
        (f"{b}/acme/./ds/", "`..` segments"),
        (f"{b}/acme//ds/", "empty segments"),
        (f"{b}/acme/ds/?endpoint_override=169.254.169.254&scheme=http", "query string"),
        (f"{b}/acme/ds/?region=eu-west-1", "BAIT_IMPORT_S3_ENDPOINT"),
        (f"s3://AKIAEXAMPLE:hunter2@{BUCKET}/acme/ds/", "must not carry credentials"),
        (f"{b}/acme/ds/#frag", "fragment"),
        (f"s3://{BUCKET}:9000/acme/ds/", "not an S3 bucket name"),
        ("s3://169.254.169.254/acme/", "outside the object-store prefixes"),
        (f"{b}/acme/*/part-0.parquet", "only be in the last part"),
        (f"{b}/acme/nothing-here.parquet", "nothing at nothing-here.parquet"),
        (f"{b}/acme/ds/*.csv", "no Parquet files found"),
        ("gs://bucket/acme/ds/", "gs:// sources are not supported"),
        ("s3a://bucket/acme/ds/", "s3a:// sources are not supported"),
    ]
    for source, fragment in cases:
        err = assert_error(start(client, auth, pool["id"], source), 400, "invalid_source", fragment)
        assert "hunter2" not in err["message"] and "secret/part-0" not in err["message"]
        assert_no_endpoint(err["message"], s3)
    with session_scope(db) as s:
        assert s.execute(select(Item)).first() is None
    assert client.get(f"/v1/pools/{pool['id']}/imports", headers=auth).json()["imports"] == []


def test_a_tenant_without_assigned_prefixes_and_another_tenants_key_are_refused(
    client: TestClient,
    auth: Auth,
    other_auth: Auth,
    db: sessionmaker[Session],
    run_jobs: RunJobs,
    s3: S3,
) -> None:
    pool = make_pool(client, auth, embedding_dim=D)
    s3.dataset("acme/ds", files=1, rows=5)
    source = f"s3://{BUCKET}/acme/ds/"
    # a tenant the operator assigned no prefix
    initech = {"Authorization": f"Bearer {make_key(db, 'initech')}"}
    own = make_pool(client, initech, embedding_dim=D)
    assert_error(start(client, initech, own["id"], source), 400, "invalid_source", "BAIT_TENANT_IMPORT_URLS", "s3://")
    # globex: acme's pool is not found, and acme's objects are outside globex's prefix
    assert_error(start(client, other_auth, pool["id"], source), 404, "not_found")
    theirs = make_pool(client, other_auth, embedding_dim=D)
    err = assert_error(start(client, other_auth, theirs["id"], source), 400, "invalid_source", "outside")
    assert f"s3://{BUCKET}/globex/" in err["message"]  # its own prefixes, so it can act on the message
    with session_scope(db) as s:
        assert s.execute(select(Item)).first() is None
        assert s.execute(select(ImportJob)).first() is None

    job = run_import(client, auth, run_jobs, pool["id"], source)
    assert job["status"] == "succeeded", job["error"]
    assert_error(client.get(f"/v1/pools/{pool['id']}/imports/{job['id']}", headers=other_auth), 404, "not_found")
    assert n_items(db, pool["id"]) == 5 and n_items(db, theirs["id"]) == 0


# ------------------------------------------------------------------------------------------ outbound guard


def test_an_endpoint_the_outbound_guard_refuses_fails_with_a_clear_error(
    limited_client: Any, auth: Auth, db: sessionmaker[Session], s3: S3, settings: Settings
) -> None:
    s3.dataset("acme/ds", files=1, rows=5)
    source = f"s3://{BUCKET}/acme/ds/"
    refusing = limited_client(outbound_allow="")  # 127.0.0.1 is loopback: refused unless allowed
    pool = make_pool(refusing, auth, embedding_dim=D)
    err = assert_error(
        start(refusing, auth, pool["id"], source), 400, "invalid_source", "outbound guard", "BAIT_OUTBOUND_ALLOW"
    )
    assert_no_endpoint(err["message"], s3)

    # a job whose worker's guard refuses the endpoint (the setting changed after the request) fails the same way
    with session_scope(db) as s:
        job = ImportJob(pool_id=pool["id"], source=source, status="queued", created_at=datetime.now(UTC))
        s.add(job)
        s.flush()
        job_id = job.id
    context.configure(settings.model_copy(update={"outbound_allow": ""}))
    try:
        import_job_module.run_import(job_id)
    finally:
        context.configure(settings)
    out = refusing.get(f"/v1/pools/{pool['id']}/imports/{job_id}", headers=auth).json()
    assert out["status"] == "failed" and "outbound guard" in out["error"], out
    assert_no_endpoint(out["error"], s3)
    assert n_items(db, pool["id"]) == 0


def test_a_store_that_does_not_answer_is_named_without_its_address(s3: S3, settings: Settings) -> None:
    """pyarrow's errors name the host it failed to reach: the message a tenant reads does not."""
    dead = f"http://127.0.0.1:{free_port()}"
    origin = ObjectOrigin((f"{BUCKET}/acme/",), dead, "us-east-1", OutboundPolicy.parse("127.0.0.1"))
    with pytest.raises(InvalidSource) as err:
        origin.resolve(f"s3://{BUCKET}/acme/ds/x.parquet", 10)
    assert "did not answer" in err.value.message and dead.rsplit(":", 1)[1] not in err.value.message


def test_settings_normalize_prefixes_and_refuse_urls_with_options() -> None:
    s = Settings(
        tenant_import_urls={"acme": ["s3://b-1/acme", "s3://b-2/", "s3://b-3"]},
        import_s3_endpoint="http://minio.internal:9000/",
    )
    assert s.tenant_import_urls == {"acme": ["s3://b-1/acme/", "s3://b-2/", "s3://b-3/"]}
    assert s.import_s3_endpoint == "http://minio.internal:9000"
    origin = origin_for("s3://b-1/acme/x.parquet", s, "acme")
    assert isinstance(origin, ObjectOrigin) and origin.prefixes == ("b-1/acme/", "b-2/", "b-3/")
    for bad in (
        {"tenant_import_urls": {"acme": ["s3://b-1/acme/?endpoint_override=10.0.0.1"]}},
        {"tenant_import_urls": {"acme": ["s3://key:secret@b-1/acme/"]}},
        {"tenant_import_urls": {"acme": ["file:///srv/acme"]}},
        {"tenant_import_urls": {"acme": ["s3://b-1/acme/*.parquet"]}},
        {"tenant_import_urls": {"acme": ["s3://b-1/acme/../"]}},
        {"import_s3_endpoint": "ftp://minio:21"},
        {"import_s3_endpoint": "http://user:pw@minio:9000"},
        {"import_s3_endpoint": "http://minio:9000/bucket"},
        {"import_s3_region": "us-east-1?x"},
    ):
        with pytest.raises(ValueError):
            Settings(**bad)
