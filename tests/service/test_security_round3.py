"""Safe to share, round 3 (issue 24): what an attacker holding a valid key got through the dashboard and
content links, each tried as it was found, and refused.

1. every /ui route needs the scope of the API route serving the same data (walked with single-scope keys);
2. the dashboard counts against the key's rate limits (general and expensive);
3. signing out, an admin, revocation and timeouts end the server-side session (a saved cookie opens nothing);
4. CSV exports neutralise formula cells;
5. content links serve only raster images and plain text inline, sandboxed and never sniffed; item data
   links other than http(s), file:// under the tenant's root and raster data: are refused at upload
   (the browser half is tests/e2e/test_dashboard_browser.py::test_svg_behind_a_content_link_runs_nothing);
6. login CSRF: a sign-in form post without the form's pre-session token is refused, whatever the Origin;
7. unauthenticated Label Studio delete events coalesce into one reconcile and are rate-limited, counted;
8. security headers on every response, error pages included;
9. a malformed URL is a 400 ``invalid_url``; embedding errors never show the server's data root;
10. no log line carries a URL's credentials, whichever library writes it.
"""

from __future__ import annotations

import csv
import io
import logging
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.routing import APIRoute, iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.keys import create_key, revoke_key
from service.headers import DASHBOARD_CSP, DEFAULT_CSP
from service.logredact import install_log_redaction, redact_text
from service.main import create_app
from service.scopes import ALL_SCOPES, SIGNED_IN, endpoint_name, required_scope
from service.store.models import ApiKey, Item, ReconcileRun, WebSession
from tests.fake_labelstudio import FakeLabelStudio, fake_labelstudio
from tests.service.conftest import assert_error, embeddings, make_pool, put_items
from tests.service.test_integrations import connect, give_text
from tests.service.test_web import login_form_token

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
SVG = b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>'


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Peers of these tests (the fake Label Studio, webhook receivers) listen on 127.0.0.1: allowed."""
    return settings.model_copy(update={"outbound_allow": "127.0.0.1"})


def key_with(db: sessionmaker[Session], *scopes: str, tenant: str = "acme") -> str:
    with session_scope(db) as s:
        key, _ = create_key(s, tenant, name="+".join(scopes), scopes=scopes)
    return key


def sign_in(client: TestClient, key: str) -> None:
    client.cookies.clear()
    r = client.post("/ui/login", data={"api_key": key, "login_csrf": login_form_token(client)}, follow_redirects=False)
    assert r.status_code == 303, r.text


def session_csrf(db: sessionmaker[Session], client: TestClient) -> str:
    """The CSRF token of the client's session, read server-side (a key without `read` cannot load a page)."""
    from hashlib import sha256

    token = client.cookies.get("bait_session")
    assert token
    with session_scope(db) as s:
        row = s.execute(
            select(WebSession).where(WebSession.token_hash == sha256(token.encode()).hexdigest())
        ).scalar_one()
        return row.csrf


def pool_with_batch(client: TestClient, auth: dict[str, str], run_jobs: Any) -> tuple[str, str]:
    pool = make_pool(client, auth)["id"]
    put_items(client, auth, pool, [f"i{i}" for i in range(30)], embeddings(30))
    labels = [{"item_id": f"i{i}", "label": ["cat", "dog", "bird"][i % 3]} for i in range(6)]
    assert client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=auth).status_code == 200
    r = client.post(f"/v1/pools/{pool}/batches", json={"size": 2, "strategy": "random"}, headers=auth)
    assert r.status_code == 202, r.text
    run_jobs()
    return pool, r.json()["id"]


# ------------------------------------------------------------------------------- 1. scopes on /ui


def ui_routes(client: TestClient) -> dict[str, APIRoute]:
    """endpoint name -> route of every authenticated dashboard route."""
    out = {}
    for ctx in iter_route_contexts(client.app.routes):  # type: ignore[attr-defined]
        path = ctx.path or ""
        if isinstance(ctx.original_route, APIRoute) and path.startswith("/ui") and not path.startswith("/ui/login"):
            out[endpoint_name(ctx.endpoint)] = ctx.original_route
    return out


