"""Pools: create, read, list, delete; validation; tenant isolation."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.store.models import Item, Label, Pool
from tests.service.conftest import assert_error, embeddings, make_pool, put_items


def _pool_count(db: sessionmaker[Session]) -> int:
    with db() as s:
        return int(s.execute(select(func.count()).select_from(Pool)).scalar_one())


def test_create_classification_pool_returns_it_with_zero_counts(client: TestClient, auth: dict[str, str]) -> None:
    pool = make_pool(client, auth, head={"kind": "mlp", "hidden": 64})
    assert pool["name"] == "animals"
    assert pool["task"] == "classification"
    assert pool["classes"] == ["cat", "dog", "bird"]
    assert pool["n_outputs"] == 3
    assert pool["embedding_dim"] == 4
    assert pool["head"] == {"kind": "mlp", "hidden": 64}
    assert pool["counts"] == {"items": 0, "unlabeled": 0, "reserved": 0, "labeled": 0}
    assert client.get(f"/v1/pools/{pool['id']}", headers=auth).json() == pool


def test_create_regression_pool_stores_n_outputs(client: TestClient, auth: dict[str, str]) -> None:
    pool = make_pool(client, auth, task="regression", n_outputs=3)
    assert pool["classes"] is None
    assert pool["n_outputs"] == 3


def test_head_defaults_to_mlp_with_128_hidden_units(client: TestClient, auth: dict[str, str]) -> None:
    body = {"name": "p", "task": "classification", "classes": ["a", "b"], "embedding_dim": 8}
    resp = client.post("/v1/pools", json=body, headers=auth)
    assert resp.status_code == 201
    assert resp.json()["head"] == {"kind": "mlp", "hidden": 128}


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"classes": ["only"]}, "at least 2"),
        ({"classes": []}, "at least 2"),
        ({"classes": ["a", "a", "b"]}, "unique"),
        ({"classes": ["a", ""]}, "classes"),
        ({"n_outputs": 3}, "not `n_outputs`"),
        ({"task": "regression", "classes": ["a", "b"]}, "not `classes`"),
        ({"task": "regression", "classes": None, "n_outputs": 0}, "n_outputs"),
        ({"task": "regression", "classes": None}, "needs `n_outputs`"),
        ({"embedding_dim": 0}, "embedding_dim"),
        ({"embedding_dim": 65537}, "embedding_dim"),
        ({"task": "ranking"}, "task"),
        ({"head": {"kind": "transformer"}}, "head.kind"),
        ({"head": {"kind": "mlp", "hidden": 0}}, "head.hidden"),
        ({"name": "   "}, "name"),
    ],
)
def test_create_pool_rejects_invalid_spec(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], overrides: dict[str, Any], fragment: str
) -> None:
    body: dict[str, Any] = {"name": "p", "task": "classification", "classes": ["a", "b"], "embedding_dim": 4}
    body.update(overrides)
    body = {k: v for k, v in body.items() if v is not None}
    assert_error(client.post("/v1/pools", json=body, headers=auth), 422, "validation_error", fragment)
    assert _pool_count(db) == 0


def test_duplicate_pool_name_for_same_tenant_is_409(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    make_pool(client, auth)
    body = {"name": "animals", "task": "regression", "n_outputs": 1, "embedding_dim": 2}
    assert_error(client.post("/v1/pools", json=body, headers=auth), 409, "conflict", "animals")
    assert _pool_count(db) == 1


def test_same_pool_name_is_allowed_for_another_tenant(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    a = make_pool(client, auth)
    b = make_pool(client, other_auth)
    assert a["id"] != b["id"]


def test_list_shows_only_own_pools(client: TestClient, auth: dict[str, str], other_auth: dict[str, str]) -> None:
    mine = [make_pool(client, auth, name=f"p{i}") for i in range(2)]
    make_pool(client, other_auth, name="theirs")
    listed = client.get("/v1/pools", headers=auth).json()["pools"]
    assert [p["id"] for p in listed] == [p["id"] for p in mine]
    theirs = client.get("/v1/pools", headers=other_auth).json()["pools"]
    assert [p["name"] for p in theirs] == ["theirs"]


def test_other_tenants_pool_is_404_for_get_and_delete(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    assert_error(client.get(f"/v1/pools/{pool['id']}", headers=other_auth), 404, "not_found", pool["id"])
    assert_error(client.delete(f"/v1/pools/{pool['id']}", headers=other_auth), 404, "not_found")
    assert _pool_count(db) == 1


def test_unknown_pool_is_404(client: TestClient, auth: dict[str, str]) -> None:
    assert_error(client.get("/v1/pools/nope", headers=auth), 404, "not_found", "nope")


def test_counts_follow_items_and_labels(client: TestClient, auth: dict[str, str]) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a", "b", "c"], embeddings(3))
    resp = client.put(
        f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "label": "cat"}]}, headers=auth
    )
    assert resp.status_code == 200
    counts = client.get(f"/v1/pools/{pool['id']}", headers=auth).json()["counts"]
    assert counts == {"items": 3, "unlabeled": 2, "reserved": 0, "labeled": 1}
    assert client.get("/v1/pools", headers=auth).json()["pools"][0]["counts"] == counts


def test_delete_pool_cascades_to_items_and_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a", "b"], embeddings(2))
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "label": "cat"}]}, headers=auth)
    resp = client.delete(f"/v1/pools/{pool['id']}", headers=auth)
    assert resp.status_code == 204
    assert resp.content == b""
    assert_error(client.get(f"/v1/pools/{pool['id']}", headers=auth), 404, "not_found")
    with db() as s:
        assert s.execute(select(func.count()).select_from(Item)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(Label)).scalar_one() == 0
    assert _pool_count(db) == 0
