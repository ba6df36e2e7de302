"""The retry decisions and the error classes, as pure functions (the live behaviour is in
test_resilience.py): which answers are waited out, for how long, and which requests may be sent twice."""

from __future__ import annotations

import random

import httpx
import pytest
from bait_client import (
    BadRequest,
    BaitError,
    Conflict,
    InsufficientScope,
    NotFound,
    RateLimited,
    RetryPolicy,
    TooManyItems,
    Unavailable,
    UnknownItem,
    ValidationError,
)
from bait_client._core import Call
from bait_client.errors import error_from_response

GET = Call("GET", "/v1/pools")
POST = Call("POST", "/v1/select")
KEYED = Call("POST", "/v1/pools/p/batches", headers={"Idempotency-Key": "k"})


def answer(status: int, retry_after: str | None = None) -> httpx.Response:
    return httpx.Response(status, headers={"Retry-After": retry_after} if retry_after else {})


@pytest.mark.parametrize("status", [429, 503])
def test_rate_limits_and_outages_wait_out_retry_after_with_jitter(status: int) -> None:
    policy, rng = RetryPolicy(jitter=0.25), random.Random(0)
    waits = [policy.delay(POST, answer(status, "3"), 0, 0.0, rng) for _ in range(200)]
    assert all(w is not None and 3.0 <= w <= 3.75 for w in waits)
    assert len({round(w or 0, 6) for w in waits}) > 100  # jittered, not in step


def test_retry_after_is_bounded_by_max_wait() -> None:
    wait = RetryPolicy(max_wait=10, jitter=0.0).delay(GET, answer(429, "3600"), 0, 0.0, random.Random(0))
    assert wait == 10.0


def test_retries_stop_at_max_retries_max_total_and_when_off() -> None:
    rng = random.Random(0)
    assert RetryPolicy(max_retries=2).delay(GET, answer(429, "1"), 2, 0.0, rng) is None
    assert RetryPolicy(max_total=5).delay(GET, answer(429, "1"), 0, 4.5, rng) is None
    assert RetryPolicy.off().delay(GET, answer(429, "1"), 0, 0.0, rng) is None


def test_other_errors_are_not_retried() -> None:
    for status in (400, 401, 403, 404, 409, 413, 422, 500):
        assert RetryPolicy().delay(GET, answer(status), 0, 0.0, random.Random(0)) is None


def test_a_lost_connection_is_retried_only_for_requests_safe_to_send_twice() -> None:
    policy, rng = RetryPolicy(), random.Random(0)
    lost = httpx.ReadError("connection reset")
    assert policy.delay(GET, lost, 0, 0.0, rng) is not None
    assert policy.delay(KEYED, lost, 0, 0.0, rng) is not None  # the Idempotency-Key makes it safe
    assert policy.delay(Call("POST", "/v1/pools/p/items", idempotent=True), lost, 0, 0.0, rng) is not None
    assert policy.delay(POST, lost, 0, 0.0, rng) is None
    # a refused connection sent nothing: any request may go again
    assert policy.delay(POST, httpx.ConnectError("refused"), 0, 0.0, rng) is not None
    assert RetryPolicy(retry_connection_errors=False).delay(GET, lost, 0, 0.0, rng) is None


def test_proxy_errors_are_retried_only_for_safe_requests() -> None:
    policy, rng = RetryPolicy(), random.Random(0)
    assert policy.delay(GET, answer(502), 0, 0.0, rng) is not None
    assert policy.delay(POST, answer(504), 0, 0.0, rng) is None


def test_backoff_grows_and_stays_under_its_cap() -> None:
    policy, rng = RetryPolicy(backoff=0.5, max_backoff=4.0), random.Random(1)
    lost = httpx.ReadError("x")
    late = [policy.delay(GET, lost, 6, 0.0, rng) or 0.0 for _ in range(300)]
    early = [policy.delay(GET, lost, 0, 0.0, rng) or 0.0 for _ in range(300)]
    assert max(early) <= 0.5 and max(late) <= 4.0 and sum(late) > 4 * sum(early)


def error(status: int, code: str, details: object = None, **headers: str) -> BaitError:
    body = {"error": {"code": code, "message": f"the {code} message", "details": details}}
    return error_from_response(status, body, httpx.Headers(headers))


def test_each_code_has_its_class_under_one_base() -> None:
    cases = {
        (404, "not_found"): NotFound,
        (409, "conflict"): Conflict,
        (403, "insufficient_scope"): InsufficientScope,
        (422, "validation_error"): ValidationError,
        (400, "unknown_item"): UnknownItem,
        (400, "invalid_string"): BadRequest,
        (413, "too_many_items"): TooManyItems,
        (503, "unavailable"): Unavailable,
    }
    for (status, code), cls in cases.items():
        err = error(status, code, {"x": 1})
        assert type(err) is cls and isinstance(err, BaitError)
        assert (err.status_code, err.code, err.message, err.details) == (status, code, f"the {code} message", {"x": 1})


def test_rate_limited_carries_retry_after() -> None:
    err = error(429, "rate_limited", {"limit": "60 per 1 minute", "retry_after": 7}, **{"Retry-After": "7"})
    assert isinstance(err, RateLimited) and err.retry_after == 7.0 and err.details["limit"] == "60 per 1 minute"


def test_an_answer_without_the_error_body_keeps_its_status_class() -> None:
    err = error_from_response(503, None, httpx.Headers({}), "<html>bad gateway</html>")
    assert isinstance(err, Unavailable) and err.code == "http_error" and "bad gateway" in err.message
