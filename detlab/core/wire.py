"""The wire contract: every message that crosses a process boundary between server, worker and ranks.

- server -> worker: the claim reply, `RunSpec` (what one attempt of a run executes);
- worker -> ranks: `RankSpec`, written by the launcher as JSON, read with `RankSpec.model_validate_json`;
- ranks -> worker: one `Record` per spool line (`env`, `tensors`, `step`, `trial`, `calls`), `model_dump_json()`;
- worker -> server: the ingest bodies (`Claim`, `RecordsBatch`, `CommLogUpload`, `Finish`, `Heartbeat`)
  and their replies.

Bounds fit the database columns, so a bad value is refused at the edge (a 422 naming the field) rather
than at the insert (a 500); floats that are stored must be finite. Pure pydantic, no server, no torch.
"""

from __future__ import annotations

from typing import Annotated, Literal, get_args

import numpy as np
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from detlab.core import sketch
from detlab.core.collective import DTYPES, OPS, CollectiveDtype, CollectiveOp
from detlab.core.configs import TorchFlags
from detlab.core.diagnosis import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_CALLS_PER_OP,
    DEFAULT_RERUNS,
    EVIDENCE_CHARS,
    INVARIANCE_DTYPES,
    MAX_BATCH,
    MAX_BATCH_SIZES,
    MAX_CALLS_PER_OP,
    MAX_FEATURES,
    MAX_RERUNS,
    MIN_FEATURES,
    InvarianceDtype,
    InvarianceOp,
    invariance_problem,
)
from detlab.core.text import storable
from detlab.core.workloads import WorkloadInfo

INT32 = 2**31 - 1  # an Integer column
INT64 = 2**63 - 1  # a BigInteger column
MAX_WORLD_SIZE = 1024  # as ConfigBody.world_size
MAX_RECORDS = 10_000  # per ingest batch
MAX_SEGMENTS = 1 << 16  # restores of one recording (StepRecord.segment)
MAX_ERROR_CHARS = 20_000  # a run's error text
REF_MAX_ELEMS = 1 << 22  # the float64 reference of a collective is skipped above this many output elements

Id = Annotated[int, Field(ge=1, le=INT32)]
Attempt = Annotated[int, Field(ge=1, le=INT32)]
Index = Annotated[int, Field(ge=0, le=INT32)]
Rank = Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]
WorldSize = Annotated[int, Field(ge=1, le=MAX_WORLD_SIZE)]
Bytes = Annotated[int, Field(ge=0, le=INT64)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Str16 = Annotated[str, Field(max_length=16)]
Str32 = Annotated[str, Field(max_length=32)]
Str64 = Annotated[str, Field(max_length=64)]
Str255 = Annotated[str, Field(max_length=255)]
# Worker.name is 255 long but a claim stores the name in Run.node (128): one bound for both.
WorkerName = Annotated[str, Field(min_length=1, max_length=128)]
WorkloadName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")]
EnvName = Annotated[str, Field(min_length=1, max_length=128)]
EnvValue = Annotated[str, Field(max_length=4096)]
# fingerprint digests: "fp1:" and 32 lowercase hex (String(48) columns); packed: 32 hex per tensor
FpVersion = Annotated[str, Field(pattern=r"^fp[0-9]{1,6}$")]
Digest = Annotated[str, Field(pattern=r"^fp[0-9]{1,6}:[0-9a-f]{32}$")]
PackedDigests = Annotated[str, Field(max_length=32 << 16, pattern=r"^(?:[0-9a-f]{32})*$")]
LossBits = Annotated[str, Field(pattern=r"^(?:[0-9a-f]{8}){0,2}$")]  # float32 bits; "" before the first step


class Wire(BaseModel):
    """Base of every wire model: unknown keys are refused, so a misspelt field is an error, not a default;
    every string, dict keys included, is storable text (no NUL, no lone surrogate: detlab.core.text)."""

    model_config = ConfigDict(extra="forbid")
    _text = field_validator("*")(storable)


def explain(exc: ValidationError, root: str = "value") -> str:
    """A validation error as one line a user can act on: `field.path: what was wrong; ...`."""
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or root}: {e['msg'].removeprefix('Value error, ')}"
                     for e in exc.errors())


