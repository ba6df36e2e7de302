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


def test_postgres_with_a_key_file_generates_it_once_and_every_process_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "secrets" / "secret.key"  # a volume shared by api and workers under compose
    api = Settings(database_url=PG, secret_key_file=path)
    check_secret_key(api)  # no BAIT_SECRET_KEY needed
    token = encrypt(api, "label-studio-token")
    assert path.exists() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(path.read_text().strip()) >= 32
    worker = Settings(database_url=PG, secret_key_file=path)
    assert decrypt(worker, token) == "label-studio-token"
    assert [p.name for p in path.parent.iterdir()] == ["secret.key"]  # no temporary file left behind


def test_processes_creating_the_key_file_at_once_agree_on_one_key(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from service.crypto import _read_or_create

    path = tmp_path / "secret.key"
    with ThreadPoolExecutor(8) as pool:
        keys = set(pool.map(lambda _: _read_or_create(path), range(32)))
    assert keys == {path.read_text().strip()}


def test_empty_key_file_setting_counts_as_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAIT_SECRET_KEY_FILE", "")  # what compose passes for an unset ${BAIT_SECRET_KEY_FILE:-}
    with pytest.raises(SecretKeyError, match="BAIT_SECRET_KEY_FILE"):
        check_secret_key(Settings(database_url=PG))