def test_every_dashboard_route_answers_each_single_scope_key_as_the_api_does(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool, batch = pool_with_batch(client, auth, run_jobs)
    # dashboard route -> (method, path, form) and its API twin (method, path, json) serving the same data
    walk: dict[str, tuple[tuple[str, str, dict[str, str] | None], tuple[str, str, Any] | None]] = {
        "pools_page": (("GET", "/ui", None), ("GET", "/v1/pools", None)),
        "pool_page": (("GET", f"/ui/pools/{pool}", None), ("GET", f"/v1/pools/{pool}", None)),
        "batches_fragment": (
            ("GET", f"/ui/pools/{pool}/batches-fragment", None),
            ("GET", f"/v1/pools/{pool}/batches", None),
        ),
        "curve_json": (("GET", f"/ui/pools/{pool}/curve.json", None), ("GET", f"/v1/pools/{pool}/curve", None)),
        "map_json": (("GET", f"/ui/pools/{pool}/map.json", None), ("GET", f"/v1/pools/{pool}/map", None)),
        "batch_page": (
            ("GET", f"/ui/pools/{pool}/batches/{batch}", None),
            ("GET", f"/v1/pools/{pool}/batches/{batch}", None),
        ),
        "export_batch": (
            ("GET", f"/ui/pools/{pool}/batches/{batch}/export.csv", None),
            ("GET", f"/v1/pools/{pool}/batches/{batch}", None),
        ),
        "request_batch": (
            ("POST", f"/ui/pools/{pool}/batches", {"size": "1", "strategy": "random"}),
            ("POST", f"/v1/pools/{pool}/batches", {"size": 1, "strategy": "random"}),
        ),
        "cancel_batch": (
            ("POST", f"/ui/pools/{pool}/batches/{batch}/cancel", {}),
            ("POST", f"/v1/pools/{pool}/batches/{batch}/cancel", None),
        ),
        "label_item": (
            ("POST", f"/ui/pools/{pool}/labels", {"item_id": "i20", "value": "cat", "back": f"/ui/pools/{pool}"}),
            ("PUT", f"/v1/pools/{pool}/labels", {"labels": [{"item_id": "i21", "label": "cat"}]}),
        ),
        "sessions_page": (("GET", "/ui/sessions", None), None),
        "end_session": (("POST", "/ui/sessions/nosuchsession/end", {}), None),
        "logout": (("POST", "/ui/logout", {}), None),  # walked last: it ends the session
    }
    routes = ui_routes(client)
    assert sorted(routes) == sorted(f"service.web.routes:{name}" for name in walk), "a /ui route is not walked"
    for scope in ALL_SCOPES:
        key = key_with(db, scope)
        api = {"Authorization": f"Bearer {key}"}
        sign_in(client, key)
        csrf = session_csrf(db, client)
        for name, ((method, path, form), twin) in walk.items():
            needed = required_scope(routes[f"service.web.routes:{name}"].endpoint)
            if method == "GET":
                r = client.get(path, follow_redirects=False)
            else:
                r = client.post(path, data={**(form or {}), "csrf": csrf}, follow_redirects=False)
            refused = r.status_code == 403
            allowed = needed in (SIGNED_IN, scope)
            assert refused == (not allowed), (scope, name, r.status_code, r.text[:300])
            if refused:
                assert f"lacks the `{needed}` scope" in r.text, (scope, name, r.text[:300])
            if twin is not None:
                t_method, t_path, body = twin
                a = client.request(t_method, t_path, json=body, headers=api)
                assert (a.status_code == 403) == refused, (scope, name, r.status_code, a.status_code, a.text[:200])


# ------------------------------------------------------------------------------- 2. rate limits


def test_the_dashboard_counts_against_the_keys_rate_limits(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str]
) -> None:
    limited = settings.model_copy(update={"rate_limit": "8/minute", "rate_limit_expensive": "2/minute"})
    with TestClient(create_app(limited)) as client:
        key = key_with(db, "read", "select")
        sign_in(client, key)  # the sign-in form is not a key's request
        pool = make_pool(client, {"Authorization": f"Bearer {key}"})["id"]  # 1 general + (not expensive)
        csrf = session_csrf(db, client)
        form = {"size": "1", "strategy": "random", "csrf": csrf}
        answers = [client.post(f"/ui/pools/{pool}/batches", data=form, follow_redirects=False) for _ in range(3)]
        assert [a.status_code for a in answers[:2]] == [303, 303]  # refused by the domain (no items), but counted
        assert answers[2].status_code == 429 and "Retry-After" in answers[2].headers
        assert "rate limit" in answers[2].text
        # the general bucket: the API and the dashboard share it (1 + 3 requests so far, 8 allowed)
        statuses = [client.get("/ui/pools/" + pool + "/curve.json").status_code for _ in range(6)]
        assert statuses[:4] == [200] * 4 and statuses[4:] == [429, 429], statuses
        assert client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"}).status_code == 429