# ---- what a run executes ---------------------------------------------------------------------------

class BitFlip(Wire):
    """Fault injection: flip one bit of one tensor on one rank after a step (to validate detection)."""

    step: int = Field(ge=1, le=INT32)
    tensor: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.]+$")
    rank: Rank = 0


class CollectiveSpec(Wire):
    """What a `collective` run measures, as its ranks take it: ops × dtypes × sizes (bytes), `trials`
    timed and fingerprinted calls per cell after `warmup` untimed ones."""

    ops: list[CollectiveOp] = Field(min_length=1, max_length=len(OPS))
    dtypes: list[CollectiveDtype] = Field(min_length=1, max_length=len(DTYPES))
    sizes: list[Annotated[int, Field(ge=4, le=1 << 40)]] = Field(min_length=1, max_length=64)
    trials: int = Field(default=5, ge=1, le=1000)
    warmup: int = Field(default=2, ge=0, le=100)

    @field_validator("sizes")
    @classmethod
    def _ascending(cls, sizes: list[int]) -> list[int]:
        return sorted(set(sizes))  # ranks build inputs for the largest and prefixes from the smallest

    def cells(self) -> int:
        """How many (op, dtype, size) cells: a collective run's steps."""
        return len(self.ops) * len(self.dtypes) * len(self.sizes)


class DiagnosisSpec(Wire):
    """What a `batch-invariance` or `op-audit` run measures (detlab.core.diagnosis).

    batch-invariance: `ops` × `dtypes` × `batch_sizes` at `features`, and, with `workload`, that workload's
    forward at the batch sizes it can fill. op-audit: one training step of the run's workload, each op's
    first `calls_per_op` calls run again `reruns` times on identical inputs."""

    ops: list[InvarianceOp] = Field(default=list(get_args(InvarianceOp)), min_length=1,
                                    max_length=len(get_args(InvarianceOp)))
    dtypes: list[InvarianceDtype] = Field(default=["float32"], min_length=1, max_length=len(INVARIANCE_DTYPES))
    batch_sizes: list[Annotated[int, Field(ge=1, le=MAX_BATCH)]] = Field(
        default=list(DEFAULT_BATCH_SIZES), min_length=1, max_length=MAX_BATCH_SIZES)
    features: int = Field(default=256, ge=MIN_FEATURES, le=MAX_FEATURES)
    workload: WorkloadName | None = None  # batch-invariance: also check this workload's forward
    reruns: int = Field(default=DEFAULT_RERUNS, ge=2, le=MAX_RERUNS)
    calls_per_op: int = Field(default=DEFAULT_CALLS_PER_OP, ge=1, le=MAX_CALLS_PER_OP)

    @field_validator("ops", "dtypes")
    @classmethod
    def _distinct(cls, names: list[str]) -> list[str]:
        return list(dict.fromkeys(names))

    @model_validator(mode="after")
    def _holdable(self) -> DiagnosisSpec:
        self.batch_sizes = sorted(set(self.batch_sizes))
        if problem := invariance_problem(self.features, self.batch_sizes):
            raise ValueError(problem)
        return self

    def cells(self) -> int:
        """How many (op, dtype, batch size) results a batch-invariance run records."""
        return len(self.ops) * len(self.dtypes) * len(self.batch_sizes)


RunKind = Literal["train", "collective", "batch-invariance", "op-audit"]
# The runs a registered script can be, and what in the script records each (under the worker, docs/sdk.md).
SCRIPT_ENTRIES: dict[RunKind, str] = {"train": "detlab.Recorder", "op-audit": "detlab.audit(step)",
                                      "batch-invariance": "detlab.batch_invariance(model, forward, samples)"}
