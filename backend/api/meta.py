"""Health, workloads and presets."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from detlab.backend.api.deps import SessionDep, SettingsDep
from detlab.backend.reports import findings
from detlab.backend.services.workers import known_workloads, live_workers
from detlab.core import configs
from detlab.core.workloads import WorkloadInfo

router = APIRouter(prefix="/api/v1", tags=["meta"])


@router.get("/live")
def live(session: SessionDep) -> dict[str, str]:
    """Liveness for container health checks: the API serves and its database answers."""
    session.execute(text("SELECT 1"))
    return {"status": "ok"}


@router.get("/health")
def health(session: SessionDep, settings: SettingsDep) -> JSONResponse:
    """200 once the database answers and a worker has beaten recently; 503 with the reason otherwise."""
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        return JSONResponse({"status": "unavailable", "database": str(exc)[:200]}, status_code=503)
    workers = live_workers(session=session, within_s=settings.run_stale_after_s)
    body = {"status": "ok" if workers else "no worker", "database": "ok",
            "workers": [{"name": w.name, "queue": w.queue, "run_id": w.info.get("run_id")} for w in workers]}
    return JSONResponse(body, status_code=200 if workers else 503)


@router.get("/workloads", response_model=list[WorkloadInfo])
def workloads(session: SessionDep) -> list[WorkloadInfo]:
    """Built-in workloads and those the workers have advertised."""
    return sorted(known_workloads(session=session).values(), key=lambda w: w.name)


@router.get("/presets")
def presets() -> list[dict[str, Any]]:
    return [{"name": name, "description": desc, "config": configs.preset(name).model_dump()}
            for name, (desc, _) in configs.PRESETS.items()]


@router.get("/findings")
def read_findings(session: SessionDep) -> dict[str, Any]:
    """The team's history: per hardware, library, config, op and dtype, the sizes that were
    reproducible and the bus bandwidth at the largest size."""
    return {"groups": findings.summary(session=session)}
