"""Migration 0008 (pool content version): up on a database with items, the triggers at work, down and up
again; on SQLite and (with BAIT_TEST_DATABASE_URL) on a scratch PostgreSQL database."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from alembic import command
from sqlalchemy import Engine, create_engine, event, inspect, text

from service.migrate import alembic_config, upgrade
from tests.conftest import PG_ADMIN_URL, scratch_postgres_database

BEFORE = "0007"  # the revision 0008 applies to (re-chained at merge if another comes between)


@pytest.fixture
def scratch_url(tmp_path: Any) -> Iterator[str]:
    if not PG_ADMIN_URL:
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with scratch_postgres_database("bait_content") as url:
        yield url


def _engine(url: str) -> Engine:
    eng = create_engine(url)
    if url.startswith("sqlite"):
        event.listen(eng, "connect", lambda conn, _rec: conn.execute("PRAGMA foreign_keys=ON"))
    return eng


def _insert_items(eng: Engine, pool: str, names: list[str]) -> None:
    with eng.begin() as conn:
        for name in names:
            conn.execute(
                text(
                    "INSERT INTO items (pool_id, external_id, embedding, status, embedding_status, split, "
                    "created_at, updated_at) VALUES (:p, :x, :e, 'unlabeled', 'ready', 'train', "
                    "CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                ),
                {"p": pool, "x": name, "e": b"\0" * 8},
            )


def _one(eng: Engine, sql: str, **params: Any) -> Any:
    with eng.connect() as conn:
        return conn.execute(text(sql), params).scalar_one()


def test_migration_0008_up_with_existing_items_then_down_and_up(scratch_url: str) -> None:
    upgrade(scratch_url, BEFORE)
    eng = _engine(scratch_url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', CURRENT_TIMESTAMP)"))
        conn.execute(
            text(
                "INSERT INTO pools (id, tenant_id, name, task, n_outputs, embedding_dim, head, created_at, updated_at) "
                "VALUES ('p1', 't', 'p1', 'classification', 2, 2, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
    _insert_items(eng, "p1", ["old-1", "old-2"])

    upgrade(scratch_url)
    # Rows from before the migration are at version 0, and so is their pool: a cache starts from a full load.
    assert _one(eng, "SELECT content_version FROM pools WHERE id = 'p1'") == 0
    assert _one(eng, "SELECT max(content_seq) FROM items") == 0
    _insert_items(eng, "p1", ["new-1"])
    v1 = _one(eng, "SELECT content_version FROM pools WHERE id = 'p1'")
    assert v1 >= 1 and _one(eng, "SELECT content_seq FROM items WHERE external_id = 'new-1'") == v1
    with eng.begin() as conn:
        conn.execute(text("UPDATE items SET status = 'labeled', label = '\"a\"' WHERE external_id = 'old-1'"))
    assert _one(eng, "SELECT content_version FROM pools WHERE id = 'p1'") == v1  # a label is not cached content
    with eng.begin() as conn:
        conn.execute(text("UPDATE items SET embedding = :e WHERE external_id = 'old-2'"), {"e": b"\1" * 8})
    v2 = _one(eng, "SELECT content_version FROM pools WHERE id = 'p1'")
    assert v2 > v1 and _one(eng, "SELECT content_seq FROM items WHERE external_id = 'old-2'") == v2
    with eng.begin() as conn:
        conn.execute(text("DELETE FROM items WHERE external_id = 'new-1'"))
    v3 = _one(eng, "SELECT content_version FROM pools WHERE id = 'p1'")
    assert v3 > v2 and _one(eng, "SELECT seq FROM item_tombstones WHERE pool_id = 'p1'") == v3

    command.downgrade(alembic_config(scratch_url), BEFORE)
    cols = {c["name"] for c in inspect(eng).get_columns("items")}
    assert "content_seq" not in cols and "item_tombstones" not in inspect(eng).get_table_names()
    _insert_items(eng, "p1", ["after-down"])  # no trigger left behind that names a dropped column
    eng.dispose()

    upgrade(scratch_url)
    eng = _engine(scratch_url)
    _insert_items(eng, "p1", ["after-up"])
    assert _one(eng, "SELECT content_seq FROM items WHERE external_id = 'after-up'") == _one(
        eng, "SELECT content_version FROM pools WHERE id = 'p1'"
    )
    eng.dispose()
