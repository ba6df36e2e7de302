"""Input limits (issue #10, "Safe to share"): strings that cannot be stored, ids that cannot be routed,
range checks before 202, class and head budgets, decompression bombs, JSON 500/503/405 answers.

Every refusal is checked to leave the database as it was. Runs on both backends (on PostgreSQL, a NUL byte
used to reach the driver and come back as a plain-text 500).
"""

from __future__ import annotations

import io
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import make_sessionmaker
from service.domain import pools as pools_domain
from service.main import create_app
from service.store.models import Batch, Item, Label, Pool, SelectJob
from tests.conftest import PG_ADMIN_URL, REDIS_URL
from tests.e2e.procs import free_port
from tests.service.bombs import MIB, Member, bomb_npz, npy_header, zip_bytes
from tests.service.conftest import assert_error, embeddings, make_pool, put_items
from tests.service.test_batches import post_batch
from tests.worker.factories import make_pool as factory_pool

Auth = dict[str, str]


def counts(db: sessionmaker[Session]) -> dict[str, int]:
    with db() as s:
        return {
            m.__tablename__: int(s.execute(select(func.count()).select_from(m)).scalar_one())
            for m in (Pool, Item, Label, Batch, SelectJob)
        }


@pytest.fixture
def pool(client: TestClient, auth: Auth) -> dict[str, Any]:
    p = make_pool(client, auth)
    put_items(client, auth, p["id"], ["a", "b", "c", "d"], embeddings(4))
    return p


def npz(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def bulk(client: TestClient, auth: Auth, pool_id: str, body: bytes) -> Any:
    return client.post(
        f"/v1/pools/{pool_id}/items:bulk", content=body, headers={**auth, "Content-Type": "application/octet-stream"}
    )


def select_npz(client: TestClient, auth: Auth, body: bytes, **fields: str) -> Any:
    data = {"strategy": "random", "batch_size": "2", **fields}
    return client.post(
        "/v1/select", files={"arrays": ("a.npz", body, "application/octet-stream")}, data=data, headers=auth
    )


# ------------------------------------------------------------------------------ NUL bytes, surrogates


@pytest.mark.parametrize(
    ("where", "make_request"),
    [
        ("pool name", lambda c, a, p: c.post("/v1/pools", json={**_POOL, "name": "a\x00b"}, headers=a)),
        ("class name", lambda c, a, p: c.post("/v1/pools", json={**_POOL, "classes": ["x", "y\x00"]}, headers=a)),
        (
            "item id",
            lambda c, a, p: c.post(
                f"/v1/pools/{p['id']}/items", json={"items": [{"id": "e\x00", "embedding": [0.0] * 4}]}, headers=a
            ),
        ),
        (
            "label",
            lambda c, a, p: c.put(
                f"/v1/pools/{p['id']}/labels", json={"labels": [{"item_id": "a", "label": "cat\x00"}]}, headers=a
            ),
        ),
        (
            "label item id",
            lambda c, a, p: c.put(
                f"/v1/pools/{p['id']}/labels", json={"labels": [{"item_id": "a\x00", "label": "cat"}]}, headers=a
            ),
        ),
        (
            "annotator",
            lambda c, a, p: c.put(
                f"/v1/pools/{p['id']}/labels",
                json={"labels": [{"item_id": "a", "label": "cat"}], "annotator": "ann\x00"},
                headers=a,
            ),
        ),
        (
            "batch strategy",
            lambda c, a, p: c.post(f"/v1/pools/{p['id']}/batches", json={"size": 1, "strategy": "ba\x00it"}, headers=a),
        ),
        (
            "batch param key",
            lambda c, a, p: c.post(
                f"/v1/pools/{p['id']}/batches", json={"size": 1, "params": {"l\x00am": 1.0}}, headers=a
            ),
        ),
        (
            "batch param value",
            lambda c, a, p: c.post(
                f"/v1/pools/{p['id']}/batches", json={"size": 1, "params": {"convention": "paper\x00"}}, headers=a
            ),
        ),
        (
            "select params",
            lambda c, a, p: c.post(
                "/v1/select",
                json={"strategy": "random", "batch_size": 1, "embeddings": [[0.0]], "params": {"x": "\x00"}},
                headers=a,
            ),
        ),
        ("URL path", lambda c, a, p: c.get("/v1/pools/%00", headers=a)),
        ("URL path item", lambda c, a, p: c.get(f"/v1/pools/{p['id']}/items/a%00b", headers=a)),
        ("URL path delete", lambda c, a, p: c.delete(f"/v1/pools/{p['id']}%00", headers=a)),
        ("query string", lambda c, a, p: c.get(f"/v1/pools/{p['id']}/items?cursor=%00", headers=a)),
        ("invalid UTF-8 in the URL", lambda c, a, p: c.get("/v1/pools/%ff%fe", headers=a)),
    ],
)
def test_nul_bytes_are_400_invalid_string_and_nothing_is_written(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], where: str, make_request: Any
) -> None:
    before = counts(db)
    resp = make_request(client, auth, pool)
    err = assert_error(resp, 400, "invalid_string")
    assert err["message"], where
    assert counts(db) == before


