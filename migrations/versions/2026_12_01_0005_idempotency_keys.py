"""idempotency keys: the Idempotency-Key of each job submission, so a retry returns the first job

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('idempotency_keys',
    sa.Column('key', sa.String(length=128), nullable=False),
    sa.Column('body_hash', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_idempotency_keys_job_id_jobs'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_idempotency_keys'))
    )
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_idempotency_keys_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_idempotency_keys_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    # Keys only dedupe retries of recent submissions; the jobs they point at stay.
    with op.batch_alter_table('idempotency_keys', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_idempotency_keys_job_id'))
        batch_op.drop_index(batch_op.f('ix_idempotency_keys_created_at'))
    op.drop_table('idempotency_keys')
