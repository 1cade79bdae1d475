"""The `collective` kind: collectives on identical seeded inputs, T trials × message sizes, under each config."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, Plan
from detlab.backend.models import Job
from detlab.backend.schemas import RequestBody
from detlab.core import configs
from detlab.core.collective import DTYPES, OPS, CollectiveDtype, CollectiveOp
from detlab.core.settings import Settings
from detlab.core.wire import RunKind
from detlab.core.workloads import WorkloadInfo

MAX_SIZES = 24  # message sizes of a collective job (min × factor^k)


class CollectiveParams(RequestBody):
    """What a `collective` run measures: ops × dtypes × message sizes, T trials each."""

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


class CollectiveCreate(JobRequest):
    """A collective test of each config."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "collective", "configs": [{"preset": "default"}, {"preset": "nccl-ring-simple"}], "world_size": 2,
         "collective": {"ops": ["all_reduce_sum"], "dtypes": ["float32"], "min_bytes": 4096,
                        "max_bytes": 1 << 20}}]}}

    kind: Literal["collective"]
    collective: CollectiveParams | None = None


def plan_collective(params: CollectiveParams | None, bodies: list[configs.ConfigBody]) -> Plan:
    """The plan of collective runs (a collective job's, a sweep over collectives'): each run is ops × dtypes ×
    sizes cells."""
    params = params or CollectiveParams()
    sizes = params.sizes()
    if not sizes or len(sizes) > MAX_SIZES or params.min_bytes > params.max_bytes:
        raise InvalidJob(f"collective sizes: min_bytes <= max_bytes, and at most {MAX_SIZES} sizes "
                         "(min × factor^k)")
    return Plan(workload="collective", steps=len(params.ops) * len(params.dtypes) * len(sizes), bodies=bodies,
                params={"collective": {**params.model_dump(), "sizes": sizes}}, unit="cells")


def collective_spec(job: Job) -> dict[str, Any]:
    """The collective keys of the request that submits a job of collective runs again."""
    fields = CollectiveParams.model_fields
    return {"collective": {k: v for k, v in (job.params.get("collective") or {}).items() if k in fields}}


class Collective(Kind):
    name = "collective"
    description = "collectives on identical seeded inputs: distinct outputs per size, bus bandwidth"
    request = CollectiveCreate
    report_name = "collective"

    def plan(self, data: CollectiveCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        return plan_collective(data.collective, bodies)

    def run_kind(self, job: Job) -> RunKind:
        return "collective"

    def spec(self, job: Job) -> dict[str, Any]:
        return collective_spec(job)


KIND = Collective()