SCRIPT_RUN_KINDS: tuple[RunKind, ...] = tuple(SCRIPT_ENTRIES)


# The parts of a training state a resume can lose (the `resume` kind leaves one out of a built-in's restore on request).
LostPart = Literal["optimizer", "rng", "data", "scheduler"]


class ResumePlan(Wire):
    """A run of a `resume` job. `stop_at` None: the straight run (the same state recorded, no checkpoint); else the
    run stopped after `stop_at`, checkpointed and continued in fresh processes. The worker adds `phase` (which of
    the two launches) and `checkpoint_dir` (where the first writes and the second reads) for its ranks."""

    stop_at: int | None = Field(default=None, ge=1, le=INT32)
    lose: LostPart | None = None
    phase: Literal["stop", "continue"] | None = None
    checkpoint_dir: str | None = Field(default=None, max_length=4096)


class RunPlan(Wire):
    """What one run executes, whoever launches it: the knobs of its config and of its job."""

    kind: RunKind
    workload: WorkloadName
    world_size: WorldSize
    steps: int = Field(ge=1, le=INT32)
    seed: int = Field(default=0, ge=0, lt=2**32)
    threads: int | None = Field(default=None, ge=1, le=256)
    # Only bounded here: the worker checks names and values against the allow-list before launching.
    env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=64)
    torch: TorchFlags | None = None  # None leaves torch's own defaults (verify-collective)
    fingerprint_interval: int = Field(default=1, ge=1, le=INT32)
    inject_bitflip: BitFlip | None = None
    collective: CollectiveSpec | None = None
    diagnosis: DiagnosisSpec | None = None
    # A bisect run: train to this step unrecorded, record this step module call by module call, and stop
    # (detlab.core.bisect names the entries).
    probe_step: int | None = Field(default=None, ge=1, le=INT32)
    record_collectives: bool = False  # train: fingerprint every collective's input and output (`calls` records)
    resume: ResumePlan | None = None  # a run of a `resume` job (detlab.worker.ranks.resume)

    @model_validator(mode="after")
    def _collective_iff_kind(self) -> RunPlan:
        if self.kind == "collective" and self.collective is None:
            raise ValueError("a collective run needs `collective` (ops, dtypes, sizes, trials, warmup)")
        if self.kind != "collective" and self.collective is not None:
            raise ValueError(f"a {self.kind} run takes no `collective` parameters")
        if self.kind in ("batch-invariance", "op-audit") and self.diagnosis is None:
            raise ValueError(f"a {self.kind} run needs `diagnosis` parameters")
        if self.kind in ("train", "collective") and self.diagnosis is not None:
            raise ValueError(f"a {self.kind} run takes no `diagnosis` parameters")
        if self.probe_step is not None and (self.kind != "train" or self.probe_step > self.steps):
            raise ValueError("probe_step is a step of a train run: 1 <= probe_step <= steps")
        return self


class RunSpec(RunPlan):
    """The claim reply: one attempt of one run, as the server hands it to a worker. `lease`: the attempt's secret;
    its records, heartbeats and finish carry it (header X-Detlab-Lease), and the server takes them from no one else."""

    run_id: Id
    attempt: Attempt
    lease: str | None = Field(default=None, max_length=128, repr=False)


class RankSpec(RunPlan):
    """What every rank program reads (spec.json): the run's plan plus what the launcher adds."""

    spool_dir: str | None = Field(default=None, max_length=4096)  # None: records are only returned
    device: Literal["auto", "cpu", "cuda"] = "auto"
    ref_max_elems: int = Field(default=REF_MAX_ELEMS, ge=0, le=INT64)

    @classmethod
    def for_run(cls, spec: RunSpec, *, device: Literal["auto", "cpu", "cuda"] = "auto") -> RankSpec:
        """The ranks' spec of a claimed run (run id, attempt and lease stay with the worker)."""
        return cls.model_validate({**spec.model_dump(exclude={"run_id", "attempt", "lease"}), "device": device})


