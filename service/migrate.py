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
    """The database schema is not the one this code needs: the message says what to run."""


def schema_problem(engine: Engine, database_url: str, where: str) -> str | None:
    """One line saying what is wrong with the schema of the database at ``where`` and what to run,
    or None when it is at the newest migration."""
    current = current_revision(engine)
    script = ScriptDirectory.from_config(alembic_config(database_url))
    head = script.get_current_head()
    if current == head:
        return None
    if current is None:
        return f"the database at {where} has no schema: run `bait migrate`"
    known = {rev.revision for rev in script.walk_revisions()}
    if current not in known:
        return (
            f"the database at {where} is at schema revision {current}, which this version of bait does not know "
            f"(it needs {head}): was it migrated by a newer version?"
        )
    return f"the database at {where} is at schema revision {current}, this version needs {head}: run `bait migrate`"


def check_schema(engine: Engine, database_url: str, where: str | None = None) -> None:
    """Raise :class:`SchemaOutdated` unless the database is at the newest migration."""
    problem = schema_problem(engine, database_url, where or database_url.split("@")[-1])
    if problem is not None:
        raise SchemaOutdated(problem)
