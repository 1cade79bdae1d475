"""Request and response bodies of the API, separate from the ORM models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from detlab.backend.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED
from detlab.core.diagnosis import VERDICTS as DIAGNOSIS_VERDICTS

# The ingest bodies (Claim, RecordsBatch, CommLogUpload, Finish, Heartbeat) are the wire contract
# between server and worker: detlab.core.wire.
from detlab.core.results import Comparison, KeyDiff
from detlab.core.text import storable
from detlab.core.wire import INT32, INT64, MAX_TAGS, Tag, Tags


class RequestBody(BaseModel):
    """A body users send: unknown keys are refused and every string in it, keys included, is storable text."""

    model_config = ConfigDict(extra="forbid")
    _text = field_validator("*")(storable)


class BisectCreate(RequestBody):
    """POST /jobs/{id}/bisect: which pair of the train job to replay and which step to probe."""

    pair: list[Annotated[int, Field(ge=0, le=7)]] | None = Field(default=None, min_length=2, max_length=2, description=(
        "two config indices of the job (their first repeats); default [0, 1], the pair its verdict is about"))
    step: int | None = Field(default=None, ge=1, le=INT32, description=(
        "the step to probe; default the pair's first divergent step"))


class JobUpdate(RequestBody):
    """PATCH /jobs/{id}: what can change after submission. `tags` replaces the job's tags."""

    tags: Tags


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, datetime) else value


IsoTime = Annotated[str, BeforeValidator(_iso)]


class RunRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    config_index: int
    repeat: int
    status: str
    steps_done: int
    steps_total: int
    attempt: int
    error: str | None
    node: str | None
    device: str | None
    fingerprint_impl: str | None


class ConfigRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    name: str
    hash: str
    body: dict[str, Any]


class JobRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    kind: str
    workload: str
    status: str
    world_size: int
    steps: int
    repeats: int
    params: dict[str, Any]
    created_at: IsoTime
    configs: list[ConfigRead]
    runs: list[RunRead]
    progress: float
    queue: str
    tags: list[str]
    verdict: str | None
    submitter: str | None
    # Workers of the job's queue that are alive now, and why the job may wait when there are none.
    live_workers: int = 0
    queue_note: str | None = None
    # Where its result is served (GET; its kind says which report it is), e.g. /api/v1/jobs/7/comparison.
    result_path: str | None = None


class JobSummary(BaseModel):
    """A row of the jobs list. `world_sizes` is each config's (its own, else the job's)."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    kind: str
    workload: str
    status: str
    created_at: IsoTime
    world_size: int
    steps: int
    repeats: int
    config_names: list[str]
    world_sizes: list[int]
    verdict: str | None
    tags: list[str]
    submitter: str | None
    queue: str
    name: str | None = None  # a recording's (detlab.Recorder(name=...)): what its user calls it


JOB_STATUSES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
VERDICTS = ("identical", "diverged", "incomplete", "incomparable", "reproducible", "not-reproducible",
            *DIAGNOSIS_VERDICTS, "found", "already", "none",  # a fix search's (its `incomplete` is above)
            "exact", "lost")  # a resume check's
JOB_SORTS = ("created", "id", "status", "verdict", "workload", "kind")


class JobsQuery(BaseModel):
    """GET /jobs: filters (all must hold; a list matches any of its values, tags all of theirs), a sort
    and a page. Unknown parameters are refused, so a misspelt filter is an error, not every job."""

    model_config = ConfigDict(extra="forbid")
    limit: int = Field(default=20, ge=1, le=200)
    offset: int = Field(default=0, ge=0, le=INT64)  # past the last job: an empty page
    sort: Literal[JOB_SORTS] = "created"  # type: ignore[valid-type]
    order: Literal["asc", "desc"] = "desc"
    q: str | None = Field(default=None, max_length=64, description=(
        "search: a job id (#12), or text found in the workload (or script), a config name or a tag"))
    workload: str | None = Field(default=None, max_length=64)
    config: str | None = Field(default=None, max_length=64, description="a config or preset name the job ran")
    tag: list[Tag] = Field(default_factory=list, max_length=MAX_TAGS)
    kind: list[str] = Field(default_factory=list, max_length=16, description="job kinds (GET /meta job_kinds)")
    status: list[Literal[JOB_STATUSES]] = Field(  # type: ignore[valid-type]
        default_factory=list, max_length=len(JOB_STATUSES))
    verdict: list[Literal[VERDICTS + ("none",)]] = Field(  # type: ignore[valid-type]
        default_factory=list, max_length=len(VERDICTS) + 1, description="`none`: no verdict (yet)")
    submitter: str | None = Field(default=None, max_length=64)
    created_after: datetime | None = Field(default=None, description="ISO 8601; without an offset, UTC")
    created_before: datetime | None = None

    _text = field_validator("q", "workload", "config", "submitter")(storable)


class JobsPage(BaseModel):
    items: list[JobSummary]
    total: int  # jobs that match the filters, over all pages
    limit: int
    offset: int


class PlotlyFigure(BaseModel):
    """A figure as plotly.js takes it (Figure.to_plotly_json): its traces' and layout's keys are plotly's."""

    model_config = ConfigDict(extra="allow")

    data: list[dict[str, Any]]
    layout: dict[str, Any]


