"""each rank's preflight findings: the known-broken or no-op settings its process ran with (detlab.core.preflight)

Revision ID: 0017
Revises: 0015
Create Date: 2026-12-02 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('rank_envs') as batch:
        batch.add_column(sa.Column('preflight', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('rank_envs') as batch:
        batch.drop_column('preflight')
