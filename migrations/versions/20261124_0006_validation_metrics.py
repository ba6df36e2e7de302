"""validation split, validation metrics per checkpoint, 2-D maps

Revision ID: 0006
Revises: 0004
Create Date: 2026-11-24 09:10:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0006'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.add_column(sa.Column('split', sa.String(length=16), server_default='train', nullable=False))
        batch_op.create_index('ix_items_pool_split', ['pool_id', 'split', 'status'], unique=False)
    with op.batch_alter_table('pools', schema=None) as batch_op:
        batch_op.add_column(sa.Column('validation', sa.JSON(), nullable=True))
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('validation_metrics', sa.JSON(), nullable=True))
    op.create_table('checkpoint_maps',
    sa.Column('checkpoint_id', sa.String(length=32), nullable=False),
    sa.Column('pool_id', sa.String(length=32), nullable=False),
    sa.Column('n_points', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['checkpoint_id'], ['checkpoints.id'], name=op.f('fk_checkpoint_maps_checkpoint_id_checkpoints'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['pool_id'], ['pools.id'], name=op.f('fk_checkpoint_maps_pool_id_pools'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('checkpoint_id', name=op.f('pk_checkpoint_maps'))
    )
    with op.batch_alter_table('checkpoint_maps', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_checkpoint_maps_pool_id'), ['pool_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('checkpoint_maps', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_checkpoint_maps_pool_id'))
    op.drop_table('checkpoint_maps')
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_column('validation_metrics')
    with op.batch_alter_table('pools', schema=None) as batch_op:
        batch_op.drop_column('validation')
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.drop_index('ix_items_pool_split')
        batch_op.drop_column('split')
