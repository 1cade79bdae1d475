"""job results: a job's result, computed once when it settles

Jobs finished before this revision keep a null result; the API computes and stores it on the
first read, and listings read their verdict from params["verdict"] until then. The downgrade puts
each stored train verdict back into params["verdict"], where the previous revision's code reads it.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 14:30:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('result', sa.JSON(), nullable=True))


def downgrade() -> None:
    jobs = sa.table('jobs', sa.column('id', sa.Integer()), sa.column('params', sa.JSON()),
                    sa.column('result', sa.JSON()))
    conn = op.get_bind()
    # One job at a time: a long job's result is tens of megabytes.
    for job_id in conn.scalars(sa.select(jobs.c.id).where(jobs.c.result.is_not(None))).all():
        params, result = conn.execute(sa.select(jobs.c.params, jobs.c.result).where(jobs.c.id == job_id)).one()
        if isinstance(result, dict) and "verdict" in result and "verdict" not in (params or {}):
            conn.execute(jobs.update().where(jobs.c.id == job_id)
                         .values(params={**(params or {}), "verdict": result["verdict"]}))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('result')
