"""Labels: write many, validation that writes nothing, reservations released, delete, history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import Item
from tests.service.conftest import assert_error, embeddings, item_rows, label_rows, make_pool, put_items

Auth = dict[str, str]


@pytest.fixture
def pool(client: TestClient, auth: Auth) -> dict[str, Any]:
    p = make_pool(client, auth)
    put_items(client, auth, p["id"], ["a", "b", "c"], embeddings(3))
    return p


@pytest.fixture
def reg_pool(client: TestClient, auth: Auth) -> dict[str, Any]:
    p = make_pool(client, auth, name="reg", task="regression", n_outputs=2)
    put_items(client, auth, p["id"], ["a", "b"], embeddings(2))
    return p


def put_labels(client: TestClient, auth: Auth, pool_id: str, body: dict[str, Any]) -> Any:
    return client.put(f"/v1/pools/{pool_id}/labels", json=body, headers=auth)


def test_put_labels_sets_label_status_and_history(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}, {"item_id": "b", "label": "dog", "annotator": "bo"}]}
    resp = put_labels(client, auth, pool["id"], {**body, "annotator": "al"})
    assert resp.json() == {"labeled": 2}
    rows = item_rows(db, pool["id"])
    assert (rows["a"].status, rows["a"].label) == ("labeled", "cat")
    assert (rows["b"].status, rows["b"].label) == ("labeled", "dog")
    assert rows["a"].labeled_at is not None
    assert (rows["c"].status, rows["c"].label) == ("unlabeled", None)
    history = label_rows(db, pool["id"])
    assert [(h.item_id, h.value, h.annotator, h.deleted) for h in history] == [
        (rows["a"].id, "cat", "al", 0),
        (rows["b"].id, "dog", "bo", 0),
    ]


def test_regression_targets_are_stored_as_lists(
    client: TestClient, auth: Auth, db: sessionmaker[Session], reg_pool: dict[str, Any]
) -> None:
    resp = put_labels(client, auth, reg_pool["id"], {"labels": [{"item_id": "a", "target": [1, -2.5]}]})
    assert resp.json() == {"labeled": 1}
    assert item_rows(db, reg_pool["id"])["a"].label == [1.0, -2.5]


def test_relabeling_overwrites_and_appends_history(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "cat"}]})
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "bird"}]})
    assert item_rows(db, pool["id"])["a"].label == "bird"
    assert [h.value for h in label_rows(db, pool["id"])] == ["cat", "bird"]


def test_labeling_a_reserved_item_releases_it_and_keeps_batch_provenance(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    with db() as s, s.begin():
        s.execute(
            update(Item)
            .where(Item.pool_id == pool["id"], Item.external_id == "a")
            .values(status="reserved", reserved_until=datetime.now(UTC) + timedelta(hours=1))
        )
    assert client.get(f"/v1/pools/{pool['id']}", headers=auth).json()["counts"]["reserved"] == 1
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "cat"}]})
    row = item_rows(db, pool["id"])["a"]
    assert (row.status, row.reserved_until) == ("labeled", None)
    assert client.get(f"/v1/pools/{pool['id']}", headers=auth).json()["counts"] == {
        "items": 3,
        "unlabeled": 2,
        "reserved": 0,
        "labeled": 1,
    }


def _assert_nothing_written(db: sessionmaker[Session], pool_id: str) -> None:
    assert all(r.status == "unlabeled" and r.label is None for r in item_rows(db, pool_id).values())
    assert label_rows(db, pool_id) == []


def test_unknown_class_is_rejected_listing_valid_classes(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}, {"item_id": "b", "label": "horse"}]}
    err = assert_error(put_labels(client, auth, pool["id"], body), 400, "invalid_label", "'horse'", "cat", "bird")
    assert err["details"] == {"unknown": ["horse"], "classes": ["cat", "dog", "bird"]}
    _assert_nothing_written(db, pool["id"])


def test_label_for_unknown_item_is_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}, {"item_id": "ghost", "label": "dog"}]}
    err = assert_error(put_labels(client, auth, pool["id"], body), 400, "unknown_item", "'ghost'")
    assert err["details"] == {"missing": ["ghost"]}
    _assert_nothing_written(db, pool["id"])


def test_target_on_classification_pool_is_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "target": [1.0, 2.0]}]}
    assert_error(put_labels(client, auth, pool["id"], body), 400, "invalid_label", "classification pool")
    _assert_nothing_written(db, pool["id"])


def test_class_label_on_regression_pool_is_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], reg_pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}]}
    assert_error(put_labels(client, auth, reg_pool["id"], body), 400, "invalid_label", "regression pool")
    _assert_nothing_written(db, reg_pool["id"])


def test_target_of_wrong_length_is_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], reg_pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "target": [1.0, 2.0]}, {"item_id": "b", "target": [1.0, 2.0, 3.0]}]}
    err = assert_error(put_labels(client, auth, reg_pool["id"], body), 400, "invalid_label", "expected 2, got 3")
    assert err["details"] == {"item_id": "b", "expected": 2, "got": 3}
    _assert_nothing_written(db, reg_pool["id"])


def test_non_finite_target_is_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], reg_pool: dict[str, Any]
) -> None:
    body = '{"labels": [{"item_id": "a", "target": [1.0, NaN]}]}'
    resp = client.put(
        f"/v1/pools/{reg_pool['id']}/labels", content=body, headers={**auth, "Content-Type": "application/json"}
    )
    assert_error(resp, 400, "invalid_label", "finite")
    _assert_nothing_written(db, reg_pool["id"])


def test_duplicate_item_ids_in_one_request_are_rejected(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}, {"item_id": "a", "label": "dog"}]}
    assert_error(put_labels(client, auth, pool["id"], body), 400, "duplicate_id", "'a'")
    _assert_nothing_written(db, pool["id"])


def test_label_with_both_or_neither_value_is_422(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    for entry in ({"item_id": "a"}, {"item_id": "a", "label": "cat", "target": [1.0]}):
        resp = put_labels(client, auth, pool["id"], {"labels": [entry]})
        assert_error(resp, 422, "validation_error", "exactly one")
    _assert_nothing_written(db, pool["id"])


def test_too_many_labels_are_rejected(
    limited_client,
    auth: Auth,
    db: sessionmaker[Session],  # type: ignore[no-untyped-def]
) -> None:
    client = limited_client(max_items_per_request=2)
    p = make_pool(client, auth)
    put_items(client, auth, p["id"], ["a", "b"], embeddings(2))
    body = {"labels": [{"item_id": i, "label": "cat"} for i in ["a", "b", "c"]]}
    assert_error(put_labels(client, auth, p["id"], body), 413, "too_many_items", "limit is 2")
    _assert_nothing_written(db, p["id"])


def test_delete_label_unlabels_item_and_records_deletion(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "cat"}]})
    resp = client.delete(f"/v1/pools/{pool['id']}/labels/a", params={"annotator": "qa"}, headers=auth)
    assert resp.status_code == 204
    row = item_rows(db, pool["id"])["a"]
    assert (row.status, row.label, row.labeled_at) == ("unlabeled", None, None)
    history = label_rows(db, pool["id"])
    assert [(h.value, h.deleted, h.annotator) for h in history] == [("cat", 0, None), (None, 1, "qa")]
    listed = client.get(f"/v1/pools/{pool['id']}/items", params={"status": "unlabeled"}, headers=auth).json()
    assert [it["id"] for it in listed["items"]] == ["a", "b", "c"]


def test_delete_label_of_unlabeled_or_unknown_item_is_404(
    client: TestClient, auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    assert_error(client.delete(f"/v1/pools/{pool['id']}/labels/a", headers=auth), 404, "not_found", "has no label")
    assert_error(client.delete(f"/v1/pools/{pool['id']}/labels/ghost", headers=auth), 404, "not_found", "'ghost'")
    assert label_rows(db, pool["id"]) == []


def test_label_history_lists_writes_and_deletions_oldest_first(
    client: TestClient, auth: Auth, pool: dict[str, Any]
) -> None:
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "cat"}], "annotator": "al"})
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "a", "label": "dog"}]})
    client.delete(f"/v1/pools/{pool['id']}/labels/a", headers=auth)
    put_labels(client, auth, pool["id"], {"labels": [{"item_id": "b", "label": "bird"}]})
    hist = client.get(f"/v1/pools/{pool['id']}/labels/a/history", headers=auth).json()
    assert hist["item_id"] == "a"
    assert [(h["value"], h["annotator"], h["deleted"]) for h in hist["history"]] == [
        ("cat", "al", False),
        ("dog", None, False),
        (None, None, True),
    ]


def test_labels_routes_of_other_tenants_pool_are_404(
    client: TestClient, auth: Auth, other_auth: Auth, db: sessionmaker[Session], pool: dict[str, Any]
) -> None:
    body = {"labels": [{"item_id": "a", "label": "cat"}]}
    assert_error(put_labels(client, other_auth, pool["id"], body), 404, "not_found")
    put_labels(client, auth, pool["id"], body)
    assert_error(client.delete(f"/v1/pools/{pool['id']}/labels/a", headers=other_auth), 404, "not_found")
    assert_error(client.get(f"/v1/pools/{pool['id']}/labels/a/history", headers=other_auth), 404, "not_found")
    assert item_rows(db, pool["id"])["a"].label == "cat"
    assert len(label_rows(db, pool["id"])) == 1
