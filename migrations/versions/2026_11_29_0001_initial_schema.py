"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 12:53:55.930364
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('configs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('hash', sa.String(length=16), nullable=False),
    sa.Column('body', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_configs')),
    sa.UniqueConstraint('name', 'hash', name=op.f('uq_configs_name'))
    )
    with op.batch_alter_table('configs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_configs_hash'), ['hash'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('workload', sa.String(length=64), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('steps', sa.Integer(), nullable=False),
    sa.Column('repeats', sa.Integer(), nullable=False),
    sa.Column('params', sa.JSON(), nullable=False),
    sa.Column('config_ids', sa.JSON(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('submitter', sa.String(length=64), nullable=True),
    sa.Column('queue', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)

    op.create_table('workers',
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('queue', sa.String(length=64), nullable=False),
    sa.Column('last_seen', sa.DateTime(timezone=True), nullable=False),
    sa.Column('info', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('name', name=op.f('pk_workers'))
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('config_id', sa.Integer(), nullable=False),
    sa.Column('config_index', sa.Integer(), nullable=False),
    sa.Column('repeat', sa.Integer(), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('steps_total', sa.Integer(), nullable=False),
    sa.Column('steps_done', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=True),
    sa.Column('device', sa.String(length=32), nullable=True),
    sa.Column('fingerprint_impl', sa.String(length=32), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('dispatched_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['config_id'], ['configs.id'], name=op.f('fk_runs_config_id_configs')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_runs_job_id_jobs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('job_id', 'config_index', 'repeat', name=op.f('uq_runs_job_id'))
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_runs_status'), ['status'], unique=False)

    op.create_table('rank_envs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('device', sa.String(length=255), nullable=True),
    sa.Column('driver', sa.String(length=64), nullable=True),
    sa.Column('cuda', sa.String(length=32), nullable=True),
    sa.Column('hip', sa.String(length=32), nullable=True),
    sa.Column('torch', sa.String(length=64), nullable=True),
    sa.Column('nccl', sa.String(length=32), nullable=True),
    sa.Column('backend', sa.String(length=16), nullable=True),
    sa.Column('effective_env', sa.JSON(), nullable=False),
    sa.Column('torch_flags', sa.JSON(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_rank_envs_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rank_envs')),
    sa.UniqueConstraint('run_id', 'rank', name=op.f('uq_rank_envs_run_id'))
    )
    op.create_table('step_records',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('step', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('fp_version', sa.String(length=8), nullable=False),
    sa.Column('model_digest', sa.String(length=48), nullable=False),
    sa.Column('digests', sa.LargeBinary(), nullable=False),
    sa.Column('loss_bits', sa.String(length=16), nullable=False),
    sa.Column('loss', sa.Float(), nullable=True),
    sa.Column('step_time_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_step_records_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_step_records')),
    sa.UniqueConstraint('run_id', 'step', 'rank', name=op.f('uq_step_records_run_id'))
    )
    with op.batch_alter_table('step_records', schema=None) as batch_op:
        batch_op.create_index('ix_step_records_run_step', ['run_id', 'step'], unique=False)

    op.create_table('tensor_meta',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=255), nullable=False),
    sa.Column('shape', sa.JSON(), nullable=False),
    sa.Column('dtype', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_tensor_meta_run_id_runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_tensor_meta')),
    sa.UniqueConstraint('run_id', 'index', name=op.f('uq_tensor_meta_run_id'))
    )


def downgrade() -> None:
    op.drop_table('tensor_meta')
    with op.batch_alter_table('step_records', schema=None) as batch_op:
        batch_op.drop_index('ix_step_records_run_step')

    op.drop_table('step_records')
    op.drop_table('rank_envs')
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_runs_status'))
        batch_op.drop_index(batch_op.f('ix_runs_job_id'))

    op.drop_table('runs')
    op.drop_table('workers')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status'))
        batch_op.drop_index(batch_op.f('ix_jobs_created_at'))

    op.drop_table('jobs')
    with op.batch_alter_table('configs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_configs_hash'))

    op.drop_table('configs')
