"""The `resume` kind: is a restarted run the run it would have been? A workload runs straight for N steps (repeat 0)
against the same workload stopped after step K, checkpointed, and continued from the checkpoint in fresh processes
(repeat 1). Built-in workloads checkpoint the model, the optimizer, the LR scheduler, the random generators and the
data position (detlab.worker.ranks.resume); a registered script gets DETLAB_RESUME_STEP and DETLAB_CHECKPOINT_DIR
and does its own (docs/sdk.md). `lose` leaves one part out of a built-in's restore, to see it named."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, Plan
from detlab.backend.kinds.train import plan_train
from detlab.backend.models import Job, Run
from detlab.core import configs
from detlab.core.settings import Settings
from detlab.core.wire import INT32, LostPart, RunKind
from detlab.core.workloads import WorkloadInfo


class ResumeCreate(JobRequest):
    """A resume check: one config, its run straight and its run resumed after `stop_at`."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "resume", "workload": "mlp", "configs": [{"preset": "default"}], "steps": 8, "stop_at": 4}]}}

    kind: Literal["resume"]
    workload: str = Field(min_length=1, max_length=64)
    steps: int = Field(ge=2, le=INT32)
    stop_at: int = Field(ge=1, le=INT32, description="the step after which the resumed run is checkpointed and "
                                                     "stopped; a fresh process continues it from there")
    lose: LostPart | None = Field(default=None, description="leave this part of the state out of the restore "
                                                            "(built-in workloads): detlab should name it")
    configs: list[dict[str, Any]] = Field(min_length=1, max_length=1)
    repeats: Literal[2] = Field(default=2, description="the straight run and the resumed one")

    @model_validator(mode="after")
    def _stop_within(self) -> ResumeCreate:
        if self.stop_at >= self.steps:
            raise ValueError(f"stop_at ({self.stop_at}) must be before the last step ({self.steps})")
        return self


class Resume(Kind):
    name = "resume"
    description = "run a workload straight and resumed from a checkpoint, and name what the resume lost"
    request = ResumeCreate
    report_name = "resume"
    records_findings = False  # a check of checkpointing, not a measurement of a config

    def plan(self, data: ResumeCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        plan = plan_train(workload=data.workload, steps=data.steps, inject_bitflip=None, record_collectives=False,
                          world_size=data.world_size, bodies=bodies, settings=settings, workloads=workloads)
        if data.lose and plan.params.get("script"):
            raise InvalidJob(f"{data.workload} is a registered script: detlab cannot leave a part out of its restore")
        plan.params["resume"] = {"stop_at": data.stop_at, **({"lose": data.lose} if data.lose else {})}
        return plan

    def run_kind(self, job: Job) -> RunKind:
        return "train"

    def run_fields(self, run: Run) -> dict[str, Any]:
        stored = run.job.params["resume"]
        if run.repeat == 0:  # straight: the same state recorded, no checkpoint
            return {"resume": {"stop_at": None}}
        return {"resume": {"stop_at": stored["stop_at"], "lose": stored.get("lose")}}

    def spec(self, job: Job) -> dict[str, Any]:
        stored = job.params["resume"]
        return {"workload": job.workload, "steps": job.steps, "stop_at": stored["stop_at"],
                **({"lose": stored["lose"]} if stored.get("lose") else {})}


KIND = Resume()
