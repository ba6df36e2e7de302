"""Items over JSON: idempotent upsert, validation that writes nothing, pagination, effective status."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import Item
from tests.service.conftest import assert_error, embeddings, item_rows, make_pool, put_items

Auth = dict[str, str]


def test_upsert_creates_items_with_float32_embedding_bytes(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(3)
    assert put_items(client, auth, pool["id"], ["a", "b", "c"], emb) == {"created": 3, "updated": 0}
    rows = item_rows(db, pool["id"])
    assert sorted(rows) == ["a", "b", "c"]
    for i, ext in enumerate(["a", "b", "c"]):
        assert rows[ext].embedding == emb[i].astype("<f4").tobytes()
        assert rows[ext].status == "unlabeled"


def test_upsert_is_idempotent_and_updates_embedding(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a", "b"], embeddings(2, seed=1))
    new = embeddings(3, seed=2)
    assert put_items(client, auth, pool["id"], ["a", "b", "c"], new) == {"created": 1, "updated": 2}
    rows = item_rows(db, pool["id"])
    assert len(rows) == 3
    assert rows["a"].embedding == new[0].tobytes()
    assert put_items(client, auth, pool["id"], ["a", "b", "c"], new) == {"created": 0, "updated": 3}
    assert len(item_rows(db, pool["id"])) == 3


def test_updating_a_labeled_items_embedding_keeps_its_label(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a"], embeddings(1, seed=1))
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "label": "dog"}]}, headers=auth)
    new = embeddings(1, seed=5)
    put_items(client, auth, pool["id"], ["a"], new)
    row = item_rows(db, pool["id"])["a"]
    assert (row.status, row.label, row.embedding) == ("labeled", "dog", new[0].tobytes())


def test_upsert_accepts_integer_numbers(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    resp = client.post(
        f"/v1/pools/{pool['id']}/items", json={"items": [{"id": "a", "embedding": [1, 2, 3, 4]}]}, headers=auth
    )
    assert resp.json() == {"created": 1, "updated": 0}
    assert item_rows(db, pool["id"])["a"].embedding == np.array([1, 2, 3, 4], dtype="<f4").tobytes()


def _post_raw(client: TestClient, auth: Auth, pool_id: str, body: str):  # type: ignore[no-untyped-def]
    return client.post(f"/v1/pools/{pool_id}/items", content=body, headers={**auth, "Content-Type": "application/json"})


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_upsert_rejects_nan_and_infinite_literals(
    client: TestClient, auth: Auth, db: sessionmaker[Session], literal: str
) -> None:
    pool = make_pool(client, auth)
    bad = '{"id": "bad", "embedding": [1, ' + literal + ", 3, 4]}"
    body = '{"items": [{"id": "ok", "embedding": [1, 2, 3, 4]}, ' + bad + "]}"
    err = assert_error(_post_raw(client, auth, pool["id"], body), 400, "invalid_embedding", "finite", "'bad'")
    assert err["details"] == {"ids": ["bad"]}
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_value_beyond_float32_range(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    body = '{"items": [{"id": "big", "embedding": [1e39, 0, 0, 0]}]}'
    assert_error(_post_raw(client, auth, pool["id"], body), 400, "invalid_embedding", "'big'")
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_wrong_dimension_naming_id_and_sizes(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    items = [{"id": "ok", "embedding": [0.0] * 4}, {"id": "short", "embedding": [0.0] * 3}]
    resp = client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth)
    err = assert_error(resp, 400, "invalid_embedding", "'short'", "expected 4, got 3")
    assert err["details"] == {"id": "short", "expected": 4, "got": 3}
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_duplicate_ids_in_one_request(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    items = [{"id": i, "embedding": [0.0] * 4} for i in ["a", "b", "a"]]
    err = assert_error(
        client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth), 400, "duplicate_id", "'a'"
    )
    assert err["details"] == {"duplicates": ["a"]}
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_empty_id(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    items = [{"id": "a", "embedding": [0.0] * 4}, {"id": "", "embedding": [0.0] * 4}]
    resp = client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth)
    assert_error(resp, 422, "validation_error", "items.1.id")
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_string_numbers(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    pool = make_pool(client, auth)
    items = [{"id": "a", "embedding": ["1", 0, 0, 0]}]
    resp = client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth)
    assert_error(resp, 422, "validation_error", "items.0.embedding.0")
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_too_many_items(
    limited_client,
    auth: Auth,
    db: sessionmaker[Session],  # type: ignore[no-untyped-def]
) -> None:
    client = limited_client(max_items_per_request=2)
    pool = make_pool(client, auth)
    items = [{"id": str(i), "embedding": [0.0] * 4} for i in range(3)]
    err = assert_error(
        client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth), 413, "too_many_items", "2"
    )
    assert err["details"] == {"limit": 2, "got": 3}
    assert item_rows(db, pool["id"]) == {}


def test_upsert_rejects_oversize_json_body(limited_client, auth: Auth, db: sessionmaker[Session]) -> None:  # type: ignore[no-untyped-def]
    client = limited_client(max_json_bytes=2048)
    pool = make_pool(client, auth)
    items = [{"id": f"item-{i}", "embedding": [0.123456] * 4} for i in range(100)]
    resp = client.post(f"/v1/pools/{pool['id']}/items", json={"items": items}, headers=auth)
    assert_error(resp, 413, "payload_too_large", "2048")
    assert item_rows(db, pool["id"]) == {}


def test_oversize_body_without_content_length_is_cut_off_while_streaming(
    limited_client,
    auth: Auth,
    db: sessionmaker[Session],  # type: ignore[no-untyped-def]
) -> None:
    client = limited_client(max_json_bytes=2048)
    pool = make_pool(client, auth)
    items = [{"id": f"item-{i}", "embedding": [0.123456] * 4} for i in range(100)]
    body = json.dumps({"items": items}).encode()

    def chunks():  # type: ignore[no-untyped-def]
        for start in range(0, len(body), 512):
            yield body[start : start + 512]

    resp = client.post(
        f"/v1/pools/{pool['id']}/items", content=chunks(), headers={**auth, "Content-Type": "application/json"}
    )
    assert "content-length" not in {k.lower() for k in resp.request.headers}
    assert_error(resp, 413, "payload_too_large", "2048")
    assert item_rows(db, pool["id"]) == {}


def test_upsert_to_other_tenants_pool_is_404_and_writes_nothing(
    client: TestClient, auth: Auth, other_auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    resp = client.post(
        f"/v1/pools/{pool['id']}/items", json={"items": [{"id": "x", "embedding": [0.0] * 4}]}, headers=other_auth
    )
    assert_error(resp, 404, "not_found")
    assert item_rows(db, pool["id"]) == {}
    assert_error(client.get(f"/v1/pools/{pool['id']}/items", headers=other_auth), 404, "not_found")
    assert_error(client.get(f"/v1/pools/{pool['id']}/items/x", headers=other_auth), 404, "not_found")


# ------------------------------------------------------------------------------------------ listing


def test_pagination_returns_every_item_exactly_once_in_upload_order(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    ids = [f"id-{i:03d}" for i in range(57)]
    put_items(client, auth, pool["id"], ids[:30], embeddings(30))
    put_items(client, auth, pool["id"], ids[30:], embeddings(27))
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, str | int] = {"limit": 10}
        if cursor:
            params["cursor"] = cursor
        page = client.get(f"/v1/pools/{pool['id']}/items", params=params, headers=auth).json()
        seen += [it["id"] for it in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    assert pages == 6


def test_list_item_shape_has_label_not_target_and_no_embedding_by_default(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a"], embeddings(1))
    item = client.get(f"/v1/pools/{pool['id']}/items", headers=auth).json()["items"][0]
    assert item == {
        "id": "a",
        "status": "unlabeled",
        "label": None,
        "batch_id": None,
        "reserved_until": None,
        "labeled_at": None,
        "split": "train",
    }


def test_list_regression_items_show_target(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth, task="regression", n_outputs=2)
    put_items(client, auth, pool["id"], ["a"], embeddings(1))
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "target": [1.5, -2]}]}, headers=auth)
    item = client.get(f"/v1/pools/{pool['id']}/items", headers=auth).json()["items"][0]
    assert item["target"] == [1.5, -2.0]
    assert "label" not in item


def test_list_with_embeddings_returns_stored_float32_values(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    emb = embeddings(2)
    put_items(client, auth, pool["id"], ["a", "b"], emb)
    page = client.get(f"/v1/pools/{pool['id']}/items", params={"include_embedding": "true"}, headers=auth).json()
    got = np.array([it["embedding"] for it in page["items"]], dtype=np.float32)
    np.testing.assert_array_equal(got, emb)
    one = client.get(f"/v1/pools/{pool['id']}/items/b", params={"include_embedding": "true"}, headers=auth).json()
    np.testing.assert_array_equal(np.array(one["embedding"], dtype=np.float32), emb[1])


def test_list_filters_by_status(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a", "b", "c"], embeddings(3))
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "b", "label": "cat"}]}, headers=auth)

    def ids(status: str) -> list[str]:
        page = client.get(f"/v1/pools/{pool['id']}/items", params={"status": status}, headers=auth).json()
        return [it["id"] for it in page["items"]]

    assert ids("labeled") == ["b"]
    assert ids("unlabeled") == ["a", "c"]
    assert ids("reserved") == []


def _reserve(db: sessionmaker[Session], pool_id: str, ext: str, until: datetime) -> None:
    with db() as s, s.begin():
        s.execute(
            update(Item)
            .where(Item.pool_id == pool_id, Item.external_id == ext)
            .values(status="reserved", reserved_until=until)
        )


def test_expired_reservation_counts_as_unlabeled_everywhere(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["live", "expired", "free"], embeddings(3))
    now = datetime.now(UTC)
    _reserve(db, pool["id"], "live", now + timedelta(hours=1))
    _reserve(db, pool["id"], "expired", now - timedelta(seconds=1))

    counts = client.get(f"/v1/pools/{pool['id']}", headers=auth).json()["counts"]
    assert counts == {"items": 3, "unlabeled": 2, "reserved": 1, "labeled": 0}
    by_status = {
        st: [
            it["id"]
            for it in client.get(f"/v1/pools/{pool['id']}/items", params={"status": st}, headers=auth).json()["items"]
        ]
        for st in ("unlabeled", "reserved")
    }
    assert by_status == {"unlabeled": ["expired", "free"], "reserved": ["live"]}
    expired = client.get(f"/v1/pools/{pool['id']}/items/expired", headers=auth).json()
    assert (expired["status"], expired["reserved_until"]) == ("unlabeled", None)
    live = client.get(f"/v1/pools/{pool['id']}/items/live", headers=auth).json()
    assert live["status"] == "reserved"
    assert datetime.fromisoformat(live["reserved_until"]) > now


def test_invalid_cursor_is_400(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    resp = client.get(f"/v1/pools/{pool['id']}/items", params={"cursor": "garbage!"}, headers=auth)
    assert_error(resp, 400, "invalid_cursor")


def test_unknown_item_is_404(client: TestClient, auth: Auth) -> None:
    pool = make_pool(client, auth)
    assert_error(client.get(f"/v1/pools/{pool['id']}/items/nope", headers=auth), 404, "not_found", "'nope'")
