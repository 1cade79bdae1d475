"""Any two runs: find them (across jobs, recordings and uploads) and compare them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import func, or_, select
from sqlalchemy.orm import selectinload

from detlab.backend.api.deps import Limit, Offset, SessionDep
from detlab.backend.figures import drift as drift_figures
from detlab.backend.figures import train as train_figures
from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import Config, Job, JobTag, Run
from detlab.backend.reports import pair
from detlab.backend.schemas import PairResult, PlotlyFigure, RunsFound, WhyReport
from detlab.backend.services import why
from detlab.core.text import StorableText
from detlab.core.wire import INT32, Tag

router = APIRouter(prefix="/api/v1", tags=["compare"])
RunQuery = Annotated[int, Query(ge=1, le=INT32, description="a run's id")]


def _like(text: str) -> str:
    escaped = text.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


@router.get("/runs", response_model=RunsFound)
def find_runs(session: SessionDep, q: Annotated[StorableText | None, Query(max_length=64)] = None,
              tag: Tag | None = None, since: datetime | None = None, until: datetime | None = None,
              limit: Limit = 50, offset: Offset = 0) -> dict[str, Any]:
    """Training runs (collective runs compare through their job's cells), newest first; `q` searches the
    workload or script, the recording's name and the config."""
    where = [Job.workload != "collective"]
    if q:
        like = _like(q)
        where.append(or_(func.lower(Job.workload).like(like, escape="\\"),
                         func.lower(Config.name).like(like, escape="\\"),
                         func.lower(Job.params["name"].as_string()).like(like, escape="\\")))
    if tag:
        where.append(Job.id.in_(select(JobTag.job_id).where(JobTag.tag == tag)))
    if since:
        where.append(Job.created_at >= since)
    if until:
        where.append(Job.created_at <= until)
    base = select(Run).join(Job, Job.id == Run.job_id).join(Config, Config.id == Run.config_id).where(*where)
    total = session.scalar(select(func.count()).select_from(base.subquery())) or 0
    runs = session.scalars(base.options(selectinload(Run.job), selectinload(Run.config))
                           .order_by(Run.id.desc()).limit(limit).offset(offset)).all()
    return {"items": [pair.describe(r) for r in runs], "total": total, "limit": limit, "offset": offset}


@router.get("/compare", response_model=PairResult, response_model_exclude_unset=True)
def compare_two(a: RunQuery, b: RunQuery, session: SessionDep) -> dict[str, Any]:
    """Run A against run B, whatever jobs they belong to: the verdict, the first divergent step, tensors and
    ranks, what is missing, their configs and stacks side by side, how far they drift apart."""
    run_a, run_b = _training_runs(session, a, b)
    return pair.build(session=session, run_a=run_a, run_b=run_b)


@router.get("/compare/drift/figure", response_model=PlotlyFigure)
def compare_drift_figure(a: RunQuery, b: RunQuery, session: SessionDep) -> dict[str, Any]:
    """‖A−B‖/‖A‖ per sampled step (estimated from the recorded sketches) beside |Δloss|, with the rounding level."""
    run_a, run_b = _training_runs(session, a, b)
    return drift_figures.drift_figure(pair.build(session=session, run_a=run_a, run_b=run_b))


@router.get("/compare/loss/figure", response_model=PlotlyFigure)
def compare_loss_figure(a: RunQuery, b: RunQuery, session: SessionDep) -> dict[str, Any]:
    """The loss per step of run A and run B; with a = b, that run's own curve (a recording's page)."""
    run_a, run_b = _training_runs(session, a, b)
    return train_figures.loss_figure(pair.build(session=session, run_a=run_a, run_b=run_b))


@router.get("/compare/why", response_model=WhyReport)
def compare_why(a: RunQuery, b: RunQuery, session: SessionDep) -> dict[str, Any]:
    """Why run A and run B may part: the checklist of GET /jobs/{id}/why for any two training runs."""
    run_a, run_b = _training_runs(session, a, b)
    found = pair.build(session=session, run_a=run_a, run_b=run_b)
    report = why.build(session=session, run_a=run_a, run_b=run_b, verdict=found["verdict"],
                       first_divergent_step=found.get("first_divergent_step"), job_id=None,
                       first_component=found.get("first_divergent_component"))
    session.commit()  # an audit job finished before results were stored has had its result stored
    return report


def _training_runs(session: SessionDep, a: int, b: int) -> tuple[Run, Run]:
    found = {r.id: r for r in session.scalars(select(Run).where(Run.id.in_([a, b])))}
    for run_id in (a, b):
        if run_id not in found:
            raise HTTPException(404, f"no run {run_id}")
        job = found[run_id].job
        if KINDS[job.kind].run_kind(job) == "collective":
            raise HTTPException(422, f"run {run_id} is a collective run: its job's page compares its cells")
    return found[a], found[b]
