"""the stopping rule: each checkpoint's predictions on the pool's stop set, their agreement with the
previous round's, and the stop recommendation at that checkpoint

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-27 20:00:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('checkpoint_stops',
    sa.Column('checkpoint_id', sa.String(length=32), nullable=False),
    sa.Column('pool_id', sa.String(length=32), nullable=False),
    sa.Column('n_items', sa.Integer(), nullable=False),
    sa.Column('predictions', sa.LargeBinary(), nullable=True),
    sa.Column('agreement', sa.Float(), nullable=True),
    sa.Column('recommendation', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name=op.f('fk_checkpoint_stops_checkpoint_id_checkpoints'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_checkpoint_stops_pool_id_pools'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('checkpoint_id', name=op.f('pk_checkpoint_stops'))
    )
    with op.batch_alter_table('checkpoint_stops', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoint_stops_pool_id'), ['pool_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('checkpoint_stops', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoint_stops_pool_id'))
    op.drop_table('checkpoint_stops')
