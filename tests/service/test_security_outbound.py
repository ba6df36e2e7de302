"""Issue 10, the outbound guard and what it keeps private.

- Webhooks and Label Studio URLs to loopback are refused under the default settings (400, nothing
  stored, the peer never contacted) and accepted through the operator allowlist.
- Metadata, private, CGNAT, 6to4, NAT64, IPv4-mapped addresses, a DNS name that resolves to a private
  address, and a redirect from a loopback server to a private address are refused at the guard. Name
  resolution is stubbed and so is ``socket.connect``: a connect to anything but 127.0.0.0/8 or ::1
  raises and is recorded, so no packet can leave even if the guard were broken.
- Foreign error bodies never reach a tenant (webhook deliveries, Label Studio at connect, references).
- Per-tenant data roots; secrets out of the access log; /readyz without exception text; /metrics token.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.logredact import AccessLogRedactor, install_access_log_redaction, redact_path, redact_url
from service.main import create_app
from service.outbound import OutboundClient, OutboundError, OutboundPolicy, OutboundRefused
from service.store.models import Integration, WebhookDelivery, WebhookEndpoint
from tests.fake_labelstudio import fake_labelstudio
from tests.worker.factories import make_pool
from worker import context
from worker.references import BadReference, FetchLimits, fetch, tenant_data_root
from worker.webhooks import batch_finished, deliver

SECRET_BODY = b"SECRET-BODY"

# ------------------------------------------------------------------------------------------ no egress


def _is_loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@pytest.fixture
def egress(loopback_only: list[Any]) -> list[Any]:
    """Every attempted connect to a non-loopback address, refused by the suite-wide stub (tests/conftest.py)."""
    return loopback_only


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[str]]:
    """Stubbed name resolution: names map to the listed addresses; literals resolve to themselves;
    anything else does not resolve (no DNS query ever leaves)."""
    table: dict[str, list[str]] = {"localhost": ["127.0.0.1"]}
    lookups: list[str] = []

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        name = host.decode() if isinstance(host, bytes) else str(host)
        lookups.append(name)
        try:
            addresses = [str(ipaddress.ip_address(name.split("%", 1)[0]))]
        except ValueError:
            if name not in table:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known") from None
            addresses = table[name]
        out = []
        for a in addresses:
            fam = socket.AF_INET6 if ":" in a else socket.AF_INET
            sockaddr: tuple[Any, ...] = (a, int(port or 0), 0, 0) if fam == socket.AF_INET6 else (a, int(port or 0))
            out.append((fam, socket.SOCK_STREAM, 6, "", sockaddr))
        return out

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    table["__lookups__"] = lookups
    return table


# ------------------------------------------------------------------------------------------ peers


class Peer:
    """A loopback HTTP server: ``routes[path] = (status, headers, body)``; records (method, path, headers)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes]] = {}
        self.default: tuple[int, dict[str, str], bytes] = (500, {}, SECRET_BODY)
        self.seen: list[tuple[str, str, dict[str, str]]] = []
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                peer.seen.append((self.command, self.path, {k.lower(): v for k, v in self.headers.items()}))
                status, headers, body = peer.routes.get(self.path.split("?")[0], peer.default)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """Default outbound policy (no allowlist), with a data root for the per-tenant folder tests."""
    root = tmp_path / "data"
    root.mkdir()
    return settings.model_copy(update={"data_root": root})


def allowing(settings: Settings, allow: str) -> Settings:
    return settings.model_copy(update={"outbound_allow": allow})


def count(db: sessionmaker[Session], model: Any) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


# ------------------------------------------------------------------------------------------ the guard