class CollectiveFigures(BaseModel):
    """The figures of a collective or sweep job page, keyed by the div they are drawn in."""

    heatmap: PlotlyFigure
    bandwidth: PlotlyFigure
    frontier: PlotlyFigure
    equality: PlotlyFigure


class LogDiff(BaseModel):
    a: int
    b: int
    diff: list[KeyDiff]


class RunBrief(BaseModel):
    """A run as the compare page lists it (reports.pair.describe)."""

    id: int
    job_id: int
    kind: str
    workload: str
    name: str
    config: str
    repeat: int
    tags: list[str]
    world_size: int
    status: str
    steps_done: int
    created_at: datetime
    submitter: str | None


class RunsFound(BaseModel):
    items: list[RunBrief]
    total: int
    limit: int
    offset: int


class PairResult(Comparison):
    """GET /compare?a=&b=: any two runs compared, as a train job's pair is (GET /jobs/{id}/comparison)."""

    verdict: str
    runs: list[RunBrief]
    tensors: int  # recorded by run A


class RankEnvRead(BaseModel):
    """GET /runs/{id}/envs: one rank's recorded stack, environment and torch flags in effect."""

    model_config = ConfigDict(from_attributes=True)

    rank: int
    host: str | None
    device: str | None
    driver: str | None
    cuda: str | None
    hip: str | None
    torch: str | None
    nccl: str | None
    backend: str | None
    effective_env: dict[str, Any]
    torch_flags: dict[str, Any]
    preflight: list[dict[str, Any]] | None = None  # the preflight table's findings on its process; null: not checked


class WhyLink(BaseModel):
    text: str
    href: str  # a page or API path on this server


class WhyDetail(BaseModel):
    key: str | None
    where: str
    a: str
    b: str


class WhyItem(BaseModel):
    """One step of the checklist (detlab.core.why): its status, one line of what was found, the evidence."""

    step: int
    key: Literal["logs", "env", "ops", "stack", "batch", "data"]
    title: str
    status: Literal["pass", "fail", "not-checked", "not-applicable"]
    found: str
    evidence: list[WhyLink]  # the first is the main one
    details: list[WhyDetail]  # the differences, at most 20 (`differences` counts them all)
    differences: int
    columns: list[str]  # what the details' `a` and `b` hold
    source: dict[str, Any] | None  # an audit item's evidence: job, kind, configs, devices, same_config


class WhyReport(BaseModel):
    """GET /jobs/{id}/why and /compare/why: why two runs may part, in the order engineers debug it."""

    run_a: int
    run_b: int
    job_id: int | None  # the job whose page shows this pair; null: the compare page does
    verdict: str | None
    first_divergent_step: int | None
    note: str | None  # set when the pair did not diverge: the checklist is for divergences
    items: list[WhyItem]
