"""API keys: random, shown once, stored as SHA-256 hashes; a key resolves to its tenant."""

from __future__ import annotations

import hashlib
import secrets

KEY_PREFIX = "bait_"


def generate_key() -> str:
    """A new random key, e.g. ``bait_3f9a...`` (32 bytes of entropy, URL-safe)."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def key_prefix(key: str) -> str:
    """The first characters of a key, stored to recognise it in listings without revealing it."""
    return key[: len(KEY_PREFIX) + 6]