# ---- what ranks spool ------------------------------------------------------------------------------

class TorchFacts(Wire):
    """The torch flags in effect on a rank, to set beside what the config asked for."""

    deterministic_algorithms: bool
    cudnn_deterministic: bool
    cudnn_benchmark: bool
    allow_tf32: bool
    num_threads: int = Field(ge=1, le=INT32)


# A rank's logical position in the run's parallel layout: mesh dimension name -> coordinate ({"dp": 1, "tp": 0}).
# Runs of different world sizes or rank numberings line up by it (detlab.core.positions).
MeshDimName = Annotated[str, Field(min_length=1, max_length=16, pattern=r"^[A-Za-z][A-Za-z0-9_]*$")]
Position = Annotated[dict[MeshDimName, Annotated[int, Field(ge=0, lt=MAX_WORLD_SIZE)]], Field(min_length=1,
                                                                                              max_length=8)]


class PreflightFinding(Wire):
    """A rule of the preflight table (detlab.core.preflight) that a rank's process matched: what matched, why it
    matters, the fix, the source."""

    rule: Str64
    matched: Annotated[str, Field(max_length=500)]
    reason: Annotated[str, Field(max_length=2000)]
    fix: Annotated[str, Field(max_length=1000)]
    source: Annotated[str, Field(max_length=1000)]


class EnvRecord(Wire):
    """A rank's stack: host, device, driver and library versions, environment and torch flags in effect;
    `position`: its logical position (dp, tp, pp, cp ...), None where not known; `preflight`: the known-broken or
    no-op settings its process ran with."""

    type: Literal["env"] = "env"
    rank: Rank
    host: Str255 | None = None
    device: Str255 | None = None
    driver: Str64 | None = None
    cuda: Str32 | None = None
    hip: Str32 | None = None
    torch: Str64 | None = None
    nccl: Str32 | None = None
    backend: Str16 | None = None
    fingerprint_impl: Str32 | None = None
    effective_env: dict[EnvName, EnvValue] = Field(default_factory=dict, max_length=512)
    torch_flags: TorchFacts | None = None
    position: Position | None = None
    # What preflight found in the rank's process at start (empty: nothing); None: not checked (older recorders).
    preflight: list[PreflightFinding] | None = Field(default=None, max_length=32)


# Which part of the training state a recorded tensor belongs to (the comparison names the first that differs).
TensorComponent = Literal["parameters", "buffers", "optimizer", "gradients"]


class TensorInfo(Wire):
    index: Index
    name: Annotated[str, Field(min_length=1, max_length=255)]
    shape: list[Bytes] = Field(max_length=32)
    dtype: Annotated[str, Field(min_length=1, max_length=32)]
    component: TensorComponent | None = None  # None: recorded before components were (a parameter, or `.grad`)


class Placement(Wire):
    """A DTensor as one rank holds it (FSDP2, tensor parallel): the device mesh's shape, one placement per mesh
    dimension as torch prints it (`Shard(dim=0)`, `Replicate()`, `Partial(sum)`), this rank's coordinate on the
    mesh, the global shape, and where the local shard starts in it (None where torch cannot say)."""

    mesh_shape: list[WorldSize] = Field(min_length=1, max_length=8)
    placements: list[Str64] = Field(min_length=1, max_length=8)
    coordinate: list[Index] = Field(max_length=8)
    global_shape: list[Bytes] = Field(max_length=32)
    offset: list[Bytes] | None = Field(default=None, max_length=32)


class TensorLayout(Wire):
    """How one recorded tensor lies over the ranks: its DTensor placement (None: a plain tensor) and the lowest
    rank of the ranks that must hold a bit-equal copy of it (None: no rank need: sharded, or not known)."""

    index: Index
    placement: Placement | None = None
    replica_of: Rank | None = None


