"""The results of diagnosis jobs (batch-invariance, op-audit) and their figure."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from detlab.backend.api.deps import JobId, SessionDep
from detlab.backend.figures import diagnosis as diagnosis_figures
from detlab.backend.models import Job
from detlab.backend.schemas import PlotlyFigure
from detlab.backend.services.settle import job_result, report_kind
from detlab.core.results import DiagnosisResult

router = APIRouter(prefix="/api/v1/jobs", tags=["jobs"])


def _result(job_id: int, session: SessionDep) -> dict[str, Any]:
    job = session.get(Job, job_id)
    if job is None:
        raise HTTPException(404, f"job {job_id} not found")
    if report_kind(job) != "diagnosis":
        raise HTTPException(404, f"job {job_id} is a {job.kind} job, not a diagnosis (batch-invariance, op-audit)")
    result = job_result(session=session, job=job)
    session.commit()  # a finished job's result may just have been stored
    if result is None:
        raise HTTPException(404, f"job {job_id} has no diagnosis results yet")
    return result


@router.get("/{job_id}/diagnosis", response_model=DiagnosisResult, response_model_exclude_unset=True)
def read_diagnosis(job_id: JobId, session: SessionDep) -> DiagnosisResult:
    """Per config: device and flags, and the batch-invariance results (op × dtype × batch size, first breaks,
    the workload's forward) or the op audit (every op of a step, nondeterministic or not, and why)."""
    return DiagnosisResult.model_validate(_result(job_id, session))


@router.get("/{job_id}/diagnosis/figure", response_model=PlotlyFigure)
def read_diagnosis_figure(job_id: JobId, session: SessionDep) -> dict[str, Any]:
    """Op × batch size heatmap of a batch-invariance job (colour by max ULP, first break marked)."""
    return diagnosis_figures.invariance_heatmap(_result(job_id, session))