# ------------------------------------------------------------------------------- 3. server-side sessions


def test_signing_out_ends_the_session_for_every_copy_of_the_cookie(
    client: TestClient, db: sessionmaker[Session], api_key: str
) -> None:
    sign_in(client, api_key)
    saved = client.cookies.get("bait_session")
    csrf = session_csrf(db, client)
    assert client.get("/ui", follow_redirects=False).status_code == 200
    assert client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    client.cookies.set("bait_session", saved or "", path="/ui")  # the attacker replays the saved cookie
    assert client.get("/ui", follow_redirects=False).status_code == 303
    assert client.get("/ui/sessions", follow_redirects=False).headers["location"].startswith("/ui/login")
    r = client.post("/ui/pools/x/labels", data={"item_id": "a", "value": "b", "csrf": csrf}, follow_redirects=False)
    assert r.status_code == 401
    with session_scope(db) as s:
        assert s.execute(select(WebSession.ended_reason)).scalar_one() == "logout"


def test_idle_and_absolute_timeouts_and_revocation_end_sessions(
    client: TestClient, db: sessionmaker[Session], api_key: str, settings: Settings
) -> None:
    sign_in(client, api_key)
    assert client.get("/ui", follow_redirects=False).status_code == 200
    idle = datetime.now(UTC) - timedelta(seconds=settings.session_idle_seconds + 5)
    with session_scope(db) as s:
        s.execute(update(WebSession).values(last_seen_at=idle))
    assert client.get("/ui", follow_redirects=False).status_code == 303  # idle too long
    sign_in(client, api_key)
    born = datetime.now(UTC) - timedelta(seconds=settings.session_max_seconds + 5)
    with session_scope(db) as s:
        s.execute(update(WebSession).where(WebSession.ended_at.is_(None)).values(created_at=born))
    assert client.get("/ui", follow_redirects=False).status_code == 303  # active, but past the lifetime
    sign_in(client, api_key)
    assert client.get("/ui", follow_redirects=False).status_code == 200
    with session_scope(db) as s:
        key_id = s.execute(select(ApiKey.id)).scalars().first()
        assert key_id is not None
        revoke_key(s, key_id)
    assert client.get("/ui", follow_redirects=False).status_code == 303
    with session_scope(db) as s:
        reasons = sorted(r or "" for r in s.execute(select(WebSession.ended_reason)).scalars())
    assert reasons == ["revoked"] * 3  # the timed-out two were only refused; revocation ends every open row


