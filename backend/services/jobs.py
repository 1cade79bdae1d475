"""Jobs and their runs: creation from a validated request, status roll-up, lookups."""

from __future__ import annotations

import hashlib
import itertools
import re
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, defer, selectinload

from detlab.backend.models import (
    CANCELLED,
    FAILED,
    FINISHED,
    QUEUED,
    RUNNING,
    SUCCEEDED,
    Config,
    Job,
    JobTag,
    Run,
    utcnow,
)
from detlab.backend.schemas import CollectiveParams, JobCreate
from detlab.backend.services.workers import known_workloads, queue_state
from detlab.core import configs
from detlab.core.diagnosis import DIAGNOSIS_KINDS
from detlab.core.settings import Settings
from detlab.core.wire import DiagnosisSpec, explain
from detlab.core.workloads import WorkloadInfo


class InvalidJob(ValueError):
    """A job request that cannot run; the message says what to change."""


def get_or_create_config(*, session: Session, body: configs.ConfigBody) -> Config:
    digest = configs.content_hash(body)
    found = session.scalars(select(Config).where(Config.name == body.name, Config.hash == digest)).first()
    if found:
        return found
    config = Config(name=body.name, hash=digest, body=body.model_dump())
    session.add(config)
    session.flush()
    return config


MAX_SWEEP_CELLS = 64
MAX_SIZES = 24  # message sizes of a collective job (min × factor^k)
CHANNEL_VARS = ("NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS", "NCCL_MIN_CTAS", "NCCL_MAX_CTAS")


def _cell_name(values: dict[str, str | None]) -> str:
    parts = [f"{k.removeprefix('NCCL_').removeprefix('RCCL_').lower().replace('_', '')}-{v}"
             for k, v in values.items() if v is not None]
    name = re.sub(r"[^A-Za-z0-9._-]", "_", ".".join(parts) or "default")
    return name if len(name) <= 64 else f"{name[:55]}.{hashlib.sha1(name.encode()).hexdigest()[:8]}"


def expand_sweep(base: configs.ConfigBody, knobs: dict[str, list[str | None]]) -> list[configs.ConfigBody]:
    """One config per cell of the cartesian product of knob values; None leaves the knob at its default."""
    problems = []
    for name, values in knobs.items():
        names = CHANNEL_VARS if name == "channels" else (name,)
        # The name is checked even when every value is null: it is stored with the job and shown.
        if named := [p for t in names if (p := configs.env_name_error(t))]:
            problems += named
            continue
        if not values:
            problems.append(f"{name}: give at least one value (null = the library default)")
        problems += [p for value in values if value is not None for t in names if (p := configs.env_error(t, value))]
    if problems:
        raise InvalidJob("sweep knobs: " + "; ".join(problems))
    cells = list(itertools.product(*knobs.values()))
    if len(cells) > MAX_SWEEP_CELLS:
        raise InvalidJob(f"the sweep has {len(cells)} cells; at most {MAX_SWEEP_CELLS}")
    def targets(knob: str) -> tuple[str, ...]:
        return CHANNEL_VARS if knob == "channels" else (knob,)

    swept = {t for knob in knobs for t in targets(knob)}
    out = []
    for cell in cells:
        chosen = dict(zip(knobs, cell, strict=True))
        env = {k: v for k, v in base.env.items() if k not in swept}  # a swept knob's default is unset
        env.update({t: v for knob, v in chosen.items() if v is not None for t in targets(knob)})
        out.append(base.model_copy(update={"env": env, "name": _cell_name(chosen)}))
    return out


