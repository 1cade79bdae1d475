"""Request and response bodies of the API, separate from the ORM models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from detlab.core.collective import DTYPES, OPS, CollectiveDtype, CollectiveOp


class BitFlip(BaseModel):
    """Fault injection: flip one bit of one tensor on one rank after a step (to validate detection)."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=1)
    tensor: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.]+$")
    rank: int = Field(default=0, ge=0)




class CollectiveParams(BaseModel):
    """What a `collective` run measures: ops × dtypes × message sizes, T trials each."""

    model_config = ConfigDict(extra="forbid")
    ops: list[CollectiveOp] = Field(default=["all_reduce_sum"], min_length=1, max_length=len(OPS))
    dtypes: list[CollectiveDtype] = Field(default=["float32"], min_length=1, max_length=len(DTYPES))
    min_bytes: int = Field(default=4096, ge=64, le=1 << 33)
    max_bytes: int = Field(default=1 << 20, ge=64, le=1 << 33)
    step_factor: int = Field(default=4, ge=2, le=1024)
    trials: int = Field(default=5, ge=1, le=1000)
    warmup: int = Field(default=2, ge=0, le=100)

    def sizes(self) -> list[int]:
        sizes, size = [], self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size *= self.step_factor
        return sizes


class SweepParams(BaseModel):
    """The cartesian product of knob values over the base config (configs[0]); null = library default.

    Knobs are env variable names from the allow-list, plus `channels`, which sets NCCL's
    MIN/MAX_NCHANNELS and MIN/MAX_CTAS together."""

    model_config = ConfigDict(extra="forbid")
    over: Literal["collective", "train"] = "collective"
    knobs: dict[str, list[str | None]] = Field(min_length=1, max_length=8)


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["train", "collective", "sweep"] = "train"
    workload: str | None = Field(default=None, min_length=1, max_length=64)
    configs: list[dict[str, Any]] = Field(min_length=1, max_length=8)
    world_size: int = Field(default=1, ge=1)
    steps: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    fingerprint_interval: int = Field(default=1, ge=1)
    inject_bitflip: BitFlip | None = None
    collective: CollectiveParams | None = None
    sweep: SweepParams | None = None
    queue: str = Field(default="default", pattern=r"^[A-Za-z0-9._-]{1,64}$")


class RunRead(BaseModel):
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
    id: int
    name: str
    hash: str
    body: dict[str, Any]


class JobRead(BaseModel):
    id: int
    kind: str
    workload: str
    status: str
    world_size: int
    steps: int
    repeats: int
    params: dict[str, Any]
    created_at: str
    configs: list[ConfigRead]
    runs: list[RunRead]
    progress: float


class JobSummary(BaseModel):
    id: int
    kind: str
    workload: str
    status: str
    created_at: str
    world_size: int
    steps: int
    repeats: int
    config_names: list[str]
    verdict: str | None


class JobsPage(BaseModel):
    items: list[JobSummary]
    total: int


class Claim(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=255)


class RecordsBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: int = Field(ge=1)
    records: list[dict[str, Any]] = Field(max_length=10_000)


class CommLogUpload(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: int = Field(ge=1)
    rank: int = Field(ge=0)
    zlib_b64: str = Field(max_length=8 << 20)
    raw_bytes: int = Field(ge=0)
    truncated: bool = False


class Finish(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt: int = Field(ge=1)
    status: Literal["succeeded", "failed"]
    error: str | None = Field(default=None, max_length=20_000)


class Heartbeat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    worker: str = Field(min_length=1, max_length=255)
    queue: str = Field(min_length=1, max_length=64)
    run_id: int | None = None
    attempt: int | None = None
    info: dict[str, Any] = Field(default_factory=dict)
