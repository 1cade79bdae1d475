"""Jobs: submit, list, read, compare."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import select

from backend import charts, comparisons, jobs
from backend.api.deps import CurrentUser, SessionDep, SettingsDep
from backend.models import Run, utcnow
from backend.queue import dispatch
from backend.schemas import JobCreate, JobRead, JobsPage

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


def _comparison(job_id: int, session: SessionDep) -> dict[str, Any]:
    job = _job_or_404(session, job_id)
    result = comparisons.build(session=session, job=job)
    if result is None:
        raise HTTPException(404, f"job {job_id} has no recorded steps yet")
    return result


@router.get("/{job_id}/comparison")
def read_comparison(job_id: int, session: SessionDep) -> dict[str, Any]:
    return _comparison(job_id, session)


@router.get("/{job_id}/comparison/figure")
def read_comparison_figure(job_id: int, session: SessionDep) -> dict[str, Any]:
    return charts.comparison_figure(_comparison(job_id, session))


@router.get("/{job_id}/throughput/figure")
def read_throughput_figure(job_id: int, session: SessionDep) -> dict[str, Any]:
    return charts.throughput_figure(_comparison(job_id, session))
