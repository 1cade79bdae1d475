"""collective trials and comm logs

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 13:08:05.017024
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('collective_trials',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=32), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('trial', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('digest', sa.String(length=48), nullable=False),
    sa.Column('prefix_digest', sa.String(length=48), nullable=True),
    sa.Column('time_s', sa.Float(), nullable=False),
    sa.Column('err_max_abs', sa.Float(), nullable=True),
    sa.Column('err_max_ulp', sa.Float(), nullable=True),
    sa.Column('frac_diff', sa.Float(), nullable=True),
    sa.Column('impl', sa.String(length=32), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_collective_trials_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_collective_trials')),
    sa.UniqueConstraint('run_id', 'op', 'dtype', 'bytes', 'trial', 'rank', name=op.f('uq_collective_trials_run_id'))
    )
    with op.batch_alter_table('collective_trials', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_collective_trials_run_id'), ['run_id'], unique=False)

    op.create_table('comm_logs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('raw', sa.LargeBinary(), nullable=False),
    sa.Column('raw_bytes', sa.BigInteger(), nullable=False),
    sa.Column('truncated', sa.Boolean(), nullable=False),
    sa.Column('parsed', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_comm_logs_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_comm_logs')),
    sa.UniqueConstraint('run_id', 'rank', name=op.f('uq_comm_logs_run_id'))
    )


def downgrade() -> None:
    op.drop_table('comm_logs')
    with op.batch_alter_table('collective_trials', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_collective_trials_run_id'))

    op.drop_table('collective_trials')
