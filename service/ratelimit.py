"""Per-API-key rate limits (the `limits` library): in memory, or in Redis when BAIT_REDIS_URL is set.

Every authenticated request counts against ``BAIT_RATE_LIMIT`` of its key; requests to the routes
:data:`service.scopes.EXPENSIVE_ROUTES` names (uploads, batch requests, stateless selection, ...)
count against ``BAIT_RATE_LIMIT_EXPENSIVE`` as well. The window is a moving window. With Redis, every
API process shares the counters; in memory each process counts on its own.

If Redis cannot be reached the request is let through (and logged): an outage of the limiter's store
must not take the API down with it; the queue's own outage is reported by the routes that need it.
"""

from __future__ import annotations

import logging
import math
import time

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage, RedisStorage, Storage
from limits.strategies import MovingWindowRateLimiter

from service.errors import RateLimited

log = logging.getLogger(__name__)

KEY_PREFIX = "bait-ratelimit"
OFF = ("", "off", "none", "0")


def parse_rate(text: str | None) -> RateLimitItem | None:
    """``"600/minute"`` -> a rate; ``""``/``off``/``none`` -> no limit.

    Raises:
        ValueError: text the `limits` library cannot read.
    """
    if text is None or text.strip().lower() in OFF:
        return None
    try:
        return parse(text.strip())
    except ValueError as exc:
        raise ValueError(f"{text!r} is not a rate like '600/minute', '10/second' or 'off': {exc}") from None


class KeyRateLimiter:
    """``check(key_id, expensive)`` raises :class:`service.errors.RateLimited` when a limit is spent."""

    def __init__(self, rate: str | None, expensive_rate: str | None, redis_url: str | None = None) -> None:
        self.rate = parse_rate(rate)
        self.expensive_rate = parse_rate(expensive_rate)
        self.storage: Storage = (
            RedisStorage(redis_url, key_prefix=KEY_PREFIX, socket_timeout=2, socket_connect_timeout=2)
            if redis_url
            else MemoryStorage()
        )
        self.limiter = MovingWindowRateLimiter(self.storage)

    @property
    def backend(self) -> str:
        return "redis" if isinstance(self.storage, RedisStorage) else "memory"

    def check(self, key_id: str, expensive: bool = False) -> None:
        """Count one request of key ``key_id``.

        Raises:
            RateLimited: with the seconds until the window has room again (``Retry-After``).
        """
        rates = [(r, "all") for r in (self.rate,) if r is not None]
        if expensive and self.expensive_rate is not None:
            rates.append((self.expensive_rate, "expensive"))
        for rate, bucket in rates:
            try:
                allowed = self.limiter.hit(rate, bucket, key_id)
            except Exception as exc:  # the store (Redis) is down: let the request through
                log.warning("rate limiter store unavailable (%s); request not counted", type(exc).__name__)
                return
            if not allowed:
                retry_after = self._retry_after(rate, bucket, key_id)
                what = str(rate)
                raise RateLimited(what + (" on expensive routes" if bucket == "expensive" else ""), retry_after)

    def _retry_after(self, rate: RateLimitItem, bucket: str, key_id: str) -> int:
        try:
            reset = self.limiter.get_window_stats(rate, bucket, key_id).reset_time
        except Exception:  # pragma: no cover - the store went away between hit and stats
            return int(rate.get_expiry())
        return max(1, math.ceil(reset - time.time()))