def test_an_admin_sees_the_tenants_sessions_and_ends_one(
    client: TestClient, db: sessionmaker[Session], other_key: str
) -> None:
    annotator = key_with(db, "read", "label")
    admin = key_with(db, "read", "admin")
    other = TestClient(client.app)
    sign_in(other, annotator)
    with other:
        assert other.get("/ui", follow_redirects=False).status_code == 200
        intruder = TestClient(client.app)
        sign_in(intruder, other_key)  # another tenant's browser: never listed, never endable
        sign_in(client, admin)
        page = client.get("/ui/sessions")
        assert page.status_code == 200 and 'id="sessions"' in page.text
        rows = re.findall(r'<tr data-session="([0-9a-f]+)">(.*?)</tr>', page.text, re.S)
        assert len(rows) == 2  # the annotator's and the admin's own, not the other tenant's
        with session_scope(db) as s:
            theirs = s.execute(select(WebSession.id).join(ApiKey).where(ApiKey.name == "read+label")).scalar_one()
            foreign = s.execute(select(WebSession.id).join(ApiKey).where(ApiKey.name.is_(None))).scalar_one()
        csrf = session_csrf(db, client)
        r = client.post(f"/ui/sessions/{foreign}/end", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 404
        assert intruder.get("/ui", follow_redirects=False).status_code == 200
        r = client.post(f"/ui/sessions/{theirs}/end", data={"csrf": csrf}, follow_redirects=False)
        assert r.status_code == 303 and "session%20ended" in r.headers["location"]
        assert other.get("/ui", follow_redirects=False).status_code == 303  # signed out at its next request
        # an annotator cannot see or end sessions
        assert other.get("/ui/sessions", follow_redirects=False).status_code == 303  # (signed out already)
        sign_in(other, annotator)
        assert other.get("/ui/sessions", follow_redirects=False).status_code == 403


# ------------------------------------------------------------------------------- 4. CSV formulas


def test_csv_export_neutralises_formula_cells(
    client: TestClient, auth: dict[str, str], api_key: str, run_jobs: Any
) -> None:
    pool = make_pool(client, auth, classes=['=HYPERLINK("http://evil")', "@SUM(A1)", "ok"])["id"]
    ids = ["=cmd|' -C calc'!A0", "+1+1", "-2+3", "@x", "plain"] + [f"i{i}" for i in range(22)]
    texts = ["=1+2", "\tTAB", "\rCR", "-3", "x"]
    items = [
        {"id": i, "embedding": [float(n % 5), 1.0, float(n % 3), 0.5], "data": {"text": texts[n % 5]}}
        for n, i in enumerate(ids)
    ]
    r = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    assert r.status_code == 200, r.text
    r = client.post(f"/v1/pools/{pool}/batches", json={"size": 27, "strategy": "random"}, headers=auth)
    run_jobs()
    batch = r.json()["id"]
    labels = [{"item_id": ids[0], "label": '=HYPERLINK("http://evil")'}, {"item_id": ids[1], "label": "@SUM(A1)"}]
    assert client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=auth).status_code == 200
    sign_in(client, api_key)
    text = client.get(f"/ui/pools/{pool}/batches/{batch}/export.csv").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 27
    for row in rows:
        for field, value in row.items():
            assert not value.startswith(("=", "+", "-", "@", "\t", "\r")), (field, value)
    by_id = {r["item_id"]: r for r in rows}
    assert "'=cmd|' -C calc'!A0" in by_id and "'@x" in by_id and "plain" in by_id
    assert {r["text"] for r in rows} == {"'=1+2", "'\tTAB", "'\rCR", "'-3", "x"}
    assert by_id["'=cmd|' -C calc'!A0"]["label"] == '\'=HYPERLINK("http://evil")'


# ------------------------------------------------------------------------------- 5. content links


