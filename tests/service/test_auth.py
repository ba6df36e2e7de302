"""Every /v1 route needs a valid, unrevoked key: missing, malformed, unknown or revoked -> 401."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.domain.keys import create_key, revoke_key
from tests.service.conftest import assert_error, make_pool


def v1_routes(client: TestClient) -> list[tuple[str, str]]:
    """(method, path with placeholders filled) of every /v1 route of the app."""
    out = []
    for template, operations in client.get("/openapi.json").json()["paths"].items():
        if template.startswith("/v1"):
            path = re.sub(r"\{[^}]+\}", "x", template)
            out += [(method.upper(), path) for method in sorted(operations)]
    return out


def test_there_are_v1_routes_to_check(client: TestClient) -> None:
    paths = {p for _, p in v1_routes(client)}
    assert {"/v1/pools", "/v1/pools/x", "/v1/pools/x/items", "/v1/pools/x/items:bulk", "/v1/pools/x/labels"} <= paths


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer "},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer bait_not-a-real-key"},
    ],
    ids=["missing", "empty", "basic-scheme", "unknown-key"],
)
def test_every_v1_route_rejects_requests_without_a_valid_key(client: TestClient, headers: dict[str, str]) -> None:
    for method, path in v1_routes(client):
        resp = client.request(method, path, headers=headers, json={})
        assert resp.status_code == 401, (method, path, resp.text)
        assert resp.json()["error"]["code"] == "unauthorized"
        assert resp.headers["www-authenticate"] == "Bearer"


def test_revoked_key_is_401_on_every_v1_route(client: TestClient, db: sessionmaker[Session]) -> None:
    with session_scope(db) as s:
        key, info = create_key(s, "acme")
    auth = {"Authorization": f"Bearer {key}"}
    pool = make_pool(client, auth)
    with session_scope(db) as s:
        revoke_key(s, info.id)
    assert_error(client.get(f"/v1/pools/{pool['id']}", headers=auth), 401, "unauthorized", "revoked")
    for method, path in v1_routes(client):
        assert client.request(method, path, headers=auth, json={}).status_code == 401, (method, path)


def test_key_of_same_tenant_sees_the_same_pools(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    with session_scope(db) as s:
        second, _ = create_key(s, "acme")
    listed = client.get("/v1/pools", headers={"Authorization": f"Bearer {second}"}).json()["pools"]
    assert [p["id"] for p in listed] == [pool["id"]]
