"""key scopes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24 09:20:00.000000

API keys carry scopes (space-separated: read label select admin). Keys that existed before keep
every scope, so nothing that worked stops working; new keys get what `bait keys create --scope` says.
"""
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('scopes', sa.String(length=64), nullable=False, server_default='read label select admin')
        )


def downgrade() -> None:
    with op.batch_alter_table('api_keys', schema=None) as batch_op:
        batch_op.drop_column('scopes')
