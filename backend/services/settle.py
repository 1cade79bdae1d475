"""Settling a job: its status from its runs and, once finished, its result, computed once and stored.

Pages read the stored result; an unfinished job's result is built live from what is recorded so far."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.kinds.base import ReportName
from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import FINISHED, Job
from detlab.backend.reports import findings
from detlab.backend.services.jobs import roll_up
from detlab.core import steps


def report_kind(job: Job) -> ReportName:
    """Which report a job's result is (its kind says: detlab.backend.kinds)."""
    return KINDS[job.kind].report(job)


def _build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The job's result from its records as they are now; None before anything is recorded."""
    result = KINDS[job.kind].build(session=session, job=job)
    if result is None:
        return None
    # As the JSON column will give it back: tuples as lists, and NaN/inf (a loss that blew up, an
    # error against a NaN reference) as null, which PostgreSQL's json and HTTP responses can carry.
    stored: dict[str, Any] = json.loads(json.dumps(result), parse_constant=lambda _: None)
    # A train comparison keeps its per-step series thinned (100k steps would be megabytes on every read);
    # a step window in full is computed from the rows on demand (reports.train.window).
    return stored if report_kind(job) != "train" else steps.downsample(stored)


def list_verdict(job: Job, result: dict[str, Any] | None) -> str | None:
    """A result in one word, for the jobs list (its kind says how); None when nothing was compared."""
    return KINDS[job.kind].list_verdict(job, result) if result else None


def _store(*, session: Session, job: Job) -> dict[str, Any]:
    job.result = _build(session=session, job=job) or {}  # {}: finished with nothing recorded
    job.verdict = list_verdict(job, job.result)
    return job.result


def settle(*, session: Session, job: Job) -> None:
    """Roll the job's status up from its runs; once finished, compute and store its result (and keep its
    measurements in the team history: a collective job's cells, a train job's configs)."""
    roll_up(session=session, job=job)
    if job.status in FINISHED and job.result is None and KINDS[job.kind].advance(session=session, job=job):
        roll_up(session=session, job=job)  # the kind added its next round: the job runs on
    if job.status not in FINISHED:
        if job.result is not None:
            job.result = job.verdict = None
        return
    if job.result is None:
        result = _store(session=session, job=job)
        if result and KINDS[job.kind].records_findings:
            findings.record_job(session=session, job=job, result=result)


def job_result(*, session: Session, job: Job) -> dict[str, Any] | None:
    """A finished job's stored result, or a live partial one while it runs; None while nothing is recorded.

    A job finished before results were stored gets its result computed and stored here, once (the
    caller commits); its findings were recorded when it settled."""
    if job.status not in FINISHED:
        return _build(session=session, job=job)
    if job.result is None:
        _store(session=session, job=job)
    elif report_kind(job) == "train" and steps.is_oversize(job.result):
        job.result = steps.downsample(job.result)  # stored before results were thinned: thinned once
    return job.result or None
