"""history_changes: one row per change to the team's history, so that the findings matrix's readers tell in
one index lookup whether a cached matrix still holds (a count of finding_cells scanned 100k+ rows per request)

Revision ID: 0014
Revises: 0009
Create Date: 2026-12-01 21:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('history_changes',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_history_changes'))
    )


def downgrade() -> None:
    op.drop_table('history_changes')