_POOL: dict[str, Any] = {
    "name": "p",
    "task": "classification",
    "classes": ["x", "y"],
    "embedding_dim": 4,
    "head": {"kind": "linear"},
}


@pytest.mark.parametrize(
    "raw_body",
    [
        b'{"name": "a\\ud800", "task": "classification", "classes": ["x", "y"], "embedding_dim": 4}',
        b'{"name": "a", "task": "classification", "classes": ["x", "\\udfff"], "embedding_dim": 4}',
    ],
)
def test_lone_surrogates_in_json_are_400(
    client: TestClient, auth: Auth, db: sessionmaker[Session], raw_body: bytes
) -> None:
    before = counts(db)
    resp = client.post("/v1/pools", content=raw_body, headers={**auth, "Content-Type": "application/json"})
    assert_error(resp, 400, "invalid_string", "surrogate")
    assert counts(db) == before


def test_lone_surrogate_in_labels_is_400(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    before = counts(db)
    body = b'{"labels": [{"item_id": "a", "label": "c\\ud83d"}]}'
    resp = client.put(
        f"/v1/pools/{pool['id']}/labels", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert_error(resp, 400, "invalid_string", "surrogate")
    assert counts(db) == before


def test_a_nul_free_pool_name_with_unicode_is_fine(client: TestClient, auth: Auth) -> None:
    resp = client.post("/v1/pools", json={**_POOL, "name": "chats 🐈 ünïcode"}, headers=auth)
    assert resp.status_code == 201, resp.text


# ------------------------------------------------------------------------------------------- ids


@pytest.mark.parametrize("bad_id", ["a/b", "/", "tab\there", "new\nline", "del\x7f", "bell\x07"])
def test_ids_with_slash_or_control_characters_are_refused_in_json(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], bad_id: str
) -> None:
    before = counts(db)
    resp = client.post(
        f"/v1/pools/{pool['id']}/items", json={"items": [{"id": bad_id, "embedding": [0.0] * 4}]}, headers=auth
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["code"] == "invalid_id"
    assert counts(db) == before


@pytest.mark.parametrize("bad_id", ["a/b", "x\x01y", "nl\n"])
def test_ids_with_slash_or_control_characters_are_refused_in_npz(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], bad_id: str
) -> None:
    before = counts(db)
    body = npz(ids=np.array(["ok1", bad_id]), embeddings=embeddings(2))
    assert_error(bulk(client, auth, pool["id"], body), 400, "invalid_id")
    assert counts(db) == before


@pytest.mark.parametrize("bad_id", ["a/b", "x\x00y", "cr\r"])
def test_ids_with_slash_or_control_characters_are_refused_in_parquet(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], bad_id: str
) -> None:
    before = counts(db)
    table = pa.table({"id": ["ok1", bad_id], "embedding": [[0.0] * 4, [1.0] * 4]})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    assert_error(bulk(client, auth, pool["id"], buf.getvalue()), 400, "invalid_id")
    assert counts(db) == before