class TensorsRecord(Wire):
    """A rank's tensor list: the order of the digests in its `step` records (the built-in ranks write rank 0's,
    the SDK each rank's own). `layouts` (SDK, optional): the tensors among them that are DTensors or replicas."""

    type: Literal["tensors"] = "tensors"
    tensors: list[TensorInfo] = Field(max_length=1 << 16)
    layouts: list[TensorLayout] = Field(default_factory=list, max_length=1 << 16)

    @model_validator(mode="after")
    def _layouts_name_tensors(self) -> TensorsRecord:
        indices = [layout.index for layout in self.layouts]
        unknown = set(indices) - {t.index for t in self.tensors}
        if unknown or len(set(indices)) != len(indices):
            raise ValueError(f"layouts must describe distinct tensors of the list (unknown indices: "
                             f"{sorted(unknown)[:5]})")
        return self


class Drift(Wire):
    """Per tensor, in the digests' order: float64 sum, L2 norm and max |x| (`stats`, 3 numbers) and the count
    sketch (`sketch`, K numbers) of detlab.core.sketch's `version`; little-endian float64 as hex. Every number
    is finite: a rank whose tensors hold NaN or inf records none of this (its digests say the rest). In Python the
    numbers may also be given as their raw bytes (the recorder's writer does): checked as they are, kept as hex."""

    version: Literal["cs1"] = "cs1"  # detlab.core.sketch.VERSION
    stats: str = Field(max_length=sketch.MAX_TENSORS * sketch.STAT_BYTES * 2)
    sketch: str = Field(max_length=sketch.MAX_TENSORS * sketch.SKETCH_BYTES * 2)

    def tensors(self) -> int:
        return len(self.stats) // (2 * sketch.STAT_BYTES)

    @field_validator("stats", "sketch", mode="before")
    @classmethod
    def _finite_hex(cls, value: object, info: ValidationInfo) -> object:
        """Decoded once (text) or not at all (bytes): lowercase hex of whole float64, none of them NaN or inf."""
        name = info.field_name
        limit = sketch.MAX_TENSORS * (sketch.STAT_BYTES if name == "stats" else sketch.SKETCH_BYTES)
        if isinstance(value, (bytes, bytearray)):
            if len(value) > limit:
                raise ValueError(f"{name} holds the numbers of at most {sketch.MAX_TENSORS} tensors")
            raw, text = bytes(value), value.hex()
        elif isinstance(value, str) and len(value) <= 2 * limit:
            try:  # hex digits and whitespace; as long as the text, no whitespace (cheaper than a pattern)
                raw = bytes.fromhex(value)
            except ValueError:
                raw = b""
            if 2 * len(raw) != len(value) or any(upper in value for upper in "ABCDEF"):
                raise ValueError(f"{name} must be lowercase hex digits, 16 per float64")
            text = value
        else:  # another type, or too long to decode: the field's own checks say what is wrong
            return value
        if len(raw) % 8:
            raise ValueError(f"{name} must be lowercase hex digits, 16 per float64")
        if not np.isfinite(np.frombuffer(raw, dtype="<f8")).all():
            raise ValueError(f"{name} holds a NaN or an infinity: record no drift data for such a step")
        return text

    @model_validator(mode="after")
    def _whole(self) -> Drift:
        if len(self.stats) % (2 * sketch.STAT_BYTES) or len(self.sketch) != self.tensors() * 2 * sketch.SKETCH_BYTES:
            raise ValueError(f"stats must hold {sketch.STATS} and sketch {sketch.K} float64 per tensor, for the "
                             f"same tensors (got {len(self.stats) // 16} and {len(self.sketch) // 16} numbers)")
        return self


StateKey = Annotated[str, Field(min_length=1, max_length=255)]
StateValue = Annotated[str, Field(max_length=64)]  # a digest (32 hex) or a short value as text (an lr)
StateEntries = Annotated[dict[StateKey, StateValue], Field(max_length=4096)]


