"""Request and response bodies of the API, separate from the ORM models."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class BitFlip(BaseModel):
    """Fault injection: flip one bit of one tensor on one rank after a step (to validate detection)."""

    model_config = ConfigDict(extra="forbid")
    step: int = Field(ge=1)
    tensor: str = Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.]+$")
    rank: int = Field(default=0, ge=0)


class JobCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["train"] = "train"
    workload: str = Field(min_length=1, max_length=64)
    configs: list[dict[str, Any]] = Field(min_length=1, max_length=8)
    world_size: int = Field(default=1, ge=1)
    steps: int | None = Field(default=None, ge=1)
    repeats: int = Field(default=1, ge=1)
    fingerprint_interval: int = Field(default=1, ge=1)
    inject_bitflip: BitFlip | None = None
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
