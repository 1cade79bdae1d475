"""The team's history: the config × stack matrix with its filters (collective cells by op and dtype, train
configs by workload) and the fix jobs' prescriptions per stack, and one cell's measurements linked to their jobs."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request, Response
from pydantic import BaseModel

from detlab.backend import static
from detlab.backend.api.deps import SessionDep
from detlab.backend.reports import matrix, prescriptions
from detlab.backend.services import cache

router = APIRouter(prefix="/api/v1/findings", tags=["findings"])


class Cost(BaseModel):
    cost: float | None
    cost_interval: list[float] | None
    within_noise: bool | None  # the bootstrap 95 % interval spans 0
    cost_text: str


class MatrixCell(Cost):
    """Config × stack: `identical` of `comparable` (train: repeats identical to the first; collective: sizes
    reproducible), the latest cost, the earliest first divergence and the rate per time slice (`trend`)."""

    config: str
    stack: str
    identical: int
    comparable: int
    rate: float | None
    measurements: int
    first_divergent_step: int | None
    last_measured_at: str
    latest_job_id: int | None
    busbw_gbps: float | None
    trend: list[float | None]
    lacks: str | None = None  # with nothing comparable: what is not measured, and how to measure it


class Bucket(BaseModel):
    """A slice of the time covered; a cell's `trend` has its rate in each."""

    start: str
    end: str


class Scope(BaseModel):
    kind: str | None
    workload: str | None
    op: str | None
    dtype: str | None
    since: str | None
    until: str | None


class ScopeOption(BaseModel):
    kind: str
    workload: str
    op: str
    dtype: str


class StackPrescription(BaseModel):
    """Per (stack, workload, world size), the latest settled fix job's answer (backend.reports.prescriptions):
    its verdict, the knobs it prescribes ([] for `already` and `none`), [k, n] repeats identical to the first (the
    first counting; `none`: the closest trial's), the cost against the base with its bootstrap 95 % interval."""

    stack: str
    workload: str
    world_size: int
    verdict: Literal["found", "already", "none"]
    knobs: list[str]
    reproducible: list[int] | None
    cost: float | None
    cost_interval: list[float] | None
    within_noise: bool | None
    job: int


class MatrixRead(BaseModel):
    scope: Scope
    options: list[ScopeOption]
    configs: list[str]
    stacks: list[str]
    cells: list[MatrixCell]
    buckets: list[Bucket]
    # What the team's fix jobs prescribe per stack: of the workload the request names (any when it names none, not
    # the matrix's defaulted one) and in its since/until window.
    prescriptions: list[StackPrescription] = []


class Measurement(Cost):
    source: str
    job_id: int | None
    job_url: str | None
    measured_at: str
    kind: str
    workload: str
    op: str
    dtype: str
    identical: int
    comparable: int
    rate: float | None
    runs: int
    first_divergent_step: int | None
    largest_bytes: int | None
    busbw_gbps: float | None
    config_env: dict[str, Any]
    hardware: str
    driver: str | None
    runtime: str | None
    torch: str | None
    library: str


class HistoryRead(BaseModel):
    config: str
    stack: str
    measurements: list[Measurement]


NO_NUL = r"^[^\x00]*$"  # compared with text columns: PostgreSQL refuses NUL in a string (a 500, not a 422)
Text = Annotated[str | None, Query(min_length=1, max_length=255, pattern=NO_NUL)]
Day = Annotated[date | None, Query(description="a day, YYYY-MM-DD (UTC)")]


def _scope(kind: str | None, workload: str | None, op: str | None, dtype: str | None, since: date | None,
           until: date | None) -> matrix.Scope:
    if since and until and until < since:
        raise HTTPException(422, f"until ({until}) is before since ({since})")
    start = datetime.combine(since, time(), UTC) if since else None
    end = datetime.combine(until, time(), UTC) + timedelta(days=1) if until else None  # until is inclusive
    return matrix.Scope(kind=kind, workload=workload, op=op, dtype=dtype, since=start, until=end)


@router.get("/matrix", response_model=MatrixRead)
def read_matrix(session: SessionDep, request: Request, kind: Text = None, workload: Text = None, op: Text = None,
                dtype: Text = None, since: Day = None, until: Day = None) -> Response:
    """Config × stack (GPU, driver, CUDA/ROCm, torch, NCCL/RCCL) over every finished job and imported
    file in scope: reproducibility k/n, cost with its interval, first divergence, trend, latest job.
    Without a kind, the scope is the first thing measured (train workloads first), as `scope` says.

    Built once per scope until the history changes (many readers of a team's page ask for the same few
    scopes between two finished jobs), then served as stored bytes, revalidated by ETag."""
    at = matrix.version(session=session)
    asked = _scope(kind, workload, op, dtype, since, until)
    scope = matrix.default_scope(session=session, scope=asked, at=at)

    def build() -> bytes:
        body = {**matrix.matrix(session=session, scope=scope), "options": matrix.options(session=session, at=at),
                "prescriptions": prescriptions.prescriptions(session=session, workload=asked.workload,
                                                             since=asked.since, until=asked.until),
                "scope": {"kind": scope.kind, "workload": scope.workload, "op": scope.op, "dtype": scope.dtype,
                          "since": since and since.isoformat(), "until": until and until.isoformat()}}
        return MatrixRead.model_validate(body).model_dump_json().encode()

    item = cache.get_or_build(("findings matrix", at, scope, asked.workload), build)
    return static.respond(request, item, cache_control=static.REVALIDATE)


@router.get("/history", response_model=HistoryRead)
def read_history(session: SessionDep, config: Annotated[str, Query(min_length=1, max_length=64, pattern=NO_NUL)],
                 stack: Annotated[str, Query(min_length=1, max_length=255, pattern=NO_NUL)], kind: Text = None,
                 workload: Text = None, op: Text = None, dtype: Text = None, since: Day = None,
                 until: Day = None) -> dict[str, Any]:
    """One matrix cell's measurements, newest first, each linked to its job (or naming its imported file)."""
    scope = _scope(kind, workload, op, dtype, since, until)
    return {"config": config, "stack": stack,
            "measurements": matrix.history(session=session, scope=scope, config=config, stack=stack)}
