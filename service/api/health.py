"""Routes: liveness (/healthz), readiness (/readyz: database and queue), Prometheus metrics (/metrics)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from service.errors import ErrorBody, ServiceUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """The process is up (no database call, no auth)."""
    return {"status": "ok"}


def _check_database(request: Request) -> str:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
    return "ok"


def _check_queue(request: Request) -> str:
    url = request.app.state.settings.redis_url
    if not url:
        return "ok (in-process runner)"
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    try:
        client.ping()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        client.close()
    return "ok"


@router.get(
    "/readyz",
    responses={503: {"model": ErrorBody, "description": "Database or queue unreachable; details say which"}},
)
def readyz(request: Request) -> dict[str, Any]:
    """Ready to serve: the database answers and, with Redis configured, the queue answers PING."""
    checks = {"database": _check_database(request), "queue": _check_queue(request)}
    failed = [name for name, result in checks.items() if result.startswith("error")]
    if failed:
        raise ServiceUnavailable(f"not ready: {' and '.join(failed)} unreachable", checks)
    return {"status": "ready", "checks": checks}


@router.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
def metrics(request: Request) -> Response:
    """Prometheus text exposition of this app's registry."""
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
