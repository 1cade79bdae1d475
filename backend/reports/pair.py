"""Any two runs compared: across jobs, SDK recordings and uploads, CI runs (the logic is detlab.core.compare)."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.models import Run
from detlab.backend.reports import train
from detlab.core import compare, configs, divergence_map, steps


def describe(run: Run) -> dict[str, Any]:
    """What a user picks a run by: its job, workload, name (a recording's) or config, tags, world size."""
    job = run.job
    return {"id": run.id, "job_id": job.id, "kind": job.kind, "workload": job.workload,
            "name": job.params.get("name") or run.config.name, "config": run.config.name, "repeat": run.repeat,
            "tags": list(job.tags or []), "world_size": run.world_size, "status": run.status,
            "steps_done": run.steps_done, "created_at": job.created_at.isoformat(), "submitter": job.submitter}


def build(*, session: Session, run_a: Run, run_b: Run) -> dict[str, Any]:
    """The comparison of run A with run B, as a train job's page shows its pair (per-step series thinned)."""
    a, b = (train.load_run(session=session, run=r, workload=r.job.workload,
                           interval=int(r.job.params.get("fingerprint_interval", 1))) for r in (run_a, run_b))
    train.load_calls(session=session, runs=[a, b])
    differing = compare.differing_steps(a, b) if a.records and b.records else []
    detail = train.detail_steps(differing)
    train.load_detail(session=session, runs=[a, b], steps=detail)  # by the ranks' own numbers, before lining up
    train.load_drift(session=session, runs=[a, b])
    result = compare.compare_runs(a, b).stored()
    if result["verdict"] == "diverged":
        result["divergence_map"] = divergence_map.tensor_step_map(a, compare.line_up(a, b)[0], detail,
                                                                  steps_differing=len(differing))
    result["config_diff"] = configs.diff(run_a.config.body, run_b.config.body)
    result["environment"] = train.environment(session=session, run_a=run_a.id, run_b=run_b.id)
    result["runs"] = [describe(run_a), describe(run_b)]
    result["tensors"] = len(a.tensors)
    # As a stored job result would give it back: NaN/inf as null, tuples as lists; then thinned.
    return steps.downsample(json.loads(json.dumps(result), parse_constant=lambda _: None))