class StepState(Wire):
    """What a step records beside its tensors, entry by entry (name -> digest or value as text), compared for
    equality: the step's input (`batch`, its tensors by path: `x`, `[0]`, `input_ids`), the random generators'
    states after it (`rng`: `torch cpu`, `torch cuda:0`, `numpy`, `python`, `rng[0]` ...) and the optimizer's
    hyperparameters and non-tensor state (`optimizer`: `param_groups[0].lr`, `fc1.weight.step` ...). None: not
    recorded."""

    batch: StateEntries | None = None
    rng: StateEntries | None = None
    optimizer: StateEntries | None = None


class StepRecord(Wire):
    """One rank's state after one step: the model's digest, one digest per tensor, the loss's bits, and (optional:
    records from before detlab took them, or without them) per-tensor statistics and sketches.

    A recording continued after a restore (Recorder(resume=True)) is in segments: the records of the n-th process
    carry `segment` n; its first record (`restored`) is the restored state of the checkpoint's step, recorded
    again beside the record of that step that the first process made."""

    type: Literal["step"] = "step"
    step: Index
    rank: Rank
    fp_version: FpVersion
    model_digest: Digest
    digests: PackedDigests
    loss_bits: LossBits
    loss: FiniteFloat | None = None  # None before the first step, or when the loss is not finite (bits keep it)
    step_time_s: Seconds
    drift: Drift | None = None
    state: StepState | None = None
    segment: int = Field(default=0, ge=0, le=MAX_SEGMENTS)
    restored: bool = False

    @model_validator(mode="after")
    def _drift_per_digest(self) -> StepRecord:
        if self.drift is not None and self.drift.tensors() != len(self.digests) // 32:
            raise ValueError(f"drift describes {self.drift.tensors()} tensors, the digests {len(self.digests) // 32}")
        if self.restored and self.segment == 0:
            raise ValueError("a restored record belongs to a resumed segment (segment >= 1)")
        return self


class TrialRecord(Wire):
    """One timed collective call on one rank: output digest, time, error against the float64 reference."""

    type: Literal["trial"] = "trial"
    op: CollectiveOp
    dtype: CollectiveDtype
    bytes: Bytes
    count: Bytes
    op_bytes: Bytes
    world_size: WorldSize
    trial: Index
    rank: Rank
    digest: Digest
    prefix_digest: Digest | None = None
    fp_version: FpVersion
    time_s: Seconds
    err_max_abs: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    err_max_ulp: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    frac_diff: Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)] | None = None
    impl: Str32 | None = None

    @model_validator(mode="after")
    def _rank_in_world(self) -> TrialRecord:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is outside world_size {self.world_size}")
        return self


class InvarianceRecord(Wire):
    """One (op, dtype, batch size) of a batch-invariance run: row 0 of the batched result against the batch-1
    result, bit for bit, and their largest distance in units in the last place."""

    type: Literal["invariance"] = "invariance"
    rank: Rank = 0
    op: InvarianceOp
    dtype: InvarianceDtype
    batch_size: int = Field(ge=1, le=MAX_BATCH)
    features: int = Field(ge=MIN_FEATURES, le=MAX_FEATURES)
    invariant: bool
    max_ulp: int = Field(ge=0, le=INT64)


class ModelInvarianceRecord(Wire):
    """A workload's forward of its sample 0 alone against inside a batch of `batch_size`: the first module (in
    call order) whose output for sample 0 differs, None when every module's is equal."""

    type: Literal["model-invariance"] = "model-invariance"
    rank: Rank = 0
    workload: WorkloadName
    batch_size: int = Field(ge=1, le=MAX_BATCH)
    invariant: bool
    first_module: Str255 | None = None
    modules_compared: int = Field(ge=0, le=INT32)


