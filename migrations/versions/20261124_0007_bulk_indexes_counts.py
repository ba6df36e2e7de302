"""item indexes for keyset pages, and per-pool item counts kept by the database

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-24 20:50:00

Pages of a pool's items are keyset pages ordered by id, so each page is an index range, not a scan:
``(pool_id, id)`` for all items, ``(pool_id, status, id)`` by stored status (it replaces ``(pool_id,
status)``, a prefix of it), and a partial ``(pool_id, embedding_status, id)`` over the items that are
not ``ready`` (pending or in error: few, and listed by that filter).

``pool_item_counts`` holds how many items a pool has per ``(split, status, embedding_status)``; the pool
page, the dashboard and batch requests read it instead of counting the pool's rows. Triggers on
``items`` maintain it on every write path (ORM, set-based upserts, COPY, cascades):

- PostgreSQL: statement-level triggers with transition tables append one signed delta row per key a
  statement changed (no row of the table is ever updated in place, so concurrent writers never wait on
  each other for it); readers sum the rows, and fold a pool's deltas into one row per key when they pile
  up (``service/store/counts.py``). A delete of rows whose pool is gone (the pool's own cascade) writes
  nothing.
- SQLite (one writer at a time): row-level triggers keep one row per key up to date.

A later migration that recreates ``items`` on SQLite (``batch_alter_table`` with ``recreate``) drops
these triggers and must create them again.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0007'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = 'pool_id, split, status, embedding_status'

_PG_FUNCTIONS = [
    f"""
    CREATE FUNCTION bait_item_counts_insert() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO pool_item_counts ({_KEY}, n)
            SELECT {_KEY}, count(*) FROM new_rows GROUP BY {_KEY};
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION bait_item_counts_update() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO pool_item_counts ({_KEY}, n)
            SELECT {_KEY}, sum(d) FROM (
                SELECT {_KEY}, 1 AS d FROM new_rows
                UNION ALL
                SELECT {_KEY}, -1 AS d FROM old_rows
            ) AS changes
            GROUP BY {_KEY} HAVING sum(d) <> 0;
        RETURN NULL;
    END $$
    """,
    f"""
    CREATE FUNCTION bait_item_counts_delete() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        -- rows of a pool that is being deleted (its cascade) leave nothing to count
        INSERT INTO pool_item_counts ({_KEY}, n)
            SELECT {_KEY}, -count(*) FROM old_rows o
            WHERE EXISTS (SELECT 1 FROM pools p WHERE p.id = o.pool_id)
            GROUP BY {_KEY};
        RETURN NULL;
    END $$
    """,
]

_PG_TRIGGERS = [
    """
    CREATE TRIGGER items_counts_insert AFTER INSERT ON items REFERENCING NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION bait_item_counts_insert()
    """,
    """
    CREATE TRIGGER items_counts_update AFTER UPDATE ON items REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION bait_item_counts_update()
    """,
    """
    CREATE TRIGGER items_counts_delete AFTER DELETE ON items REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION bait_item_counts_delete()
    """,
]


def _sqlite_add(row: str, delta: str) -> str:
    """Statements adding ``delta`` to the count of ``row``'s key (``NEW`` or ``OLD``), creating the key."""
    match = ' AND '.join(f'{c} = {row}.{c}' for c in _KEY.split(', '))
    values = ', '.join(f'{row}.{c}' for c in _KEY.split(', '))
    return f"""
        INSERT INTO pool_item_counts ({_KEY}, n)
            SELECT {values}, 0 WHERE NOT EXISTS (SELECT 1 FROM pool_item_counts WHERE {match});
        UPDATE pool_item_counts SET n = n + ({delta}) WHERE {match};
    """


_SQLITE_TRIGGERS = [
    f"CREATE TRIGGER items_counts_insert AFTER INSERT ON items BEGIN {_sqlite_add('NEW', '1')} END",
    f"""
    CREATE TRIGGER items_counts_update AFTER UPDATE OF {_KEY} ON items
        WHEN {' OR '.join(f'OLD.{c} IS NOT NEW.{c}' for c in _KEY.split(', '))}
    BEGIN {_sqlite_add('OLD', '-1')} {_sqlite_add('NEW', '1')} END
    """,
    # A pool's cascade deletes its count rows too; decrementing a row that is gone is a no-op.
    """
    CREATE TRIGGER items_counts_delete AFTER DELETE ON items BEGIN
        UPDATE pool_item_counts SET n = n - 1 WHERE pool_id = OLD.pool_id AND split = OLD.split
            AND status = OLD.status AND embedding_status = OLD.embedding_status;
    END
    """,
]


def upgrade() -> None:
    op.drop_index('ix_items_pool_status', table_name='items')
    op.create_index('ix_items_pool_status_id', 'items', ['pool_id', 'status', 'id'], unique=False)
    op.create_index('ix_items_pool_id', 'items', ['pool_id', 'id'], unique=False)
    op.create_index(
        'ix_items_pool_embedding_status',
        'items',
        ['pool_id', 'embedding_status', 'id'],
        unique=False,
        postgresql_where=sa.text("embedding_status <> 'ready'"),
        sqlite_where=sa.text("embedding_status <> 'ready'"),
    )
    op.create_table('pool_item_counts',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('pool_id', sa.String(length=32), nullable=False),
    sa.Column('split', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('embedding_status', sa.String(length=16), nullable=False),
    sa.Column('n', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_pool_item_counts_pool_id_pools'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pool_item_counts'))
    )
    op.create_index(
        'ix_pool_item_counts_key', 'pool_item_counts', ['pool_id', 'split', 'status', 'embedding_status'], unique=False
    )
    # The counts of the items already there, then the triggers (a migration runs alone: no write comes between).
    op.execute(
        f"INSERT INTO pool_item_counts ({_KEY}, n) SELECT {_KEY}, count(*) FROM items GROUP BY {_KEY}"
    )
    statements = _PG_FUNCTIONS + _PG_TRIGGERS if op.get_bind().dialect.name == 'postgresql' else _SQLITE_TRIGGERS
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == 'postgresql'
    for trigger in ('items_counts_insert', 'items_counts_update', 'items_counts_delete'):
        op.execute(f'DROP TRIGGER IF EXISTS {trigger} ON items' if postgresql else f'DROP TRIGGER IF EXISTS {trigger}')
    if postgresql:
        for function in ('bait_item_counts_insert', 'bait_item_counts_update', 'bait_item_counts_delete'):
            op.execute(f'DROP FUNCTION IF EXISTS {function}()')
    op.drop_index('ix_pool_item_counts_key', table_name='pool_item_counts')
    op.drop_table('pool_item_counts')
    op.drop_index('ix_items_pool_embedding_status', table_name='items')
    op.drop_index('ix_items_pool_id', table_name='items')
    op.drop_index('ix_items_pool_status_id', table_name='items')
    op.create_index('ix_items_pool_status', 'items', ['pool_id', 'status'], unique=False)