REFUSED = [
    ("169.254.169.254", "link-local"),
    ("10.0.0.5", "private"),
    ("192.168.1.1", "private"),
    ("172.16.3.4", "private"),
    ("100.64.1.1", "carrier-grade NAT"),
    ("[2002:a00:5::1]", "6to4"),
    ("[64:ff9b::a00:5]", "NAT64"),
    ("[::ffff:10.0.0.1]", "private"),
    ("[::ffff:169.254.169.254]", "link-local"),
    ("[fd00::1]", "unique local"),
    ("[fe80::1]", "link-local"),
    ("[::1]", "loopback"),
    ("127.0.0.1", "loopback"),
    ("0.0.0.0", "unspecified"),
    ("224.0.0.1", "multicast"),
    ("240.0.0.1", "reserved"),
]


@pytest.mark.parametrize(("host", "why"), REFUSED)
def test_guard_refuses_internal_addresses_without_connecting(
    host: str, why: str, egress: list[Any], dns: dict[str, list[str]]
) -> None:
    with OutboundClient(OutboundPolicy(), timeout=2) as http, pytest.raises(OutboundRefused, match=why) as info:
        http.request("GET", f"http://{host}/latest/meta-data/")
    assert "BAIT_OUTBOUND_ALLOW" in info.value.message
    assert egress == []


def test_guard_refuses_a_name_that_resolves_to_a_private_address(egress: list[Any], dns: dict[str, list[str]]) -> None:
    dns["intranet.example.com"] = ["10.0.0.5"]
    dns["mixed.example.com"] = ["93.184.215.14", "192.168.1.1"]  # one bad answer is enough to refuse
    with OutboundClient(OutboundPolicy(), timeout=2) as http:
        with pytest.raises(OutboundRefused, match=r"'intranet.example.com' resolves to the private address 10\."):
            http.request("POST", "https://intranet.example.com/hook", content=b"{}")
        with pytest.raises(OutboundRefused, match=r"private address 192\.168\.1\.1"):
            http.request("GET", "http://mixed.example.com/")
    assert egress == []


def test_redirect_from_loopback_to_a_private_address_is_refused(
    peer: Peer, egress: list[Any], dns: dict[str, list[str]]
) -> None:
    dns["intranet.example.com"] = ["192.168.1.1"]
    peer.routes["/to-ip"] = (302, {"Location": "http://10.0.0.5/admin"}, b"")
    peer.routes["/to-name"] = (307, {"Location": "http://intranet.example.com/admin"}, b"")
    peer.routes["/to-metadata"] = (301, {"Location": "http://169.254.169.254/latest/meta-data/"}, b"")
    with OutboundClient(OutboundPolicy.parse("127.0.0.1"), timeout=2) as http:
        with pytest.raises(OutboundRefused, match=r"private address 10\.0\.0\.5"):
            http.request("GET", f"{peer.url}/to-ip")
        with pytest.raises(OutboundRefused, match=r"private address 192\.168\.1\.1"):
            http.request("POST", f"{peer.url}/to-name", content=b"x")
        with pytest.raises(OutboundRefused, match="link-local"):
            http.request("GET", f"{peer.url}/to-metadata")
    assert [p for _, p, _ in peer.seen] == ["/to-ip", "/to-name", "/to-metadata"]
    assert egress == []


def test_redirects_are_bounded_and_followed_on_allowed_hosts(peer: Peer, dns: dict[str, list[str]]) -> None:
    peer.routes["/loop"] = (302, {"Location": "/loop"}, b"")
    peer.routes["/a"] = (303, {"Location": "/b"}, b"")
    peer.routes["/b"] = (200, {}, b"arrived")
    with OutboundClient(OutboundPolicy.parse("127.0.0.1"), timeout=2) as http:
        with pytest.raises(OutboundError, match="more than 3 redirects"):
            http.request("GET", f"{peer.url}/loop")
        r = http.request("POST", f"{peer.url}/a", content=b"x", headers={"Authorization": "Token t"})
    assert r.status_code == 200 and r.content == b"arrived"
    assert peer.seen[-1][0] == "GET"  # 303 continues as GET


