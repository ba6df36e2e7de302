"""Outgoing webhooks: registration, signed deliveries a receiver can verify, retries with backoff, the
delivery log with response codes. The receiver is a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.webhooks import sign, verify_signature
from service.store.models import Batch, WebhookDelivery
from tests.worker.factories import make_pool
from worker import context
from worker.webhooks import batch_finished, deliver, sweep


class Receiver:
    """Answers each POST with the next status of ``statuses`` (the last one repeats); keeps what it got."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.received: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.received.append(({k.lower(): v for k, v in self.headers.items()}, body))
                n = len(receiver.received) - 1
                self.send_response(receiver.statuses[min(n, len(receiver.statuses) - 1)])
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The peers of these tests listen on 127.0.0.1, which the outbound guard refuses by default: the
    operator allowlist opens it, as the README's local setup does."""
    return settings.model_copy(update={"outbound_allow": "127.0.0.1"})


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([200])
    yield r
    r.close()


def register(client: TestClient, auth: dict[str, str], pool_id: str, url: str, **extra: Any) -> dict[str, Any]:
    r = client.post(f"/v1/pools/{pool_id}/webhooks", json={"url": url, **extra}, headers=auth)
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def finished_batch(db: sessionmaker[Session], pool_id: str, status: str) -> str:
    now = datetime.now(UTC)
    with session_scope(db) as s:
        batch = Batch(
            pool_id=pool_id, size=2, strategy="random", params={}, status=status, attempts=1, created_at=now,
            finished_at=now, item_ids=["item-00020", "item-00021"] if status == "succeeded" else None,
            error="boom" if status == "failed" else None,
        )  # fmt: skip
        s.add(batch)
        s.flush()
        return batch.id


def deliveries(client: TestClient, auth: dict[str, str], pool_id: str, hook_id: str) -> list[dict[str, Any]]:
    r = client.get(f"/v1/pools/{pool_id}/webhooks/{hook_id}/deliveries", headers=auth)
    assert r.status_code == 200, r.text
    out: list[dict[str, Any]] = r.json()["deliveries"]
    return out


def test_signature_verifies_and_rejects_tampering_and_stale_timestamps() -> None:
    body = b'{"event":"batch.succeeded"}'
    now = int(time.time())
    header = sign("s3cret-s3cret-s3cret", now, body)
    assert header.startswith("v1=") and len(header) == 3 + 64
    assert verify_signature("s3cret-s3cret-s3cret", body, str(now), header)
    assert not verify_signature("s3cret-s3cret-s3cret", body + b" ", str(now), header)
    assert not verify_signature("other-secret-other", body, str(now), header)
    assert not verify_signature("s3cret-s3cret-s3cret", body, str(now + 1), header)
    old = now - 600
    assert not verify_signature("s3cret-s3cret-s3cret", body, str(old), sign("s3cret-s3cret-s3cret", old, body))


def test_register_returns_secret_once_and_validates(
    client: TestClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: sessionmaker[Session],
    loopback_only: list[Any],
) -> None:
    pool = make_pool(db, n=10, n_labeled=2)
    # a public address literal: checked without any DNS query, never contacted here
    hook = register(client, auth, pool.pool_id, "https://93.184.215.14/hook", events=["batch.failed"])
    assert len(hook["secret"]) >= 16 and hook["events"] == ["batch.failed"]
    got = client.get(f"/v1/pools/{pool.pool_id}/webhooks/{hook['id']}", headers=auth)
    assert got.status_code == 200 and "secret" not in got.json() and hook["secret"] not in got.text
    assert client.get(f"/v1/pools/{pool.pool_id}/webhooks/{hook['id']}", headers=other_auth).status_code == 404
    bad = client.post(f"/v1/pools/{pool.pool_id}/webhooks", json={"url": "ftp://x/y"}, headers=auth)
    assert bad.status_code == 400 and "http(s)" in bad.json()["error"]["message"]
    bad = client.post(
        f"/v1/pools/{pool.pool_id}/webhooks", json={"url": "https://x/y", "events": ["nope"]}, headers=auth
    )
    assert bad.status_code == 422
    assert client.delete(f"/v1/pools/{pool.pool_id}/webhooks/{hook['id']}", headers=auth).status_code == 204
    assert client.get(f"/v1/pools/{pool.pool_id}/webhooks", headers=auth).json() == {"webhooks": []}
    assert loopback_only == []  # registering never contacted the receiver (any attempt would be blocked here)


