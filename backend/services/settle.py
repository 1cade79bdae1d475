"""Settling a job: its status from its runs and, once finished, its result, computed once and stored.

Pages read the stored result; an unfinished job's result is built live from what is recorded so far."""

from __future__ import annotations

import json
from typing import Any, Literal

from sqlalchemy.orm import Session

from detlab.backend.models import BISECT, FINISHED, Job
from detlab.backend.reports import bisect as bisect_report
from detlab.backend.reports import collective as collective_report
from detlab.backend.reports import diagnosis as diagnosis_report
from detlab.backend.reports import findings
from detlab.backend.reports import train as train_report
from detlab.backend.services.jobs import roll_up
from detlab.core import steps
from detlab.core.diagnosis import DIAGNOSIS_KINDS

ReportKind = Literal["train", "collective", "bisect", "diagnosis"]
REPORTS = {"train": train_report, "collective": collective_report, "bisect": bisect_report,
           "diagnosis": diagnosis_report}


def report_kind(job: Job) -> ReportKind:
    """Which report a job's result is: collective (collective and sweep-over-collective jobs), bisect, diagnosis
    (batch-invariance and op-audit jobs), or train (train and sweep-over-train jobs, SDK recordings)."""
    if job.workload == "collective":
        return "collective"
    if job.kind == BISECT:
        return "bisect"
    return "diagnosis" if job.kind in DIAGNOSIS_KINDS else "train"


def _build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The job's result from its records as they are now; None before anything is recorded."""
    report = REPORTS[report_kind(job)]
    result = report.build(session=session, job=job)
    if result is None:
        return None
    # As the JSON column will give it back: tuples as lists, and NaN/inf (a loss that blew up, an
    # error against a NaN reference) as null, which PostgreSQL's json and HTTP responses can carry.
    stored: dict[str, Any] = json.loads(json.dumps(result), parse_constant=lambda _: None)
    # A train comparison keeps its per-step series thinned (100k steps would be megabytes on every read);
    # a step window in full is computed from the rows on demand (reports.train.window).
    return stored if report is not train_report else steps.downsample(stored)


def list_verdict(result: dict[str, Any] | None) -> str | None:
    """A result in one word, for the jobs list: a train pair's verdict; else, for a single train config
    or a collective/sweep job, reproducible or not-reproducible (repeats identical to the first; every
    cell one digest); None when nothing was compared."""
    if not result:
        return None
    if result.get("kind") in DIAGNOSIS_KINDS:
        return diagnosis_report.verdict(result)
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


def _store(*, session: Session, job: Job) -> dict[str, Any]:
    job.result = _build(session=session, job=job) or {}  # {}: finished with nothing recorded
    job.verdict = list_verdict(job.result)
    return job.result


def settle(*, session: Session, job: Job) -> None:
    """Roll the job's status up from its runs; once finished, compute and store its result (and keep its
    measurements in the team history: a collective job's cells, a train job's configs)."""
    roll_up(session=session, job=job)
    if job.status not in FINISHED:
        if job.result is not None:
            job.result = job.verdict = None
        return
    if job.result is None:
        result = _store(session=session, job=job)
        if result and report_kind(job) != "bisect":  # a replay of one step measures no config
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
