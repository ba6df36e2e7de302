"""Routes: liveness (/healthz), readiness (/readyz: database and queue), Prometheus metrics (/metrics)."""

from __future__ import annotations

import hmac
import logging
from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.errors import ErrorBody, ServiceUnavailable, Unauthorized

router = APIRouter(tags=["health"])
log = logging.getLogger(__name__)


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (no database call, no auth)."""
    return {"status": "ok"}


def _check_database(request: Request) -> str:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception:
        # The exception text (host names, user names, driver messages) goes to the log, not to the caller.
        log.warning("readyz: the database did not answer", exc_info=True)
        return "error"
    return "ok"


def _check_queue(request: Request) -> str:
    url = request.app.state.settings.redis_url
    if not url:
        return "ok (in-process runner)"
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except Exception:
        log.warning("readyz: the queue (Redis) did not answer", exc_info=True)
        return "error"
    finally:
        client.close()
    return "ok"


@router.get(
    "/readyz",
    responses={503: {"model": ErrorBody, "description": "Database or queue unreachable; details say which"}},
)
def readyz(request: Request) -> dict[str, Any]:
    """Ready to serve: the database answers and, with Redis configured, the queue answers PING.

    A failure names the dependency (``database``, ``queue``), never its exception text (that is logged).
    """
    checks = {"database": _check_database(request), "queue": _check_queue(request)}
    failed = [name for name, result in checks.items() if result.startswith("error")]
    if failed:
        raise ServiceUnavailable(f"not ready: {' and '.join(failed)} unreachable", checks)
    return {"status": "ready", "checks": checks}


def _metrics_allowed(request: Request) -> bool:
    token: str | None = request.app.state.settings.metrics_token
    if token is None:
        return True
    scheme, _, given = (request.headers.get("authorization") or "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}},
        401: {"model": ErrorBody, "description": "BAIT_METRICS_TOKEN is set and the bearer token is missing or wrong"},
    },
)
def metrics(request: Request) -> Response:
    """Prometheus text exposition. With ``BAIT_METRICS_TOKEN`` set, that bearer token is required and every
    figure is served (jobs by state, selection and batch timings of all tenants); without it, only the
    HTTP request counters and latencies by route template."""
    if not _metrics_allowed(request):
        raise Unauthorized("GET /metrics needs `Authorization: Bearer <BAIT_METRICS_TOKEN>`")
    m = request.app.state.metrics
    # Without a configured token, only this process's request figures: batches of every tenant stay hidden.
    registry = m.registry if request.app.state.settings.metrics_token else m.public_registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
