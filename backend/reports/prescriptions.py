"""The findings' prescriptions: per (stack, workload, world size), what the latest settled `fix` job found — its
verdict, the knobs it prescribes, how reproducible they made the runs and what they cost. The team's answer to
"what do we set on this stack, and what does it cost"."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import Job
from detlab.backend.reports.findings import job_facts, stack_of
from detlab.core.results import FixResult

VERDICTS = ("found", "already", "none")  # the answers: not `incomplete` (stopped at a failed or cancelled run)


def row(*, job: Job, stack: str, world_size: int) -> dict[str, Any]:
    """One stack's prescription from a settled fix job's stored result. `none`: no knobs, and `reproducible` is the
    closest trial's [k, n] (k < n), its cost not a prescription's; `already`: the base as it is, at no cost."""
    result = FixResult.model_validate(job.result)
    found, closest = result.prescription, result.closest
    reproducible = found.reproducible if found else closest.reproducible if closest else None
    return {"stack": stack, "workload": job.workload, "world_size": world_size, "verdict": result.verdict,
            "knobs": list(found.knobs) if found else [], "reproducible": reproducible,
            "cost": found.cost if found else None, "cost_interval": found.cost_interval if found else None,
            "within_noise": found.within_noise if found else None, "job": job.id}


def prescriptions(*, session: Session, workload: str | None = None, since: datetime | None = None,
                  until: datetime | None = None) -> list[dict[str, Any]]:
    """One row per (stack, workload, world size): the latest settled fix job's (by when it finished), in the
    window and of the workload asked for (None: any). The stack is labelled as the matrix labels it, from what the
    base's runs recorded."""
    kinds = [k.name for k in KINDS.values() if k.report_name == "fix"]
    query = select(Job).where(Job.kind.in_(kinds), Job.verdict.in_(VERDICTS), Job.result.is_not(None))
    if workload is not None:
        query = query.where(Job.workload == workload)
    if since is not None:
        query = query.where(Job.finished_at >= since)
    if until is not None:
        query = query.where(Job.finished_at < until)
    latest: dict[tuple[str, str, int], dict[str, Any]] = {}
    for job in session.scalars(query.order_by(Job.finished_at, Job.id)):
        world = int(job.params["fix"]["base"].get("world_size") or job.world_size)
        stack = stack_of(job_facts(session=session, job=job).get(0, {}), world)["stack"]
        latest[(stack, job.workload, world)] = row(job=job, stack=stack, world_size=world)
    return [latest[key] for key in sorted(latest)]
