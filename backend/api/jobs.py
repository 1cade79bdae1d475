"""Jobs: submit, list, read, cancel; their results and figures; runs' NCCL/RCCL logs; cancelling a run."""

from __future__ import annotations

import zlib
from collections.abc import Callable, Hashable
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query, Request, Response
from fastapi.responses import PlainTextResponse
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from detlab.backend import static
from detlab.backend.api.deps import (
    CurrentUser,
    JobId,
    RankPath,
    RunId,
    SessionDep,
    SettingsDep,
    Submitter,
    may_change,
)
from detlab.backend.api.responses import json_response
from detlab.backend.figures import collective as collective_figures
from detlab.backend.figures import drift as drift_figures
from detlab.backend.figures import train as train_figures
from detlab.backend.kinds.base import RESULT_PATHS, ReportName
from detlab.backend.kinds.registry import KINDS, JobCreate
from detlab.backend.models import BISECT, FINISHED, CommLog, Job, RankEnv, Run, utcnow
from detlab.backend.reports import train as train_report
from detlab.backend.schemas import (
    BisectCreate,
    CollectiveFigures,
    JobRead,
    JobsPage,
    JobsQuery,
    JobSummary,
    JobUpdate,
    LogDiff,
    PlotlyFigure,
    RankEnvRead,
    RunRead,
    WhyReport,
)
from detlab.backend.services import bisect, cache, cancel, idempotency, job_list, jobs, why
from detlab.backend.services.dispatch import send, undispatch
from detlab.backend.services.settle import job_result, report_kind
from detlab.backend.services.workers import queue_state
from detlab.core import commlog
from detlab.core.results import BisectResult, CollectiveResult, FixResult, ResumeResult, TrainResult
from detlab.core.wire import INT32

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
    return _send(session, settings, job, response)


def _send(session: SessionDep, settings: SettingsDep, job: Job, response: Response) -> JobRead:
    """Commit a new job and send its runs."""
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
def list_jobs(session: SessionDep, query: Annotated[JobsQuery, Query()]) -> Response:
    """Jobs matching the filters, sorted (newest first by default), a page at a time, with the total."""
    if unknown := [k for k in query.kind if k not in KINDS]:
        raise HTTPException(422, f"kind: unknown {unknown}; known: {list(KINDS)}")
    items, total = job_list.list_jobs(session=session, query=query)
    return json_response(JobsPage(items=[JobSummary.model_validate(item) for item in items], total=total,
                                  limit=query.limit, offset=query.offset))