def test_connection_goes_to_the_checked_address_once_resolved(peer: Peer, dns: dict[str, list[str]]) -> None:
    dns["ls.internal"] = ["127.0.0.1"]
    lookups = dns["__lookups__"]
    peer.routes["/x"] = (200, {}, b"ok")
    with OutboundClient(OutboundPolicy.parse("ls.internal"), timeout=2) as http:
        lookups.clear()
        r = http.request("GET", f"http://ls.internal:{peer.port}/x")
    assert r.content == b"ok"
    # the name is resolved once (by the guard); the connection is made to the checked address literal
    assert lookups == ["ls.internal", "127.0.0.1"]
    assert peer.seen[-1][2]["host"] == f"ls.internal:{peer.port}"  # the Host header keeps the name


def test_allowlist_entries_open_exactly_what_they_name(dns: dict[str, list[str]]) -> None:
    policy = OutboundPolicy.parse("10.0.0.0/8, labelstudio.internal ,::1")
    assert policy.refusal("x", "10.0.0.5") is None
    assert policy.refusal("x", "::ffff:10.0.0.1") is None  # judged by its IPv4 address
    assert policy.refusal("x", "::1") is None
    assert policy.refusal("labelstudio.internal", "192.168.1.1") is None
    assert policy.refusal("x", "192.168.1.1") == "private"
    assert policy.refusal("x", "169.254.169.254") == "link-local (cloud metadata)"
    assert policy.refusal("x", "93.184.215.14") is None  # public addresses need no entry
    assert OutboundPolicy(allow_all=True).refusal("x", "169.254.169.254") is None  # deprecated alias
    with pytest.raises(ValueError, match="BAIT_OUTBOUND_ALLOW"):
        Settings(outbound_allow="10.0.0.0/33")


def test_answer_size_is_capped(peer: Peer, dns: dict[str, list[str]]) -> None:
    peer.routes["/big"] = (200, {}, b"z" * 5000)
    client = OutboundClient(OutboundPolicy.parse("127.0.0.1"), timeout=2, max_bytes=1024)
    with client as http, pytest.raises(OutboundError, match="larger than the limit of 1024"):
        http.request("GET", f"{peer.url}/big")


# ------------------------------------------------------------------------------------------ webhooks


def test_webhook_to_loopback_is_refused_by_default_and_nothing_is_stored(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], peer: Peer, egress: list[Any]
) -> None:
    pool = make_pool(db, n=10, n_labeled=2)
    for url in (f"{peer.url}/hook", "http://169.254.169.254/latest/meta-data/", "http://[::ffff:10.0.0.1]/x"):
        r = client.post(f"/v1/pools/{pool.pool_id}/webhooks", json={"url": url}, headers=auth)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "destination_refused" and "BAIT_OUTBOUND_ALLOW" in err["message"]
    assert count(db, WebhookEndpoint) == 0
    assert peer.seen == [] and egress == []


def test_webhook_to_loopback_works_through_the_allowlist_and_never_shows_the_answer_body(
    settings: Settings, auth: dict[str, str], db: sessionmaker[Session], peer: Peer
) -> None:
    allowed = allowing(settings, "127.0.0.1")
    pool = make_pool(db, n=10, n_labeled=2)
    with TestClient(create_app(allowed)) as c:
        r = c.post(f"/v1/pools/{pool.pool_id}/webhooks", json={"url": f"{peer.url}/hook"}, headers=auth)
        assert r.status_code == 201, r.text
        hook = r.json()
        context.configure(allowed.model_copy(update={"webhook_max_attempts": 1}))
        try:
            from tests.service.test_webhooks import finished_batch

            (delivery_id,) = batch_finished(finished_batch(db, pool.pool_id, "succeeded"))
            assert deliver(delivery_id) == "failed"
        finally:
            context.configure(settings)
        listed = c.get(f"/v1/pools/{pool.pool_id}/webhooks/{hook['id']}/deliveries", headers=auth)
    assert listed.status_code == 200
    (attempt,) = listed.json()["deliveries"][0]["log"]
    assert attempt["status_code"] == 500 and attempt["error"] == "HTTP 500 Internal Server Error"
    assert "SECRET-BODY" not in listed.text
    with session_scope(db) as s:
        assert "SECRET-BODY" not in str(s.get(WebhookDelivery, delivery_id).log)  # type: ignore[union-attr]
    assert peer.seen[0][0] == "POST" and peer.seen[0][1] == "/hook"


