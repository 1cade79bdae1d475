"""a recording's id on its job: one unique column, so that every rank, retry and upload of an SDK recording
finds its one job (it had borrowed the submissions' idempotency keys, which expire after a day)

Recording ids stored as idempotency keys ("recording:<id>") move to the column; the downgrade moves them back.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 18:50:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

PREFIX = "recording:"


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("recording", sa.String(length=64), nullable=True))
        batch.create_index("ix_jobs_recording", ["recording"], unique=True)
    keys = sa.table("idempotency_keys", sa.column("key", sa.String), sa.column("job_id", sa.Integer))
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("recording", sa.String))
    bind = op.get_bind()
    for key, job_id in bind.execute(sa.select(keys.c.key, keys.c.job_id).where(keys.c.key.like(f"{PREFIX}%"))):
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(recording=key.removeprefix(PREFIX)))
    bind.execute(keys.delete().where(keys.c.key.like(f"{PREFIX}%")))


def downgrade() -> None:
    keys = sa.table("idempotency_keys", sa.column("key", sa.String), sa.column("job_id", sa.Integer),
                    sa.column("body_hash", sa.String), sa.column("created_at", sa.DateTime))
    jobs = sa.table("jobs", sa.column("id", sa.Integer), sa.column("recording", sa.String),
                    sa.column("created_at", sa.DateTime))
    bind = op.get_bind()
    for job_id, recording, created in bind.execute(
            sa.select(jobs.c.id, jobs.c.recording, jobs.c.created_at).where(jobs.c.recording.is_not(None))):
        bind.execute(keys.insert().values(key=f"{PREFIX}{recording}", job_id=job_id, body_hash="recording",
                                          created_at=created))
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_recording")
        batch.drop_column("recording")