@pytest.fixture
def data_root(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    (root / "acme").mkdir(parents=True)
    return root


def test_content_links_serve_only_raster_images_and_text_inline(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], data_root: Path
) -> None:
    from service.domain import content

    files = {"a.png": PNG, "b.svg": SVG, "c.html": b"<script>alert(1)</script>", "d.txt": b"hello", "e.xml": b"<x/>"}
    for name, body in files.items():
        (data_root / "acme" / name).write_bytes(body)
    app_settings = settings.model_copy(update={"data_root": data_root})
    with TestClient(create_app(app_settings)) as client:
        pool = make_pool(client, auth)["id"]
        items = [
            {"id": name, "embedding": [1.0, 0.0, 0.0, float(n)], "data": {"f": f"file://{data_root}/acme/{name}"}}
            for n, name in enumerate(files)
        ]
        assert client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth).status_code == 200
        for name, body in files.items():
            r = client.get(f"/labelstudio/content/{content.sign(app_settings, pool, name, 'f', 60)}")
            assert r.status_code == 200 and r.content == body, (name, r.text)
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-security-policy"] == "default-src 'none'; sandbox"
            inline = name.endswith((".png", ".txt"))
            assert r.headers["content-disposition"].startswith("inline" if inline else "attachment"), name


@pytest.mark.parametrize(
    "value",
    [
        "javascript:alert(document.cookie)",
        " JaVaScRiPt:alert(1)",
        "\x01javascript:alert(1)",
        "java\tscript:alert(1)",
        "javascript: alert(1)",
        "vbscript:msgbox(1)",
        "data:text/html,<script>alert(1)</script>",
        "data:image/svg+xml;base64,PHN2Zz48L3N2Zz4=",
        "blob:http://127.0.0.1/x",
        "mailto:someone@example.org",
        "file:///etc/passwd",
    ],
)
def test_item_data_links_other_than_http_file_and_raster_data_are_refused(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], data_root: Path, value: str
) -> None:
    with TestClient(create_app(settings.model_copy(update={"data_root": data_root}))) as client:
        pool = make_pool(client, auth)["id"]
        item = {"id": "x", "embedding": [1.0, 0.0, 0.0, 0.0], "data": {"text": "fine", "nested": [{"img": value}]}}
        r = client.post(f"/v1/pools/{pool}/items", json={"items": [item]}, headers=auth)
        assert_error(r, 400, "invalid_item_data", "'x'")
        assert client.get(f"/v1/pools/{pool}/items", headers=auth).json()["items"] == []  # nothing written


def test_item_data_keeps_text_and_allowed_links(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], data_root: Path
) -> None:
    with TestClient(create_app(settings.model_copy(update={"data_root": data_root}))) as client:
        pool = make_pool(client, auth)["id"]
        data = {
            "text": "Note: this is text, not a link",
            "img": "https://images.example.org/a.png",
            "local": f"file://{data_root}/acme/a.png",
            "thumb": "data:image/png;base64,iVBORw0KGgo=",
            "time": "10:30",
        }
        item = {"id": "ok", "embedding": [1.0, 0.0, 0.0, 0.0], "data": data}
        r = client.post(f"/v1/pools/{pool}/items", json={"items": [item]}, headers=auth)
        assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------- 6. login CSRF


