"""Outgoing webhooks: endpoints a pool registers, the events they receive, and how deliveries are signed.

Events: ``batch.succeeded`` and ``batch.failed``. Each event to each subscribed endpoint is one
:class:`~service.store.models.WebhookDelivery` row; the worker (:mod:`worker.webhooks`) sends it, logs
every attempt's status code, and retries failures with exponential backoff
(``BAIT_WEBHOOK_BACKOFF_SECONDS`` x 2^(attempt-1), up to ``BAIT_WEBHOOK_MAX_ATTEMPTS``). Due retries are
picked up by a sweep job the api submits every ``BAIT_WEBHOOK_SWEEP_SECONDS`` (:class:`SweepTicker`).

Signature (Stripe-style, so receivers can verify and reject replays)::

    X-Bait-Event: batch.succeeded
    X-Bait-Delivery: <delivery id>            (the same on every retry of one delivery: dedupe on it)
    X-Bait-Timestamp: <unix seconds of this attempt>
    X-Bait-Signature: v1=<hex HMAC-SHA256(secret, "<timestamp>." + raw body)>

A receiver recomputes the HMAC over the timestamp, a dot and the raw request body with the endpoint's
secret (returned once, when the endpoint is created), compares with ``hmac.compare_digest`` and rejects
timestamps more than five minutes away from its clock (:func:`verify_signature` does exactly this).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service import catalog, crypto
from service.config import Settings
from service.domain.pools import get_pool
from service.errors import BadRequest, NotFound
from service.outbound import OutboundPolicy, check_destination
from service.queue import JobQueue
from service.store import integrations as repo
from service.store.models import WebhookDelivery, WebhookEndpoint
from service.urls import http_url

log = logging.getLogger(__name__)

EVENTS = ("batch.succeeded", "batch.failed")
SIGNATURE_TOLERANCE_S = 300


def utcnow() -> datetime:
    return datetime.now(UTC)


# ------------------------------------------------------------------------------------------ signing


def body_bytes(payload: dict[str, Any]) -> bytes:
    return json.dumps(payload, separators=(",", ":"), sort_keys=True, default=str).encode()


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """The ``X-Bait-Signature`` header value of ``body`` sent at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"v1={mac}"


def signed_headers(
    secret: str, event: str, delivery_id: str, body: bytes, timestamp: int | None = None
) -> dict[str, str]:
    ts = int(time.time()) if timestamp is None else timestamp
    return {
        "Content-Type": "application/json",
        "User-Agent": "bait-service-webhooks/1",
        "X-Bait-Event": event,
        "X-Bait-Delivery": delivery_id,
        "X-Bait-Timestamp": str(ts),
        "X-Bait-Signature": sign(secret, ts, body),
    }


def verify_signature(
    secret: str,
    body: bytes,
    timestamp: str,
    signature: str,
    *,
    now: float | None = None,
    tolerance_s: int = SIGNATURE_TOLERANCE_S,
) -> bool:
    """What a receiver does: recompute, compare in constant time, refuse stale timestamps."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, ts, body), signature.strip())


# ------------------------------------------------------------------------------------------ endpoints


@dataclass(frozen=True)
class EndpointRequest:
    url: str
    events: list[str]
    secret: str | None = None


def _check_url(url: str, settings: Settings) -> str:
    http_url(url, "webhook url")  # malformed, not http(s) or no host: 400 invalid_url
    # Resolved and checked now (and again at every delivery): loopback, private, link-local... refused.
    check_destination(url, OutboundPolicy.from_settings(settings), "webhook url")
    return url


def create_endpoint(
    session: Session, settings: Settings, tenant_id: str, pool_id: str, req: EndpointRequest
) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it and its signing secret (shown to the caller this once)."""
    pool = get_pool(session, tenant_id, pool_id)
    unknown = sorted(set(req.events) - set(EVENTS))
    if not req.events or unknown:
        raise BadRequest(f"events must be a non-empty subset of {list(EVENTS)}; unknown: {unknown}")
    if req.secret is not None and len(req.secret) < 16:
        raise BadRequest("a webhook secret must be at least 16 characters (or leave it out to get a generated one)")
    secret = req.secret or crypto.new_secret()
    row = WebhookEndpoint(
        pool_id=pool.id,
        url=_check_url(req.url, settings),
        secret_encrypted=crypto.encrypt(settings, secret),
        events=sorted(set(req.events)),
        active=1,
        created_at=utcnow(),
    )
    repo.add(session, row)
    return row, secret


def get_endpoint(session: Session, tenant_id: str, pool_id: str, endpoint_id: str) -> WebhookEndpoint:
    pool = get_pool(session, tenant_id, pool_id)
    row = repo.get_endpoint(session, pool.id, endpoint_id)
    if row is None:
        raise NotFound(f"webhook {endpoint_id!r} not found")
    return row


def list_endpoints(session: Session, tenant_id: str, pool_id: str) -> list[WebhookEndpoint]:
    return list(repo.list_endpoints(session, get_pool(session, tenant_id, pool_id).id))


def delete_endpoint(session: Session, tenant_id: str, pool_id: str, endpoint_id: str) -> None:
    repo.delete_row(session, get_endpoint(session, tenant_id, pool_id, endpoint_id))


def list_deliveries(
    session: Session, tenant_id: str, pool_id: str, endpoint_id: str, *, limit: int
) -> list[WebhookDelivery]:
    endpoint = get_endpoint(session, tenant_id, pool_id, endpoint_id)
    return list(repo.list_deliveries(session, endpoint.id, limit=limit))


def record_event(session: Session, pool_id: str, event: str, payload: dict[str, Any], now: datetime) -> list[str]:
    """One pending delivery per active endpoint subscribed to ``event``; returns their ids (send after commit)."""
    ids: list[str] = []
    for endpoint in repo.active_endpoints_for(session, pool_id, event):
        row = WebhookDelivery(
            endpoint_id=endpoint.id,
            event=event,
            payload=payload,
            status="pending",
            attempts=0,
            next_attempt_at=now,
            log=[],
            created_at=now,
        )
        session.add(row)
        session.flush()
        ids.append(row.id)
    return ids


# ------------------------------------------------------------------------------------------ sweep ticker


class SweepTicker:
    """Submits the retry sweep job every ``interval`` seconds from a daemon thread of the api process.

    The job id is fixed (``webhook-sweep``), so a sweep still waiting is not submitted twice and several
    api processes do not pile sweeps up.
    """

    def __init__(self, queue: JobQueue, interval: float) -> None:
        self.queue = queue
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bait-webhook-sweep", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self.queue.is_pending("webhook-sweep"):
                    self.queue.enqueue(catalog.WEBHOOK_SWEEP, "webhook-sweep")
            except Exception:
                log.warning("could not submit the webhook sweep; retrying in %.0f s", self.interval, exc_info=True)
