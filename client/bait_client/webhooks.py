"""Verify a bait-service webhook delivery on the receiving side (standard library only).

Each delivery carries ``X-Bait-Timestamp`` (unix seconds) and ``X-Bait-Signature: v1=<hex>``, the
HMAC-SHA256 of ``"<timestamp>." + raw body`` keyed by the endpoint's secret.
"""

from __future__ import annotations

import hashlib
import hmac
import time

TOLERANCE_S = 300


def verify(secret: str, body: bytes, timestamp: str, signature: str, *, tolerance_s: int = TOLERANCE_S) -> bool:
    """True when the signature matches the raw body and the timestamp is within ``tolerance_s`` of now."""
    try:
        ts = int(timestamp)
    except (TypeError, ValueError):
        return False
    if abs(time.time() - ts) > tolerance_s:
        return False
    expected = "v1=" + hmac.new(secret.encode(), f"{ts}.".encode() + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature.strip())
