"""The dashboard over HTTP (no browser): sign-in and its cookie, CSRF, tenancy, actions, exports, and
the offline API docs. The browser test (tests/e2e/test_dashboard_browser.py) drives the same pages in
Chromium."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from service.domain import dashboard
from service.store.models import ApiKey, Item
from tests.service.conftest import item_rows, make_pool, put_items


def login_form_token(client: TestClient) -> str:
    """The sign-in form's pre-session token (the page also sets it as the bait_login cookie)."""
    page = client.get("/ui/login")
    match = re.search(r'name="login_csrf" value="([^"]+)"', page.text)
    assert match, page.text
    return match.group(1)


def _sign_in(client: TestClient, key: str) -> str:
    r = client.post("/ui/login", data={"api_key": key, "login_csrf": login_form_token(client)}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui", r.text
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert key not in cookie  # the key is exchanged, never stored in the browser
    page = client.get("/ui")
    match = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert match, page.text
    return match.group(1)


def _pool_with_items(client: TestClient, auth: dict[str, str], n: int = 30) -> dict[str, Any]:
    pool = make_pool(client, auth)
    X = np.random.default_rng(0).standard_normal((n, 4)).astype(np.float32)
    put_items(client, auth, pool["id"], [f"i{i}" for i in range(n)], X)
    labels = [{"item_id": f"i{i}", "label": ["cat", "dog", "bird"][i % 3]} for i in range(6)]
    assert client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": labels}, headers=auth).status_code == 200
    return pool


def test_pages_need_a_session_and_bad_keys_are_refused(client: TestClient, api_key: str) -> None:
    r = client.get("/ui/pools/abc", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/ui/login?next=/ui/pools/abc"
    assert client.get("/ui/pools/abc/curve.json").status_code == 401
    r = client.post(
        "/ui/login", data={"api_key": "bait_wrong", "login_csrf": login_form_token(client)}, follow_redirects=False
    )
    assert r.status_code == 401 and "invalid or revoked API key" in r.text
    assert "bait_session" not in r.headers.get("set-cookie", "")
    # a made-up session token opens nothing (the cookie names a server-side session, not a claim)
    client.cookies.set("bait_session", "A" * 43, path="/ui")
    assert client.get("/ui", follow_redirects=False).status_code == 303


def test_sign_in_lists_only_own_pools_and_other_tenants_pool_is_404(
    client: TestClient, api_key: str, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    mine = make_pool(client, auth, name="mine")
    theirs = make_pool(client, other_auth, name="theirs")
    _sign_in(client, api_key)
    page = client.get("/ui").text
    assert "mine" in page and "theirs" not in page
    assert client.get(f"/ui/pools/{mine['id']}").status_code == 200
    for path in ("", "/curve.json", "/map.json", "/batches-fragment"):
        assert client.get(f"/ui/pools/{theirs['id']}{path}").status_code == 404, path


def test_posts_without_the_csrf_token_or_from_another_origin_are_refused(
    client: TestClient, api_key: str, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = _pool_with_items(client, auth)
    csrf = _sign_in(client, api_key)
    url = f"/ui/pools/{pool['id']}/batches"
    assert client.post(url, data={"size": "3", "strategy": "random"}, follow_redirects=False).status_code == 403
    r = client.post(url, data={"size": "3", "strategy": "random", "csrf": "x" + csrf}, follow_redirects=False)
    assert r.status_code == 403
    r = client.post(
        url,
        data={"size": "3", "strategy": "random", "csrf": csrf},
        headers={"Origin": "http://evil.example"},
        follow_redirects=False,
    )
    assert r.status_code == 403
    assert client.get(f"/v1/pools/{pool['id']}/batches", headers=auth).json()["batches"] == []  # nothing written


def test_request_batch_label_by_hand_export_and_sign_out(
    client: TestClient, api_key: str, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = _pool_with_items(client, auth)
    csrf = _sign_in(client, api_key)
    r = client.post(
        f"/ui/pools/{pool['id']}/batches", data={"size": "4", "strategy": "confidence", "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 303 and "requested" in r.headers["location"]
    r = client.post(
        f"/ui/pools/{pool['id']}/batches", data={"size": "999", "strategy": "confidence", "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 303 and "err=" in r.headers["location"]  # the domain's message, shown on the page
    run_jobs()
    batch = client.get(f"/v1/pools/{pool['id']}/batches", headers=auth).json()["batches"][0]
    assert batch["status"] == "succeeded"
    fragment = client.get(f"/ui/pools/{pool['id']}/batches-fragment").text
    assert f'id="batch-{batch["id"]}" data-status="succeeded"' in fragment
    page = client.get(f"/ui/pools/{pool['id']}/batches/{batch['id']}").text
    # in pick order (matched on the row attribute: a bare id like "i8" can also occur in a random token)
    assert page.index(f'data-item="{batch["item_ids"][0]}"') < page.index(f'data-item="{batch["item_ids"][1]}"')
    first = batch["item_ids"][0]
    back = f"/ui/pools/{pool['id']}/batches/{batch['id']}"
    r = client.post(
        f"/ui/pools/{pool['id']}/labels",
        data={"item_id": first, "value": "bird", "back": back, "csrf": csrf},
        follow_redirects=False,
    )
    assert r.status_code == 303 and r.headers["location"].startswith(back + "?msg=")
    row = item_rows(db, pool["id"])[first]
    assert row.status == "labeled" and row.label == "bird"
    r = client.post(
        f"/ui/pools/{pool['id']}/labels",
        data={"item_id": first, "value": "whale", "back": back, "csrf": csrf},
        follow_redirects=False,
    )
    assert "err=" in r.headers["location"] and item_rows(db, pool["id"])[first].label == "bird"
    csv_text = client.get(f"{back}/export.csv").text.splitlines()
    assert csv_text[0] == "position,item_id,status,label,predicted,confidence,text,uri"
    assert [line.split(",")[1] for line in csv_text[1:]] == batch["item_ids"]
    records = [json.loads(line) for line in client.get(f"{back}/export.jsonl").text.splitlines()]
    assert records[0]["item_id"] == first and records[0]["label"] == "bird" and records[0]["status"] == "labeled"
    assert all(r["predicted"] in ("cat", "dog", "bird") and 0 < r["confidence"] <= 1 for r in records)
    r = client.post("/ui/logout", data={"csrf": csrf}, follow_redirects=False)
    assert r.status_code == 303 and 'bait_session=""' in r.headers["set-cookie"]
    client.cookies.clear()
    assert client.get("/ui", follow_redirects=False).status_code == 303


def test_revoking_the_key_ends_the_session(client: TestClient, api_key: str, db: sessionmaker[Session]) -> None:
    _sign_in(client, api_key)
    assert client.get("/ui", follow_redirects=False).status_code == 200
    with db.begin() as s:
        s.execute(update(ApiKey).values(revoked_at=datetime.now(UTC)))
    assert client.get("/ui", follow_redirects=False).status_code == 303


def test_docs_and_redoc_load_only_vendored_assets(client: TestClient) -> None:
    for path in ("/docs", "/redoc"):
        r = client.get(path)
        assert r.status_code == 200
        urls = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert urls and all(u.startswith("/ui/static/vendor/") for u in urls), urls
        assert "default-src 'self'" in r.headers["content-security-policy"]
        for u in urls:
            assert client.get(u).status_code == 200, u
    assert "fonts.googleapis" not in client.get("/redoc").text
    assert client.get("/openapi.json").status_code == 200


def test_batch_page_shows_text_content_and_survives_items_without_data(
    client: TestClient, api_key: str, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = _pool_with_items(client, auth, n=12)
    csrf = _sign_in(client, api_key)
    client.post(
        f"/ui/pools/{pool['id']}/batches", data={"size": "6", "strategy": "random", "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    run_jobs()
    batch = client.get(f"/v1/pools/{pool['id']}/batches", headers=auth).json()["batches"][0]
    with db.begin() as s:
        s.execute(
            update(Item).where(Item.external_id == batch["item_ids"][0]).values(text="<b>a caption</b> " + "x" * 400)
        )
    page = client.get(f"/ui/pools/{pool['id']}/batches/{batch['id']}").text
    assert page.count('class="inline label-form"') == 6
    assert "<b>a caption" not in page and "&lt;b&gt;a caption&lt;/b&gt;" in page and "…" in page  # escaped, cut
    assert page.count("no content stored") == 5


def test_item_content_from_data_text_or_reference() -> None:
    png = "data:image/png;base64,iVBORw0KGgo="
    shown = dashboard._content({"data": {"image": png, "text": "a cat"}, "text": None, "uri": None})
    assert shown == {"text": "a cat", "image": png, "uri": None}
    # an image elsewhere is never loaded by the page: its reference is shown instead
    far = dashboard._content({"data": {"image": "https://example.com/a.png"}, "uri": "file:///d/a.png"})
    assert far == {"text": None, "image": None, "uri": "file:///d/a.png"}
    assert dashboard._content({"text": "x" * 300})["text"] == "x" * 280 + "…"
    assert dashboard._content({}) == {"text": None, "image": None, "uri": None}  # no data column at all


def test_dashboard_allows_a_key_only_what_its_scopes_allow(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    """A labeling tool's key (read, label) signed in to the dashboard can label but not request or cancel
    batches, and does not see integrations or webhook deliveries (admin only, as in the API)."""
    from service.db import session_scope
    from service.domain.keys import create_key

    pool = _pool_with_items(client, auth)
    with session_scope(db) as s:
        tool_key, _ = create_key(s, "acme", name="labeling-tool", scopes=("read", "label"))
    csrf = _sign_in(client, tool_key)
    page = client.get(f"/ui/pools/{pool['id']}").text
    assert page.count("Shown to keys with the <code>admin</code> scope.") == 2
    r = client.post(
        f"/ui/pools/{pool['id']}/batches", data={"size": "3", "strategy": "random", "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    # refused like the API refuses it (403 naming the missing scope), before anything is written
    assert r.status_code == 403 and "lacks the `select` scope" in r.text
    assert client.get(f"/v1/pools/{pool['id']}/batches", headers=auth).json()["batches"] == []  # nothing created
    back = f"/ui/pools/{pool['id']}"
    r = client.post(
        f"/ui/pools/{pool['id']}/labels", data={"item_id": "i9", "value": "cat", "back": back, "csrf": csrf},
        follow_redirects=False,
    )  # fmt: skip
    assert r.status_code == 303 and "msg=" in r.headers["location"]
    assert item_rows(db, pool["id"])["i9"].label == "cat"


def test_pool_page_shows_the_integration_status_sync_and_unmatched_annotations(
    client: TestClient, api_key: str, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    """The integrations card of an admin key: Label Studio's status, last sync and the annotations that
    matched no item (counted by the reconcile and webhook paths, shown so none is dropped silently)."""
    from service.db import session_scope
    from service.store.models import Integration

    pool = _pool_with_items(client, auth)
    with session_scope(db) as s:
        s.add(
            Integration(
                pool_id=pool["id"], kind="labelstudio", url="http://127.0.0.1:8080", token_encrypted=b"x",
                project_id=7, config={}, secret_hash="h" * 64, status="error", last_error="answered HTTP 401",
                last_synced_at=datetime(2026, 11, 24, 10, 30, tzinfo=UTC),
                state={"unmatched_annotations": 3, "refused_hints": 5},
            )
        )  # fmt: skip
    _sign_in(client, api_key)
    page = client.get(f"/ui/pools/{pool['id']}").text
    card = page.split("<h2>Integrations</h2>", 1)[1].split("</section>", 1)[0]
    assert "http://127.0.0.1:8080 #7" in card and "answered HTTP 401" in card and "2026-11-24 10:30" in card
    assert re.search(r'<td class="num">3</td>\s*<td class="num refused-hints">5</td></tr>', card), card
    # ^ the unmatched annotations, then the unauthenticated events refused (issue 24)