def _validate(data: JobCreate, settings: Settings,
              workloads: dict[str, WorkloadInfo]) -> tuple[str, int, list[configs.ConfigBody]]:
    """Checks a request against the known workloads and the limits; returns (workload, steps, configs).

    Limits are checked on what each run will use: a config's own world_size overrides the job's."""
    if data.repeats > settings.max_repeats:
        raise InvalidJob(f"repeats must be <= {settings.max_repeats}")
    bodies = []
    for i, ref in enumerate(data.configs):
        try:
            bodies.append(configs.resolve(ref))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            reason = explain(exc, "config") if isinstance(exc, ValidationError) else str(exc)
            raise InvalidJob(f"config {i}: {reason}") from exc
    worlds = [body.world_size or data.world_size for body in bodies]
    if max(worlds) > settings.max_world_size:
        where = "world_size" if data.world_size > settings.max_world_size else \
            f"config {worlds.index(max(worlds))} ({bodies[worlds.index(max(worlds))].name}): world_size"
        raise InvalidJob(f"{where} is {max(worlds)}; this server runs at most {settings.max_world_size} ranks")
    kind = data.kind
    if kind == "sweep":
        if data.sweep is None or len(bodies) != 1:
            raise InvalidJob("a sweep needs `sweep` (over, knobs) and exactly one base config")
        bodies = expand_sweep(bodies[0], data.sweep.knobs)
        kind = data.sweep.over
    if kind in DIAGNOSIS_KINDS:
        return _validate_diagnosis(data, bodies, workloads)
    if data.diagnosis is not None:
        raise InvalidJob(f"a {kind} job takes no `diagnosis` parameters")
    if kind == "collective" and data.record_collectives:
        raise InvalidJob("record_collectives is a train job's: a collective job fingerprints every call already")
    if kind == "collective":
        params = data.collective or CollectiveParams()
        sizes = params.sizes()
        if not sizes or len(sizes) > MAX_SIZES or params.min_bytes > params.max_bytes:
            raise InvalidJob(f"collective sizes: min_bytes <= max_bytes, and at most {MAX_SIZES} sizes "
                             "(min × factor^k)")
        return "collective", len(params.ops) * len(params.dtypes) * len(sizes), bodies
    if data.workload not in workloads:
        raise InvalidJob(f"unknown workload {data.workload!r}; known: {sorted(workloads)}")
    workload = workloads[data.workload]
    steps = data.steps or workload.default_steps
    if steps > settings.max_steps:
        raise InvalidJob(f"steps must be <= {settings.max_steps}")
    if workload.script and data.record_collectives:
        raise InvalidJob(f"{data.workload} is a registered script: its own detlab.Recorder(collectives=True) "
                         "records its collectives")
    if workload.script and data.inject_bitflip:
        raise InvalidJob(f"{data.workload} is a registered script: detlab cannot flip a bit inside it")
    for body in bodies:
        world = body.world_size or data.world_size
        if workload.world_sizes and world not in workload.world_sizes:
            raise InvalidJob(f"{data.workload} runs at world sizes {list(workload.world_sizes)}, not {world} "
                             f"(config {body.name})")
        if not workload.script and workload.global_batch % world:  # a script splits its own batch
            raise InvalidJob(f"{data.workload} has a global batch of {workload.global_batch}, which does not split "
                             f"evenly over world_size {world}")
        if data.inject_bitflip and data.inject_bitflip.rank >= world:
            raise InvalidJob(f"inject_bitflip.rank must be < world_size ({world} in config {body.name})")
    if data.inject_bitflip and data.inject_bitflip.step > steps:
        raise InvalidJob("inject_bitflip.step must be <= steps")
    return data.workload, steps, bodies


