"""Request and response bodies of the API, separate from the ORM models."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

from detlab.backend.models import CANCELLED, FAILED, QUEUED, RUNNING, SUCCEEDED
from detlab.core.diagnosis import VERDICTS as DIAGNOSIS_VERDICTS
from detlab.core.text import storable

# The ingest bodies (Claim, RecordsBatch, CommLogUpload, Finish, Heartbeat) are the wire contract
# between server and worker: detlab.core.wire.
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


JOB_STATUSES = (QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED)
VERDICTS = ("identical", "diverged", "incomplete", "incomparable", "reproducible", "not-reproducible",
            *DIAGNOSIS_VERDICTS)
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


class OpenModel(BaseModel):
    """Known keys typed; keys added later (or by a newer report) pass through unchanged."""

    model_config = ConfigDict(extra="allow")


# Results: the top level and the fixed rows are typed; rows whose keys vary by source stay dicts.

class KeyDiff(OpenModel):
    """A key whose value differs between A and B (a config's dotted key, a log fact)."""

    key: str
    a: Any
    b: Any


class ThroughputRow(OpenModel):
    config_index: int
    name: str
    world_size: int | None = None  # the config's runs' (results stored before it was recorded lack it)
    samples_per_s: float | None
    spread: list[float] | None
    step_time_ms_median: float | None
    runs: int
    cost: float | None
    cost_interval: list[float] | None = None  # bootstrap 95 % interval of the cost
    within_noise: bool | None = None  # the interval spans 0
    cost_text: str = ""


class ReproducibilityRow(OpenModel):
    config_index: int
    name: str
    repeats: int
    recorded: int
    comparable: int = 0  # repeats compared with the first that were identical or diverged
    identical_to_first: int
    incomplete: int = 0
    incomparable: int = 0
    rate: float | None  # identical_to_first / comparable
    first_divergent_step: int | None = None  # the earliest step a repeat parted from the first


class StepDiff(OpenModel):
    """One step, or (thinned) the bucket of steps step..to_step: the most tensors differing at one of
    them and how many of its steps differ."""

    step: int
    tensors_differing: int | None
    to_step: int | None = None
    steps_differing: int | None = None
    steps: int | None = None


class Downsampled(OpenModel):
    """How a comparison's per-step series were thinned: ask for a step window to see it in full."""

    steps: int
    points: int
    steps_per_point: int


class StepWindow(OpenModel):
    from_step: int
    to_step: int


class DivergenceMap(OpenModel):
    """Where the compared runs' per-tensor digests differ, tensor × step (detlab.core.divergence_map): only
    differing cells, tensors and steps capped (`truncated`, `note`); cells are [step, index into tensors,
    index into rank_sets]; rank sets are empty in rank-consensus mode."""

    mode: str
    steps: list[int]
    tensors: list[str]
    rank_sets: list[list[int]]
    cells: list[tuple[int, int, int]]
    steps_differing: int
    tensors_differing: int
    truncated: bool
    note: str | None = None


class Drift(OpenModel):
    """How far the compared runs drift apart (detlab.core.drift): per sampled step the estimate of ‖A−B‖/‖A‖
    (`points`, the worst rank; `ranks` per rank where they differ) and |Δloss|, the dtype's one-ulp relative
    rounding level, and the verdict text; `available` false with `reason` when a run recorded no statistics."""

    available: bool
    reason: str | None = None
    version: str | None = None
    k: int | None = None
    relative_error: float | None = None
    points: list[tuple[int, float]] = Field(default_factory=list)
    ranks: dict[str, list[tuple[int, float]]] = Field(default_factory=dict)
    loss_delta: list[tuple[int, float]] = Field(default_factory=list)
    dtype: str | None = None
    rounding_level: float | None = None
    max: float | None = None
    max_step: int | None = None
    sampled: bool = False
    verdict: str | None = None


class EnvFact(OpenModel):
    key: str
    a: Any
    b: Any
    differs: bool


class CollectiveCalls(OpenModel):
    """The runs' collective calls compared (detlab.core.collective_calls): `status` identical | differs |
    not-recorded | incomparable; `first`: the first call whose output differs, its cause (reduction-order,
    carried, calls-differ) and, for reduction-order, what the NCCL logs show NCCL chose at its size."""

    status: str
    calls_compared: int
    first: dict[str, Any] | None = None
    text: str | None = None


class Comparison(OpenModel):
    """Two runs compared (detlab.core.compare.compare_runs): the verdict, where they part, what is missing."""

    verdict: str | None
    reason: str | None
    mode: str | None = None
    run_a: int | None = None
    run_b: int | None = None
    first_divergent_step: int | None = None
    first_divergent_tensors: list[str] = Field(default_factory=list)
    ranks: list[int] = Field(default_factory=list)
    steps_differing: int = 0
    steps_compared: int = 0
    per_step: list[StepDiff] = Field(default_factory=list)
    loss: dict[str, list[tuple[int, float | None]]] = Field(default_factory=dict)
    missing: list[str] = Field(default_factory=list)
    divergence_map: DivergenceMap | None = None  # diverged pairs only
    config_diff: list[KeyDiff]
    environment: list[EnvFact] = Field(default_factory=list)
    downsampled: Downsampled | None = None  # per_step and loss thinned (null: in full)
    drift: Drift | None = None  # absent from results stored before drift was estimated
    collectives: CollectiveCalls | None = None  # null: neither run recorded its collective calls


class TrainResult(Comparison):
    """GET /jobs/{id}/comparison: the verdict between the first runs of the first two configs, throughput
    and cost per config, reproducibility of repeats. A single-config job has no two-run keys (mode … missing,
    environment): they are absent, not null."""

    throughput: list[ThroughputRow]
    reproducibility: list[ReproducibilityRow]
    effective_mismatches: list[dict[str, Any]]
    window: StepWindow | None = None  # present when a step window was asked for


class CollectiveConfig(OpenModel):
    index: int
    name: str
    env: dict[str, Any]


class EqualityRow(OpenModel):
    op: str
    dtype: str
    bytes: int
    equal: list[list[bool | None]]


class CollectiveResult(OpenModel):
    """GET /jobs/{id}/collective: per config × (op, dtype, size) cells, cross-config equality, effective
    settings from NCCL/RCCL logs, and the nccl-tests-style export."""

    world_size: int
    configs: list[CollectiveConfig]
    cells: list[dict[str, Any]]
    equality: list[EqualityRow]
    effective: list[dict[str, Any]]
    logs: list[dict[str, Any]]
    note: str | None
    export: dict[str, Any]


class InvarianceRow(OpenModel):
    op: str
    dtype: str
    batch_size: int
    invariant: bool
    max_ulp: int


class FirstBreak(OpenModel):
    op: str
    dtype: str
    first_break: int | None


class ModelInvariance(OpenModel):
    workload: str
    batch_sizes: list[int]
    invariant: bool
    first_module: str | None
    first_break: int | None


class AuditOp(OpenModel):
    op: str
    count: int
    nondeterministic: bool | None
    evidence: str


class DiagnosisConfig(OpenModel):
    """One config of a diagnosis job: where it ran and under which flags, and what it measured (the keys of
    its kind: results/summary/model for batch-invariance, ops/ineffective for op-audit)."""

    index: int
    label: str
    device: str | None
    tf32: bool | None = None
    torch_flags: dict[str, Any] | None = None
    threads: int | None = None
    results: list[InvarianceRow] | None = None
    summary: list[FirstBreak] | None = None
    model: ModelInvariance | None = None
    ops: list[AuditOp] | None = None
    ineffective: list[str] | None = None


class DiagnosisResult(OpenModel):
    """GET /jobs/{id}/diagnosis: a batch-invariance or op-audit job's result, per config."""

    kind: Literal["batch-invariance", "op-audit"]
    workload: str | None
    configs: list[DiagnosisConfig]


class PlotlyFigure(OpenModel):
    """A figure as plotly.js takes it (Figure.to_plotly_json)."""

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
    key: Literal["logs", "env", "ops", "stack", "batch"]
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


class BisectCall(OpenModel):
    """The first difference, or the first divergent module call, of a bisect (detlab.core.bisect.diagnose)."""

    entry: str
    phase: str
    ranks: list[int]


class ModuleRow(OpenModel):
    """One module of the model's tree: depth, class, calls made at the probe step, and its status."""

    module: str
    shown: str
    depth: int
    type: str
    calls: int
    status: Literal["equal", "differs", "first difference", "not called"]
    state_differs: bool
    verdict: Literal["introduced", "carried"] | None = None
    differing: list[str]


class Diagnosis(OpenModel):
    first: BisectCall | None
    first_module: BisectCall | None
    state_differs: list[str]
    tree: list[ModuleRow]
    entries: int
    entries_differing: int
    summary: str


class BisectResult(OpenModel):
    """GET /jobs/{id}/bisect: the replay's verdict (as a train pair's), and where in the step the runs part."""

    verdict: str
    reason: str | None
    run_a: int | None = None
    run_b: int | None = None
    ranks: list[int] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    source: dict[str, Any]
    step: int
    diagnosis: Diagnosis | None
    config_diff: list[KeyDiff]
    environment: list[EnvFact] = Field(default_factory=list)
