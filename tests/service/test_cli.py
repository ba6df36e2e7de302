"""The `bait` CLI: keys create/list/revoke against the test database, migrate, the schema check."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, inspect

from service.cli import main
from service.config import Settings, get_settings
from service.main import create_app
from service.migrate import SchemaOutdated, current_revision, head_revision
from tests.service.conftest import assert_error


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, database_url: str) -> Iterator[None]:
    """The CLI reads its settings from the environment (cached): point it at the test database."""
    monkeypatch.setenv("BAIT_DATABASE_URL", database_url)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().out.strip().splitlines()


def test_keys_create_prints_key_alone_on_last_line_and_it_authenticates(
    cli_env: None, client: TestClient, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = run(capsys, "keys", "create", "--tenant", "initech", "--name", "ci")
    assert code == 0
    key = lines[-1]
    assert key.startswith("bait_") and " " not in key
    resp = client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"})
    assert resp.status_code == 200
    assert resp.json() == {"pools": []}


def test_keys_list_shows_key_without_revealing_it(
    cli_env: None, db: object, capsys: pytest.CaptureFixture[str]
) -> None:
    _, created = run(capsys, "keys", "create", "--tenant", "initech")
    key = created[-1]
    code, lines = run(capsys, "keys", "list", "--tenant", "initech")
    assert code == 0
    text = "\n".join(lines)
    assert key not in text
    assert key[:11] in text  # the stored prefix identifies it
    assert "initech" in text


def test_keys_revoke_makes_the_key_401(cli_env: None, client: TestClient, capsys: pytest.CaptureFixture[str]) -> None:
    _, created = run(capsys, "keys", "create", "--tenant", "initech")
    key = created[-1]
    code, lines = run(capsys, "keys", "revoke", key[:11])
    assert code == 0
    assert "revoked" in lines[-1]
    resp = client.get("/v1/pools", headers={"Authorization": f"Bearer {key}"})
    assert_error(resp, 401, "unauthorized", "revoked")
    _, listed = run(capsys, "keys", "list", "--tenant", "initech")
    assert listed[-1].split()[-1] != "-"  # revoked_at is shown


def test_keys_revoke_of_unknown_key_fails_with_a_clear_line(
    cli_env: None, db: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["keys", "revoke", "bait_nothing"]) == 2
    assert "no single key" in capsys.readouterr().err


def test_migrate_brings_a_fresh_sqlite_file_to_head(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'fresh.db'}"
    monkeypatch.setenv("BAIT_DATABASE_URL", url)
    get_settings.cache_clear()
    try:
        code, lines = run(capsys, "migrate")
    finally:
        get_settings.cache_clear()
    assert code == 0
    assert "newest schema" in lines[-1]
    engine = create_engine(url)
    assert current_revision(engine) == head_revision(url)
    assert {"tenants", "api_keys", "pools", "items", "labels", "batches"} <= set(inspect(engine).get_table_names())
    engine.dispose()
    create_app(Settings(database_url=url))  # starts on the migrated schema


def test_app_refuses_to_start_on_an_unmigrated_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    with pytest.raises(SchemaOutdated, match="bait migrate"):
        create_app(Settings(database_url=url))


def test_app_refuses_to_start_one_migration_behind(tmp_path: Path) -> None:
    from alembic import command

    from service.migrate import alembic_config, upgrade

    url = f"sqlite:///{tmp_path / 'behind.db'}"
    upgrade(url)
    command.downgrade(alembic_config(url), "-1")
    with pytest.raises(SchemaOutdated, match="run `bait migrate`"):
        create_app(Settings(database_url=url))