def test_batch_succeeded_delivery_is_signed_and_logged(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, receiver: Receiver
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    hook = register(client, auth, pool.pool_id, receiver.url)
    r = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 3, "strategy": "random"}, headers=auth)
    run_jobs(until=lambda: len(receiver.received) >= 1)
    headers, body = receiver.received[0]
    assert headers["x-bait-event"] == "batch.succeeded"
    assert verify_signature(hook["secret"], body, headers["x-bait-timestamp"], headers["x-bait-signature"])
    import json

    payload = json.loads(body)
    assert payload["batch"]["id"] == r.json()["id"] and len(payload["batch"]["item_ids"]) == 3
    assert payload["delivery_id"] == headers["x-bait-delivery"] and payload["pool_id"] == pool.pool_id
    (delivery,) = deliveries(client, auth, pool.pool_id, hook["id"])
    assert delivery["status"] == "succeeded" and delivery["attempts"] == 1
    assert [a["status_code"] for a in delivery["log"]] == [200]


def test_failed_delivery_is_retried_with_backoff_until_it_succeeds(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Any
) -> None:
    receiver = Receiver([500, 503, 200])
    try:
        pool = make_pool(db, n=30, n_labeled=3)
        hook = register(client, auth, pool.pool_id, receiver.url)
        context.configure(settings)
        batch_id = finished_batch(db, pool.pool_id, "failed")
        (delivery_id,) = batch_finished(batch_id)
        with session_scope(db) as s:
            row = s.get(WebhookDelivery, delivery_id)
            assert row is not None and row.status == "pending" and row.attempts == 1
            first_due = row.next_attempt_at
            assert first_due is not None
            delay = (first_due - datetime.fromisoformat(row.log[0]["at"])).total_seconds()
            assert delay == pytest.approx(settings.webhook_backoff_seconds, abs=0.01)
        assert sweep() == []  # not due yet
        assert sweep((first_due + timedelta(seconds=0.1)).isoformat()) == [delivery_id]
        with session_scope(db) as s:
            row = s.get(WebhookDelivery, delivery_id)
            assert row is not None and row.status == "pending" and row.next_attempt_at is not None
            delay = (row.next_attempt_at - datetime.fromisoformat(row.log[1]["at"])).total_seconds()
            assert delay == pytest.approx(2 * settings.webhook_backoff_seconds, abs=0.01)  # doubled
            second_due = row.next_attempt_at
        sweep((second_due + timedelta(seconds=0.1)).isoformat())
        (shown,) = deliveries(client, auth, pool.pool_id, hook["id"])
        assert shown["status"] == "succeeded" and shown["event"] == "batch.failed"
        assert [a["status_code"] for a in shown["log"]] == [500, 503, 200]
        assert shown["payload"]["batch"]["error"] == "boom"
        # the same delivery id on every attempt, so receivers can deduplicate
        assert len({h["x-bait-delivery"] for h, _ in receiver.received}) == 1
    finally:
        receiver.close()


def test_delivery_gives_up_after_max_attempts_and_logs_unreachable(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Any
) -> None:
    pool = make_pool(db, n=30, n_labeled=3)
    dead = Receiver([200])
    dead.close()  # nothing listens there any more
    register(client, auth, pool.pool_id, dead.url, events=["batch.succeeded"])
    context.configure(settings.model_copy(update={"webhook_max_attempts": 2}))
    try:
        (delivery_id,) = batch_finished(finished_batch(db, pool.pool_id, "succeeded"))
        assert deliver(delivery_id) == "failed"
        with session_scope(db) as s:
            row = s.get(WebhookDelivery, delivery_id)
            assert row is not None and row.attempts == 2 and row.next_attempt_at is None
            assert [a["status_code"] for a in row.log] == [None, None]
            assert all("ConnectError" in a["error"] and "failed" in a["error"] for a in row.log)
    finally:
        context.configure(settings)


def test_endpoint_not_subscribed_to_the_event_gets_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Any, receiver: Receiver
) -> None:
    pool = make_pool(db, n=30, n_labeled=3)
    register(client, auth, pool.pool_id, receiver.url, events=["batch.failed"])
    context.configure(settings)
    assert batch_finished(finished_batch(db, pool.pool_id, "succeeded")) == []
    assert receiver.received == []