def test_id_with_a_slash_is_refused_in_labels(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    before = counts(db)
    resp = client.put(
        f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a/b", "label": "cat"}]}, headers=auth
    )
    assert_error(resp, 400, "invalid_id", "item_id", "'/'")
    assert counts(db) == before


# ------------------------------------------------------------------------------ strict batch requests


@pytest.mark.parametrize("size", ["5", 5.0, True])
def test_batch_size_must_be_a_json_integer(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], size: Any
) -> None:
    before = counts(db)
    resp = client.post(f"/v1/pools/{pool['id']}/batches", json={"size": size}, headers=auth)
    assert_error(resp, 422, "validation_error", "size")
    assert counts(db) == before


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"lam": 0}, "lam"),
        ({"lam": -1.5}, "lam"),
        ({"seed": 2**63}, "seed"),
        ({"seed": -1}, "seed"),
        ({"oversample": 0.5}, "oversample"),
        ({"convention": "nope"}, "convention"),
        ({"approx": "pca", "approx_dim": 5}, "approx_dim"),  # above the pool's embedding_dim of 4
    ],
)
def test_out_of_range_params_are_400_before_202_and_nothing_is_written(
    client: TestClient,
    auth: Auth,
    db: sessionmaker[Session],
    pool: dict[str, Any],
    params: dict[str, Any],
    fragment: str,
) -> None:
    before = counts(db)
    resp = client.post(f"/v1/pools/{pool['id']}/batches", json={"size": 1, "params": params}, headers=auth)
    assert_error(resp, 400, "bad_request", fragment)
    assert counts(db) == before


def test_out_of_range_seed_in_stateless_select_is_400(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    before = counts(db)
    body = {"strategy": "random", "batch_size": 1, "embeddings": [[0.0], [1.0]], "params": {"seed": 2**63}}
    assert_error(client.post("/v1/select", json=body, headers=auth), 400, "bad_request", "seed")
    assert counts(db) == before


# ------------------------------------------------------------------------------ class and head budgets


def test_40000_classes_are_refused_fast(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    before = counts(db)
    classes = [f"class-{i}" for i in range(40_000)]
    t0 = time.monotonic()
    resp = client.post("/v1/pools", json={**_POOL, "classes": classes}, headers=auth)
    elapsed = time.monotonic() - t0
    assert_error(resp, 422, "validation_error", "classes")
    assert elapsed < 5.0, f"refusing 40,000 classes took {elapsed:.1f} s"
    assert counts(db) == before


def test_10000_distinct_classes_are_checked_in_linear_time(client: TestClient, auth: Auth) -> None:
    classes = [f"c{i}" for i in range(10_000)]
    t0 = time.monotonic()
    resp = client.post("/v1/pools", json={**_POOL, "classes": [*classes[:-1], "c0"]}, headers=auth)
    assert_error(resp, 422, "validation_error", "unique", "c0")
    resp = client.post("/v1/pools", json={**_POOL, "classes": classes, "embedding_dim": 16}, headers=auth)
    assert resp.status_code == 201, resp.text
    assert time.monotonic() - t0 < 10.0


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"embedding_dim": 65536, "head": {"kind": "mlp", "hidden": 4096}}, "mlp head"),
        ({"classes": [f"c{i}" for i in range(5000)], "embedding_dim": 8192, "head": {"kind": "linear"}}, "linear head"),
        ({"task": "regression", "classes": None, "n_outputs": 10_000, "embedding_dim": 4096}, "parameters"),
    ],
)
def test_head_above_the_parameter_budget_is_422_naming_it(
    client: TestClient, auth: Auth, db: sessionmaker[Session], body: dict[str, Any], fragment: str
) -> None:
    before = counts(db)
    resp = client.post("/v1/pools", json={**_POOL, **body}, headers=auth)
    assert_error(resp, 422, "validation_error", fragment, "20,000,000")
    assert counts(db) == before


# ------------------------------------------------------------------------------ 405, 500, 503


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/pools", {"GET", "POST"}),
        ("POST", "/v1/pools/some-pool", {"GET", "PATCH", "DELETE"}),
        ("GET", "/v1/select", {"POST"}),
        ("DELETE", "/healthz", {"GET"}),
    ],
)
def test_405_has_an_allow_header_with_every_method_of_the_path(
    client: TestClient, auth: Auth, method: str, path: str, allow: set[str]
) -> None:
    resp = client.request(method, path, headers=auth)
    assert_error(resp, 405, "method_not_allowed")
    assert {m.strip() for m in resp.headers["allow"].split(",")} == allow


