"""Health, the lists and limits the pages build their forms from, workloads, presets and findings."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel
from sqlalchemy import text

from detlab.backend.api.deps import SessionDep, SettingsDep
from detlab.backend.reports import findings
from detlab.backend.services.dispatch import broker_state
from detlab.backend.services.jobs import MAX_SIZES, MAX_SWEEP_CELLS
from detlab.backend.services.workers import known_workloads, live_workers
from detlab.core import collective, configs
from detlab.core.configs import ConfigBody
from detlab.core.workloads import WorkloadInfo

router = APIRouter(prefix="/api/v1", tags=["meta"])


class LiveRead(BaseModel):
    status: Literal["ok"]


class WorkerBrief(BaseModel):
    name: str
    queue: str
    run_id: int | None = None


class HealthRead(BaseModel):
    status: Literal["ok", "no worker", "unavailable"]
    database: str
    broker: str = "not checked"
    workers: list[WorkerBrief] = []


class LimitsRead(BaseModel):
    """What this server accepts in one job (a submit form checks them before sending)."""

    max_world_size: int
    max_steps: int
    max_repeats: int
    max_sweep_cells: int
    max_sizes: int


class MetaRead(BaseModel):
    """The lists the server owns, in the order the pages show them."""

    ops: list[str]
    dtypes: list[str]
    dtype_bytes: dict[str, int]
    limits: LimitsRead


class PresetRead(BaseModel):
    name: str
    description: str
    config: ConfigBody


class FindingGroup(BaseModel):
    """One hardware × library × config × op × dtype: sizes reproducible and busbw at the largest size."""

    hardware: str
    library: str
    config: str
    op: str
    dtype: str
    env: dict[str, Any]
    sources: list[str]
    sizes: int
    reproducible: int
    cells: int
    min_runs: int
    largest_bytes: int
    busbw_gbps_at_largest: float | None


class FindingsRead(BaseModel):
    groups: list[FindingGroup]


@router.get("/live", response_model=LiveRead)
def live(session: SessionDep) -> LiveRead:
    """Liveness for container health checks: the API serves and its database answers."""
    session.execute(text("SELECT 1"))
    return LiveRead(status="ok")


@router.get("/health", response_model=HealthRead, responses={503: {"model": HealthRead}})
def health(session: SessionDep, settings: SettingsDep, response: Response) -> HealthRead:
    """200 once the database and the broker answer and a worker has beaten recently; 503 with the reason
    otherwise. The broker check is one PING bounded by a 2 s timeout."""
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        response.status_code = 503
        return HealthRead(status="unavailable", database=str(exc)[:200], broker=broker_state(settings))
    broker = broker_state(settings)
    workers = live_workers(session=session, within_s=settings.run_stale_after_s)
    status: Literal["ok", "no worker", "unavailable"] = (
        "unavailable" if broker != "ok" else "ok" if workers else "no worker")
    if status != "ok":
        response.status_code = 503
    return HealthRead(status=status, database="ok", broker=broker,
                      workers=[WorkerBrief(name=w.name, queue=w.queue, run_id=(w.info or {}).get("run_id"))
                               for w in workers])


@router.get("/meta", response_model=MetaRead)
def meta(settings: SettingsDep) -> MetaRead:
    """Collective ops, dtypes and their byte sizes, and this server's limits on a job."""
    return MetaRead(
        ops=list(collective.OPS),
        dtypes=list(collective.DTYPES),
        dtype_bytes=collective.DTYPE_BYTES,
        limits=LimitsRead(max_world_size=settings.max_world_size, max_steps=settings.max_steps,
                          max_repeats=settings.max_repeats, max_sweep_cells=MAX_SWEEP_CELLS,
                          max_sizes=MAX_SIZES),
    )


@router.get("/workloads", response_model=list[WorkloadInfo])
def workloads(session: SessionDep) -> list[WorkloadInfo]:
    """Built-in workloads and those the workers have advertised."""
    return sorted(known_workloads(session=session).values(), key=lambda w: w.name)


@router.get("/presets", response_model=list[PresetRead])
def presets() -> list[PresetRead]:
    """The named configs a job may start from."""
    return [PresetRead(name=name, description=desc, config=configs.preset(name))
            for name, (desc, _) in configs.PRESETS.items()]


@router.get("/findings", response_model=FindingsRead)
def read_findings(session: SessionDep) -> FindingsRead:
    """The team's history: per hardware, library, config, op and dtype, the sizes that were
    reproducible and the bus bandwidth at the largest size."""
    return FindingsRead.model_validate({"groups": findings.summary(session=session)})