def _validate_diagnosis(data: JobCreate, bodies: list[configs.ConfigBody], workloads: dict[str, WorkloadInfo],
                        ) -> tuple[str, int, list[configs.ConfigBody]]:
    """A batch-invariance or op-audit job: one rank per config (its world_size is 1), a workload of the
    workers' that is not a script (its model is built here), and its size in results (the run's steps)."""
    spec = data.diagnosis or DiagnosisSpec()
    if data.world_size != 1 or any((b.world_size or 1) != 1 for b in bodies):
        raise InvalidJob(f"a {data.kind} job runs one rank per config: world_size must be 1")
    if data.collective or data.sweep or data.inject_bitflip or data.steps or data.record_collectives:
        raise InvalidJob(f"a {data.kind} job takes no collective, sweep, inject_bitflip, steps or record_collectives")
    if data.kind == "op-audit" and spec.workload is not None and data.workload not in (None, spec.workload):
        raise InvalidJob("give the workload once: `workload` (diagnosis.workload is batch-invariance's)")
    workload = data.workload or spec.workload
    if data.kind == "op-audit" and workload is None:
        raise InvalidJob("an op-audit needs a workload: the one whose training step is audited")
    if workload is not None and (workload not in workloads or workloads[workload].script):
        known = sorted(name for name, info in workloads.items() if not info.script)
        raise InvalidJob(f"unknown workload {workload!r} for {data.kind} (registered scripts cannot be "
                         f"diagnosed); known: {known}")
    if data.kind == "batch-invariance":
        steps = spec.cells() + (len(spec.batch_sizes) if workload else 0)
        return workload or "batch-invariance", steps, bodies
    return str(workload), 1, bodies


def _check_load(*, session: Session, data: JobCreate, steps: int, bodies: list[configs.ConfigBody],
                settings: Settings) -> None:
    """Nothing is accepted that the workers cannot hold: each run's world size against what the workers of
    the job's queue report they can launch, and the whole job's rank-steps against the server's ceiling."""
    worlds = [body.world_size or data.world_size for body in bodies]
    rank_steps = data.repeats * sum(worlds) * steps
    if rank_steps > settings.max_rank_steps:
        unit = "steps" if data.kind == "train" or (data.sweep and data.sweep.over == "train") else "cells"
        raise InvalidJob(f"the job is {data.repeats} repeat(s) × {len(bodies)} config(s) at world sizes "
                         f"{sorted(set(worlds))} × {steps} {unit} = {rank_steps:,} rank-steps; this server takes at "
                         f"most {settings.max_rank_steps:,} (max_rank_steps): ask for fewer repeats, configs, "
                         f"ranks or {unit}")
    state = queue_state(session=session, queue=data.queue, within_s=settings.run_stale_after_s)
    if state.max_world_size is not None and max(worlds) > state.max_world_size:
        i = worlds.index(max(worlds))
        raise InvalidJob(f"config {i} ({bodies[i].name}): world_size {worlds[i]} exceeds what the workers of "
                         f"queue {data.queue!r} can run: {state.limit}")


def create_job(*, session: Session, data: JobCreate, settings: Settings, submitter: str | None) -> Job:
    """Validate, store the job and its runs (repeats interleaved A B A B so drift cancels)."""
    workloads = known_workloads(session=session)
    workload, steps, bodies = _validate(data, settings, workloads)
    _check_load(session=session, data=data, steps=steps, bodies=bodies, settings=settings)
    stored = [get_or_create_config(session=session, body=b) for b in bodies]
    params: dict[str, Any] = {"fingerprint_interval": data.fingerprint_interval}
    if data.kind in DIAGNOSIS_KINDS:
        spec = data.diagnosis or DiagnosisSpec()
        # batch-invariance checks its workload's forward (diagnosis.workload); op-audit runs the job's
        params["diagnosis"] = spec.model_copy(update={
            "workload": workload if data.kind == "batch-invariance" and workload != data.kind else None}).model_dump()
    elif workload == "collective":
        params["collective"] = {**(data.collective or CollectiveParams()).model_dump(),
                                "sizes": (data.collective or CollectiveParams()).sizes()}
    else:
        params["global_batch"] = workloads[workload].global_batch
        if workloads[workload].script:
            params["script"] = True
    if data.sweep:
        params["sweep"] = data.sweep.model_dump()
        params["sweep_base"] = configs.resolve(data.configs[0]).model_dump()  # for a rerun: cells lose it
    if data.inject_bitflip:
        params["inject_bitflip"] = data.inject_bitflip.model_dump()
    if data.record_collectives:
        params["record_collectives"] = True
    job = Job(kind=data.kind, workload=workload, world_size=data.world_size, steps=steps,
              repeats=data.repeats, params=params, config_ids=[c.id for c in stored], submitter=submitter,
              queue=data.queue)
    session.add(job)
    session.flush()
    set_tags(session=session, job=job, tags=data.tags)
    for repeat in range(data.repeats):
        for index, (config, body) in enumerate(zip(stored, bodies, strict=True)):
            session.add(Run(job_id=job.id, config_id=config.id, config_index=index, repeat=repeat,
                            world_size=body.world_size or data.world_size, steps_total=steps))
    session.flush()
    return job


