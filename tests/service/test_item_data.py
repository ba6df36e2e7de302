"""Item content (`data`): stored beside the embedding or reference, returned by the items API, in JSON
and bulk uploads; every rule a 4xx with nothing written."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.service.conftest import assert_error, embeddings, item_rows, make_pool

Auth = dict[str, str]


def upsert(client: TestClient, auth: Auth, pool_id: str, items: list[dict[str, Any]]) -> Any:
    return client.post(f"/v1/pools/{pool_id}/items", json={"items": items}, headers=auth)


def test_item_data_is_stored_and_returned_beside_the_embedding(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(2)
    r = upsert(
        client,
        auth,
        pool["id"],
        [
            {"id": "a", "embedding": emb[0].tolist(), "data": {"text": "a red fox", "meta": {"source": "web"}}},
            {"id": "b", "embedding": emb[1].tolist()},
        ],
    )
    assert r.status_code == 200, r.text
    got = client.get(f"/v1/pools/{pool['id']}/items/a", headers=auth).json()
    assert got["data"] == {"text": "a red fox", "meta": {"source": "web"}}
    listed = {i["id"]: i for i in client.get(f"/v1/pools/{pool['id']}/items", headers=auth).json()["items"]}
    assert listed["a"]["data"]["text"] == "a red fox" and "data" not in listed["b"]
    # re-sending the embedding without data keeps the data; sending data replaces it
    assert upsert(client, auth, pool["id"], [{"id": "a", "embedding": emb[1].tolist()}]).status_code == 200
    assert item_rows(db, pool["id"])["a"].data == {"text": "a red fox", "meta": {"source": "web"}}
    upsert(client, auth, pool["id"], [{"id": "a", "embedding": emb[1].tolist(), "data": {"image": "https://x/1.png"}}])
    assert item_rows(db, pool["id"])["a"].data == {"image": "https://x/1.png"}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ("just text", "must be a JSON object"),
        ([1, 2], "must be a JSON object"),
        ({"text": "x" * (70 * 1024)}, "the limit is 65536"),
        ({"text": "a\x00b"}, "NUL"),
        ({"a\x00": 1}, "NUL"),
        ({"deep": json.loads("[" * 40 + "]" * 40)}, "nested deeper"),
    ],
)
def test_invalid_item_data_is_400_and_writes_nothing(
    client: TestClient, auth: Auth, db: sessionmaker[Session], data: Any, says: str
) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(2)
    items = [{"id": "ok", "embedding": emb[0].tolist(), "data": {"text": "fine"}},
             {"id": "bad", "embedding": emb[1].tolist(), "data": data}]  # fmt: skip
    r = upsert(client, auth, pool["id"], items)
    assert r.status_code in (400, 422), r.text
    err = r.json()["error"]
    if err["code"] == "invalid_string":  # NUL bytes are refused by the request model for every string
        assert says in err["message"] and err["message"].startswith("items.1")
    elif r.status_code == 400:
        assert says in err["message"] and "'bad'" in err["message"]
    assert item_rows(db, pool["id"]) == {}


def test_item_data_rejects_nan(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    body = '{"items": [{"id": "a", "embedding": [0, 0, 0, 0], "data": {"score": NaN}}]}'
    r = client.post(f"/v1/pools/{pool['id']}/items", content=body, headers={**auth, "Content-Type": "application/json"})
    assert r.status_code in (400, 422), r.text
    assert item_rows(db, pool["id"]) == {}


def test_items_given_by_text_carry_data_too(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth, embedding_dim=384, encoder={"kind": "text-minilm"})
    r = upsert(client, auth, pool["id"], [{"id": "t", "text": "hello", "data": {"title": "greeting"}}])
    assert r.status_code == 200, r.text
    row = item_rows(db, pool["id"])["t"]
    assert row.text == "hello" and row.data == {"title": "greeting"}


def _parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _npz(**arrays: Any) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def bulk(client: TestClient, auth: Auth, pool_id: str, body: bytes, **params: str) -> Any:
    return client.post(
        f"/v1/pools/{pool_id}/items:bulk",
        content=body,
        params=params,
        headers={**auth, "Content-Type": "application/octet-stream"},
    )


def test_bulk_parquet_and_npz_carry_data_as_json_strings(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(3)
    table = pa.table(
        {
            "id": ["p0", "p1", "p2"],
            "embedding": [r.tolist() for r in emb],
            "data": [json.dumps({"text": "zero"}), None, json.dumps({"image": "https://x/2.png"})],
        }
    )
    assert bulk(client, auth, pool["id"], _parquet(table)).status_code == 200
    rows = item_rows(db, pool["id"])
    assert (
        rows["p0"].data == {"text": "zero"} and rows["p1"].data is None and rows["p2"].data["image"].endswith("2.png")
    )
    body = _npz(ids=np.array(["n0", "n1"]), embeddings=emb[:2], data=np.array([json.dumps({"text": "n"}), ""]))
    assert bulk(client, auth, pool["id"], body).status_code == 200
    rows = item_rows(db, pool["id"])
    assert rows["n0"].data == {"text": "n"} and rows["n1"].data is None
    # a differently named column, asked for by name
    table = pa.table({"id": ["q"], "embedding": [emb[0].tolist()], "content": [json.dumps({"text": "q"})]})
    assert bulk(client, auth, pool["id"], _parquet(table), data_column="content").status_code == 200
    assert item_rows(db, pool["id"])["q"].data == {"text": "q"}


@pytest.mark.parametrize(
    ("values", "says"),
    [
        (["{not json", "{}"], "is not valid JSON"),
        (['["a list"]', "{}"], "must be a JSON object"),
        (['{"x": NaN}', "{}"], "finite"),
    ],
)
def test_bulk_invalid_data_is_400_and_writes_nothing(
    client: TestClient, auth: Auth, db: sessionmaker[Session], values: list[str], says: str
) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(2)
    table = pa.table({"id": ["a", "b"], "embedding": [r.tolist() for r in emb], "data": values})
    r = bulk(client, auth, pool["id"], _parquet(table))
    assert_error(r, 400, "invalid_item_data", says, "'a'")
    assert item_rows(db, pool["id"]) == {}


def test_bulk_data_column_of_wrong_type_is_400(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(2)
    table = pa.table({"id": ["a", "b"], "embedding": [r.tolist() for r in emb], "data": [1, 2]})
    assert_error(bulk(client, auth, pool["id"], _parquet(table)), 400, "invalid_file", "JSON strings")
    r = bulk(client, auth, pool["id"], _parquet(table.drop(["data"])), data_column="nope")
    assert_error(r, 400, "invalid_file", "no column 'nope'")
    assert item_rows(db, pool["id"]) == {}