def test_webhook_failure_log_line_has_no_url_credentials(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    dead = Peer()
    dead.close()  # nothing listens there any more
    allowed = allowing(settings, "127.0.0.1")
    pool = make_pool(db, n=10, n_labeled=2)
    url = f"http://user:hunter2pw@127.0.0.1:{dead.port}/hook?token=tok-abc-123"
    with TestClient(create_app(allowed)) as c:
        assert c.post(f"/v1/pools/{pool.pool_id}/webhooks", json={"url": url}, headers=auth).status_code == 201
    context.configure(allowed.model_copy(update={"webhook_max_attempts": 1}))
    try:
        from tests.service.test_webhooks import finished_batch

        with caplog.at_level(logging.INFO):
            (delivery_id,) = batch_finished(finished_batch(db, pool.pool_id, "succeeded"))
            assert deliver(delivery_id) == "failed"
    finally:
        context.configure(settings)
    assert "failed after 1 attempts" in caplog.text
    assert "hunter2pw" not in caplog.text and "tok-abc-123" not in caplog.text


# ------------------------------------------------------------------------------------------ Label Studio


def test_labelstudio_url_to_loopback_is_refused_by_default(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], egress: list[Any]
) -> None:
    pool = make_pool(db, n=10, n_labeled=2)
    with fake_labelstudio() as ls:
        for verify in (True, False):
            body = {"url": ls.url, "token": ls.token, "project_id": 7, "verify": verify}
            r = client.post(f"/v1/pools/{pool.pool_id}/integrations/labelstudio", json=body, headers=auth)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["code"] == "destination_refused"
            assert "loopback" in r.json()["error"]["message"]
        assert ls.requests == []  # never contacted
        body = {"url": "http://169.254.169.254/", "token": "t", "project_id": 7}
        r = client.post(f"/v1/pools/{pool.pool_id}/integrations/labelstudio", json=body, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["code"] == "destination_refused"
    assert count(db, Integration) == 0
    assert egress == []


def test_labelstudio_url_to_loopback_is_accepted_through_the_allowlist(
    settings: Settings, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = make_pool(db, n=10, n_labeled=2)
    with fake_labelstudio() as ls, TestClient(create_app(allowing(settings, "127.0.0.1"))) as c:
        body = {"url": ls.url, "token": ls.token, "project_id": 7}
        r = c.post(f"/v1/pools/{pool.pool_id}/integrations/labelstudio", json=body, headers=auth)
        assert r.status_code == 201, r.text
        assert ls.requests  # checked at connect time
    assert count(db, Integration) == 1


def test_labelstudio_error_body_is_not_echoed_at_connect(
    settings: Settings, auth: dict[str, str], db: sessionmaker[Session], peer: Peer
) -> None:
    pool = make_pool(db, n=10, n_labeled=2)
    with TestClient(create_app(allowing(settings, "127.0.0.1"))) as c:
        for status in (500, 400):
            peer.default = (status, {"Content-Type": "application/json"}, b'{"detail": "SECRET-BODY"}')
            body = {"url": peer.url, "token": "tok", "project_id": 7}
            r = c.post(f"/v1/pools/{pool.pool_id}/integrations/labelstudio", json=body, headers=auth)
            assert r.status_code == 400, r.text
            assert f"HTTP {status}" in r.json()["error"]["message"]
            assert "SECRET-BODY" not in r.text
    assert count(db, Integration) == 0


# ------------------------------------------------------------------------------------------ references


def test_reference_error_body_is_not_echoed(peer: Peer) -> None:
    limits = FetchLimits(data_root=None, policy=OutboundPolicy.parse("127.0.0.1"), max_bytes=10_000, timeout_s=2)
    with pytest.raises(BadReference) as info:
        fetch(f"{peer.url}/x.npy", limits)
    assert str(info.value) == "HTTP 500 Internal Server Error from 127.0.0.1"


def test_reference_to_metadata_is_refused_without_connecting(egress: list[Any], dns: dict[str, list[str]]) -> None:
    dns["metadata.google.internal"] = ["169.254.169.254"]
    limits = FetchLimits(data_root=None, policy=OutboundPolicy(), max_bytes=10_000, timeout_s=2)
    with pytest.raises(BadReference, match="link-local"):
        fetch("http://metadata.google.internal/computeMetadata/v1/", limits)
    assert egress == []


def test_each_tenant_reads_only_its_own_folder(tmp_path: Path, settings: Settings) -> None:
    root = tmp_path / "data"
    for tenant in ("acme", "globex"):
        (root / tenant).mkdir(parents=True)
        (root / tenant / "v.txt").write_bytes(tenant.encode())
    os.symlink(root / "globex" / "v.txt", root / "acme" / "link.txt")
    s = settings.model_copy(update={"data_root": root})
    acme = FetchLimits.from_settings(s, "acme")
    assert acme.data_root == root / "acme"
    assert fetch(f"file://{root}/acme/v.txt", acme) == b"acme"
    for uri in (
        f"file://{root}/globex/v.txt",  # another tenant's folder, absolute
        f"file://{root}/acme/../globex/v.txt",  # ..
        f"file://{root}/acme/%2e%2e/globex/v.txt",  # encoded ..
        f"file://{root}/acme/link.txt",  # a symlink into another tenant's folder
        f"file://{root}/v.txt",  # the shared root itself
        "file:///etc/passwd",
    ):
        with pytest.raises(BadReference, match="outside the data root"):
            fetch(uri, acme)
    # names that are not plain folder names get no folder; an operator assignment wins
    assert tenant_data_root(s, "../globex") is None and tenant_data_root(s, "a/b") is None
    assigned = s.model_copy(update={"tenant_data_roots": {"acme": root / "globex"}})
    assert fetch(f"file://{root}/globex/v.txt", FetchLimits.from_settings(assigned, "acme")) == b"globex"
    assert tenant_data_root(settings.model_copy(update={"data_root": None}), "acme") is None


def test_a_tenant_cannot_embed_another_tenants_file(
    client: TestClient, other_auth: dict[str, str], settings: Settings, run_jobs: Any
) -> None:
    from tests.worker.test_embed_job import items_by_id
    from tests.worker.test_embed_job import make_pool as make_reference_pool

    root = settings.data_root
    assert root is not None
    for tenant in ("acme", "globex"):
        (root / tenant).mkdir()
        np.save(root / tenant / "v.npy", np.ones(4, np.float32))
    pool = make_reference_pool(client, other_auth, {"kind": "identity"})  # tenant globex
    items = [
        {"id": "own", "uri": f"file://{root}/globex/v.npy"},
        {"id": "theirs", "uri": f"file://{root}/acme/v.npy"},
        {"id": "dotdot", "uri": f"file://{root}/globex/../acme/v.npy"},
    ]
    r = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=other_auth)
    assert r.status_code < 300, r.text
    run_jobs()
    listed = items_by_id(client, other_auth, pool)
    assert listed["own"]["embedding_status"] == "ready"
    for ext in ("theirs", "dotdot"):
        assert listed[ext]["embedding_status"] == "error"
        assert "outside the data root" in listed[ext]["embedding_error"]


# ------------------------------------------------------------------------------------------ logs, readyz, metrics


def test_access_log_hides_the_ml_backend_secret_and_query_strings(caplog: pytest.LogCaptureFixture) -> None:
    assert redact_path("/labelstudio/int123/s3cr3t-value/predict") == "/labelstudio/int123/***/predict"
    assert redact_path("/labelstudio/int123/s3cr3t-value") == "/labelstudio/int123/***"
    assert redact_path("/v1/pools/p/items?cursor=abc") == "/v1/pools/p/items?***"
    assert redact_path("/v1/pools/p") == "/v1/pools/p"
    shown = redact_url("https://user:pw-123@hooks.example.com:8443/in/hook?token=tok-9")
    assert shown == "https://***@hooks.example.com:8443/in/hook?***"
    install_access_log_redaction()
    install_access_log_redaction()  # idempotent
    access = logging.getLogger("uvicorn.access")
    assert sum(isinstance(f, AccessLogRedactor) for f in access.filters) == 1
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        access.info(
            '%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "POST", "/labelstudio/int123/s3cr3t-value/predict", "1.1", 200
        )
    assert "s3cr3t-value" not in caplog.text and "/labelstudio/int123/***/predict" in caplog.text


def test_access_log_hides_content_link_tokens(caplog: pytest.LogCaptureFixture) -> None:
    """A /labelstudio/content/<token> link opens an item's file for 30 days: its token never reaches a log."""
    token = "eyJwIjoicG9vbCJ9.c2lnbmF0dXJlLXZhbHVl"
    assert redact_path(f"/labelstudio/content/{token}") == "/labelstudio/content/***"
    assert redact_path(f"/labelstudio/content/{token}?x=1") == "/labelstudio/content/***?***"
    assert token not in redact_url(f"https://bait.example.org/labelstudio/content/{token}")
    install_access_log_redaction()
    access = logging.getLogger("uvicorn.access")
    with caplog.at_level(logging.INFO, logger="uvicorn.access"):
        access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "GET", f"/labelstudio/content/{token}", "1.1", 200)
    assert token not in caplog.text and "/labelstudio/content/***" in caplog.text


