"""step records carry per-tensor float64 statistics and count sketches (detlab.core.sketch), packed like the
digests: how far two runs drift apart is estimated from them. Nullable: older records have none.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 20:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("step_records") as batch:
        batch.add_column(sa.Column("drift_version", sa.String(length=8), nullable=True))
        batch.add_column(sa.Column("stats", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("sketch", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("step_records") as batch:
        batch.drop_column("sketch")
        batch.drop_column("stats")
        batch.drop_column("drift_version")
