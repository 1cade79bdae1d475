"""Health, the lists and limits the pages build their forms from, workloads and presets."""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel
from sqlalchemy import text

from detlab.backend.api.deps import SessionDep, SettingsDep
from detlab.backend.kinds.base import RESULT_PATHS
from detlab.backend.kinds.collective import MAX_SIZES
from detlab.backend.kinds.registry import KINDS
from detlab.backend.kinds.sweep import MAX_SWEEP_CELLS
from detlab.backend.schemas import JOB_STATUSES, VERDICTS
from detlab.backend.services.dispatch import broker_state
from detlab.backend.services.workers import known_workloads, live_workers
from detlab.core import collective, configs, diagnosis
from detlab.core.configs import ConfigBody
from detlab.core.wire import MAX_TAGS, TAG_LENGTH, TAG_PATTERN
from detlab.core.workloads import WorkloadInfo

log = logging.getLogger(__name__)
router = APIRouter(prefix="/api/v1", tags=["meta"])
# Health and liveness answer without an identity in every auth mode (probes, load balancers).
health_router = APIRouter(prefix="/api/v1", tags=["meta"])


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
    max_tags: int
    max_tag_length: int
    tag_pattern: str


class DiagnosisLists(BaseModel):
    """What a batch-invariance or op-audit job may ask for (detlab.core.diagnosis)."""

    ops: list[str]
    dtypes: list[str]
    default_batch_sizes: list[int]
    min_features: int
    max_features: int
    features_multiple: int
    max_batch: int
    max_batch_sizes: int
    max_elements: int
    max_reruns: int


class KindRead(BaseModel):
    """A job kind: whether POST /jobs takes it (others are made otherwise: a bisect from a train job, a recording
    by the SDK), and the path under /jobs/{id}/ that serves its result, when it does not depend on the job."""

    name: str
    description: str
    submit: bool
    result: str | None


class MetaRead(BaseModel):
    """The lists the server owns, in the order the pages show them."""

    ops: list[str]
    dtypes: list[str]
    dtype_bytes: dict[str, int]
    limits: LimitsRead
    # What the jobs list filters on (GET /jobs kind=, status=, verdict=).
    job_kinds: list[str]
    kinds: list[KindRead]  # the registry of job kinds (detlab.backend.kinds)
    job_statuses: list[str]
    verdicts: list[str]
    diagnosis: DiagnosisLists


class PresetRead(BaseModel):
    name: str
    description: str
    config: ConfigBody


@health_router.get("/live", response_model=LiveRead)
def live(session: SessionDep) -> LiveRead:
    """Liveness for container health checks: the API serves and its database answers."""
    session.execute(text("SELECT 1"))
    return LiveRead(status="ok")


@health_router.get("/health", response_model=HealthRead, responses={503: {"model": HealthRead}})
def health(session: SessionDep, settings: SettingsDep, response: Response) -> HealthRead:
    """200 once the database and the broker answer and a worker has beaten recently; 503 with the reason
    otherwise. The broker check is one PING bounded by a 2 s timeout."""
    # Unauthenticated: it names what is down, never its address or its error text (the log has those).
    broker = broker_state(settings)
    if broker != "ok":
        log.warning("health: broker %s", broker)
        broker = "unreachable"
    try:
        session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        log.warning("health: database unreachable: %s", exc)
        response.status_code = 503
        return HealthRead(status="unavailable", database="unreachable", broker=broker)
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
                          max_sizes=MAX_SIZES, max_tags=MAX_TAGS, max_tag_length=TAG_LENGTH,
                          tag_pattern=TAG_PATTERN),
        job_kinds=list(KINDS),
        kinds=[KindRead(name=name, description=kind.description, submit=kind.request is not None,
                        result=RESULT_PATHS[kind.report_name] if kind.report_name else None)
               for name, kind in KINDS.items()], job_statuses=list(JOB_STATUSES), verdicts=list(VERDICTS),
        diagnosis=DiagnosisLists(ops=list(diagnosis.INVARIANCE_OPS), dtypes=list(diagnosis.INVARIANCE_DTYPES),
                                 default_batch_sizes=list(diagnosis.DEFAULT_BATCH_SIZES),
                                 min_features=diagnosis.MIN_FEATURES, max_features=diagnosis.MAX_FEATURES,
                                 features_multiple=diagnosis.FEATURES_MULTIPLE, max_batch=diagnosis.MAX_BATCH,
                                 max_batch_sizes=diagnosis.MAX_BATCH_SIZES, max_elements=diagnosis.MAX_ELEMENTS,
                                 max_reruns=diagnosis.MAX_RERUNS),
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