def _job_or_404(session: SessionDep, job_id: int) -> Job:
    job = jobs.load_job(session=session, job_id=job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


def _read(session: SessionDep, settings: SettingsDep, job: Job) -> JobRead:
    """The job as read, with its queue's live workers (an unfinished job says why it may wait)."""
    state = queue_state(session=session, queue=job.queue, within_s=settings.run_stale_after_s)
    note = None if job.status in FINISHED else state.note()
    path = f"/api/v1/jobs/{job.id}/{RESULT_PATHS[KINDS[job.kind].report(job)]}"
    return JobRead.model_validate(job).model_copy(update={"live_workers": state.live, "queue_note": note,
                                                          "result_path": path})


@router.get("/{job_id}", response_model=JobRead)
def read_job(job_id: JobId, session: SessionDep, settings: SettingsDep) -> Response:
    """The job, its configs and runs, progress and live workers: what its page polls."""
    return json_response(_read(session, settings, _job_or_404(session, job_id)))


@router.patch("/{job_id}", response_model=JobRead)
def update_job(job_id: JobId, data: JobUpdate, session: SessionDep, settings: SettingsDep,
               found: Submitter) -> JobRead:
    """Change what can change after submission: the job's tags (replaced by the list sent). The owner's or an
    admin's to change."""
    job = _job_or_404(session, job_id)
    may_change(job.id, job.submitter, found, settings, "edit")
    jobs.set_tags(session=session, job=job, tags=data.tags)
    session.commit()
    return _read(session, settings, job)


@router.get("/{job_id}/spec", response_model=JobCreate, responses={409: {"description": "a bisect or a recording"}})
def read_spec(job_id: JobId, session: SessionDep) -> JobCreate:
    """The body that submits this job again (POST /jobs), configs in full: what the page's Rerun fills in."""
    job = _job_or_404(session, job_id)
    try:
        return JobCreate.model_validate(jobs.spec_of(job))
    except jobs.InvalidJob as exc:  # a kind not submitted through POST /jobs
        raise HTTPException(409, str(exc)) from exc


@router.post("/{job_id}/rerun", status_code=201, response_model=JobRead, responses={
    202: {"model": JobRead, "description": "stored; the broker is down, so its runs are sent later"},
    409: {"description": "a recording: the server cannot run a user's own loop"}})
def rerun_job(job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser, found: Submitter,
              response: Response) -> JobRead:
    """Submit the job again, as it was submitted (a new job with new runs; the old one is kept); a bisect job is
    a new bisect of the same pair and step. The owner or an admin reruns a job; the new job is theirs."""
    old = _job_or_404(session, job_id)
    may_change(old.id, old.submitter, found, settings, "rerun")
    try:
        if old.kind == BISECT:
            job = bisect.again(session=session, job=old, settings=settings, submitter=user)
        else:
            try:
                spec = JobCreate.model_validate(jobs.spec_of(old))
            except jobs.InvalidJob as exc:  # a kind not submitted through POST /jobs (a recording)
                raise HTTPException(409, str(exc)) from exc
            job = jobs.create_job(session=session, data=spec, settings=settings, submitter=user)
    except jobs.InvalidJob as exc:  # the server's limits or workers changed since
        raise HTTPException(422, str(exc)) from exc
    return _send(session, settings, job, response)


@router.post("/{job_id}/bisect", status_code=201, response_model=JobRead, responses={
    202: {"model": JobRead, "description": "stored; the broker is down, so its runs are sent later"},
    422: {"description": "the job cannot be bisected (not a finished train job of a built-in workload, or its "
                         "pair did not diverge): the message says why"}})
def bisect_job(job_id: JobId, data: BisectCreate, session: SessionDep, settings: SettingsDep, user: CurrentUser,
               response: Response) -> JobRead:
    """Replay a diverged train pair up to its first divergent step and probe that step module by module: a new
    `bisect` job with two runs (GET /jobs/{new}/bisect for the first divergent module)."""
    try:
        job = bisect.create_bisect(session=session, job=_job_or_404(session, job_id), data=data, settings=settings,
                                   submitter=user)
    except jobs.InvalidJob as exc:
        raise HTTPException(422, str(exc)) from exc
    return _send(session, settings, job, response)


@router.get("/{job_id}/bisect", response_model=BisectResult)
def read_bisect(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    """A bisect job's replay: its verdict, the first difference, the first divergent module and the module tree."""
    return _result(job_id, session, kind="bisect")


@router.post("/{job_id}/cancel", response_model=JobRead, responses={409: {"description": "the job already finished"}})
def cancel_job(job_id: JobId, session: SessionDep, settings: SettingsDep, user: CurrentUser,
               found: Submitter) -> JobRead:
    """Cancel the job's queued and running runs; their workers kill the ranks within seconds and what the
    runs recorded is kept. Cancelling a cancelled job again is a no-op; a finished job is a 409. The owner or an
    admin cancels a job."""
    job = _job_or_404(session, job_id)
    may_change(job.id, job.submitter, found, settings, "cancel")
    try:
        cancel.cancel_job(session=session, job=job, user=user)
    except cancel.NotCancellable as exc:
        raise HTTPException(409, str(exc)) from exc
    session.commit()
    return _read(session, settings, job)


def _result(job_id: int, session: SessionDep, *, kind: ReportName) -> dict[str, Any]:
    """The job's result (stored once it finished, live before), if the job's report is of this kind."""
    job = _job_or_404(session, job_id)
    what = {"collective": "collective trials", "train": "recorded steps", "bisect": "probe steps",
            "diagnosis": "diagnosis results", "fix": "trials", "resume": "resumed runs"}[kind]  # what each report reads
    if report_kind(job) != kind:
        raise HTTPException(404, f"job {job_id} is a {job.kind} job: it has no {what}")
    result = job_result(session=session, job=job)
    session.commit()  # a job finished before results were stored has just had its result stored
    if result is None:
        raise HTTPException(404, f"job {job_id} has no {what} yet")
    return result


StepQuery = Annotated[int | None, Query(ge=0, le=INT32, description="a step window, inclusive: its per-step rows "
                                                                   "and loss in full (thinned past 2000 steps)")]


def _comparison(job_id: int, session: SessionDep, from_step: int | None, to_step: int | None) -> dict[str, Any]:
    """The stored comparison (per-step series thinned), or a step window of it in full from the rows."""
    result = _result(job_id, session, kind="train")
    if from_step is None and to_step is None:
        return result
    lo, hi = from_step or 0, INT32 if to_step is None else to_step
    if hi < lo:
        raise HTTPException(422, f"to_step ({hi}) is before from_step ({lo})")
    job = _job_or_404(session, job_id)
    return train_report.window(session=session, job=job, result=result, from_step=lo, to_step=hi)


def _cached(request: Request, session: SessionDep, job_id: int, what: Hashable, build: Callable[[], bytes]) -> Response:
    """A JSON response of a job's result: a finished job's is built once per process (services.cache), sent
    gzipped when the client takes it, and revalidated by ETag (304 without the body)."""
    key = cache.finished_key(session=session, job_id=job_id)
    return static.respond(request, cache.get_or_build(key and (key, what), build), cache_control=static.REVALIDATE)


# A single-config comparison has no two-run keys: absent, as the report leaves them, not null.
@router.get("/{job_id}/comparison", response_model=TrainResult, response_model_exclude_unset=True)
def read_comparison(job_id: JobId, session: SessionDep, request: Request, from_step: StepQuery = None,
                    to_step: StepQuery = None) -> Response:
    """The comparison; per-step rows and loss are thinned to 2000 points (`downsampled` says how) unless
    a window (from_step, to_step) is asked for."""
    return _cached(request, session, job_id, ("comparison", from_step, to_step), lambda: TrainResult.model_validate(
        _comparison(job_id, session, from_step, to_step)).model_dump_json(exclude_unset=True).encode())


@router.get("/{job_id}/comparison/figure", response_model=PlotlyFigure)
def read_comparison_figure(job_id: JobId, session: SessionDep, request: Request, from_step: StepQuery = None,
                           to_step: StepQuery = None) -> Response:
    return _cached(request, session, job_id, ("figure", from_step, to_step), lambda: PlotlyFigure.model_validate(
        train_figures.comparison_figure(_comparison(job_id, session, from_step, to_step))).model_dump_json().encode())


@router.get("/{job_id}/comparison/drift/figure", response_model=PlotlyFigure)
def read_drift_figure(job_id: JobId, session: SessionDep, request: Request, from_step: StepQuery = None,
                      to_step: StepQuery = None) -> Response:
    """‖A−B‖/‖A‖ per sampled step (estimated from the recorded sketches) beside |Δloss|, with the rounding level."""
    return _cached(request, session, job_id, ("drift figure", from_step, to_step), lambda: PlotlyFigure.model_validate(
        drift_figures.drift_figure(_comparison(job_id, session, from_step, to_step))).model_dump_json().encode())


@router.get("/{job_id}/comparison/divergence/figure", response_model=PlotlyFigure)
def read_divergence_figure(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    """Tensor × step heatmap of where the compared runs differ, the differing ranks on hover."""
    return train_figures.divergence_figure(_result(job_id, session, kind="train"))


@router.get("/{job_id}/throughput/figure", response_model=PlotlyFigure)
def read_throughput_figure(job_id: JobId, session: SessionDep, request: Request) -> Response:
    return _cached(request, session, job_id, "throughput figure", lambda: PlotlyFigure.model_validate(
        train_figures.throughput_figure(_result(job_id, session, kind="train"))).model_dump_json().encode())


@router.get("/{job_id}/fix", response_model=FixResult)
def read_fix(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    """A fix search: its verdict (null while it runs), the prescription, each kept knob's evidence, every trial."""
    return _result(job_id, session, kind="fix")


@router.get("/{job_id}/resume", response_model=ResumeResult, response_model_exclude_unset=True)
def read_resume(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    """A resume check: its verdict (exact, lost; null until both runs recorded), the first divergent step and
    component, and whether the restored state matched the saved step."""
    return _result(job_id, session, kind="resume")


@router.get("/{job_id}/collective", response_model=CollectiveResult)
def read_collective(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    return _result(job_id, session, kind="collective")


@router.get("/{job_id}/collective/figures", response_model=CollectiveFigures)
def read_collective_figures(job_id: JobId, session: SessionDep) -> dict[str, dict[str, Any]]:
    return collective_figures.collective_figures(_result(job_id, session, kind="collective"))


PairRun = Annotated[int | None, Query(ge=1, le=INT32, description="a run of the job (give a and b, or neither)")]


@router.get("/{job_id}/why", response_model=WhyReport)
def read_why(job_id: JobId, session: SessionDep, a: PairRun = None, b: PairRun = None) -> dict[str, Any]:
    """Why two runs of the job may part: a checklist in the order engineers debug it (logs, env parity,
    nondeterministic ops, stack and topology, batch invariance), each item with its evidence. By default the
    pair the job's verdict is about."""
    try:
        report = why.for_job(session=session, job=_job_or_404(session, job_id), a=a, b=b)
    except why.BadPair as exc:
        raise HTTPException(422, str(exc)) from exc
    except why.NoPair as exc:
        raise HTTPException(404, str(exc)) from exc
    session.commit()  # an audit job finished before results were stored has had its result stored
    return report


runs_router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@runs_router.get("/{run_id}/envs", response_model=list[RankEnvRead])
def read_rank_envs(run_id: RunId, session: SessionDep) -> list[RankEnvRead]:
    """Each rank's recorded stack, environment variables and torch flags in effect (the why-report's evidence
    for env parity)."""
    if session.get(Run, run_id) is None:
        raise HTTPException(404, f"no run {run_id}")
    envs = session.scalars(select(RankEnv).where(RankEnv.run_id == run_id).order_by(RankEnv.rank))
    return [RankEnvRead.model_validate(e) for e in envs]


@runs_router.post("/{run_id}/cancel", response_model=RunRead,
                  responses={409: {"description": "the run already finished"}})
def cancel_run(run_id: RunId, session: SessionDep, settings: SettingsDep, user: CurrentUser,
               found: Submitter) -> RunRead:
    """Cancel one queued or running run; the job goes on with its other runs. The job's owner or an admin cancels
    it."""
    run = session.get(Run, run_id)
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    may_change(run.job_id, run.job.submitter, found, settings, "cancel")
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