@pytest.mark.parametrize("origin", [None, "null", "http://evil.example"])
def test_sign_in_without_the_forms_token_is_refused_whatever_the_origin(
    client: TestClient, api_key: str, db: sessionmaker[Session], origin: str | None
) -> None:
    """An attacker's page posts its own key to /ui/login: it cannot send the browser's bait_login cookie
    (SameSite=Strict) nor read the form's token, so nothing signs the browser in."""
    headers = {} if origin is None else {"Origin": origin}
    client.cookies.clear()
    r = client.post("/ui/login", data={"api_key": api_key}, headers=headers, follow_redirects=False)
    assert r.status_code == 403 and "bait_session" not in r.headers.get("set-cookie", "")
    r = client.post(
        "/ui/login", data={"api_key": api_key, "login_csrf": "forged-token-0123456789"}, headers=headers,
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 403 and "bait_session" not in r.headers.get("set-cookie", "")
    with session_scope(db) as s:
        assert s.execute(select(WebSession)).first() is None


# ------------------------------------------------------------------------------- 7. Label Studio hints


@pytest.fixture
def ls() -> Iterator[FakeLabelStudio]:
    with fake_labelstudio() as fake:
        yield fake


def test_unauthenticated_delete_events_coalesce_and_are_rate_limited(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    from tests.worker.factories import make_pool as make_worker_pool

    pool = make_worker_pool(db, n=20, n_labeled=6)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    run_jobs()
    with session_scope(db) as s:  # the connect's own reconcile ran long enough ago
        s.execute(update(ReconcileRun).values(created_at=datetime.now(UTC) - timedelta(minutes=5)))
        before = len(s.execute(select(ReconcileRun)).scalars().all())
    event = {"action": "ANNOTATIONS_DELETED", "annotations": [{"id": 1}]}
    answers = [client.post(f"/labelstudio/{created['id']}/webhook", json=event).json() for _ in range(10)]
    # the first starts a reconcile; the rest join it while it is queued or running, or are refused once it ran
    assert answers[0]["status"] == "queued", answers
    assert all(a["status"] in ("coalesced", "ignored") for a in answers[1:]), answers
    run_jobs()
    answers += [client.post(f"/labelstudio/{created['id']}/webhook", json=event).json() for _ in range(5)]
    assert all(a["status"] == "ignored" and "at most one every" in a["reason"] for a in answers[10:]), answers
    with session_scope(db) as s:
        assert len(s.execute(select(ReconcileRun)).scalars().all()) == before + 1
    view = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth).json()
    assert view["refused_hints"] == sum(a["status"] == "ignored" for a in answers) >= 5
    # an event with the backend's credentials is not throttled
    r = client.post(f"/labelstudio/{created['id']}/{created['secret']}/webhook", json=event)
    assert r.json()["status"] == "queued"


# ------------------------------------------------------------------------------- 8. headers


def test_every_response_carries_the_security_headers(
    client: TestClient, api_key: str, db: sessionmaker[Session]
) -> None:
    def check(r: Any, csp: str) -> None:
        assert r.headers["content-security-policy"] == csp, (r.url, r.status_code)
        assert r.headers["x-content-type-options"] == "nosniff"
        assert r.headers["x-frame-options"] == "DENY"
        assert r.headers["referrer-policy"] == "same-origin"

    check(client.get("/ui/nosuchpage"), DASHBOARD_CSP)  # 404 page of the dashboard
    check(client.get("/ui/static/nosuch.css"), DASHBOARD_CSP)
    check(client.get("/ui/login"), DASHBOARD_CSP)
    check(client.get("/v1/pools"), DEFAULT_CSP)  # 401 JSON
    check(client.get("/nosuch"), DEFAULT_CSP)
    check(client.get("/healthz"), DEFAULT_CSP)
    check(client.post("/v1/pools", content=b"x" * (3 * 2**20)), DEFAULT_CSP)  # 413 from the body limit
    sign_in(client, api_key)
    r = client.post("/ui/logout", data={"csrf": "wrong"}, follow_redirects=False)  # the CSRF 403 page
    assert r.status_code == 403
    check(r, DASHBOARD_CSP)
    docs = client.get("/docs")
    assert "unsafe-inline" in docs.headers["content-security-policy"]  # its own policy is kept
    assert docs.headers["x-frame-options"] == "DENY"


# ------------------------------------------------------------------------------- 9. URLs and paths


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999/x", "http://127.0.0.1:port/x", "ftp://h/x"])
def test_malformed_urls_are_a_400_invalid_url(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], url: str
) -> None:
    pool = make_pool(client, auth)["id"]
    r = client.post(f"/v1/pools/{pool}/webhooks", json={"url": url}, headers=auth)
    assert_error(r, 400, "invalid_url", "webhook url")
    body = {"url": url, "token": "t", "project_id": 1}
    r = client.post(f"/v1/pools/{pool}/integrations/labelstudio", json=body, headers=auth)
    assert_error(r, 400, "invalid_url", "Label Studio url")
    assert client.get(f"/v1/pools/{pool}/webhooks", headers=auth).json()["webhooks"] == []


