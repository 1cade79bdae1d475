"""findings

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 13:41:31.902955
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('findings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('source', sa.String(length=255), nullable=False),
    sa.Column('recorded_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('hardware', sa.String(length=128), nullable=False),
    sa.Column('library', sa.String(length=64), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('config', sa.String(length=64), nullable=False),
    sa.Column('config_env', sa.JSON(), nullable=False),
    sa.Column('op', sa.String(length=32), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('bytes', sa.BigInteger(), nullable=False),
    sa.Column('runs', sa.Integer(), nullable=False),
    sa.Column('reproducible', sa.Boolean(), nullable=False),
    sa.Column('busbw_gbps', sa.Float(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_findings')),
    sa.UniqueConstraint('source', 'config', 'op', 'dtype', 'bytes', name=op.f('uq_findings_source'))
    )
    with op.batch_alter_table('findings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_findings_source'), ['source'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('findings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_findings_source'))

    op.drop_table('findings')
