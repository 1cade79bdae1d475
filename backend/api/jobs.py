"""Jobs: submit, list, read, compare."""

from __future__ import annotations

import zlib
from collections import OrderedDict
from typing import Any

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import PlainTextResponse
from sqlalchemy import select

from detlab.backend.api.deps import CurrentUser, SessionDep, SettingsDep
from detlab.backend.figures import collective as collective_figures
from detlab.backend.figures import train as train_figures
from detlab.backend.models import FINISHED, CommLog, Run, utcnow
from detlab.backend.reports import collective as collective_report
from detlab.backend.reports import train as train_report
from detlab.backend.schemas import JobCreate, JobRead, JobsPage
from detlab.backend.services import jobs
from detlab.backend.services.dispatch import dispatch
from detlab.core import commlog

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


@router.post("", status_code=201, response_model=JobRead)
def submit_job(data: JobCreate, session: SessionDep, settings: SettingsDep, user: CurrentUser) -> dict[str, Any]:
    try:
        job = jobs.create_job(session=session, data=data, settings=settings, submitter=user)
    except jobs.InvalidJob as exc:
        raise HTTPException(422, str(exc)) from exc
    runs = session.scalars(select(Run).where(Run.job_id == job.id).order_by(Run.id)).all()
    for run in runs:
        run.dispatched_at = utcnow()
    session.commit()
    # Sent only after the commit; a send that fails leaves runs the reconciler will dispatch.
    for run in runs:
        dispatch(run.id, job.queue)
    session.refresh(job)
    return jobs.read_job(session=session, job=job)


@router.get("", response_model=JobsPage)
def list_jobs(session: SessionDep, limit: int = Query(20, ge=1, le=200), offset: int = Query(0, ge=0)) -> dict:
    items, total = jobs.list_jobs(session=session, limit=limit, offset=offset)
    out = []
    for job in items:
        names = [c.name for c in jobs.job_configs(session=session, job=job)]
        out.append({"id": job.id, "kind": job.kind, "workload": job.workload, "status": job.status,
                    "created_at": job.created_at.isoformat(), "world_size": job.world_size, "steps": job.steps,
                    "repeats": job.repeats, "config_names": names, "verdict": job.params.get("verdict")})
    return {"items": out, "total": total}


def _job_or_404(session: SessionDep, job_id: int):  # type: ignore[no-untyped-def]
    job = jobs.load_job(session=session, job_id=job_id)
    if job is None:
        raise HTTPException(404, f"no job {job_id}")
    return job


@router.get("/{job_id}", response_model=JobRead)
def read_job(job_id: int, session: SessionDep) -> dict[str, Any]:
    return jobs.read_job(session=session, job=_job_or_404(session, job_id))


# A finished job's records no longer change (ingest refuses finished runs), so its comparison is
# built once per API process, not once per request: a job page asks for it three times.
_FINISHED_COMPARISONS: OrderedDict[tuple[str, int], dict[str, Any]] = OrderedDict()
_CACHE_SIZE = 32


def _comparison(job_id: int, session: SessionDep) -> dict[str, Any]:
    key = (str(session.get_bind().engine.url), job_id)
    if key in _FINISHED_COMPARISONS:
        _FINISHED_COMPARISONS.move_to_end(key)
        return _FINISHED_COMPARISONS[key]
    job = _job_or_404(session, job_id)
    result = train_report.build(session=session, job=job)
    if result is None:
        raise HTTPException(404, f"job {job_id} has no recorded steps yet")
    if job.status in FINISHED:
        _FINISHED_COMPARISONS[key] = result
        if len(_FINISHED_COMPARISONS) > _CACHE_SIZE:
            _FINISHED_COMPARISONS.popitem(last=False)
    return result


@router.get("/{job_id}/comparison")
def read_comparison(job_id: int, session: SessionDep) -> dict[str, Any]:
    return _comparison(job_id, session)


@router.get("/{job_id}/comparison/figure")
def read_comparison_figure(job_id: int, session: SessionDep) -> dict[str, Any]:
    return train_figures.comparison_figure(_comparison(job_id, session))


@router.get("/{job_id}/throughput/figure")
def read_throughput_figure(job_id: int, session: SessionDep) -> dict[str, Any]:
    return train_figures.throughput_figure(_comparison(job_id, session))


def _collective(job_id: int, session: SessionDep) -> dict[str, Any]:
    result = collective_report.build(session=session, job=_job_or_404(session, job_id))
    if result is None:
        raise HTTPException(404, f"job {job_id} has no collective trials yet")
    return result


@router.get("/{job_id}/collective")
def read_collective(job_id: int, session: SessionDep) -> dict[str, Any]:
    return _collective(job_id, session)


@router.get("/{job_id}/collective/figures")
def read_collective_figures(job_id: int, session: SessionDep) -> dict[str, Any]:
    return collective_figures.collective_figures(_collective(job_id, session))


runs_router = APIRouter(prefix="/api/v1/runs", tags=["runs"])


@runs_router.get("/{run_a}/logdiff/{run_b}")
def log_diff(run_a: int, run_b: int, session: SessionDep) -> dict[str, Any]:
    """The NCCL/RCCL log facts that differ between two runs (their lowest ranks' logs)."""
    facts = []
    for run_id in (run_a, run_b):
        log = session.scalars(select(CommLog).where(CommLog.run_id == run_id).order_by(CommLog.rank)).first()
        if log is None:
            raise HTTPException(404, f"run {run_id} has no NCCL/RCCL log")
        facts.append(log.parsed)
    return {"a": run_a, "b": run_b, "diff": commlog.diff_facts(facts[0], facts[1])}


@runs_router.get("/{run_id}/commlog/{rank}", response_class=PlainTextResponse)
def read_comm_log(run_id: int, rank: int, session: SessionDep) -> str:
    """One rank's NCCL/RCCL debug log as uploaded (cut to head and tail if it was over the cap)."""
    log = session.scalars(select(CommLog).where(CommLog.run_id == run_id, CommLog.rank == rank)).first()
    if log is None:
        raise HTTPException(404, f"run {run_id} has no NCCL/RCCL log for rank {rank}")
    return zlib.decompress(log.raw).decode("utf-8", errors="replace")
