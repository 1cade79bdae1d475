"""Settling a job: its status from its runs and, once finished, its result."""

from __future__ import annotations

from sqlalchemy.orm import Session

from detlab.backend.models import FINISHED, Job
from detlab.backend.reports import findings
from detlab.backend.reports import train as train_report
from detlab.backend.services.jobs import roll_up


def settle(*, session: Session, job: Job) -> None:
    """Roll the job's status up from its runs; once finished, keep its verdict for listings."""
    roll_up(session=session, job=job)
    if job.status in FINISHED and job.workload == "collective":
        findings.record_job(session=session, job=job)
    elif job.status in FINISHED:
        result = train_report.build(session=session, job=job)
        job.params = {**job.params, "verdict": result["verdict"] if result else None}