class AuditOpRecord(Wire):
    """One aten op of an op-audit's training step: how often it ran and whether it is nondeterministic here,
    by PyTorch's deterministic-algorithms alert or by different bits on re-runs of identical inputs.
    `distinct`: the most distinct outputs one re-run call gave (None: not re-run); `evidence` says which."""

    type: Literal["audit-op"] = "audit-op"
    rank: Rank = 0
    op: Annotated[str, Field(min_length=1, max_length=128)]
    count: int = Field(ge=1, le=INT64)
    nondeterministic: bool | None
    alert: bool | None = None  # None: the check could not run the op
    distinct: int | None = Field(default=None, ge=1, le=MAX_RERUNS)
    reruns: int = Field(default=0, ge=0, le=MAX_RERUNS)
    evidence: str = Field(max_length=EVIDENCE_CHARS)



MAX_CALLS = 1 << 14  # collective calls recorded per step and rank


class CallInfo(Wire):
    """One collective call as a training loop made it: the torch function (`all_reduce`, `ddp_allreduce` for a
    DDP bucket ...), the input's dtype and element count, and the size of the group it ran over."""

    op: Annotated[str, Field(min_length=1, max_length=32, pattern=r"^[a-z_]+$")]
    dtype: Annotated[str, Field(min_length=1, max_length=16, pattern=r"^[a-z0-9_]+$")]
    count: Bytes
    group_size: WorldSize


class CallsRecord(Wire):
    """One rank's collective calls within one step, in call order (a call's `seq` is its index): what each call
    was, and the digests of its input and of its output, packed as in `step` records. `unread`: the calls whose
    output was never waited for (async_op=True without wait()); their output digest is zeros, not compared."""

    type: Literal["calls"] = "calls"
    step: Index
    rank: Rank
    fp_version: FpVersion
    calls: list[CallInfo] = Field(min_length=1, max_length=MAX_CALLS)
    inputs: PackedDigests
    outputs: PackedDigests
    unread: list[Index] = Field(default_factory=list, max_length=MAX_CALLS)

    @model_validator(mode="after")
    def _one_digest_per_call(self) -> CallsRecord:
        n = len(self.calls)
        if len(self.inputs) != 32 * n or len(self.outputs) != 32 * n:
            raise ValueError(f"inputs and outputs hold one digest (32 hex) per call: {n} calls")
        if any(i >= n for i in self.unread):
            raise ValueError("unread names a call the record does not hold")
        return self



Record = Annotated[EnvRecord | TensorsRecord | StepRecord | TrialRecord | CallsRecord | InvarianceRecord
                   | ModelInvarianceRecord | AuditOpRecord, Field(discriminator="type")]
RECORD: TypeAdapter[EnvRecord | TensorsRecord | StepRecord | TrialRecord | CallsRecord | InvarianceRecord
                    | ModelInvarianceRecord | AuditOpRecord] = TypeAdapter(Record)
DIAGNOSIS_RECORDS = (InvarianceRecord, ModelInvarianceRecord, AuditOpRecord)


# ---- ingest bodies and replies -----------------------------------------------------------------------

class Claim(Wire):
    worker: WorkerName


class RecordsBatch(Wire):
    attempt: Attempt
    records: list[Record] = Field(max_length=MAX_RECORDS)


class RecordsAccepted(Wire):
    accepted: int


class CommLogUpload(Wire):
    """One process's NCCL/RCCL debug log, zlib-compressed and base64-encoded (head and tail when cut)."""

    attempt: Attempt
    rank: Rank
    zlib_b64: str = Field(max_length=8 << 20)
    raw_bytes: Bytes
    truncated: bool = False


class CommLogStored(Wire):
    """What the server read from a log: the library and its version (None when it found none)."""

    version: str | None
    library: str | None


class Finish(Wire):
    attempt: Attempt
    status: Literal["succeeded", "failed"]
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)


class RunStatus(Wire):
    status: str


# ---- recordings: runs of a team's own training, streamed or uploaded by the SDK ------------------------

# A job's tags (the jobs list filters on them, a recording's come from the SDK): at most MAX_TAGS, each
# a letter or digit then letters, digits and . _ : = + -; repeats dropped.
TAG_LENGTH = 32
MAX_TAGS = 16
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:=+-]*$"
Tag = Annotated[str, Field(min_length=1, max_length=TAG_LENGTH, pattern=TAG_PATTERN)]


