"""Bulk item files: .npz and Parquet, raw body or multipart; malformed files write nothing."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.service.conftest import assert_error, embeddings, item_rows, make_pool, put_items

Auth = dict[str, str]


def npz_bytes(compressed: bool = False, **arrays: Any) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def ids_of(n: int, prefix: str = "x") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def bulk(client: TestClient, auth: Auth, pool_id: str, body: bytes, **params: str) -> Any:
    return client.post(
        f"/v1/pools/{pool_id}/items:bulk",
        content=body,
        params=params,
        headers={**auth, "Content-Type": "application/octet-stream"},
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("compressed", [False, True])
def test_npz_upload_round_trips_float32_bytes(
    client: TestClient, auth: Auth, db: sessionmaker[Session], dtype: Any, compressed: bool
) -> None:
    pool = make_pool(client, auth)
    ids = ids_of(50)
    emb = np.random.default_rng(3).standard_normal((50, 4)).astype(dtype)
    resp = bulk(client, auth, pool["id"], npz_bytes(compressed, ids=np.array(ids), embeddings=emb))
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"created": 50, "updated": 0}
    rows = item_rows(db, pool["id"])
    assert len(rows) == 50
    for i, ext in enumerate(ids):
        assert rows[ext].embedding == emb[i].astype("<f4").tobytes()


def test_bulk_upload_is_an_idempotent_upsert_keeping_labels(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["x0"], embeddings(1, seed=9))
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "x0", "label": "cat"}]}, headers=auth)
    emb = embeddings(10, seed=1)
    body = npz_bytes(ids=np.array(ids_of(10)), embeddings=emb)
    assert bulk(client, auth, pool["id"], body).json() == {"created": 9, "updated": 1}
    assert bulk(client, auth, pool["id"], body).json() == {"created": 0, "updated": 10}
    rows = item_rows(db, pool["id"])
    assert len(rows) == 10
    assert (rows["x0"].label, rows["x0"].status, rows["x0"].embedding) == ("cat", "labeled", emb[0].tobytes())


def test_bulk_items_list_in_file_order(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    ids = ["z", "a", "m", "b"]
    bulk(client, auth, pool["id"], npz_bytes(ids=np.array(ids), embeddings=embeddings(4)))
    page = client.get(f"/v1/pools/{pool['id']}/items", headers=auth).json()
    assert [it["id"] for it in page["items"]] == ids


@pytest.mark.parametrize("value_type", [pa.float32(), pa.float64()])
@pytest.mark.parametrize("list_kind", ["list", "large_list", "fixed_size_list"])
def test_parquet_upload_round_trips_float32_bytes(
    client: TestClient, auth: Auth, db: sessionmaker[Session], value_type: Any, list_kind: str
) -> None:
    pool = make_pool(client, auth)
    ids = ids_of(20)
    emb = embeddings(20, seed=4).astype(np.float64)
    typ = {
        "list": pa.list_(value_type),
        "large_list": pa.large_list(value_type),
        "fixed_size_list": pa.list_(value_type, 4),
    }[list_kind]
    table = pa.table({"id": ids, "embedding": pa.array(emb.tolist(), type=typ)})
    resp = bulk(client, auth, pool["id"], parquet_bytes(table))
    assert resp.status_code == 200, resp.text
    assert resp.json() == {"created": 20, "updated": 0}
    rows = item_rows(db, pool["id"])
    for i, ext in enumerate(ids):
        assert rows[ext].embedding == emb[i].astype("<f4").tobytes()


def test_parquet_columns_can_be_renamed_by_query_params(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    table = pa.table({"key": ["a", "b"], "vec": embeddings(2).tolist(), "other": [1, 2]})
    resp = bulk(client, auth, pool["id"], parquet_bytes(table), id_column="key", embedding_column="vec")
    assert resp.json() == {"created": 2, "updated": 0}
    assert sorted(item_rows(db, pool["id"])) == ["a", "b"]


def test_npz_arrays_can_be_renamed_by_query_params(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    body = npz_bytes(names=np.array(["a"]), X=embeddings(1))
    assert bulk(client, auth, pool["id"], body, id_column="names", embedding_column="X").json()["created"] == 1


def test_multipart_upload_of_npz_file(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(5)
    body = npz_bytes(ids=np.array(ids_of(5)), embeddings=emb)
    resp = client.post(
        f"/v1/pools/{pool['id']}/items:bulk",
        files={"file": ("items.npz", body, "application/octet-stream")},
        headers=auth,
    )
    assert resp.json() == {"created": 5, "updated": 0}
    assert item_rows(db, pool["id"])["x4"].embedding == emb[4].tobytes()


# ----------------------------------------------------------------------------- malformed: nothing written


def _rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], body: bytes, status: int, code: str, *frag: str
) -> dict[str, Any]:
    pool = make_pool(client, auth)
    err = assert_error(bulk(client, auth, pool["id"], body), status, code, *frag)
    assert item_rows(db, pool["id"]) == {}
    return err


def test_bulk_rejects_nan_in_npz(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    emb = embeddings(3)
    emb[2, 1] = np.nan
    body = npz_bytes(ids=np.array(ids_of(3)), embeddings=emb)
    err = _rejected(client, auth, db, body, 400, "invalid_embedding", "finite", "'x2'")
    assert err["details"] == {"ids": ["x2"]}


def test_bulk_rejects_inf_in_parquet(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    rows = embeddings(2).tolist()
    rows[0][3] = float("inf")
    body = parquet_bytes(pa.table({"id": ["a", "b"], "embedding": rows}))
    _rejected(client, auth, db, body, 400, "invalid_embedding", "'a'")


def test_bulk_rejects_wrong_dimension(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(ids_of(3)), embeddings=embeddings(3, d=5))
    err = _rejected(client, auth, db, body, 400, "invalid_embedding", "expected 4, got 5")
    assert err["details"] == {"expected": 4, "got": 5}


def test_bulk_rejects_duplicate_ids(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(["a", "b", "a"]), embeddings=embeddings(3))
    _rejected(client, auth, db, body, 400, "duplicate_id", "'a'")


def test_bulk_rejects_empty_id(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(["a", ""]), embeddings=embeddings(2))
    _rejected(client, auth, db, body, 422, "validation_error", "non-empty")


def test_bulk_rejects_npz_without_ids(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(embeddings=embeddings(2))
    err = _rejected(client, auth, db, body, 400, "invalid_file", "'ids'")
    assert err["details"] == {"missing": "ids"}


def test_bulk_rejects_numeric_ids(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.arange(2), embeddings=embeddings(2))
    _rejected(client, auth, db, body, 400, "invalid_file", "must hold strings")


def test_bulk_rejects_integer_embeddings(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(["a", "b"]), embeddings=np.ones((2, 4), dtype=np.int64))
    _rejected(client, auth, db, body, 400, "invalid_file", "float32 or float64")


def test_bulk_rejects_object_arrays_without_unpickling(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    body = npz_bytes(ids=np.array(["a", "b"], dtype=object), embeddings=embeddings(2))
    _rejected(client, auth, db, body, 400, "invalid_file", "pickles are refused")


def test_bulk_rejects_row_count_mismatch(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(ids_of(3)), embeddings=embeddings(2))
    _rejected(client, auth, db, body, 400, "invalid_file", "3 ids but 2 embedding rows")


def test_bulk_rejects_truncated_npz(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = npz_bytes(ids=np.array(ids_of(30)), embeddings=embeddings(30))
    _rejected(client, auth, db, body[: len(body) // 2], 400, "invalid_file")


def test_bulk_rejects_ragged_parquet(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = parquet_bytes(pa.table({"id": ["a", "b", "c"], "embedding": [[0.0] * 4, [0.0] * 4, [0.0] * 3]}))
    err = _rejected(client, auth, db, body, 400, "invalid_file", "ragged", "row 2 has 3")
    assert err["details"] == {"row": 2}


def test_bulk_rejects_parquet_missing_column(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = parquet_bytes(pa.table({"id": ["a"], "vector": [[0.0] * 4]}))
    _rejected(client, auth, db, body, 400, "invalid_file", "no column 'embedding'")


def test_bulk_rejects_parquet_wrong_types(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = parquet_bytes(pa.table({"id": ["a"], "embedding": [[1, 2, 3, 4]]}))
    _rejected(client, auth, db, body, 400, "invalid_file", "float32 or float64")


def test_bulk_rejects_parquet_null_values(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    body = parquet_bytes(pa.table({"id": ["a"], "embedding": [[1.0, None, 3.0, 4.0]]}))
    _rejected(client, auth, db, body, 400, "invalid_file", "null")


def test_bulk_rejects_bare_npy_with_415(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    buf = io.BytesIO()
    np.save(buf, embeddings(2))
    _rejected(client, auth, db, buf.getvalue(), 415, "unsupported_media_type", "no item ids")


def test_bulk_rejects_unknown_format_with_415(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    _rejected(client, auth, db, b"id,embedding\na,1 2 3 4\n", 415, "unsupported_media_type", ".npz or a Parquet")


def test_bulk_rejects_oversize_upload(
    limited_client,
    auth: Auth,
    db: sessionmaker[Session],  # type: ignore[no-untyped-def]
) -> None:
    client = limited_client(max_upload_bytes=4096)
    pool = make_pool(client, auth)
    body = npz_bytes(ids=np.array(ids_of(300)), embeddings=embeddings(300))
    assert_error(bulk(client, auth, pool["id"], body), 413, "payload_too_large", "4096")
    assert item_rows(db, pool["id"]) == {}


def test_bulk_rejects_npz_that_inflates_beyond_the_limit(
    limited_client,
    auth: Auth,
    db: sessionmaker[Session],  # type: ignore[no-untyped-def]
) -> None:
    client = limited_client(max_upload_inflated_bytes=8192)
    pool = make_pool(client, auth)
    body = npz_bytes(True, ids=np.array(ids_of(1000)), embeddings=np.zeros((1000, 4), dtype=np.float32))
    assert len(body) < 8192
    err = assert_error(bulk(client, auth, pool["id"], body), 413, "payload_too_large", "inflates", "8,192")
    assert err["details"]["limit_bytes"] == 8192
    assert item_rows(db, pool["id"]) == {}


def test_bulk_upload_to_other_tenants_pool_is_404(
    client: TestClient, auth: Auth, other_auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    body = npz_bytes(ids=np.array(["a"]), embeddings=embeddings(1))
    assert_error(bulk(client, other_auth, pool["id"], body), 404, "not_found")
    assert item_rows(db, pool["id"]) == {}