def test_metrics_token_guards_every_figure(settings: Settings, auth: dict[str, str]) -> None:
    with TestClient(create_app(settings.model_copy(update={"metrics_token": "scrape-token-123"}))) as c:
        assert c.get("/metrics").status_code == 401
        wrong = c.get("/metrics", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "unauthorized"
        assert c.get("/metrics", headers=auth).status_code == 401  # a tenant key is not the token
        ok = c.get("/metrics", headers={"Authorization": "Bearer scrape-token-123"})
        assert ok.status_code == 200 and "bait_jobs" in ok.text
    with TestClient(create_app(settings)) as c:  # no token configured: no cross-tenant database figures
        open_ = c.get("/metrics")
        assert open_.status_code == 200 and "bait_http_requests_total" in open_.text
        assert "bait_jobs" not in open_.text and "bait_selection_seconds" not in open_.text


def test_readyz_names_the_dependency_not_the_exception(settings: Settings) -> None:
    broken = settings.model_copy(update={"redis_url": "redis://user:redispw@127.0.0.1:1/0"})
    c = TestClient(create_app(broken))
    r = c.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["details"] == {"database": "ok", "queue": "error"}
    assert "redispw" not in r.text and "Error" not in r.json()["error"]["message"]


def test_the_connect_stub_stops_a_guard_that_lets_everything_through(
    egress: list[Any], dns: dict[str, list[str]]
) -> None:
    """The safety net of these tests: even a guard allowing every address sends no packet out."""
    with OutboundClient(OutboundPolicy(allow_all=True), timeout=2) as http, pytest.raises(OutboundError):
        http.request("GET", "http://10.0.0.5/")
    assert egress and egress[0][0] == "10.0.0.5"
