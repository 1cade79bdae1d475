"""Jobs: submit, list, read, cancel; their results and figures; runs' NCCL/RCCL logs; cancelling a run."""

from __future__ import annotations

import zlib
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from detlab.backend.api.deps import CurrentUser, JobId, Limit, Offset, RankPath, RunId, SessionDep, SettingsDep
from detlab.backend.figures import collective as collective_figures
from detlab.backend.figures import train as train_figures
from detlab.backend.models import FINISHED, CommLog, Job, Run, utcnow
from detlab.backend.schemas import (
    CollectiveFigures,
    CollectiveResult,
    JobCreate,
    JobRead,
    JobsPage,
    JobSummary,
    LogDiff,
    PlotlyFigure,
    RunRead,
    TrainResult,
)
from detlab.backend.services import cancel, idempotency, jobs
from detlab.backend.services.dispatch import send, undispatch
from detlab.backend.services.settle import is_collective, job_result
from detlab.backend.services.workers import queue_state
from detlab.core import commlog

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


IdempotencyKeyHeader = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=idempotency.MAX_KEY_LENGTH, pattern=r"^[!-~]+$",
    description="any printable ASCII string: a retry with the same key and body within a day returns the "
                "first job (200) and creates nothing; the same key with another body is a 422")]


@router.post("", status_code=201, response_model=JobRead, responses={
    200: {"model": JobRead, "description": "the job its Idempotency-Key was first sent with; nothing created"},
    202: {"model": JobRead, "description": "stored; the broker is down, so its runs are sent by the reconciler "
                                           "once it is back"}})
def submit_job(data: JobCreate, session: SessionDep, settings: SettingsDep, user: CurrentUser, response: Response,
               idempotency_key: IdempotencyKeyHeader = None) -> JobRead:
    digest = idempotency.body_hash(data=data, submitter=user)
    if idempotency_key and (first := _first_job(session, idempotency_key, digest)):
        response.status_code = 200
        return _read(session, settings, first)
    try:
        job = jobs.create_job(session=session, data=data, settings=settings, submitter=user)
        if idempotency_key:
            idempotency.remember(session=session, key=idempotency_key, digest=digest, job=job)
    except jobs.InvalidJob as exc:
        raise HTTPException(422, str(exc)) from exc
    except IntegrityError:
        # A twin request with the same key stored its job first: answer with that one.
        session.rollback()
        if idempotency_key and (first := _first_job(session, idempotency_key, digest)):
            response.status_code = 200
            return _read(session, settings, first)
        raise
    runs = session.scalars(select(Run).where(Run.job_id == job.id).order_by(Run.id)).all()
    for run in runs:
        run.dispatched_at = utcnow()  # so the reconciler does not send them too while we do
    session.commit()
    # Sent only after the commit. With the broker down the job is kept and the answer is 202: a client
    # retrying a 500 would submit it twice. Runs not sent are marked so; the reconciler sends them.
    unsent = send([(run.id, job.queue) for run in runs])
    if unsent:
        undispatch(session=session, run_ids=unsent)
        session.commit()
        response.status_code = 202
    session.refresh(job)
    return _read(session, settings, job)


def _first_job(session: SessionDep, key: str, digest: str) -> Job | None:
    try:
        return idempotency.find_job(session=session, key=key, digest=digest)
    except idempotency.KeyReused as exc:
        raise HTTPException(422, str(exc)) from exc


@router.get("", response_model=JobsPage)
def list_jobs(session: SessionDep, limit: Limit = 20, offset: Offset = 0) -> JobsPage:
    items, total = jobs.list_jobs(session=session, limit=limit, offset=offset)
    return JobsPage(items=[JobSummary.model_validate(job) for job in items], total=total)


