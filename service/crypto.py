"""Secrets at rest: Label Studio API tokens and webhook signing secrets are stored Fernet-encrypted.

The key comes from ``BAIT_SECRET_KEY`` (any string of at least 16 characters; the Fernet key is its
SHA-256, so a passphrase works as well as ``python -c "import secrets; print(secrets.token_urlsafe(32))"``).

- Embedded mode (SQLite): when the setting is unset, a random key is generated once and written to
  ``secret.key`` next to the database file with permissions 0600; later starts read it back. Losing the
  file makes the stored tokens unreadable (reconnect the integrations), so back it up with the database.
- Production mode (PostgreSQL): the setting is required, or ``BAIT_SECRET_KEY_FILE``: a file every api and
  worker process can read (a shared volume under docker compose), generated there 0600 on first start
  when it does not exist. Without either, :func:`check_secret_key` fails fast at start (api and worker),
  since api processes and workers on several machines must all share one key.

Hashes (not encryption) are used where a secret only has to be recognised: the per-integration secret in
Label Studio's ML-backend URL is stored as its SHA-256 (:func:`hash_secret`).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import threading
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from service.config import Settings

KEY_FILE = "secret.key"
MIN_KEY_CHARS = 16

_lock = threading.Lock()
_cache: dict[str, Fernet] = {}


class SecretKeyError(RuntimeError):
    """The encryption key is missing, too short, or does not decrypt what is stored."""


def check_secret_key(settings: Settings) -> None:
    """Fail fast: PostgreSQL without ``BAIT_SECRET_KEY``, or a key that is too short.

    Raises:
        SecretKeyError: with the fix in the message.
    """
    if settings.secret_key is not None and len(settings.secret_key) < MIN_KEY_CHARS:
        raise SecretKeyError(f"BAIT_SECRET_KEY must be at least {MIN_KEY_CHARS} characters")
    if settings.secret_key is None and settings.secret_key_file is None and not settings.is_sqlite:
        raise SecretKeyError(
            "BAIT_SECRET_KEY is required with PostgreSQL (it encrypts Label Studio tokens and webhook secrets; "
            "every api and worker process needs the same value), e.g. "
            '`export BAIT_SECRET_KEY=$(python -c "import secrets; print(secrets.token_urlsafe(32))")`, '
            "or BAIT_SECRET_KEY_FILE naming a file all of them share (generated there if missing)"
        )


def _key_material(settings: Settings) -> str:
    check_secret_key(settings)
    if settings.secret_key is not None:
        return settings.secret_key
    path = key_file(settings)
    if path is None:  # in-memory SQLite: the data dies with the process, so may the key
        return "in-memory:" + _EPHEMERAL
    return _read_or_create(path)


def _read_or_create(path: Path) -> str:
    """The key in ``path``; a new random one written there (0600) when the file does not exist yet.

    The new key is written to a temporary file and hard-linked into place: processes starting at the same
    moment (api and worker under compose) agree on the first one linked, and none reads a partial file."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)  # fails if another process linked its key first: then that one is read
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    material = path.read_text().strip()
    if len(material) < MIN_KEY_CHARS:
        raise SecretKeyError(f"the key file {path} holds fewer than {MIN_KEY_CHARS} characters")
    return material


_EPHEMERAL = secrets.token_urlsafe(32)


def fernet(settings: Settings) -> Fernet:
    """The Fernet of these settings (cached per key)."""
    material = _key_material(settings)
    with _lock:
        f = _cache.get(material)
        if f is None:
            key = base64.urlsafe_b64encode(hashlib.sha256(material.encode()).digest())
            f = _cache[material] = Fernet(key)
        return f


def encrypt(settings: Settings, plaintext: str) -> bytes:
    return fernet(settings).encrypt(plaintext.encode())


def decrypt(settings: Settings, token: bytes) -> str:
    """The plaintext of :func:`encrypt`'s output.

    Raises:
        SecretKeyError: the key changed since the value was stored.
    """
    try:
        return fernet(settings).decrypt(bytes(token)).decode()
    except InvalidToken as exc:
        raise SecretKeyError(
            "a stored secret cannot be decrypted: BAIT_SECRET_KEY (or the embedded key file) changed since it was "
            "stored; reconnect the integration or re-register the webhook"
        ) from exc


def new_secret() -> str:
    return secrets.token_urlsafe(24)


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(hash_secret(secret), stored_hash)


def key_file(settings: Settings) -> Path | None:
    """Where the generated key is kept: ``BAIT_SECRET_KEY_FILE``, or in embedded mode beside the SQLite
    database (None when ``BAIT_SECRET_KEY`` is set, or for in-memory SQLite)."""
    if settings.secret_key is not None:
        return None
    if settings.secret_key_file is not None:
        return settings.secret_key_file
    db_path = settings.sqlite_path()
    return None if db_path is None else db_path.parent / KEY_FILE


def derived_key(settings: Settings, purpose: str) -> bytes:
    """A 32-byte key for one ``purpose`` (e.g. signing dashboard session cookies), derived from the
    service secret with HMAC-SHA256, so one secret serves several uses without reusing a key."""
    return hmac.new(_key_material(settings).encode(), purpose.encode(), hashlib.sha256).digest()
