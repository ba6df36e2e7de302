"""Key scopes: every authenticated route declares the scope it needs, and keys without it get 403.

Table-driven over the app's own routes: a /v1 route missing from :data:`service.scopes.ROUTE_SCOPES`
fails :func:`test_every_v1_route_declares_a_scope`, and every route is called with a key of each
single scope (403 ``insufficient_scope`` naming the needed scope unless the key holds it).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, select, text
from sqlalchemy.orm import Session, sessionmaker

from bait.cli import main as cli_main
from service.config import Settings, get_settings
from service.db import session_scope
from service.deps import get_tenant
from service.domain.keys import create_key, list_keys
from service.migrate import upgrade
from service.scopes import ADMIN, ALL_SCOPES, LABEL, READ, ROUTE_SCOPES, SELECT, endpoint_name, parse_scopes
from service.store.models import Batch, WebhookEndpoint
from tests.conftest import scratch_postgres_database
from tests.service.conftest import make_pool, put_items

PG_ADMIN_URL = os.environ.get("BAIT_TEST_DATABASE_URL")


def routes(app: FastAPI) -> list[tuple[str, str, Any]]:
    """``(method, path, endpoint)`` of every API route of the app, with prefixes applied."""
    out = []
    for ctx in iter_route_contexts(app.routes):
        if not isinstance(ctx.original_route, APIRoute) or ctx.path is None or ctx.endpoint is None:
            continue
        for method in sorted(ctx.methods or ()):
            if method != "HEAD":
                out.append((method, ctx.path, ctx.endpoint))
    return out


def needs_key(route: APIRoute) -> bool:
    """Whether the route depends (directly or through sub-dependencies) on :func:`get_tenant`."""
    stack = [route.dependant]
    while stack:
        dep = stack.pop()
        if dep.call is get_tenant:
            return True
        stack.extend(dep.dependencies)
    return False


@pytest.fixture
def app(client: TestClient) -> FastAPI:
    assert isinstance(client.app, FastAPI)
    return client.app


def key_with(db: sessionmaker[Session], scopes: tuple[str, ...], tenant: str = "acme") -> dict[str, str]:
    with session_scope(db) as s:
        key, _ = create_key(s, tenant, scopes=scopes)
    return {"Authorization": f"Bearer {key}"}


# ------------------------------------------------------------------------------ the table is complete


def test_every_v1_route_declares_a_scope(app: FastAPI) -> None:
    table = routes(app)
    v1 = [(m, p, e) for m, p, e in table if p.startswith("/v1/")]
    assert len(v1) >= 35  # the whole API is seen, not an empty list
    missing = [f"{m} {p} ({endpoint_name(e)})" for m, p, e in v1 if endpoint_name(e) not in ROUTE_SCOPES]
    assert missing == [], f"routes without a declared scope in service.scopes.ROUTE_SCOPES: {missing}"
    # ... and every route that authenticates with a key, wherever it lives.
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        if isinstance(route, APIRoute) and needs_key(route):
            assert endpoint_name(route.endpoint) in ROUTE_SCOPES, f"{ctx.path} authenticates but declares no scope"
    # No stale entries: each table entry is a route of the app (the API's, and the dashboard's, which
    # answers a key as the API does: tests/service/test_security_round3.py walks it).
    ui = [(m, p, e) for m, p, e in table if p.startswith("/ui") and not p.startswith("/ui/login")]
    assert set(ROUTE_SCOPES) == {endpoint_name(e) for _, _, e in v1 + ui}


def test_every_v1_route_authenticates_with_a_key(app: FastAPI) -> None:
    for ctx in iter_route_contexts(app.routes):
        route = ctx.original_route
        if isinstance(route, APIRoute) and (ctx.path or "").startswith("/v1/"):
            assert needs_key(route), f"{ctx.path} does not authenticate"


def test_scope_classes_are_the_documented_ones() -> None:
    named = {k: v for k, v in ROUTE_SCOPES.items()}
    assert named["service.api.labels:put_labels"] == LABEL
    assert named["service.api.batches:create_batch"] == SELECT
    assert named["service.api.select:select"] == SELECT
    assert named["service.api.encoders:upload_encoder"] == ADMIN
    assert named["service.api.webhooks:create_webhook"] == ADMIN
    assert named["service.api.integrations:connect_labelstudio"] == ADMIN
    assert named["service.api.pools:delete_pool"] == ADMIN
    assert all(v == READ for k, v in named.items() if k.endswith((":list_pools", ":get_item", ":get_batch")))


# --------------------------------------------------------------------- each scope against each route


def concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "nosuch", path)


def test_each_scope_against_each_route(app: FastAPI, client: TestClient, db: sessionmaker[Session]) -> None:
    keys = {scope: key_with(db, (scope,)) for scope in ALL_SCOPES}
    seen: dict[str, int] = {}
    for method, path, endpoint in routes(app):
        if not path.startswith("/v1/"):
            continue
        needed = ROUTE_SCOPES[endpoint_name(endpoint)]
        seen[needed] = seen.get(needed, 0) + 1
        for scope, auth in keys.items():
            resp = client.request(method, concrete(path), headers=auth)
            where = f"{method} {path} with a {scope!r} key"
            if scope == needed:
                assert resp.status_code not in (401, 403), f"{where}: {resp.status_code} {resp.text}"
            else:
                assert resp.status_code == 403, f"{where}: {resp.status_code} {resp.text}"
                err = resp.json()["error"]
                assert err["code"] == "insufficient_scope"
                assert err["details"]["required_scope"] == needed
                assert f"`{needed}`" in err["message"]
    assert set(seen) == set(ALL_SCOPES)  # every class of route was exercised


def test_labelstudio_backend_routes_ignore_keys(client: TestClient, db: sessionmaker[Session]) -> None:
    # They authenticate by the integration's secret: a read-only key neither helps nor hurts.
    auth = key_with(db, (READ,))
    for headers in ({}, auth):
        resp = client.get("/labelstudio/nosuch/s3cret/health", headers=headers)
        assert resp.status_code in (401, 404), resp.text
        assert resp.json()["error"]["code"] != "insufficient_scope"


# ------------------------------------------------------------------------------- behaviour of scopes


def test_labeling_tool_key_reads_and_labels_only(client: TestClient, auth: dict[str, str], db: Any) -> None:
    pool = make_pool(client, auth)
    put_items(client, auth, pool["id"], ["a", "b", "c"], __import__("numpy").eye(3, 4, dtype="float32"))
    tool = key_with(db, (READ, LABEL))

    assert client.get(f"/v1/pools/{pool['id']}", headers=tool).status_code == 200
    assert client.get(f"/v1/pools/{pool['id']}/items", headers=tool).json()["items"][0]["id"] == "a"
    resp = client.put(
        f"/v1/pools/{pool['id']}/labels", json={"labels": [{"item_id": "a", "label": "cat"}]}, headers=tool
    )
    assert resp.status_code == 200, resp.text

    resp = client.post(f"/v1/pools/{pool['id']}/batches", json={"size": 1, "strategy": "random"}, headers=tool)
    assert resp.status_code == 403
    assert resp.json()["error"]["details"] == {"required_scope": "select", "key_scopes": ["read", "label"]}
    resp = client.post(
        f"/v1/pools/{pool['id']}/webhooks",
        json={"url": "http://127.0.0.1:9/hook", "events": ["batch.succeeded"]},
        headers=tool,
    )
    assert resp.status_code == 403 and resp.json()["error"]["details"]["required_scope"] == "admin"
    resp = client.delete(f"/v1/pools/{pool['id']}", headers=tool)
    assert resp.status_code == 403
    with db() as s:  # nothing was written by the refused requests
        assert s.execute(select(Batch)).first() is None
        assert s.execute(select(WebhookEndpoint)).first() is None
    assert client.get(f"/v1/pools/{pool['id']}", headers=auth).status_code == 200


def test_select_key_cannot_upload_an_encoder(client: TestClient, db: sessionmaker[Session]) -> None:
    auth = key_with(db, (READ, LABEL, SELECT))
    resp = client.post(
        "/v1/encoders", files={"file": ("m.pt", b"PK\x03\x04 not checked", "application/zip")}, headers=auth
    )
    assert resp.status_code == 403
    assert resp.json()["error"]["details"]["required_scope"] == "admin"
    assert client.get("/v1/encoders", headers=auth).json() == {"encoders": []}


def test_parse_scopes_refuses_unknown_and_empty() -> None:
    assert parse_scopes("label, read") == ("read", "label")
    assert parse_scopes("admin select select") == ("select", "admin")
    with pytest.raises(ValueError, match="unknown scope"):
        parse_scopes("read,write")
    with pytest.raises(ValueError, match="at least one scope"):
        parse_scopes(" , ")


# ------------------------------------------------------------------------------------------ the CLI


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[None]:
    monkeypatch.setenv("BAIT_DATABASE_URL", database_url)
    monkeypatch.setenv("BAIT_SECRET_KEY", "test-secret-key-0123456789")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_cli_scope_option_narrows_the_key(
    cli_env: None, client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["keys", "create", "--tenant", "studio", "--scope", "read,label"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "scopes read,label" in out[0]
    auth = {"Authorization": f"Bearer {out[-1]}"}
    assert client.get("/v1/pools", headers=auth).status_code == 200
    resp = client.post(
        "/v1/pools", json={"name": "p", "task": "regression", "n_outputs": 1, "embedding_dim": 2}, headers=auth
    )
    assert resp.status_code == 403 and resp.json()["error"]["details"]["required_scope"] == "select"


def test_cli_default_scopes_are_all_but_admin(
    cli_env: None, client: TestClient, db: sessionmaker[Session], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["keys", "create", "--tenant", "pipeline"]) == 0
    capsys.readouterr()
    with db() as s:
        (info,) = list_keys(s, "pipeline")
    assert info.scopes == ("read", "label", "select")


def test_cli_refuses_an_unknown_scope(cli_env: None, db: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["keys", "create", "--tenant", "x", "--scope", "read,root"]) == 2
    assert "unknown scope" in capsys.readouterr().err
    with db() as s:
        assert list_keys(s, "x") == []


def test_bootstrap_key_of_embedded_mode_has_every_scope(
    cli_env: None, db: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    monkeypatch.setenv("BAIT_PRINT_BOOTSTRAP_KEY", "true")
    get_settings.cache_clear()
    monkeypatch.setattr(uvicorn.Server, "run", lambda *a, **k: None)  # the server itself is not under test
    assert cli_main(["serve"]) == 0
    assert "bait_" in capsys.readouterr().out
    with db() as s:
        (info,) = list_keys(s, "default")
    assert info.scopes == ALL_SCOPES


# ------------------------------------------------------------------------------------ the migration


@pytest.fixture
def scratch_url(tmp_path: Any) -> Iterator[str]:
    if not PG_ADMIN_URL:
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with scratch_postgres_database("bait_scopes") as url:
        yield url


def test_keys_made_before_scopes_keep_every_scope(scratch_url: str) -> None:
    upgrade(scratch_url, "0002")
    eng = create_engine(scratch_url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t1', 'old', CURRENT_TIMESTAMP)"))
        conn.execute(
            text(
                "INSERT INTO api_keys (id, tenant_id, prefix, key_hash, created_at) "
                "VALUES ('k1', 't1', 'bait_abcdef', :h, CURRENT_TIMESTAMP)"
            ),
            {"h": "0" * 64},
        )
    upgrade(scratch_url)
    with eng.connect() as conn:
        assert (
            conn.execute(text("SELECT scopes FROM api_keys WHERE id = 'k1'")).scalar_one() == "read label select admin"
        )
    eng.dispose()


def test_settings_refuse_a_bad_rate() -> None:
    with pytest.raises(ValueError, match="not a rate"):
        Settings(rate_limit="lots")
