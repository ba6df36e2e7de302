"""Schema management through Alembic only: upgrade, and the check that refuses an outdated schema."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` (default: the newest)."""
    command.upgrade(alembic_config(database_url), revision)


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


class SchemaOutdated(RuntimeError):
    """The database schema is behind the code: run `bait migrate`."""


def check_schema(engine: Engine, database_url: str) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the newest migration."""
    current = current_revision(engine)
    head = head_revision(database_url)
    if current != head:
        raise SchemaOutdated(
            f"database schema is at revision {current or 'none'} but the code needs {head}; run `bait migrate`"
        )
