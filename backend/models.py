"""SQLAlchemy ORM models: the database is the source of truth for jobs, runs and their records."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    Float,
    ForeignKey,
    Index,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, object_session, relationship

from detlab.core.wire import TAG_LENGTH

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
FINISHED = (SUCCEEDED, FAILED, CANCELLED)
# A job of this kind is an SDK recording (services.recordings): its one run is fed by the SDK, never by a worker.
RECORDING = "recording"
# A job of this kind replays a train job's diverged pair and probes one step module by module (services.bisect).
BISECT = "bisect"


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON, datetime: DateTime(timezone=True)}


class Config(Base):
    __tablename__ = "configs"
    __table_args__ = (UniqueConstraint("name", "hash"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    hash: Mapped[str] = mapped_column(String(16), index=True)
    body: Mapped[dict[str, Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)




class Job(Base):
    __tablename__ = "jobs"
    # The jobs list filters and sorts on these; the id breaks ties, so paging is stable.
    __table_args__ = (Index("ix_jobs_status_id", "status", "id"), Index("ix_jobs_workload_id", "workload", "id"),
                      Index("ix_jobs_kind_id", "kind", "id"), Index("ix_jobs_verdict_id", "verdict", "id"),
                      Index("ix_jobs_submitter_id", "submitter", "id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    workload: Mapped[str] = mapped_column(String(64))
    world_size: Mapped[int]
    steps: Mapped[int]
    repeats: Mapped[int]
    params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    config_ids: Mapped[list[Any]]
    status: Mapped[str] = mapped_column(String(16), default=QUEUED)  # indexed with the id, above
    submitter: Mapped[str | None] = mapped_column(String(64))
    queue: Mapped[str] = mapped_column(String(64), default="default")
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    finished_at: Mapped[datetime | None]
    # Computed once, when the job settles (train: its comparison; collective/sweep: its cells); null
    # until then ({} when it finished with nothing recorded). Jobs finished before the column existed
    # get theirs on the first read of a result page.
    result: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # The result in one word, for listings, set with it (services.settle.list_verdict): a train pair's
    # verdict, else reproducible / not-reproducible; null while unfinished or nothing was compared.
    verdict: Mapped[str | None] = mapped_column(String(32))
    # Labels users give a job, in their order; job_tags holds them again, one row each, for filtering.
    tags: Mapped[list[Any]] = mapped_column(default=list)
    # An SDK recording's id (services.recordings): every rank, retry and upload of it finds this job.
    recording: Mapped[str | None] = mapped_column(String(64), index=True, unique=True)

    runs: Mapped[list[Run]] = relationship(back_populates="job", order_by="Run.id")

    @property
    def configs(self) -> list[Config]:
        """The job's configs in its order (a config listed twice appears twice)."""
        session = object_session(self)
        assert session is not None, "a job's configs are looked up through its session"
        by_id = {c.id: c for c in session.scalars(select(Config).where(Config.id.in_(self.config_ids)))}
        return [by_id[i] for i in self.config_ids]

    @property
    def config_names(self) -> list[str]:
        return [c.name for c in self.configs]

    @property
    def progress(self) -> float:
        """Share of the steps done over all runs (a finished run counts whole, even if it stopped early)."""
        total = sum(r.steps_total for r in self.runs) or 1
        done = sum(r.steps_total if r.status in FINISHED else r.steps_done for r in self.runs)
        return min(1.0, done / total)


class JobTag(Base):
    """One tag of a job: the jobs list filters on tags through this table's index."""

    __tablename__ = "job_tags"
    __table_args__ = (Index("ix_job_tags_tag_job_id", "tag", "job_id"),)

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    tag: Mapped[str] = mapped_column(String(TAG_LENGTH), primary_key=True)


IDEMPOTENCY_KEY_LENGTH = 128


