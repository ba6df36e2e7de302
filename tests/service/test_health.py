"""/healthz, /readyz (database and queue), /metrics (Prometheus text)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.main import create_app
from service.store.models import Batch
from tests.service.conftest import assert_error, make_pool


def samples(
    client: TestClient, headers: dict[str, str] | None = None
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = client.get("/metrics", headers=headers or {})
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(resp.text)
        for s in fam.samples
    }


def test_healthz_needs_no_key(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_readyz_reports_database_and_queue(client: TestClient, settings: Settings) -> None:
    body = client.get("/readyz").json()
    assert body["status"] == "ready"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["queue"] == ("ok" if settings.redis_url else "ok (in-process runner)")


def test_readyz_is_503_naming_the_unreachable_database(settings: Settings) -> None:
    broken = settings.model_copy(update={"database_url": "postgresql+psycopg://nobody@127.0.0.1:1/none"})
    client = TestClient(create_app(broken, check_migrations=False))  # no lifespan: nothing else starts
    resp = client.get("/readyz")
    err = assert_error(resp, 503, "unavailable", "database")
    assert err["details"]["database"] == "error"
    assert "queue" not in err["message"]
    # which dependency, not its exception text (host, user, driver message stay in the server log)
    assert "nobody" not in resp.text and "psycopg" not in resp.text.lower() and "OperationalError" not in resp.text


def test_readyz_is_503_naming_the_unreachable_redis(settings: Settings) -> None:
    broken = settings.model_copy(update={"redis_url": "redis://127.0.0.1:1/0"})
    client = TestClient(create_app(broken))
    resp = client.get("/readyz")
    err = assert_error(resp, 503, "unavailable", "queue")
    assert err["details"]["database"] == "ok"
    assert err["details"]["queue"] == "error"
    assert "ConnectionError" not in resp.text and "127.0.0.1:1" not in resp.text


def test_metrics_count_requests_by_route_template(client: TestClient, auth: dict[str, str]) -> None:
    pool = make_pool(client, auth)
    client.get(f"/v1/pools/{pool['id']}", headers=auth)
    client.get(f"/v1/pools/{pool['id']}", headers=auth)
    client.get("/v1/pools/missing", headers=auth)
    got = samples(client)
    key = "bait_http_requests_total"
    assert got[(key, (("method", "GET"), ("route", "/v1/pools/{pool}"), ("status", "200")))] == 2
    assert got[(key, (("method", "GET"), ("route", "/v1/pools/{pool}"), ("status", "404")))] == 1
    assert got[(key, (("method", "POST"), ("route", "/v1/pools"), ("status", "201")))] == 1
    assert got[("bait_http_request_duration_seconds_count", (("method", "GET"), ("route", "/v1/pools/{pool}")))] == 3
    assert not any(pool["id"] in str(labels) for _, labels in got)


def test_metrics_registry_is_per_app(client: TestClient, settings: Settings) -> None:
    client.get("/healthz")
    other = TestClient(create_app(settings))
    got = samples(other)
    assert ("bait_http_requests_total", (("method", "GET"), ("route", "/healthz"), ("status", "200"))) not in got


def test_metrics_report_jobs_by_state_and_selection_seconds(
    settings: Settings, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    client = TestClient(create_app(settings.model_copy(update={"metrics_token": "scrape-token-123"})))
    pool = make_pool(client, auth)
    now = datetime.now(UTC)
    with session_scope(db) as s:
        s.add(Batch(pool_id=pool["id"], size=2, strategy="bait", params={}, status="queued"))
        s.add(Batch(pool_id=pool["id"], size=2, strategy="bait", params={}, status="running"))
        for seconds in (0.3, 2.0):
            s.add(
                Batch(
                    pool_id=pool["id"],
                    size=2,
                    strategy="bait",
                    params={},
                    status="succeeded",
                    created_at=now - timedelta(seconds=10),
                    finished_at=now,
                    diagnostics={"timings": {"total": seconds, "strategy": seconds / 2}},
                )
            )
    got = samples(client, {"Authorization": "Bearer scrape-token-123"})
    assert got[("bait_jobs", (("state", "queued"),))] == 1
    assert got[("bait_jobs", (("state", "running"),))] == 1
    assert got[("bait_jobs", (("state", "succeeded"),))] == 2
    assert got[("bait_jobs", (("state", "failed"),))] == 0
    assert got[("bait_selection_seconds_count", (("strategy", "bait"),))] == 2
    assert abs(got[("bait_selection_seconds_sum", (("strategy", "bait"),))] - 2.3) < 1e-9
    assert got[("bait_selection_seconds_bucket", (("le", "0.5"), ("strategy", "bait")))] == 1
    assert got[("bait_selection_seconds_bucket", (("le", "2.5"), ("strategy", "bait")))] == 2
    assert abs(got[("bait_batch_seconds_sum", (("strategy", "bait"),))] - 20.0) < 1e-3
    assert got[("bait_metrics_database_up", ())] == 1
