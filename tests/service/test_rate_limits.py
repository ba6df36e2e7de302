"""Per-key rate limits: 429 with Retry-After in the JSON error shape; in Redis when it is configured.

Runs on both backends: with ``BAIT_TEST_REDIS_URL`` the counters live in Redis and two app
instances share them; without it each app counts in its own memory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.main import create_app
from service.ratelimit import KEY_PREFIX, KeyRateLimiter
from tests.conftest import REDIS_URL


@pytest.fixture
def limited(settings: Settings) -> Settings:
    return settings.model_copy(update={"rate_limit": "5/minute", "rate_limit_expensive": "2/minute"})


@pytest.fixture
def limited_client(limited: Settings, db: sessionmaker[Session]) -> Iterator[TestClient]:
    with TestClient(create_app(limited)) as c:
        yield c


def assert_limited(resp: object, limit_text: str) -> None:
    assert resp.status_code == 429, resp.text  # type: ignore[attr-defined]
    retry_after = int(resp.headers["Retry-After"])  # type: ignore[attr-defined]
    assert 1 <= retry_after <= 60
    err = resp.json()["error"]  # type: ignore[attr-defined]
    assert err["code"] == "rate_limited"
    assert limit_text in err["message"]
    assert err["details"]["retry_after"] == retry_after


def test_key_over_its_rate_gets_429_with_retry_after(
    limited_client: TestClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    for _ in range(5):
        assert limited_client.get("/v1/pools", headers=auth).status_code == 200
    assert_limited(limited_client.get("/v1/pools", headers=auth), "5 per 1 minute")
    # Another key (of another tenant) has its own budget; unauthenticated probes are not counted as the key.
    assert limited_client.get("/v1/pools", headers=other_auth).status_code == 200
    assert limited_client.get("/healthz").status_code == 200


def test_expensive_routes_have_a_lower_rate(limited_client: TestClient, auth: dict[str, str]) -> None:
    body = {"size": 1, "strategy": "random"}
    for _ in range(2):
        resp = limited_client.post("/v1/pools/nosuch/batches", json=body, headers=auth)
        assert resp.status_code == 404, resp.text  # counted even though it found nothing
    assert_limited(limited_client.post("/v1/pools/nosuch/batches", json=body, headers=auth), "on expensive routes")
    # Cheap routes still have room in the general budget (3 of 5 used).
    assert limited_client.get("/v1/pools", headers=auth).status_code == 200


def test_rate_limit_off_lets_everything_through(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str]
) -> None:
    off = settings.model_copy(update={"rate_limit": "off", "rate_limit_expensive": "off"})
    with TestClient(create_app(off)) as c:
        for _ in range(30):
            assert c.get("/v1/pools", headers=auth).status_code == 200


def test_two_app_instances_share_counters_only_through_redis(
    limited: Settings, db: sessionmaker[Session], auth: dict[str, str]
) -> None:
    with TestClient(create_app(limited)) as first, TestClient(create_app(limited)) as second:
        assert first.app.state.rate_limiter.backend == ("redis" if REDIS_URL else "memory")  # type: ignore[attr-defined]
        for _ in range(5):
            assert first.get("/v1/pools", headers=auth).status_code == 200
        resp = second.get("/v1/pools", headers=auth)
        if REDIS_URL:
            assert_limited(resp, "5 per 1 minute")  # the second API process sees the first one's requests
        else:
            assert resp.status_code == 200  # in memory: each process counts its own
            assert_limited(first.get("/v1/pools", headers=auth), "5 per 1 minute")


@pytest.mark.skipif(not REDIS_URL, reason="the Redis backend of the limiter (BAIT_TEST_REDIS_URL)")
def test_counters_live_in_redis() -> None:
    assert REDIS_URL is not None
    key_id = f"test-{uuid.uuid4().hex}"
    limiter = KeyRateLimiter("3/minute", "off", REDIS_URL)
    for _ in range(3):
        limiter.check(key_id)
    conn = redis.Redis.from_url(REDIS_URL)
    try:
        stored = [k.decode() for k in conn.scan_iter(match=f"{KEY_PREFIX}*{key_id}*")]
        assert stored, "no counter of the key in Redis"
        from service.errors import RateLimited

        with pytest.raises(RateLimited):
            KeyRateLimiter("3/minute", "off", REDIS_URL).check(key_id)  # a fresh limiter reads the same counter
    finally:
        for k in conn.scan_iter(match=f"{KEY_PREFIX}*{key_id}*"):
            conn.delete(k)
        conn.close()


def test_limiter_lets_requests_through_when_redis_is_unreachable() -> None:
    limiter = KeyRateLimiter("1/minute", "1/minute", "redis://127.0.0.1:1/0")  # nothing listens on port 1
    for _ in range(3):
        limiter.check("k", expensive=True)  # fails open: an outage of the store must not take the API down
