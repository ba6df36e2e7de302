"""item data, Label Studio event dedupe, reconcile runs, integration state

Revision ID: 0005
Revises: 0006
Create Date: 2026-11-24 09:40:00
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0005'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.add_column(sa.Column('data', sa.JSON(), nullable=True))
    with op.batch_alter_table('integrations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('state', sa.JSON(), nullable=True))

    op.create_table('labelstudio_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('integration_id', sa.String(length=32), nullable=False),
    sa.Column('annotation_id', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['integration_id'], ['integrations.id'], name=op.f('fk_labelstudio_events_integration_id_integrations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_labelstudio_events')),
    sa.UniqueConstraint('integration_id', 'annotation_id', 'updated_at', name=op.f('uq_labelstudio_events_integration_id'))
    )
    op.create_table('reconcile_runs',
    sa.Column('id', sa.String(length=32), nullable=False),
    sa.Column('integration_id', sa.String(length=32), nullable=False),
    sa.Column('trigger', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('counts', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['integration_id'], ['integrations.id'], name=op.f('fk_reconcile_runs_integration_id_integrations'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reconcile_runs'))
    )
    with op.batch_alter_table('reconcile_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_reconcile_runs_integration_id'), ['integration_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('reconcile_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_reconcile_runs_integration_id'))
    op.drop_table('reconcile_runs')
    op.drop_table('labelstudio_events')
    with op.batch_alter_table('integrations', schema=None) as batch_op:
        batch_op.drop_column('state')
    with op.batch_alter_table('items', schema=None) as batch_op:
        batch_op.drop_column('data')
