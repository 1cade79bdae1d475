"""resumed recordings and the state beside a step's tensors: each step record's segment (the process that wrote
it) and whether it is a restored state, the batch / RNG / optimizer entries it recorded; each tensor's component

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 13:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('step_records') as batch:
        batch.add_column(sa.Column('segment', sa.Integer(), server_default='0', nullable=False))
        batch.add_column(sa.Column('restored', sa.Boolean(), server_default=sa.false(), nullable=False))
        batch.add_column(sa.Column('state', sa.JSON(), nullable=True))
        # A resumed recording holds a step once per segment (the restored state beside the saved one).
        batch.drop_constraint('uq_step_records_run_id', type_='unique')
        batch.create_unique_constraint('uq_step_records_run_id', ['run_id', 'step', 'rank', 'segment'])
    with op.batch_alter_table('tensor_meta') as batch:
        batch.add_column(sa.Column('component', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('tensor_meta') as batch:
        batch.drop_column('component')
    # Before resumes there was one record per step: the first process's, as its segment 0 holds it.
    op.execute(sa.text("DELETE FROM step_records WHERE segment > 0"))
    with op.batch_alter_table('step_records') as batch:
        batch.drop_constraint('uq_step_records_run_id', type_='unique')
        batch.create_unique_constraint('uq_step_records_run_id', ['run_id', 'step', 'rank'])
        batch.drop_column('state')
        batch.drop_column('restored')
        batch.drop_column('segment')
