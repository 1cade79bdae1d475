"""diagnosis results: the records of batch-invariance and op-audit runs, one row each

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 20:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('diagnosis_records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('type', sa.String(length=16), nullable=False),
    sa.Column('key', sa.String(length=160), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_diagnosis_records_run_id_runs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_diagnosis_records')),
    sa.UniqueConstraint('run_id', 'type', 'key', name=op.f('uq_diagnosis_records_run_id'))
    )
    with op.batch_alter_table('diagnosis_records', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_diagnosis_records_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('diagnosis_records', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_diagnosis_records_run_id'))
    op.drop_table('diagnosis_records')
