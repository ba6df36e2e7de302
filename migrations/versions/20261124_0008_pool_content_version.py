"""pool content version: what a worker's pool cache is keyed by

Revision ID: 0008
Revises: 0005
Create Date: 2026-11-24 19:05:00

``pools.content_version`` counts the changes to what a worker caches of a pool (the set of selectable
items and their ids and embeddings); ``items.content_seq`` is the version at which the row last
changed; ``item_tombstones`` remembers deleted rows with the version of their deletion. The database
maintains all three itself, with triggers, so every write path (ORM, set-based upserts, COPY) is
covered:

- an INSERT, a DELETE, or an UPDATE that changes ``external_id``, ``embedding``, ``embedding_status``
  or ``split`` bumps the pool's version and stamps the row (or its tombstone) with it; label, status
  and reservation writes do not (the cache does not hold them);
- versions are handed out in commit order: on PostgreSQL the first stamping statement of a transaction
  takes the pool row's lock (``UPDATE pools``) and the transaction stamps every row with that one
  version (kept in a transaction-local setting), so a second writer of the same pool waits for the
  first to commit; SQLite has one writer at a time anyway (one bump per row there).

So a reader that has seen version ``v`` finds every change since by ``content_seq > v`` (and
tombstones with ``seq > v``), through the ``(pool_id, content_seq)`` index.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Columns whose change a worker's cache must see.
_WATCHED = ('external_id', 'embedding', 'embedding_status', 'split')

_PG_FUNCTIONS = [
    """
    CREATE FUNCTION bait_pool_content_version(p_pool text) RETURNS bigint LANGUAGE plpgsql AS $$
    -- The version this transaction stamps the pool's rows with: bumped (and the pool row locked until
    -- commit) by the first change of the transaction, then reused. NULL when the pool is gone.
    DECLARE
        k text := 'bait.content_v_' || md5(p_pool);
        v bigint := nullif(current_setting(k, true), '')::bigint;
    BEGIN
        IF v IS NULL THEN
            UPDATE pools SET content_version = content_version + 1 WHERE id = p_pool
                RETURNING content_version INTO v;
            IF v IS NOT NULL THEN
                PERFORM set_config(k, v::text, true);
            END IF;
        END IF;
        RETURN v;
    END $$
    """,
    """
    CREATE FUNCTION bait_items_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.content_seq := coalesce(bait_pool_content_version(NEW.pool_id), 0);
        RETURN NEW;
    END $$
    """,
    """
    CREATE FUNCTION bait_items_tombstones() RETURNS trigger LANGUAGE plpgsql AS $$
    -- Deleted rows of pools that still exist (a pool's own deletion cascades without tombstones).
    DECLARE
        p text;
        v bigint;
    BEGIN
        FOR p IN SELECT DISTINCT o.pool_id FROM old_rows o JOIN pools ON pools.id = o.pool_id LOOP
            v := bait_pool_content_version(p);
            INSERT INTO item_tombstones (pool_id, item_id, seq)
                SELECT o.pool_id, o.id, v FROM old_rows o WHERE o.pool_id = p;
        END LOOP;
        RETURN NULL;
    END $$
    """,
]

_PG_TRIGGERS = [
    """
    CREATE TRIGGER items_content_insert BEFORE INSERT ON items
        FOR EACH ROW EXECUTE FUNCTION bait_items_stamp()
    """,
    f"""
    CREATE TRIGGER items_content_update BEFORE UPDATE OF {', '.join(_WATCHED)} ON items FOR EACH ROW
        WHEN ({' OR '.join(f'OLD.{c} IS DISTINCT FROM NEW.{c}' for c in _WATCHED)})
        EXECUTE FUNCTION bait_items_stamp()
    """,
    """
    CREATE TRIGGER items_content_delete AFTER DELETE ON items REFERENCING OLD TABLE AS old_rows
        FOR EACH STATEMENT EXECUTE FUNCTION bait_items_tombstones()
    """,
]

_SQLITE_STAMP = """
        UPDATE pools SET content_version = content_version + 1 WHERE id = NEW.pool_id;
        UPDATE items SET content_seq = (SELECT content_version FROM pools WHERE id = NEW.pool_id) WHERE id = NEW.id;
"""

_SQLITE_TRIGGERS = [
    f"""
    CREATE TRIGGER items_content_insert AFTER INSERT ON items BEGIN {_SQLITE_STAMP} END
    """,
    f"""
    CREATE TRIGGER items_content_update AFTER UPDATE OF {', '.join(_WATCHED)} ON items
        WHEN {' OR '.join(f'OLD.{c} IS NOT NEW.{c}' for c in _WATCHED)}
    BEGIN {_SQLITE_STAMP} END
    """,
    """
    CREATE TRIGGER items_content_delete AFTER DELETE ON items
        WHEN EXISTS (SELECT 1 FROM pools WHERE id = OLD.pool_id)
    BEGIN
        UPDATE pools SET content_version = content_version + 1 WHERE id = OLD.pool_id;
        INSERT INTO item_tombstones (pool_id, item_id, seq)
            SELECT OLD.pool_id, OLD.id, content_version FROM pools WHERE id = OLD.pool_id;
    END
    """,
]


def upgrade() -> None:
    with op.batch_alter_table('pools', schema=None) as batch_op:
        batch_op.add_column(sa.Column('content_version', sa.BigInteger(), server_default='0', nullable=False))
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.add_column(sa.Column('content_seq', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.create_index('ix_items_pool_content_seq', ['pool_id', 'content_seq'], unique=False)
    op.create_table('item_tombstones',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('pool_id', sa.String(length=32), nullable=False),
    sa.Column('item_id', sa.BigInteger(), nullable=False),
    sa.Column('seq', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_item_tombstones_pool_id_pools'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_item_tombstones'))
    )
    with op.batch_alter_table('item_tombstones', schema=None) as batch_op:
        batch_op.create_index('ix_item_tombstones_pool_seq', ['pool_id', 'seq'], unique=False)
    statements = _PG_FUNCTIONS + _PG_TRIGGERS if op.get_bind().dialect.name == 'postgresql' else _SQLITE_TRIGGERS
    for statement in statements:
        op.execute(statement)


def downgrade() -> None:
    for trigger in ('items_content_insert', 'items_content_update', 'items_content_delete'):
        if op.get_bind().dialect.name == 'postgresql':
            op.execute(f'DROP TRIGGER IF EXISTS {trigger} ON items')
        else:
            op.execute(f'DROP TRIGGER IF EXISTS {trigger}')
    if op.get_bind().dialect.name == 'postgresql':
        for function in ('bait_items_tombstones()', 'bait_items_stamp()', 'bait_pool_content_version(text)'):
            op.execute(f'DROP FUNCTION IF EXISTS {function}')
    with op.batch_alter_table('item_tombstones', schema=None) as batch_op:
        batch_op.drop_index('ix_item_tombstones_pool_seq')
    op.drop_table('item_tombstones')
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.drop_index('ix_items_pool_content_seq')
        batch_op.drop_column('content_seq')
    with op.batch_alter_table('pools', schema=None) as batch_op:
        batch_op.drop_column('content_version')
