"""Jobs and their runs: creation from a validated request (planned by its kind), status roll-up, lookups."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, defer, selectinload

from detlab.backend.kinds.base import InvalidJob, JobRequest, Plan
from detlab.backend.kinds.registry import KINDS, JobCreate
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
from detlab.backend.services.workers import known_workloads, queue_context, queue_state
from detlab.core import configs, preflight
from detlab.core.settings import Settings
from detlab.core.wire import explain
from detlab.core.workloads import WorkloadInfo


def get_or_create_config(*, session: Session, body: configs.ConfigBody) -> Config:
    digest = configs.content_hash(body)
    found = session.scalars(select(Config).where(Config.name == body.name, Config.hash == digest)).first()
    if found:
        return found
    config = Config(name=body.name, hash=digest, body=body.model_dump())
    session.add(config)
    session.flush()
    return config


def _validate(request: JobRequest, settings: Settings, workloads: dict[str, WorkloadInfo]) -> Plan:
    """Checks a request against the limits, and through its kind against the known workloads; returns the plan.

    Limits are checked on what each run will use: a config's own world_size overrides the job's."""
    if request.repeats > settings.max_repeats:
        raise InvalidJob(f"repeats must be <= {settings.max_repeats}")
    bodies = []
    for i, ref in enumerate(request.configs):
        try:
            bodies.append(configs.resolve(ref))
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            reason = explain(exc, "config") if isinstance(exc, ValidationError) else str(exc)
            raise InvalidJob(f"config {i}: {reason}") from exc
    worlds = [body.world_size or request.world_size for body in bodies]
    if max(worlds) > settings.max_world_size:
        where = "world_size" if request.world_size > settings.max_world_size else \
            f"config {worlds.index(max(worlds))} ({bodies[worlds.index(max(worlds))].name}): world_size"
        raise InvalidJob(f"{where} is {max(worlds)}; this server runs at most {settings.max_world_size} ranks")
    return KINDS[request.kind].plan(request, bodies=bodies, settings=settings, workloads=workloads)


def _check_load(*, session: Session, data: JobRequest, plan: Plan, settings: Settings) -> None:
    """Nothing is accepted that the workers cannot hold: each run's world size against what the workers of
    the job's queue report they can launch, and the whole job's rank-steps against the server's ceiling."""
    bodies, steps, unit = plan.bodies, plan.steps, plan.unit
    worlds = [body.world_size or data.world_size for body in bodies]
    rank_steps = data.repeats * sum(worlds) * steps
    if rank_steps > settings.max_rank_steps:
        raise InvalidJob(f"the job is {data.repeats} repeat(s) × {len(bodies)} config(s) at world sizes "
                         f"{sorted(set(worlds))} × {steps} {unit} = {rank_steps:,} rank-steps; this server takes at "
                         f"most {settings.max_rank_steps:,} (max_rank_steps): ask for fewer repeats, configs, "
                         f"ranks or {unit}")
    state = queue_state(session=session, queue=data.queue, within_s=settings.run_stale_after_s)
    if state.max_world_size is not None and max(worlds) > state.max_world_size:
        i = worlds.index(max(worlds))
        raise InvalidJob(f"config {i} ({bodies[i].name}): world_size {worlds[i]} exceeds what the workers of "
                         f"queue {data.queue!r} can run: {state.limit}")


def check_preflight(*, session: Session, plan: Plan, queue: str) -> None:
    """Fail closed: every config the job will run against the table of known-broken and no-op settings
    (detlab.core.preflight); the first match refuses the job, naming the setting and its fix."""
    stored = plan.params.get("collective")
    ctx = queue_context(session=session, queue=queue,
                        ops=frozenset(stored["ops"]) if stored else preflight.TRAIN_OPS)
    for body in plan.bodies:
        if found := preflight.check(body, ctx):
            raise InvalidJob(found[0].message())


def create_job(*, session: Session, data: JobCreate | JobRequest, settings: Settings, submitter: str | None) -> Job:
    """Validate, store the job and its runs (repeats interleaved A B A B so drift cancels)."""
    request = data.root if isinstance(data, JobCreate) else data
    plan = _validate(request, settings, known_workloads(session=session))
    _check_load(session=session, data=request, plan=plan, settings=settings)
    check_preflight(session=session, plan=plan, queue=request.queue)
    bodies, data = plan.bodies, request
    stored = [get_or_create_config(session=session, body=b) for b in bodies]
    params: dict[str, Any] = {"fingerprint_interval": data.fingerprint_interval, **plan.params}
    job = Job(kind=data.kind, workload=plan.workload, world_size=data.world_size, steps=plan.steps,
              repeats=data.repeats, params=params, config_ids=[c.id for c in stored], submitter=submitter,
              queue=data.queue)
    session.add(job)
    session.flush()
    set_tags(session=session, job=job, tags=data.tags)
    for repeat in range(data.repeats):
        for index, (config, body) in enumerate(zip(stored, bodies, strict=True)):
            session.add(Run(job_id=job.id, config_id=config.id, config_index=index, repeat=repeat,
                            world_size=body.world_size or data.world_size, steps_total=plan.steps))
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


def spec_of(job: Job) -> dict[str, Any]:
    """The request that submits this job again (a JobCreate body): its configs in full, so they can be
    edited, and its kind's own keys, sizes, repeats, queue and tags."""
    spec: dict[str, Any] = {"kind": job.kind, "world_size": job.world_size, "repeats": job.repeats,
                            "queue": job.queue, "tags": list(job.tags or []),
                            "fingerprint_interval": job.params.get("fingerprint_interval", 1),
                            "configs": [dict(c.body) for c in job.configs]}
    return {**spec, **KINDS[job.kind].spec(job)}