def roll_up(*, session: Session, job: Job) -> None:
    """Job status from its runs."""
    statuses = [r.status for r in job.runs]
    if all(s in FINISHED for s in statuses):
        job.status = SUCCEEDED if all(s == SUCCEEDED for s in statuses) else \
            CANCELLED if CANCELLED in statuses else FAILED
        job.finished_at = job.finished_at or utcnow()
        return
    # Reopened (a run re-dispatched) or not started: not finished. Its next finish is a new time, which
    # tells the new result from the old one (services.cache.finished_key).
    job.finished_at = None
    job.status = RUNNING if any(s != QUEUED for s in statuses) else QUEUED


def load_job(*, session: Session, job_id: int) -> Job | None:
    """The job with its runs. Its stored result (hundreds of kB of JSON for a long comparison) is loaded
    when first read: most reads of a job (its page polling GET /jobs/N, a cached figure) never touch it."""
    return session.scalars(select(Job).where(Job.id == job_id)
                           .options(selectinload(Job.runs), defer(Job.result))).first()


def set_tags(*, session: Session, job: Job, tags: list[str]) -> None:
    """Replace the job's tags (validated by schemas.Tags): the list shown, and the rows the list filters on."""
    job.tags = list(tags)
    session.execute(delete(JobTag).where(JobTag.job_id == job.id))
    session.add_all(JobTag(job_id=job.id, tag=tag) for tag in dict.fromkeys(tags))
    session.flush()


def _sweep_base(job: Job) -> dict[str, Any]:
    """A sweep's base config: stored with the job; for jobs from before, its first cell without the
    swept knobs (their values in the base are lost with it)."""
    if "sweep_base" in job.params:
        return dict(job.params["sweep_base"])
    body = dict(job.configs[0].body)
    swept = {t for knob in job.params["sweep"]["knobs"] for t in (CHANNEL_VARS if knob == "channels" else (knob,))}
    return {**body, "name": "sweep-base", "env": {k: v for k, v in body["env"].items() if k not in swept}}


def spec_of(job: Job) -> dict[str, Any]:
    """The request that submits this job again (a JobCreate body): its configs in full, so they can be
    edited, and its workload, sizes, repeats, queue and tags."""
    params = job.params
    spec: dict[str, Any] = {"kind": job.kind, "world_size": job.world_size, "repeats": job.repeats,
                            "queue": job.queue, "tags": list(job.tags or []),
                            "fingerprint_interval": params.get("fingerprint_interval", 1)}
    if job.kind == "sweep":
        spec["configs"] = [_sweep_base(job)]
        spec["sweep"] = params["sweep"]
    else:
        spec["configs"] = [dict(c.body) for c in job.configs]
    if job.kind in DIAGNOSIS_KINDS:
        spec["diagnosis"] = params["diagnosis"]
        if job.kind == "op-audit":
            spec["workload"] = job.workload
    elif job.workload == "collective":
        fields = CollectiveParams.model_fields
        spec["collective"] = {k: v for k, v in (params.get("collective") or {}).items() if k in fields}
    else:
        spec.update(workload=job.workload, steps=job.steps)
    if "inject_bitflip" in params:
        spec["inject_bitflip"] = params["inject_bitflip"]
    if params.get("record_collectives"):
        spec["record_collectives"] = True
    return spec