def test_reference_errors_show_paths_relative_to_the_tenants_folder(data_root: Path) -> None:
    from service.outbound import OutboundPolicy
    from worker.references import BadReference, FetchLimits, read_file

    (data_root / "acme" / "sub").mkdir()
    limits = FetchLimits(data_root=data_root / "acme", policy=OutboundPolicy.parse(), max_bytes=2**20, timeout_s=5)
    for uri in (f"file://{data_root}/acme/sub/missing.npy", f"file://{data_root}/acme/sub", f"file://{data_root}/x"):
        with pytest.raises(BadReference) as caught:
            read_file(uri, limits)
        assert str(data_root) not in str(caught.value), caught.value
    with pytest.raises(BadReference, match=r"sub/missing\.npy"):
        read_file(f"file://{data_root}/acme/sub/missing.npy", limits)


# ------------------------------------------------------------------------------- 10. logs


def test_no_log_line_carries_url_credentials(
    client: TestClient, auth: dict[str, str], run_jobs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from tests.service.test_webhooks import Receiver

    receiver = Receiver([200])
    try:
        pool = make_pool(client, auth)["id"]
        put_items(client, auth, pool, [f"i{i}" for i in range(10)], embeddings(10))
        url = receiver.url.replace("http://", "http://user:hunter2secret@") + "?token=tok-sec-123&x=1"
        r = client.post(f"/v1/pools/{pool}/webhooks", json={"url": url}, headers=auth)
        assert r.status_code == 201, r.text
        caplog.set_level(logging.DEBUG)
        for name in ("httpx", "httpcore"):  # an earlier test may have quietened these libraries' own loggers
            caplog.set_level(logging.DEBUG, logger=name)
        client.post(f"/v1/pools/{pool}/batches", json={"size": 2, "strategy": "random"}, headers=auth)
        run_jobs(until=lambda: len(receiver.received) >= 1)
    finally:
        receiver.close()
    assert receiver.received[0][0]["authorization"].startswith("Basic ")  # the credentials were used...
    lines = [rec.getMessage() for rec in caplog.records]
    port = str(urlsplit(receiver.url).port)
    assert any(port in line for line in lines), lines  # ...and the delivery was logged (httpx / httpcore lines)
    assert not [line for line in lines if "hunter2secret" in line or "tok-sec-123" in line]


def test_log_redaction_covers_any_logger_and_argument_style() -> None:
    install_log_redaction()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger("some.third.party")
    handler = Keep()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("POST %s", "https://u:p4ss@host.example/x?api_key=k3y&ok=1")
        logger.warning("GET http://a:b@h/ then %(u)s", {"u": "redis://:pw@127.0.0.1:6379/0"})
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    text = " ".join(r.getMessage() for r in records)
    assert "p4ss" not in text and "k3y" not in text and ":b@" not in text and ":pw@" not in text
    assert "ok=1" in text and "host.example/x" in text
    assert redact_text("no url here = fine") == "no url here = fine"


def test_item_rows_are_untouched_by_a_refused_upload(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    """Bulk .npz uploads go through the same data-link rule (a data array of JSON strings)."""
    import numpy as np

    pool = make_pool(client, auth)["id"]
    buf = io.BytesIO()
    np.savez(
        buf,
        ids=np.array(["a", "b"]),
        embeddings=np.ones((2, 4), dtype=np.float32),
        data=np.array(['{"t": "fine"}', '{"u": "javascript:alert(1)"}']),
    )
    r = client.post(f"/v1/pools/{pool}/items:bulk", content=buf.getvalue(), headers=auth)
    assert_error(r, 400, "invalid_item_data", "'b'", "javascript")
    with session_scope(db) as s:
        assert s.execute(select(Item)).first() is None
