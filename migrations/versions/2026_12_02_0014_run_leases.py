"""run leases: the sha256 of the secret a claim hands out, so only that attempt's holder writes it

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Null for runs claimed before leases existed (and for queued runs, and recordings): a running run without one
    # takes no writes until it is claimed again, which the reconciler does when its worker goes quiet.
    with op.batch_alter_table('runs') as batch:
        batch.add_column(sa.Column('lease_hash', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('runs') as batch:
        batch.drop_column('lease_hash')
