"""Cancelling a job or one run: unfinished runs become `cancelled` at once, so a queued run is never
claimed, and a running run's worker kills its ranks when its next heartbeat (or its next batch of
records) is answered. What the runs recorded stays; the job settles and its result is computed from it."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.db import locking
from detlab.backend.models import CANCELLED, FINISHED, RUNNING, Job, Run, utcnow
from detlab.backend.services.settle import settle


class NotCancellable(Exception):
    """The job or run already finished otherwise; the message says how."""


def _cancel(run: Run, user: str | None) -> None:
    when = "while running" if run.status == RUNNING else "before it started"
    run.error = f"cancelled{f' by {user}' if user else ''} {when}; what it recorded is kept"
    run.status, run.finished_at = CANCELLED, utcnow()


def cancel_job(*, session: Session, job: Job, user: str | None) -> Job:
    """Cancel every unfinished run of the job. Cancelling a cancelled job again changes nothing."""
    query = select(Run).where(Run.job_id == job.id).order_by(Run.id).execution_options(populate_existing=True)
    # locked as a claim locks its run: a claim racing a cancel waits, then sees `cancelled`
    runs = list(session.scalars(query.with_for_update() if locking(session) else query))
    unfinished = [run for run in runs if run.status not in FINISHED]
    for run in unfinished:
        _cancel(run, user)
    settle(session=session, job=job)
    if not unfinished and job.status != CANCELLED:
        raise NotCancellable(f"job {job.id} already {job.status}; only a queued or running job can be cancelled")
    return job


def cancel_run(*, session: Session, run: Run, user: str | None) -> Run:
    """Cancel one run (its job goes on with the others). Cancelling a cancelled run again changes nothing."""
    session.refresh(run, with_for_update=locking(session) or None)
    if run.status == CANCELLED:
        return run
    if run.status in FINISHED:
        raise NotCancellable(f"run {run.id} already {run.status}; only a queued or running run can be cancelled")
    _cancel(run, user)
    settle(session=session, job=run.job)
    return run
