"""attempt history of batches and embed jobs

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24 09:10:00

Each job row keeps the story of its attempts (when each ran, on which worker, how it ended and
why: ``worker_lost`` with the heartbeat gap, ``failed`` with the error, ...), shown on GET batch.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('batches') as batch_op:
        batch_op.add_column(sa.Column('attempt_history', sa.JSON(), nullable=True))
    with op.batch_alter_table('embed_jobs') as batch_op:
        batch_op.add_column(sa.Column('attempt_history', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('embed_jobs') as batch_op:
        batch_op.drop_column('attempt_history')
    with op.batch_alter_table('batches') as batch_op:
        batch_op.drop_column('attempt_history')
