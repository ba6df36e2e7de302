"""dashboard sessions held server-side: sign-out, idle timeout and an admin's "end session" take effect

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 18:00:00

A signed cookie alone cannot be revoked: after sign-out a saved copy still opened the dashboard until
it expired. The cookie now names a row of ``web_sessions`` (by the SHA-256 of a random token), which
signing out, an admin, the key's revocation or a timeout ends.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('web_sessions',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('key_id', sa.String(length=32), nullable=False),
    sa.Column('csrf', sa.String(length=64), nullable=False),
    sa.Column('user_agent', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_reason', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['key_id'], ['api_keys.id'], name=op.f('fk_web_sessions_key_id_api_keys'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_web_sessions')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_web_sessions_token_hash'))
    )
    with op.batch_alter_table('web_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_web_sessions_key_id'), ['key_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('web_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_web_sessions_key_id'))
    op.drop_table('web_sessions')
