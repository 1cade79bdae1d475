"""job tags and list verdicts: tags on jobs (and job_tags to filter on them), each job's verdict in a column,
and the indexes the jobs list filters and sorts on

The verdict of jobs settled before is read from their stored result (or, for jobs settled before 0004,
params["verdict"]). The downgrade drops the tags: the previous revision has nowhere to keep them.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 17:00:00.000000
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None

# ix_jobs_status_id replaces ix_jobs_status: a sort by status then reads its pages in order.
JOB_INDEXES = {"ix_jobs_status_id": "status", "ix_jobs_workload_id": "workload", "ix_jobs_kind_id": "kind",
               "ix_jobs_verdict_id": "verdict", "ix_jobs_submitter_id": "submitter"}


def _verdict(result: Any) -> str | None:
    """services.settle.list_verdict as of this revision (a migration keeps its own copy)."""
    if not isinstance(result, dict) or not result:
        return None
    if result.get("verdict"):
        return str(result["verdict"])
    if "cells" in result:
        cells = result["cells"] or []
        return None if not cells else "reproducible" if all(c.get("reproducible") for c in cells) \
            else "not-reproducible"
    measured = [r for r in result.get("reproducibility") or [] if r.get("comparable")]
    if not measured:
        return None
    return "reproducible" if all(r["identical_to_first"] == r["comparable"] for r in measured) else "not-reproducible"


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('verdict', sa.String(length=32), nullable=True))
        batch_op.add_column(sa.Column('tags', sa.JSON(), nullable=False, server_default=sa.text("'[]'")))
        batch_op.drop_index('ix_jobs_status')
        for name, column in JOB_INDEXES.items():
            batch_op.create_index(name, [column, 'id'], unique=False)
    op.create_table('job_tags',
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('tag', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_job_tags_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_id', 'tag', name=op.f('pk_job_tags'))
    )
    with op.batch_alter_table('job_tags', schema=None) as batch_op:
        batch_op.create_index('ix_job_tags_tag_job_id', ['tag', 'job_id'], unique=False)
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index('ix_runs_config_id_job_id', ['config_id', 'job_id'], unique=False)

    jobs = sa.table('jobs', sa.column('id', sa.Integer()), sa.column('params', sa.JSON()),
                    sa.column('result', sa.JSON()), sa.column('verdict', sa.String()))
    conn = op.get_bind()
    # One job at a time: a long job's result is tens of megabytes.
    for job_id in conn.scalars(sa.select(jobs.c.id)).all():
        params, result = conn.execute(sa.select(jobs.c.params, jobs.c.result).where(jobs.c.id == job_id)).one()
        verdict = _verdict(result) if result is not None else (params or {}).get("verdict")
        if isinstance(verdict, str):
            conn.execute(jobs.update().where(jobs.c.id == job_id).values(verdict=verdict[:32]))


def downgrade() -> None:
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index('ix_runs_config_id_job_id')
    with op.batch_alter_table('job_tags', schema=None) as batch_op:
        batch_op.drop_index('ix_job_tags_tag_job_id')
    op.drop_table('job_tags')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        for name in JOB_INDEXES:
            batch_op.drop_index(name)
        batch_op.create_index('ix_jobs_status', ['status'], unique=False)
        batch_op.drop_column('tags')
        batch_op.drop_column('verdict')
