"""The `sweep` kind: one run per cell of a cartesian product of knob values over a base config, each cell a
collective test or a train run (`sweep.over`)."""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any, Literal

from pydantic import Field

from detlab.backend.kinds.base import InvalidJob, JobRequest, Kind, Plan, ReportName
from detlab.backend.kinds.collective import CollectiveParams, collective_spec, plan_collective
from detlab.backend.kinds.train import plan_train, train_spec
from detlab.backend.models import Job
from detlab.backend.schemas import RequestBody
from detlab.core import configs
from detlab.core.settings import Settings
from detlab.core.wire import INT32, BitFlip, RunKind
from detlab.core.workloads import WorkloadInfo

MAX_SWEEP_CELLS = 64
CHANNEL_VARS = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")
TRAIN_KEYS = ("workload", "steps", "inject_bitflip", "record_collectives")


class SweepParams(RequestBody):
    """The cartesian product of knob values over the base config (configs[0]); null = library default.

    Knobs are env variable names from the allow-list, plus `channels`, which sets NCCL's
    MIN/MAX_NCHANNELS and MIN/MAX_CTAS together."""

    over: Literal["collective", "train"] = "collective"
    knobs: dict[str, list[str | None]] = Field(min_length=1, max_length=8)


class SweepCreate(JobRequest):
    """A sweep: `sweep` and one base config; a sweep over collectives takes `collective`, one over training runs
    the train keys (workload, steps, inject_bitflip, record_collectives)."""

    model_config = {"json_schema_extra": {"examples": [
        {"kind": "sweep", "configs": [{"preset": "default"}], "world_size": 2,
         "sweep": {"over": "collective", "knobs": {"NCCL_ALGO": ["Ring", "Tree", None],
                                                     "NCCL_PROTO": ["Simple", None]}}}]}}

    kind: Literal["sweep"]
    sweep: SweepParams
    collective: CollectiveParams | None = None
    workload: str | None = Field(default=None, min_length=1, max_length=64)
    steps: int | None = Field(default=None, ge=1, le=INT32)
    inject_bitflip: BitFlip | None = None
    record_collectives: bool = False


def _cell_name(values: dict[str, str | None]) -> str:
    parts = [f"{k.removeprefix('NCCL_').removeprefix('RCCL_').lower().replace('_', '')}-{v}"
             for k, v in values.items() if v is not None]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", ".".join(parts) or "default")
    return name if len(name) <= 64 else f"{name[:55]}.{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def _targets(knob: str) -> tuple[str, ...]:
    return CHANNEL_VARS if knob == "channels" else (knob,)


def expand_sweep(base: configs.ConfigBody, knobs: dict[str, list[str | None]]) -> list[configs.ConfigBody]:
    """One config per cell of the cartesian product of knob values; None leaves the knob at its default."""
    problems = []
    for name, values in knobs.items():
        # The name is checked even when every value is null: it is stored with the job and shown.
        if named := [p for t in _targets(name) if (p := configs.env_name_error(t))]:
            problems += named
            continue
        if not values:
            problems.append(f"{name}: give at least one value (null = the library default)")
        problems += [p for value in values if value is not None for t in _targets(name)
                     if (p := configs.env_error(t, value))]
    if problems:
        raise InvalidJob("sweep knobs: " + "; ".join(problems))
    cells = list(itertools.product(*knobs.values()))
    if len(cells) > MAX_SWEEP_CELLS:
        raise InvalidJob(f"the sweep has {len(cells)} cells; at most {MAX_SWEEP_CELLS}")
    swept = {t for knob in knobs for t in _targets(knob)}
    out = []
    for cell in cells:
        chosen = dict(zip(knobs, cell, strict=True))
        env = {k: v for k, v in base.env.items() if k not in swept}  # a swept knob's default is unset
        env.update({t: v for knob, v in chosen.items() if v is not None for t in _targets(knob)})
        out.append(base.model_copy(update={"env": env, "name": _cell_name(chosen)}))
    return out


def _sweep_base(job: Job) -> dict[str, Any]:
    """A sweep's base config: stored with the job; for jobs from before, its first cell without the
    swept knobs (their values in the base are lost with it)."""
    if "sweep_base" in job.params:
        return dict(job.params["sweep_base"])
    body = dict(job.configs[0].body)
    swept = {t for knob in job.params["sweep"]["knobs"] for t in _targets(knob)}
    return {**body, "name": "sweep-base", "env": {k: v for k, v in body["env"].items() if k not in swept}}


def _over(job: Job) -> Literal["collective", "train"]:
    return "collective" if job.params["sweep"].get("over", "collective") == "collective" else "train"


class Sweep(Kind):
    name = "sweep"
    description = "one run per cell of a knob product over a base config: reproducibility against bandwidth"
    request = SweepCreate

    def plan(self, data: SweepCreate, *, bodies: list[configs.ConfigBody], settings: Settings,
             workloads: dict[str, WorkloadInfo]) -> Plan:
        if len(bodies) != 1:
            raise InvalidJob("a sweep needs `sweep` (over, knobs) and exactly one base config")
        cells = expand_sweep(bodies[0], data.sweep.knobs)
        if data.sweep.over == "collective":
            if given := [k for k in TRAIN_KEYS if getattr(data, k)]:
                raise InvalidJob(f"a sweep over collectives takes no {', '.join(given)}: those are a train "
                                 "run's (sweep.over: train)")
            plan = plan_collective(data.collective, cells)
        else:
            if data.collective is not None:
                raise InvalidJob("a sweep over train runs takes no `collective` parameters")
            plan = plan_train(workload=data.workload, steps=data.steps, inject_bitflip=data.inject_bitflip,
                              record_collectives=data.record_collectives, world_size=data.world_size, bodies=cells,
                              settings=settings, workloads=workloads)
        plan.params.update(sweep=data.sweep.model_dump(), sweep_base=bodies[0].model_dump())  # base: for a rerun
        return plan

    def report(self, job: Job) -> ReportName:
        return _over(job)

    def run_kind(self, job: Job) -> RunKind:
        return _over(job)

    def spec(self, job: Job) -> dict[str, Any]:
        own = collective_spec(job) if _over(job) == "collective" else train_spec(job)
        return {**own, "configs": [_sweep_base(job)], "sweep": job.params["sweep"]}


KIND = Sweep()