def _job_or_404(session: SessionDep, job_id: int) -> Job:
    job = jobs.load_job(session=session, job_id=job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


def _read(session: SessionDep, settings: SettingsDep, job: Job) -> JobRead:
    """The job as read, with its queue's live workers (an unfinished job says why it may wait)."""
    state = queue_state(session=session, queue=job.queue, within_s=settings.run_stale_after_s)
    note = None if job.status in FINISHED else state.note()
    return JobRead.model_validate(job).model_copy(update={"live_workers": state.live, "queue_note": note})


@router.get("/{job_id}", response_model=JobRead)
def read_job(job_id: JobId, session: SessionDep, settings: SettingsDep) -> JobRead:
    return _read(session, settings, _job_or_404(session, job_id))


@router.post("/{job_id}/cancel", response_model=JobRead, responses={409: {"description": "the job already finished"}})
def cancel_job(job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser) -> JobRead:
    """Cancel the job's queued and running runs; their workers kill the ranks within seconds and what the
    runs recorded is kept. Cancelling a cancelled job again is a no-op; a finished job is a 409."""
    job = _job_or_404(session, job_id)
    try:
        cancel.cancel_job(session=session, job=job, user=user)
    except cancel.NotCancellable as exc:
        raise HTTPException(409, str(exc)) from exc
    session.commit()
    return _read(session, settings, job)


def _result(job_id: int, session: SessionDep, *, collective: bool) -> dict[str, Any]:
    """The job's result (stored once it finished, live before), if the job is of this kind."""
    job = _job_or_404(session, job_id)
    result = job_result(session=session, job=job) if is_collective(job) == collective else None
    session.commit()  # a job finished before results were stored has just had its result stored
    if result is None:
        raise HTTPException(404, f"job {job_id} has no {'collective trials' if collective else 'recorded steps'} yet")
    return result


# A single-config comparison has no two-run keys: absent, as the report leaves them, not null.
@router.get("/{job_id}/comparison", response_model=TrainResult, response_model_exclude_unset=True)
def read_comparison(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    return _result(job_id, session, collective=False)


@router.get("/{job_id}/comparison/figure", response_model=PlotlyFigure)
def read_comparison_figure(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    return train_figures.comparison_figure(_result(job_id, session, collective=False))


@router.get("/{job_id}/throughput/figure", response_model=PlotlyFigure)
def read_throughput_figure(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    return train_figures.throughput_figure(_result(job_id, session, collective=False))


@router.get("/{job_id}/collective", response_model=CollectiveResult)
def read_collective(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    return _result(job_id, session, collective=True)


@router.get("/{job_id}/collective/figures", response_model=CollectiveFigures)
def read_collective_figures(job_id: JobId, session: SessionDep) -> dict[str, dict[str, Any]]:
    return collective_figures.collective_figures(_result(job_id, session, collective=True))


runs_router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@runs_router.post("/{run_id}/cancel", response_model=RunRead,
                  responses={409: {"description": "the run already finished"}})
def cancel_run(run_id: RunId, session: SessionDep, user: CurrentUser) -> RunRead:
    """Cancel one queued or running run; the job goes on with its other runs."""
    run = session.get(Run, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    try:
        cancel.cancel_run(session=session, run=run, user=user)
    except cancel.NotCancellable as exc:
        raise HTTPException(409, str(exc)) from exc
    session.commit()
    return RunRead.model_validate(run)


@runs_router.get("/{run_a}/logdiff/{run_b}", response_model=LogDiff)
def log_diff(run_a: RunId, run_b: RunId, session: SessionDep) -> dict[str, Any]:
    """The NCCL/RCCL log facts that differ between two runs (their lowest ranks' logs)."""
    facts = []
    for run_id in (run_a, run_b):
        log = session.scalars(select(CommLog).where(CommLog.run_id == run_id).order_by(CommLog.rank)).first()
        if log is None:
            raise HTTPException(404, f"run {run_id} has no NCCL/RCCL log")
        facts.append(log.parsed)
    return {"a": run_a, "b": run_b, "diff": commlog.diff_facts(facts[0], facts[1])}


@runs_router.get("/{run_id}/commlog/{rank}", response_model=str, response_class=PlainTextResponse)
def read_comm_log(run_id: RunId, rank: RankPath, session: SessionDep) -> str:
    """One rank's NCCL/RCCL debug log as uploaded (cut to head and tail if it was over the cap)."""
    log = session.scalars(select(CommLog).where(CommLog.run_id == run_id, CommLog.rank == rank)).first()
    if log is None:
        raise HTTPException(404, f"run {run_id} has no NCCL/RCCL log for rank {rank}")
    return zlib.decompress(log.raw).decode("utf-8", errors="replace")
