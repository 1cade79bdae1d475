"""The `train` kind: a registered workload trains for S steps under each config; its runs are compared."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, Plan
from detlab.backend.models import Job
from detlab.core import configs
from detlab.core.settings import Settings
from detlab.core.wire import INT32, BitFlip, RunKind
from detlab.core.workloads import WorkloadInfo


class TrainCreate(JobRequest):
    """A train comparison: two configs compare their runs; one config, its repeats."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "train", "workload": "mlp", "configs": [{"preset": "default"}, {"preset": "full-deterministic"}],
         "world_size": 2, "steps": 20, "repeats": 2}]}}

    kind: Literal["train"] = "train"
    workload: str | None = Field(default=None, min_length=1, max_length=64)
    steps: int | None = Field(default=None, ge=1, le=INT32)
    inject_bitflip: BitFlip | None = None
    # fingerprint every collective call's input and output (DDP buckets, the workload's own calls)
    record_collectives: bool = False


def plan_train(*, workload: str | None, steps: int | None, inject_bitflip: BitFlip | None, record_collectives: bool,
               world_size: int, bodies: list[configs.ConfigBody], settings: Settings,
               workloads: dict[str, WorkloadInfo]) -> Plan:
    """The plan of training runs (a train job's, a sweep over train's): the workload's steps, checked against
    the workload's world sizes and batch, the server's steps, and where a bit flip can land."""
    if workload not in workloads:
        raise InvalidJob(f"unknown workload {workload!r}; known: {sorted(workloads)}")
    info = workloads[workload]
    steps = steps or info.default_steps
    if steps > settings.max_steps:
        raise InvalidJob(f"steps must be <= {settings.max_steps}")
    if info.script and record_collectives:
        raise InvalidJob(f"{workload} is a registered script: its own detlab.Recorder(collectives=True) "
                         "records its collectives")
    if info.script and inject_bitflip:
        raise InvalidJob(f"{workload} is a registered script: detlab cannot flip a bit inside it")
    for body in bodies:
        world = body.world_size or world_size
        if info.world_sizes and world not in info.world_sizes:
            raise InvalidJob(f"{workload} runs at world sizes {list(info.world_sizes)}, not {world} "
                             f"(config {body.name})")
        if not info.script and info.global_batch % world:  # a script splits its own batch
            raise InvalidJob(f"{workload} has a global batch of {info.global_batch}, which does not split "
                             f"evenly over world_size {world}")
        if inject_bitflip and inject_bitflip.rank >= world:
            raise InvalidJob(f"inject_bitflip.rank must be < world_size ({world} in config {body.name})")
    if inject_bitflip and inject_bitflip.step > steps:
        raise InvalidJob("inject_bitflip.step must be <= steps")
    params: dict[str, Any] = {"global_batch": info.global_batch}
    if info.script:
        params["script"] = True
    if inject_bitflip:
        params["inject_bitflip"] = inject_bitflip.model_dump()
    if record_collectives:
        params["record_collectives"] = True
    return Plan(workload=workload, steps=steps, bodies=bodies, params=params)


def train_spec(job: Job) -> dict[str, Any]:
    """The train keys of the request that submits a job of training runs again."""
    spec: dict[str, Any] = {"workload": job.workload, "steps": job.steps}
    if "inject_bitflip" in job.params:
        spec["inject_bitflip"] = job.params["inject_bitflip"]
    if job.params.get("record_collectives"):
        spec["record_collectives"] = True
    return spec


class Train(Kind):
    name = "train"
    description = "train a workload under each config and find where the runs part"
    request = TrainCreate
    report_name = "train"

    def plan(self, data: TrainCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        return plan_train(workload=data.workload, steps=data.steps, inject_bitflip=data.inject_bitflip,
                          record_collectives=data.record_collectives, world_size=data.world_size, bodies=bodies,
                          settings=settings, workloads=workloads)

    def run_kind(self, job: Job) -> RunKind:
        return "train"

    def bisect_refusal(self, job: Job) -> str | None:
        return None

    def spec(self, job: Job) -> dict[str, Any]:
        return train_spec(job)


KIND = Train()
