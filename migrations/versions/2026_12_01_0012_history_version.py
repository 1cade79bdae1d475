"""history_version: one row counted up by every change to the team's history, so that the findings matrix's
readers tell in one lookup whether a matrix they built still holds (a count of finding_cells scanned 100k+
rows on every request)

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 21:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('history_version',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.BigInteger(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_history_version'))
    )


def downgrade() -> None:
    op.drop_table('history_version')
