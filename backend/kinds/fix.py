"""The `fix` kind: from a base config, a workload and a world size, find the cheapest reproducible config — a search
in rounds over the knob catalogue (detlab.core.knobs, detlab.core.prescription), one trial (a config with repeats,
each run beside a run of the base: A B A B) per round, added by `advance` when the previous round's runs have
finished."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, Plan
from detlab.backend.kinds.train import plan_train
from detlab.backend.models import CANCELLED, Config, Job, Run, Worker
from detlab.backend.reports import fix as fix_report
from detlab.backend.services.workers import capacity
from detlab.core import configs, knobs, prescription
from detlab.core.settings import Settings
from detlab.core.wire import INT32, RunKind
from detlab.core.workloads import WorkloadInfo

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

MAX_TRIALS = 32


class FixCreate(JobRequest):
    """A search for the cheapest reproducible config: one base config (configs[0]), a workload, repeats (≥ 2) per
    trial, and a budget of trials (the base included)."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "fix", "workload": "scatter", "configs": [{"preset": "default", "threads": 2}], "world_size": 1,
         "steps": 6, "repeats": 2, "max_trials": 6}]}}

    kind: Literal["fix"]
    workload: str = Field(min_length=1, max_length=64)
    steps: int | None = Field(default=None, ge=1, le=INT32)
    repeats: int = Field(default=2, ge=2, le=INT32)
    max_trials: int = Field(default=8, ge=1, le=MAX_TRIALS)


def stack_of(*, session: Session, job: Job) -> knobs.Stack:
    """Where the base's runs executed: cuda when a worker that ran one reports GPUs, else cpu (a worker that does
    not say is taken for CPU: then no CUDA knob is tried)."""
    devices = {cap.device for run in job.runs if run.node and (worker := session.get(Worker, run.node))
               and (cap := capacity(worker)) is not None}
    base = configs.ConfigBody.model_validate(job.params["fix"]["base"])
    return knobs.Stack("cuda" if "cuda" in devices else "cpu", base.world_size or job.world_size)


def _config(session: Session, body: configs.ConfigBody) -> Config:
    digest = configs.content_hash(body)
    # The same lookup as services.jobs.get_or_create_config (not imported: services import the kinds).
    for found in session.query(Config).filter(Config.name == body.name, Config.hash == digest):
        return found
    config = Config(name=body.name, hash=digest, body=body.model_dump())
    session.add(config)
    session.flush()
    return config


class Fix(Kind):
    name = "fix"
    description = "find the cheapest config that makes a workload reproducible, each knob with its evidence"
    request = FixCreate
    report_name = "fix"
    records_findings = True  # its prescription per stack (reports.prescriptions), not matrix cells

    def plan(self, data: FixCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        if len(bodies) != 1:
            raise InvalidJob("a fix job takes exactly one base config (configs[0])")
        plan = plan_train(workload=data.workload, steps=data.steps, inject_bitflip=None, record_collectives=False,
                          world_size=data.world_size, bodies=bodies, settings=settings, workloads=workloads)
        world = bodies[0].world_size or data.world_size
        # Every trial after the base runs beside as many base runs (interleaved): 2·max_trials − 1 configs' repeats.
        worst = data.repeats * world * plan.steps * (2 * data.max_trials - 1)
        if worst > settings.max_rank_steps:
            raise InvalidJob(f"the search may run {data.max_trials} trial(s), each after the base with as many base "
                             f"runs, × {data.repeats} repeat(s) × world size {world} × {plan.steps} steps = "
                             f"{worst:,} rank-steps; this server takes at most "
                             f"{settings.max_rank_steps:,} (max_rank_steps): ask for fewer trials, repeats or steps")
        plan.params["fix"] = {"base": bodies[0].model_dump(), "max_trials": data.max_trials,
                              "trials": [prescription.Trial((), "base").to_json()], "order": None, "skipped": None,
                              "stack": None}
        return plan

    def run_kind(self, job: Job) -> RunKind:
        return "train"

    def spec(self, job: Job) -> dict[str, Any]:
        fix = job.params["fix"]
        return {"workload": job.workload, "steps": job.steps, "max_trials": fix["max_trials"],
                "configs": [fix["base"]]}

    def advance(self, *, session: Session, job: Job) -> bool:
        if any(r.status == CANCELLED for r in job.runs):
            return False
        fix = dict(job.params["fix"])
        base = configs.ConfigBody.model_validate(fix["base"])
        if fix.get("stack") is None:  # the base round has run: the stack is known, and so the knobs to try
            stack = stack_of(session=session, job=job)
            order, skipped = knobs.plan(base, stack)
            fix.update(stack=stack.describe(), order=order, skipped=skipped)
        trials = fix_report.trials(job)
        nxt = prescription.next_trials(trials, fix_report.outcomes(session=session, job=job), fix["order"],
                                       int(fix["max_trials"]))
        fix["trials"] = [t.to_json() for t in trials + nxt]
        job.params = {**job.params, "fix": fix}
        if not nxt:
            return False
        world = base.world_size or job.world_size
        for trial in nxt:
            config = _config(session, knobs.apply(base, trial.knobs))
            index = len(job.config_ids)
            job.config_ids = [*job.config_ids, config.id]
            for repeat in range(job.repeats):
                # A B A B: a base run before each of the trial's, sent in this order, so that the trial's cost is
                # measured against base runs of its own round and a drift of the machine between rounds cancels.
                # The base's runs of round `index` carry repeats index·R … index·R + R − 1 (fix_report.base_round).
                job.runs.append(Run(job_id=job.id, config_id=job.config_ids[0], config_index=0,
                                    repeat=index * job.repeats + repeat, world_size=world, steps_total=job.steps))
                job.runs.append(Run(job_id=job.id, config_id=config.id, config_index=index, repeat=repeat,
                                    world_size=world, steps_total=job.steps))
        session.flush()
        return True


KIND = Fix()
