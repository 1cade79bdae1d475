"""findings at scale: finding_cells, one measurement per source × config × op × dtype (train jobs
included) with its stack, cost and first divergence, indexed for the config × stack matrix

The history kept so far is carried over: each source's collective findings rows folded by config, op and
dtype, and every finished train job's stored result (its configs' reproducibility and cost). The
downgrade drops the table; the collective findings rows it was folded from stay.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 18:00:00.000000
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

CELLS = sa.table(
    'finding_cells', *(sa.column(name, sa.JSON() if name == 'config_env' else None) for name in (
        'source', 'job_id', 'measured_at', 'kind', 'workload', 'op', 'dtype', 'config_index', 'config',
        'config_env', 'stack', 'hardware', 'world_size', 'driver', 'runtime', 'torch', 'library', 'identical',
        'comparable', 'runs', 'cost', 'cost_lo', 'cost_hi', 'first_divergent_step', 'largest_bytes',
        'busbw_gbps')))


def _stack(facts: dict[str, Any], world_size: int, library: str) -> dict[str, Any]:
    """reports.findings.stack_of as of this revision (a migration keeps its own copy)."""
    device = facts.get("device") or "unknown device"
    runtime = f"CUDA {facts['cuda']}" if facts.get("cuda") else f"ROCm {facts['hip']}" if facts.get("hip") else None
    hardware = f"{world_size} x {device}"[:128]
    parts = [hardware, facts.get("driver") and f"driver {facts['driver']}", runtime,
             facts.get("torch") and f"torch {facts['torch']}", library]
    return {"hardware": hardware, "world_size": world_size, "driver": facts.get("driver"), "runtime": runtime,
            "torch": facts.get("torch"), "library": library[:64],
            "stack": " · ".join(p for p in parts if p)[:255]}


def _when(value: Any) -> datetime:
    when = value if isinstance(value, datetime) else datetime.fromisoformat(str(value))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def _collective_cells(conn: sa.Connection) -> list[dict[str, Any]]:
    findings = sa.table('findings', *(sa.column(n, sa.JSON() if n == 'config_env' else None) for n in (
        'source', 'recorded_at', 'hardware', 'library', 'world_size', 'config', 'config_env', 'op', 'dtype',
        'bytes', 'runs', 'reproducible', 'busbw_gbps')))
    groups: dict[tuple[str, str, str, str], list[Any]] = {}
    for row in conn.execute(sa.select(findings)).mappings():
        groups.setdefault((row["source"], row["config"], row["op"], row["dtype"]), []).append(row)
    cells = []
    for (source, config, op_name, dtype), rows in groups.items():
        largest = max(r["bytes"] for r in rows)
        at_largest = [r["busbw_gbps"] for r in rows if r["bytes"] == largest and r["busbw_gbps"] is not None]
        job_id = int(source[4:]) if source.startswith("job ") and source[4:].isdigit() else None
        first = rows[0]
        device = first["hardware"].split(" x ", 1)[-1]
        cells.append({"source": source, "job_id": job_id, "measured_at": _when(first["recorded_at"]),
                      "kind": "collective", "workload": "collective", "op": op_name, "dtype": dtype,
                      "config_index": 0, "config": config, "config_env": first["config_env"],
                      **_stack({"device": device}, first["world_size"], first["library"]),
                      "identical": sum(bool(r["reproducible"]) for r in rows), "comparable": len(rows),
                      "runs": min(r["runs"] for r in rows), "cost": None, "cost_lo": None, "cost_hi": None,
                      "first_divergent_step": None, "largest_bytes": largest,
                      "busbw_gbps": max(at_largest) if at_largest else None})
    return cells


def _train_cells(conn: sa.Connection, existing_jobs: set[int]) -> list[dict[str, Any]]:
    jobs = sa.table('jobs', *(sa.column(n, sa.JSON() if n == 'result' else None) for n in (
        'id', 'workload', 'world_size', 'status', 'result', 'created_at', 'finished_at')))
    runs = sa.table('runs', *(sa.column(n) for n in ('id', 'job_id', 'config_index', 'repeat', 'device')))
    envs = sa.table('rank_envs', *(sa.column(n) for n in ('run_id', 'rank', 'device', 'driver', 'cuda', 'hip',
                                                            'torch', 'nccl', 'backend')))
    cells = []
    finished = sa.select(jobs.c.id).where(jobs.c.workload != "collective", jobs.c.result.is_not(None),
                                          jobs.c.status.in_(("succeeded", "failed", "cancelled")))
    for job_id in conn.scalars(finished).all():
        if job_id in existing_jobs:
            continue
        job = conn.execute(sa.select(jobs).where(jobs.c.id == job_id)).mappings().one()
        result = job["result"]
        if not isinstance(result, dict) or not result.get("reproducibility"):
            continue
        facts: dict[int, dict[str, Any]] = {}
        for row in conn.execute(sa.select(runs.c.config_index, runs.c.device.label("run_device"), envs)
                                .outerjoin(envs, envs.c.run_id == runs.c.id).where(runs.c.job_id == job_id)
                                .order_by(runs.c.config_index, runs.c.repeat, envs.c.rank)).mappings():
            got = facts.setdefault(row["config_index"], {})
            for key in ("device", "driver", "cuda", "hip", "torch", "nccl", "backend"):
                got.setdefault(key, row[key])
            got["device"] = got.get("device") or row["run_device"]
        throughput = {t["config_index"]: t for t in result.get("throughput") or []}
        for repro in result["reproducibility"]:
            i = int(repro["config_index"])
            thr = throughput.get(i, {})
            env = facts.get(i) or facts.get(0) or {}
            library = (f"{'RCCL' if env.get('hip') else 'NCCL'} {env['nccl']}"
                       if env.get("nccl") and env.get("backend") in (None, "nccl") else env.get("backend") or "unknown")
            interval = thr.get("cost_interval") or [None, None]
            cells.append({"source": f"job {job_id}", "job_id": job_id,
                          "measured_at": _when(job["finished_at"] or job["created_at"]), "kind": "train",
                          "workload": job["workload"], "op": "", "dtype": "", "config_index": i,
                          "config": str(repro.get("name") or "")[:64], "config_env": {},
                          **_stack(env, int(thr.get("world_size") or job["world_size"]), library),
                          "identical": int(repro.get("identical_to_first") or 0),
                          "comparable": int(repro.get("comparable") or 0), "runs": int(repro.get("repeats") or 0),
                          "cost": thr.get("cost"), "cost_lo": interval[0], "cost_hi": interval[1],
                          "first_divergent_step": repro.get("first_divergent_step"), "largest_bytes": None,
                          "busbw_gbps": None})
    return cells


def upgrade() -> None:
    op.create_table('finding_cells',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('source', sa.String(length=255), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('measured_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('workload', sa.String(length=64), nullable=False),
    sa.Column('op', sa.String(length=32), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('config_index', sa.Integer(), nullable=False),
    sa.Column('config', sa.String(length=64), nullable=False),
    sa.Column('config_env', sa.JSON(), nullable=False),
    sa.Column('stack', sa.String(length=255), nullable=False),
    sa.Column('hardware', sa.String(length=128), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=False),
    sa.Column('driver', sa.String(length=64), nullable=True),
    sa.Column('runtime', sa.String(length=32), nullable=True),
    sa.Column('torch', sa.String(length=64), nullable=True),
    sa.Column('library', sa.String(length=64), nullable=False),
    sa.Column('identical', sa.Integer(), nullable=False),
    sa.Column('comparable', sa.Integer(), nullable=False),
    sa.Column('runs', sa.Integer(), nullable=False),
    sa.Column('cost', sa.Float(), nullable=True),
    sa.Column('cost_lo', sa.Float(), nullable=True),
    sa.Column('cost_hi', sa.Float(), nullable=True),
    sa.Column('first_divergent_step', sa.Integer(), nullable=True),
    sa.Column('largest_bytes', sa.BigInteger(), nullable=True),
    sa.Column('busbw_gbps', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_finding_cells_job_id_jobs'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_finding_cells')),
    sa.UniqueConstraint('source', 'config_index', 'op', 'dtype', name=op.f('uq_finding_cells_source'))
    )
    with op.batch_alter_table('finding_cells', schema=None) as batch_op:
        batch_op.create_index('ix_finding_cells_history', ['config', 'stack', 'measured_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_finding_cells_job_id'), ['job_id'], unique=False)
        batch_op.create_index('ix_finding_cells_matrix', ['kind', 'workload', 'op', 'dtype', 'config', 'stack',
                                                          'measured_at'], unique=False, postgresql_include=[
            'identical', 'comparable', 'first_divergent_step', 'job_id', 'busbw_gbps'])
        batch_op.create_index('ix_finding_cells_scope', ['kind', 'workload', 'op', 'dtype', 'measured_at'],
                              unique=False)
        batch_op.create_index(batch_op.f('ix_finding_cells_source'), ['source'], unique=False)

    conn = op.get_bind()
    cells = _collective_cells(conn)
    # A job deleted since its findings were recorded keeps them, unlinked.
    job_ids = set(conn.scalars(sa.text("SELECT id FROM jobs")).all())
    for cell in cells:
        if cell["job_id"] not in job_ids:
            cell["job_id"] = None
    cells += _train_cells(conn, existing_jobs={c["job_id"] for c in cells if c["job_id"]})
    if cells:
        op.bulk_insert(CELLS, cells)


def downgrade() -> None:
    with op.batch_alter_table('finding_cells', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_finding_cells_source'))
        batch_op.drop_index('ix_finding_cells_scope')
        batch_op.drop_index('ix_finding_cells_matrix')
        batch_op.drop_index(batch_op.f('ix_finding_cells_job_id'))
        batch_op.drop_index('ix_finding_cells_history')

    op.drop_table('finding_cells')