def test_an_unhandled_exception_is_a_json_500_without_its_text(
    settings: Settings, db: sessionmaker[Session], auth: Auth, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("SECRET: /etc/shadow and SELECT * FROM api_keys")

    monkeypatch.setattr(pools_domain, "list_pools", boom)
    with TestClient(create_app(settings), raise_server_exceptions=False) as c:
        resp = c.get("/v1/pools", headers=auth)
    assert_error(resp, 500, "internal_error")
    assert resp.headers["content-type"].startswith("application/json")
    assert "SECRET" not in resp.text and "shadow" not in resp.text


def _unreachable_database_url(tmp_path: Any) -> str:
    if PG_ADMIN_URL:
        return f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nothing?connect_timeout=2"
    return f"sqlite:///{tmp_path}/missing-folder/cannot-open.db"


def test_database_outage_is_503_with_retry_after(
    client: TestClient, auth: Auth, db: sessionmaker[Session], tmp_path: Any
) -> None:
    assert client.get("/v1/pools", headers=auth).status_code == 200
    broken = create_engine(_unreachable_database_url(tmp_path))
    app: Any = client.app
    healthy = app.state.sessionmaker
    app.state.sessionmaker = make_sessionmaker(broken)
    try:
        for resp in (
            client.get("/v1/pools", headers=auth),
            client.post("/v1/pools", json=_POOL, headers=auth),
        ):
            err = assert_error(resp, 503, "unavailable", "database")
            assert int(resp.headers["retry-after"]) > 0
            assert "psycopg" not in err["message"] and "sqlite" not in err["message"].lower()
    finally:
        app.state.sessionmaker = healthy
        broken.dispose()
    assert client.get("/v1/pools", headers=auth).status_code == 200


@pytest.mark.skipif(not REDIS_URL, reason="the queue is Redis only with BAIT_TEST_REDIS_URL (PostgreSQL pass)")
def test_redis_outage_is_503_with_retry_after(
    settings: Settings, db: sessionmaker[Session], auth: Auth, client: TestClient, run_jobs: Any
) -> None:
    # Predictions wait on a job: the one request that talks to Redis before answering (batches and selections
    # are submitted after their commit and re-submitted by the recovery sweep when Redis is down).
    pool = factory_pool(db, n=20, n_labeled=5)
    # cold_start off: with 5 labels a cold start would pick without training, and predictions need a model.
    resp = post_batch(client, auth, pool.pool_id, size=2, strategy="confidence", params={"cold_start": False})
    assert resp.status_code == 202, resp.text
    run_jobs()
    dead = settings.model_copy(update={"redis_url": f"redis://127.0.0.1:{free_port()}/0"})
    with TestClient(create_app(dead), raise_server_exceptions=False) as c:
        resp = c.post(f"/v1/pools/{pool.pool_id}/predictions", json={"item_ids": ["item-00001"]}, headers=auth)
    err = assert_error(resp, 503, "unavailable", "queue")
    assert int(resp.headers["retry-after"]) > 0
    assert "127.0.0.1" not in err["message"]


# ------------------------------------------------------------------------------ decompression bombs


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """An .npz of ~3.9 GiB of zeros in ~4 MB (built without compressing anything big)."""
    return bomb_npz("embeddings", 3.9)


def test_zip_bomb_to_select_is_413_naming_the_limit(
    client: TestClient, auth: Auth, db: sessionmaker[Session], bomb: bytes, settings: Settings
) -> None:
    assert len(bomb) < 8 * MIB
    before = counts(db)
    t0 = time.monotonic()
    err = assert_error(
        select_npz(client, auth, bomb), 413, "payload_too_large", f"{settings.max_select_inflated_bytes:,}"
    )
    assert err["details"]["limit_bytes"] == settings.max_select_inflated_bytes
    assert time.monotonic() - t0 < 10
    assert counts(db) == before


def test_zip_bomb_to_bulk_upload_is_413_naming_the_limit(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any], settings: Settings
) -> None:
    body = bomb_npz("embeddings", 3.9, extra={"ids": np.array(["z1", "z2"])})
    before = counts(db)
    err = assert_error(
        bulk(client, auth, pool["id"], body), 413, "payload_too_large", f"{settings.max_upload_inflated_bytes:,}"
    )
    assert err["details"]["limit_bytes"] == settings.max_upload_inflated_bytes
    assert counts(db) == before