def _unique(tags: list[str]) -> list[str]:
    return list(dict.fromkeys(tags))


Tags = Annotated[list[Tag], Field(max_length=MAX_TAGS, description=(
    f"at most {MAX_TAGS} tags of 1-{TAG_LENGTH} characters: a letter or digit, then letters, digits and . _ : = + -")),
    AfterValidator(_unique)]
# The recording's own id, drawn once by the SDK and kept in run.json: what makes opening it again (another
# rank, a retry, `detlab upload` of the same directory) land on the same run.
RecordingId = Annotated[str, Field(min_length=8, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


class RecordingOpen(Wire):
    """Open (or find again) the server run of an SDK recording; every rank and every retry sends the same."""

    recording: RecordingId
    name: str | None = Field(default=None, max_length=64)
    tags: Tags = Field(default_factory=list)
    world_size: WorldSize
    workload: WorkloadName = "sdk"


class RecordingOpened(Wire):
    job_id: int
    run_id: int
    attempt: Attempt
    status: str  # "running" until every rank closed: a finished recording takes no more records


class RecordingClose(Wire):
    """One rank is done; the run finishes when every rank of its world has closed (failed if one failed)."""

    rank: Rank
    status: Literal["succeeded", "failed"]
    error: str | None = Field(default=None, max_length=MAX_ERROR_CHARS)


class WorkerCapacity(Wire):
    """How many ranks of one run a worker can launch: one GPU each (nccl), or a share of its CPU cores (gloo)."""

    device: Literal["cuda", "cpu"]  # where its ranks run
    gpus: int = Field(ge=0, le=MAX_WORLD_SIZE)
    cpu_cores: int = Field(ge=1, le=1 << 16)
    ranks_per_core: int = Field(default=1, ge=1, le=64)  # gloo ranks it starts per core (DETLAB_CPU_RANKS_PER_CORE)
    # The torch and CUDA runtime its GPU ranks run (torch.__version__, torch.version.cuda): preflight rules that
    # depend on them (detlab.core.preflight). None: a CPU worker, or one that does not say.
    torch: Str64 | None = None
    cuda: Str32 | None = None

    @property
    def max_world_size(self) -> int:
        return self.gpus if self.device == "cuda" else self.cpu_cores * self.ranks_per_core

    def describe(self) -> str:
        """The limit in words, e.g. `8 GPUs (nccl)` or `8 gloo ranks (2 CPU cores × 4 ranks per core)`."""
        if self.device == "cuda":
            return f"{self.gpus} GPU{'s' if self.gpus != 1 else ''} (nccl)"
        return f"{self.max_world_size} gloo ranks ({self.cpu_cores} CPU cores × {self.ranks_per_core} ranks per core)"


class WorkerInfo(Wire):
    """What a worker offers, sent with every heartbeat (the server need not have its workloads installed)."""

    workloads: list[WorkloadInfo] = Field(default_factory=list, max_length=256)
    capacity: WorkerCapacity | None = None  # None: a worker that does not say (the server checks nothing)


LEASE_HEADER = "X-Detlab-Lease"  # the claim's lease, sent with every write of that attempt


class Heartbeat(Wire):
    """A worker is alive; `run_id`/`attempt` name the run it is executing, if any."""

    worker: WorkerName
    queue: str = Field(min_length=1, max_length=64)
    run_id: Id | None = None
    attempt: Attempt | None = None
    info: WorkerInfo = Field(default_factory=WorkerInfo)


class HeartbeatAck(Wire):
    """`stop`: the run the heartbeat named is no longer this worker's to execute (cancelled, finished, or
    another attempt owns it): kill its ranks now; `reason` says why."""

    ok: bool
    stop: bool = False
    reason: str | None = Field(default=None, max_length=1024)
