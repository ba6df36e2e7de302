"""Helpers of the service tests: make pools and items over HTTP, read rows straight from the database."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.main import create_app
from service.store.models import Item, Label


def make_pool(client: TestClient, auth: dict[str, str], **overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": "animals",
        "task": "classification",
        "classes": ["cat", "dog", "bird"],
        "embedding_dim": 4,
        "head": {"kind": "linear"},
    }
    body.update(overrides)
    if body["task"] == "regression" and "classes" not in overrides:
        body.pop("classes")
        body.setdefault("n_outputs", 2)
    resp = client.post("/v1/pools", json=body, headers=auth)
    assert resp.status_code == 201, resp.text
    pool: dict[str, Any] = resp.json()
    return pool


def embeddings(n: int, d: int = 4, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, d)).astype(np.float32)


def put_items(
    client: TestClient, auth: dict[str, str], pool_id: str, ids: list[str], emb: np.ndarray
) -> dict[str, Any]:
    resp = client.post(
        f"/v1/pools/{pool_id}/items",
        json={"items": [{"id": i, "embedding": row.tolist()} for i, row in zip(ids, emb, strict=True)]},
        headers=auth,
    )
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def item_rows(db: sessionmaker[Session], pool_id: str) -> dict[str, Item]:
    """``external id -> Item`` as stored."""
    with db() as s:
        return {it.external_id: it for it in s.execute(select(Item).where(Item.pool_id == pool_id)).scalars()}


def label_rows(db: sessionmaker[Session], pool_id: str) -> list[Label]:
    with db() as s:
        return list(s.execute(select(Label).where(Label.pool_id == pool_id).order_by(Label.id)).scalars())


def assert_error(resp: Any, status: int, code: str, *fragments: str) -> dict[str, Any]:
    """The response is the error body with this status and code, its message containing each fragment."""
    assert resp.status_code == status, resp.text
    err: dict[str, Any] = resp.json()["error"]
    assert err["code"] == code, err
    for f in fragments:
        assert f in err["message"], (f, err["message"])
    return err


@pytest.fixture
def limited_client(settings: Settings, db: sessionmaker[Session]) -> Iterator[Callable[..., TestClient]]:
    """A factory of clients on apps with small limits (``max_json_bytes=...`` and friends)."""
    clients: list[TestClient] = []

    def make(**limits: Any) -> TestClient:
        c = TestClient(create_app(settings.model_copy(update=limits)))
        c.__enter__()
        clients.append(c)
        return c

    yield make
    for c in clients:
        c.__exit__(None, None, None)