def test_npy_header_declaring_a_huge_shape_is_413(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    # The zip entry holds only the header (small declared size); the header claims 2**40 x 64 float32.
    body = zip_bytes([Member("embeddings.npy", npy_header((2**40, 64)))])
    before = counts(db)
    err = assert_error(select_npz(client, auth, body), 413, "payload_too_large", "1099511627776")
    assert err["details"]["inflated_bytes"] == 2**40 * 64 * 4
    ids = Member("ids.npy", _npy_bytes(np.array(["a", "b"])))
    body = zip_bytes([Member("embeddings.npy", npy_header((2**40, 64))), ids])
    assert_error(bulk(client, auth, pool["id"], body), 413, "payload_too_large")
    assert counts(db) == before


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def test_zip_entry_that_lies_about_its_size_is_400(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    # The .npy header says 1 MiB of float32 (512 x 512); the zip entry declares only the header's bytes.
    header = npy_header((512, 512))
    lying = Member("embeddings.npy", header, 1, declared_size=len(header) + 100)
    before = counts(db)
    resp = select_npz(client, auth, zip_bytes([lying]))
    assert resp.status_code == 400, resp.text
    assert "embeddings" in resp.json()["error"]["message"]
    ids = Member("ids.npy", _npy_bytes(np.array([f"i{i}" for i in range(512)])))
    resp = bulk(client, auth, pool["id"], zip_bytes([lying, ids]))
    assert_error(resp, 400, "invalid_file", "embeddings")
    assert counts(db) == before


def test_npz_entry_with_a_wrong_crc_is_400(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    bad = Member("embeddings.npy", npy_header((4, 4)), tail=b"\1" * 64, correct_crc=False)
    resp = select_npz(client, auth, zip_bytes([bad]))
    assert resp.status_code == 400, resp.text


def _parquet(rows: int, dim: int, *, dictionary: bool) -> bytes:
    table = pa.table(
        {
            "id": pa.array([f"i{i}" for i in range(rows)]),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(rows * dim, np.float32)), dim).cast(
                pa.list_(pa.float32())
            ),
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", use_dictionary=dictionary, row_group_size=rows // 4)
    return buf.getvalue()


@pytest.mark.parametrize("dictionary", [False, True], ids=["plain", "dictionary-encoded"])
def test_parquet_decompression_bomb_is_413(
    limited_client: Any, auth: Auth, db: sessionmaker[Session], dictionary: bool
) -> None:
    # 200,000 rows of 64 zeros: ~51 MB decoded, a few hundred kB compressed. With dictionary encoding the
    # footer's uncompressed sizes are small too, and the decoded bytes are what passes the budget.
    budget = 8 * MIB
    client = limited_client(max_upload_inflated_bytes=budget)
    p = make_pool(client, auth, embedding_dim=64)
    body = _parquet(200_000, 64, dictionary=dictionary)
    assert len(body) < budget
    before = counts(db)
    err = assert_error(bulk(client, auth, p["id"], body), 413, "payload_too_large", f"{budget:,}")
    assert err["details"]["limit_bytes"] == budget
    assert counts(db) == before


def test_parquet_within_the_budget_is_accepted(limited_client: Any, auth: Auth, db: sessionmaker[Session]) -> None:
    client = limited_client(max_upload_inflated_bytes=8 * MIB)
    p = make_pool(client, auth, embedding_dim=64)
    resp = bulk(client, auth, p["id"], _parquet(2000, 64, dictionary=False))
    assert resp.status_code == 200, resp.text
    assert resp.json()["created"] == 2000


def test_select_within_a_small_budget_and_above_it(limited_client: Any, auth: Auth, db: sessionmaker[Session]) -> None:
    client = limited_client(max_select_inflated_bytes=64 * 1024)
    small = npz(embeddings=np.zeros((100, 4), np.float32))
    resp = select_npz(client, auth, small, strategy="nope")
    assert_error(resp, 400, "bad_request", "nope")  # parsed, then the strategy is refused
    big = io.BytesIO()
    np.savez_compressed(big, embeddings=np.zeros((100, 256), np.float32))  # 100 kB inflated, ~1 kB sent
    assert_error(select_npz(client, auth, big.getvalue()), 413, "payload_too_large", "65,536")
