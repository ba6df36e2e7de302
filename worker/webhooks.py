"""Outgoing webhook jobs: send one delivery (signed), retry failures with backoff, record every attempt.

- :func:`batch_finished`: after a batch's final transaction commits, record a ``batch.succeeded`` or
  ``batch.failed`` delivery per subscribed endpoint and make the first attempt of each.
- :func:`deliver`: one attempt of one delivery. A 2xx answer marks it ``succeeded``; anything else
  (status code, timeout, refused connection) is logged in ``WebhookDelivery.log`` as
  ``{"at", "attempt", "status_code", "error", "seconds"}`` and the next attempt is scheduled
  ``backoff x 2^(attempt-1)`` seconds later, until ``webhook_max_attempts`` (then ``failed``).
- :func:`sweep`: attempts every delivery whose ``next_attempt_at`` has come (submitted periodically by
  the api, see :class:`service.domain.webhooks.SweepTicker`).

The signing format is documented in :mod:`service.domain.webhooks`.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from service import crypto
from service.config import Settings
from service.db import session_scope
from service.domain import webhooks as domain
from service.logredact import redact_url
from service.outbound import OutboundError, client_from_settings, status_line
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store.models import WebhookEndpoint
from worker import context

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


def batch_payload(batch: Any, event: str, now: datetime) -> dict[str, Any]:
    return {
        "event": event,
        "created_at": now.isoformat(),
        "pool_id": batch.pool_id,
        "batch": {
            "id": batch.id,
            "status": batch.status,
            "size": batch.size,
            "strategy": batch.strategy,
            "item_ids": batch.item_ids,
            "checkpoint_id": batch.checkpoint_id,
            "error": batch.error,
            "finished_at": batch.finished_at.isoformat() if batch.finished_at else None,
        },
    }


def batch_finished(batch_id: str) -> list[str]:
    """Record and send the webhook deliveries of a batch that just succeeded or failed; returns their ids."""
    env = context.env()
    now = utcnow()
    with session_scope(env.sessionmaker) as s:
        batch = batches_repo.get_batch_by_id(s, batch_id)
        if batch is None or batch.status not in ("succeeded", "failed"):
            return []
        event = f"batch.{batch.status}"
        ids = domain.record_event(s, batch.pool_id, event, batch_payload(batch, event, now), now)
    for delivery_id in ids:
        deliver(delivery_id)
    return ids


def deliver(delivery_id: str) -> str | None:
    """One attempt of one delivery; returns its status afterwards (None when it no longer exists)."""
    env = context.env()
    return attempt(env.sessionmaker, env.settings, delivery_id)


def attempt(factory: sessionmaker[Session], settings: Settings, delivery_id: str) -> str | None:
    with session_scope(factory) as s:
        row = repo.get_delivery(s, delivery_id)
        if row is None:
            return None
        if row.status != "pending":
            return row.status
        endpoint = s.get(WebhookEndpoint, row.endpoint_id)
        if endpoint is None:
            return None
        url, event, payload, number = endpoint.url, row.event, dict(row.payload), row.attempts + 1
        try:
            secret: str | None = crypto.decrypt(settings, endpoint.secret_encrypted)
        except crypto.SecretKeyError as exc:
            secret, key_error = None, str(exc)
    payload["delivery_id"] = delivery_id
    body = domain.body_bytes(payload)
    status_code: int | None = None
    error: str | None = None
    t0 = time.perf_counter()
    if secret is None:
        error = key_error
    else:
        # Through the outbound guard; no redirects (a 3xx is a failed attempt). Only the status line of
        # the receiver's answer is kept: its body is never shown to the tenant.
        try:
            with client_from_settings(settings, timeout=settings.webhook_timeout_seconds) as http:
                r = http.request(
                    "POST",
                    url,
                    content=body,
                    headers=domain.signed_headers(secret, event, delivery_id, body),
                    follow_redirects=False,
                    read_body=False,
                )
            status_code = r.status_code
            if not 200 <= r.status_code < 300:
                error = status_line(r.status_code)
        except OutboundError as exc:
            status_code = exc.status_code
            error = exc.message
    seconds = round(time.perf_counter() - t0, 4)
    now = utcnow()
    with session_scope(factory) as s:
        row = repo.get_delivery(s, delivery_id, for_update=True)
        if row is None or row.status != "pending" or row.attempts != number - 1:
            return None if row is None else row.status  # another attempt got there first
        row.attempts = number
        row.log = [
            *(row.log or []),
            {"at": now.isoformat(), "attempt": number, "status_code": status_code, "error": error, "seconds": seconds},
        ]
        if error is None:
            row.status = "succeeded"
            row.delivered_at = now
            row.next_attempt_at = None
        elif number >= settings.webhook_max_attempts:
            row.status = "failed"
            row.next_attempt_at = None
            log.warning(
                "webhook delivery %s to %s failed after %d attempts: %s", delivery_id, redact_url(url), number, error
            )
        else:
            delay = settings.webhook_backoff_seconds * 2 ** (number - 1)
            row.next_attempt_at = now + timedelta(seconds=delay)
            log.info("webhook delivery %s attempt %d failed (%s); next in %.0f s", delivery_id, number, error, delay)
        return row.status


def sweep(now: str | None = None) -> list[str]:
    """Attempt every pending delivery that is due (``now``: ISO time, for tests); returns their ids."""
    env = context.env()
    at = datetime.fromisoformat(now) if now else utcnow()
    with session_scope(env.sessionmaker) as s:
        due = repo.due_deliveries(s, at)
    for delivery_id in due:
        attempt(env.sessionmaker, env.settings, delivery_id)
    return due
