"""BAIT_SECRET_KEY: required with PostgreSQL, generated once in embedded mode, never too short."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from service.config import Settings
from service.crypto import SecretKeyError, check_secret_key, decrypt, encrypt

PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def test_postgres_without_secret_key_refuses_to_start() -> None:
    with pytest.raises(SecretKeyError, match="required with PostgreSQL"):
        check_secret_key(Settings(database_url=PG))


def test_empty_secret_key_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    # what `docker compose` passes for an unset ${BAIT_SECRET_KEY:-}
    monkeypatch.setenv("BAIT_SECRET_KEY", "")
    settings = Settings(database_url=PG)
    assert settings.secret_key is None
    with pytest.raises(SecretKeyError, match="required with PostgreSQL"):
        check_secret_key(settings)


def test_short_secret_key_is_rejected() -> None:
    with pytest.raises(SecretKeyError, match="at least 16 characters"):
        check_secret_key(Settings(database_url=PG, secret_key="short"))


def test_embedded_mode_generates_one_private_key_file(tmp_path: Path) -> None:
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'bait.db'}")
    token = encrypt(settings, "label-studio-token")
    assert b"label-studio-token" not in token
    key_file = tmp_path / "secret.key"
    assert key_file.exists() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    first = key_file.read_bytes()
    assert decrypt(settings, token) == "label-studio-token"  # same key read back, not regenerated
    assert key_file.read_bytes() == first
