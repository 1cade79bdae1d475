"""collective calls per step and rank (packed input and output digests), and each rank's logical position

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01 20:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('collective_calls',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('fp_version', sa.String(length=8), nullable=False),
    sa.Column('calls', sa.JSON(), nullable=False),
    sa.Column('inputs', sa.LargeBinary(), nullable=False),
    sa.Column('outputs', sa.LargeBinary(), nullable=False),
    sa.Column('unread', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_collective_calls_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_collective_calls')),
    sa.UniqueConstraint('run_id', 'step', 'rank', name=op.f('uq_collective_calls_run_id'))
    )
    with op.batch_alter_table('rank_envs') as batch:
        batch.add_column(sa.Column('position', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('rank_envs') as batch:
        batch.drop_column('position')
    op.drop_table('collective_calls')