class IdempotencyKey(Base):
    """A client's `Idempotency-Key` on a job submission: a retry with the same key and body gets this job."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(IDEMPOTENCY_KEY_LENGTH), primary_key=True)
    # sha256 of the submitter and the parsed body: the same key with another body is refused.
    body_hash: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)


class Run(Base):
    __tablename__ = "runs"
    # The jobs list's config filter goes from a config to its jobs on the second index alone.
    __table_args__ = (UniqueConstraint("job_id", "config_index", "repeat"),
                      Index("ix_runs_config_id_job_id", "config_id", "job_id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    config_id: Mapped[int] = mapped_column(ForeignKey("configs.id"))
    config_index: Mapped[int]
    repeat: Mapped[int]
    world_size: Mapped[int]
    steps_total: Mapped[int]
    steps_done: Mapped[int] = mapped_column(default=0)
    status: Mapped[str] = mapped_column(String(16), default=QUEUED, index=True)
    attempt: Mapped[int] = mapped_column(default=0)
    node: Mapped[str | None] = mapped_column(String(128))
    device: Mapped[str | None] = mapped_column(String(32))
    fingerprint_impl: Mapped[str | None] = mapped_column(String(32))
    error: Mapped[str | None] = mapped_column(Text)
    dispatched_at: Mapped[datetime | None]
    started_at: Mapped[datetime | None]
    finished_at: Mapped[datetime | None]
    heartbeat_at: Mapped[datetime | None]
    # sha256 of the lease its current attempt's claim handed out: only the holder writes that attempt.
    lease_hash: Mapped[str | None] = mapped_column(String(64))

    job: Mapped[Job] = relationship(back_populates="runs")
    config: Mapped[Config] = relationship()


class RankEnv(Base):
    __tablename__ = "rank_envs"
    __table_args__ = (UniqueConstraint("run_id", "rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int]
    host: Mapped[str | None] = mapped_column(String(255))
    device: Mapped[str | None] = mapped_column(String(255))
    driver: Mapped[str | None] = mapped_column(String(64))
    cuda: Mapped[str | None] = mapped_column(String(32))
    hip: Mapped[str | None] = mapped_column(String(32))
    torch: Mapped[str | None] = mapped_column(String(64))
    nccl: Mapped[str | None] = mapped_column(String(32))
    backend: Mapped[str | None] = mapped_column(String(16))
    effective_env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    torch_flags: Mapped[dict[str, Any]] = mapped_column(default=dict)
    position: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))  # {"dp": 0, "tp": 1}
    # The preflight table's findings on the rank's process (wire.PreflightFinding rows); None: not checked.
    preflight: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON(none_as_null=True))


class TensorMeta(Base):
    __tablename__ = "tensor_meta"
    __table_args__ = (UniqueConstraint("run_id", "index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    index: Mapped[int]
    name: Mapped[str] = mapped_column(String(255))
    shape: Mapped[list[Any]]
    dtype: Mapped[str] = mapped_column(String(32))
    component: Mapped[str | None] = mapped_column(String(16))  # parameters, buffers, optimizer, gradients


class StepRecord(Base):
    """One row per (run, step, rank); per-tensor digests packed 16 bytes each in tensor order, and optionally
    per-tensor statistics and sketches."""

    __tablename__ = "step_records"
    __table_args__ = (UniqueConstraint("run_id", "step", "rank", "segment"),
                      Index("ix_step_records_run_step", "run_id", "step"))

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    rank: Mapped[int]
    attempt: Mapped[int]
    fp_version: Mapped[str] = mapped_column(String(8))
    model_digest: Mapped[str] = mapped_column(String(48))
    digests: Mapped[bytes] = mapped_column(LargeBinary)
    loss_bits: Mapped[str] = mapped_column(String(16))
    loss: Mapped[float | None] = mapped_column(Float)
    step_time_s: Mapped[float] = mapped_column(Float)
    # Per tensor, in the digests' order: float64 (sum, L2 norm, max |x|) and the count sketch of
    # detlab.core.sketch's `drift_version`, packed little-endian. None: recorded without them.
    drift_version: Mapped[str | None] = mapped_column(String(8))
    stats: Mapped[bytes | None] = mapped_column(LargeBinary)
    sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    # A resumed recording (detlab.core.wire.StepRecord): the process that wrote the row (0: the first), and whether
    # it is the restored state of a checkpoint's step. `state`: the batch / rng / optimizer entries (None: none).
    segment: Mapped[int] = mapped_column(default=0, server_default="0")
    restored: Mapped[bool] = mapped_column(default=False, server_default=false())
    state: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class CallsRecord(Base):
    """One rank's collective calls within one step: what each was (a compact JSON list of [op, dtype, count,
    group_size]) and the packed input and output digests, as StepRecord packs tensors'."""

    __tablename__ = "collective_calls"
    __table_args__ = (UniqueConstraint("run_id", "step", "rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    step: Mapped[int]
    rank: Mapped[int]
    fp_version: Mapped[str] = mapped_column(String(8))
    calls: Mapped[list[Any]]
    inputs: Mapped[bytes] = mapped_column(LargeBinary)
    outputs: Mapped[bytes] = mapped_column(LargeBinary)
    unread: Mapped[list[Any]] = mapped_column(default=list)


class Worker(Base):
    __tablename__ = "workers"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    queue: Mapped[str] = mapped_column(String(64))
    last_seen: Mapped[datetime] = mapped_column(default=utcnow)
    info: Mapped[dict[str, Any]] = mapped_column(default=dict)


class CollectiveTrial(Base):
    """One timed collective call on one rank: output digest, time, error against float64."""

    __tablename__ = "collective_trials"
    __table_args__ = (UniqueConstraint("run_id", "op", "dtype", "bytes", "trial", "rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    op: Mapped[str] = mapped_column(String(32))
    dtype: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    trial: Mapped[int]
    rank: Mapped[int]
    digest: Mapped[str] = mapped_column(String(48))
    prefix_digest: Mapped[str | None] = mapped_column(String(48))
    time_s: Mapped[float] = mapped_column(Float)
    err_max_abs: Mapped[float | None] = mapped_column(Float)
    err_max_ulp: Mapped[float | None] = mapped_column(Float)
    frac_diff: Mapped[float | None] = mapped_column(Float)
    impl: Mapped[str | None] = mapped_column(String(32))


class CommLog(Base):
    """One process's NCCL/RCCL debug log: raw text compressed (size-capped) and its parsed facts."""

    __tablename__ = "comm_logs"
    __table_args__ = (UniqueConstraint("run_id", "rank"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int]
    raw: Mapped[bytes] = mapped_column(LargeBinary)  # zlib-compressed text
    raw_bytes: Mapped[int] = mapped_column(BigInteger)  # size before truncation
    truncated: Mapped[bool] = mapped_column(default=False)
    parsed: Mapped[dict[str, Any]] = mapped_column(default=dict)


class DiagnosisRecord(Base):
    """One result of a diagnosis run (detlab.core.wire: `invariance`, `model-invariance`, `audit-op`), as the
    rank recorded it: `key` names it within its run (op/dtype/batch size, batch size, or op), `body` is the
    validated record."""

    __tablename__ = "diagnosis_records"
    __table_args__ = (UniqueConstraint("run_id", "type", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(16))
    key: Mapped[str] = mapped_column(String(160))
    body: Mapped[dict[str, Any]]


class Finding(Base):
    """One measured cell of the team's history: config × (op, dtype, size) on a hardware and library
    stack, reproducible or not, at what bandwidth. From finished jobs or imported result files."""

    __tablename__ = "findings"
    __table_args__ = (UniqueConstraint("source", "config", "op", "dtype", "bytes"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(String(255), index=True)
    recorded_at: Mapped[datetime] = mapped_column(default=utcnow)
    hardware: Mapped[str] = mapped_column(String(128))
    library: Mapped[str] = mapped_column(String(64))
    world_size: Mapped[int]
    config: Mapped[str] = mapped_column(String(64))
    config_env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    op: Mapped[str] = mapped_column(String(32))
    dtype: Mapped[str] = mapped_column(String(16))
    bytes: Mapped[int] = mapped_column(BigInteger)
    runs: Mapped[int]
    reproducible: Mapped[bool]
    busbw_gbps: Mapped[float | None] = mapped_column(Float)


class FindingCell(Base):
    """One measurement in the team's history, what the findings pages and API read: a config on a
    workload (and, for collectives, an op and dtype, its sizes folded) on a stack, from one job or
    imported file. Train jobs give one per config; collective/sweep jobs one per config × op × dtype,
    aggregating their `findings` rows. Matrices aggregate these rows in SQL, indexed for that."""

    __tablename__ = "finding_cells"
    __table_args__ = (
        UniqueConstraint("source", "config_index", "op", "dtype"),
        # A matrix is read from this index alone on PostgreSQL (an index-only scan of its scope).
        Index("ix_finding_cells_matrix", "kind", "workload", "op", "dtype", "config", "stack", "measured_at",
              postgresql_include=["identical", "comparable", "first_divergent_step", "job_id", "busbw_gbps"]),
        Index("ix_finding_cells_scope", "kind", "workload", "op", "dtype", "measured_at"),
        Index("ix_finding_cells_history", "config", "stack", "measured_at"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    source: Mapped[str] = mapped_column(String(255), index=True)
    # The job in this database it came from (null for imported files; kept when the job is deleted).
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), index=True)
    measured_at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(16))  # "train" or "collective"
    workload: Mapped[str] = mapped_column(String(64))  # the train workload; "collective" for collectives
    op: Mapped[str] = mapped_column(String(32))  # the collective op; "" for train
    dtype: Mapped[str] = mapped_column(String(16))  # the collective dtype; "" for train
    config_index: Mapped[int]
    config: Mapped[str] = mapped_column(String(64))
    config_env: Mapped[dict[str, Any]] = mapped_column(default=dict)
    # The stack: one label to group by, and its facts apart.
    stack: Mapped[str] = mapped_column(String(255))
    hardware: Mapped[str] = mapped_column(String(128))  # "4 x NVIDIA H200"
    world_size: Mapped[int]
    driver: Mapped[str | None] = mapped_column(String(64))
    runtime: Mapped[str | None] = mapped_column(String(32))  # "CUDA 12.8", "ROCm 6.2"
    torch: Mapped[str | None] = mapped_column(String(64))
    library: Mapped[str] = mapped_column(String(64))  # "NCCL 2.28.9", "gloo"
    # k of n: train, repeats identical to the first of the comparable ones; collective, sizes reproducible.
    identical: Mapped[int]
    comparable: Mapped[int]
    runs: Mapped[int]  # train: repeats run; collective: fewest fresh processes of a size
    cost: Mapped[float | None] = mapped_column(Float)  # train: against config 0 of the job
    cost_lo: Mapped[float | None] = mapped_column(Float)  # bootstrap 95 % interval
    cost_hi: Mapped[float | None] = mapped_column(Float)
    first_divergent_step: Mapped[int | None]  # train: the earliest step a repeat parted from the first
    largest_bytes: Mapped[int | None] = mapped_column(BigInteger)  # collective
    busbw_gbps: Mapped[float | None] = mapped_column(Float)  # collective: at the largest size


class HistoryVersion(Base):
    """The team history's version: one row, counted up by every change to it (reports.findings.store: a
    settled job's or an imported file's measurements replaced, or only removed), in the changing transaction.
    A reader tells from it in one lookup whether what it built from the history still holds (counting the
    history's rows to notice a removal took a scan); concurrent changes queue on the row, so a version seen
    covers every change committed before it."""

    __tablename__ = "history_version"

    id: Mapped[int] = mapped_column(primary_key=True)  # always 1
    version: Mapped[int] = mapped_column(BigInteger)


class User(Base):
    """A person of auth mode `local`: a role (viewer, member, admin) and an argon2 password hash; or a worker node
    (role worker), whose tokens of scope `worker` are its credential."""

    __tablename__ = "users"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    password_hash: Mapped[str] = mapped_column(String(255))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiToken(Base):
    """A bearer token for the CLI, CI and the SDK: only its sha256 is kept, with the scopes it grants."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]]
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    user: Mapped[User] = relationship()


class BrowserSession(Base):
    """A logged-in browser: the sha256 of its cookie, until it expires or logs out."""

    __tablename__ = "browser_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(index=True)

    user: Mapped[User] = relationship()
