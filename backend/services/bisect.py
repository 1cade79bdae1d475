"""Bisect jobs: a diverged train pair replayed up to its first divergent step, that step probed module by module.

Built-in workloads are probed by their rank program (worker/ranks/train.py), registered scripts by the
detlab.Recorder in them (detlab.sdk.probing); SDK recordings cannot be run again.
A bisect job is a train job in everything but its kind and its runs' `probe_step` (detlab.core.wire.RunPlan):
the same workload, world size, configs (so seeds and knobs) and fault injection as the pair it replays, made by
`jobs.create_job`, so limits, queues and the run lifecycle (claim, records, finish, cancel) are the train ones.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.kinds.base import InvalidJob
from detlab.backend.kinds.registry import kind_of
from detlab.backend.kinds.train import TrainCreate
from detlab.backend.models import BISECT, FINISHED, Job, Run
from detlab.backend.reports import train as train_report
from detlab.backend.schemas import BisectCreate
from detlab.backend.services.jobs import create_job
from detlab.core import compare
from detlab.core.settings import Settings


def pair_runs(job: Job, pair: tuple[int, int]) -> tuple[Run, Run]:
    """The first repeat of each of the two configs (their indices in the job)."""
    found = {(r.config_index, r.repeat): r for r in job.runs}
    n = len(job.config_ids)
    if pair[0] == pair[1] or max(pair) >= n:
        raise InvalidJob(f"pair must name two different configs of job {job.id}, each in 0..{n - 1}; got {list(pair)}")
    if (pair[0], 0) not in found or (pair[1], 0) not in found:
        raise InvalidJob(f"job {job.id} has no run of config {pair[0] if (pair[0], 0) not in found else pair[1]}")
    return found[(pair[0], 0)], found[(pair[1], 0)]


def _source_error(job: Job) -> str | None:
    """Why this job cannot be bisected, or None."""
    if refusal := kind_of(job.kind).bisect_refusal(job):
        return refusal
    if job.status not in FINISHED:
        return f"job {job.id} is {job.status}; bisect it once it has finished"
    return None


def first_divergent_step(*, session: Session, job: Job, a: Run, b: Run) -> int:
    """The step at which runs a and b first differ (model digests), or InvalidJob saying why there is none."""
    data = [train_report.load_run(session=session, run=r, workload=job.workload,
                                  interval=int(job.params.get("fingerprint_interval", 1))) for r in (a, b)]
    result = compare.compare_runs(*data)
    if result.verdict != "diverged" or result.first_divergent_step is None:
        why = f": {result.reason}" if result.verdict == "incomparable" else ""
        raise InvalidJob(f"runs {a.id} and {b.id} compare {result.verdict}{why}; only a diverged pair has a "
                         "first divergent step to replay")
    return result.first_divergent_step


def create_bisect(*, session: Session, job: Job, data: BisectCreate, settings: Settings,
                  submitter: str | None) -> Job:
    """A bisect job of `job`'s pair (configs data.pair, default the pair its verdict is about: 0 and 1), probing
    data.step (default the pair's first divergent step)."""
    if reason := _source_error(job):
        raise InvalidJob(reason)
    pair = (data.pair[0], data.pair[1]) if data.pair else (0, 1)
    a, b = pair_runs(job, pair)
    if a.world_size != b.world_size:
        raise InvalidJob(f"runs {a.id} and {b.id} ran at world sizes {a.world_size} and {b.world_size}: their ranks "
                         "hold different slices of the batch, so module calls cannot be matched rank to rank")
    first = first_divergent_step(session=session, job=job, a=a, b=b)
    step = data.step or first
    if step < 1:
        what = ("its first recorded step: the hooks go on at the step before, which a script never records"
                if job.params.get("script") else "the initial weights (another seed or model): there is no training "
                "step to replay")
        raise InvalidJob(f"runs {a.id} and {b.id} already differ at step 0, {what}")
    if step > min(a.steps_total, b.steps_total):
        raise InvalidJob(f"step {step} is past the runs' {min(a.steps_total, b.steps_total)} steps")
    flip = job.params.get("inject_bitflip")
    request = TrainCreate(kind="train", workload=job.workload, configs=[dict(a.config.body), dict(b.config.body)],
                        world_size=job.world_size, steps=step, repeats=1, queue=job.queue,
                        # A fault injected after the probe step never happens in the replay.
                        inject_bitflip=flip if flip and flip["step"] <= step else None)
    bisect = create_job(session=session, data=request, settings=settings, submitter=submitter)
    params: dict[str, Any] = {**bisect.params, "bisect": {
        "job": job.id, "runs": [a.id, b.id], "pair": list(pair), "step": step, "first_divergent_step": first}}
    bisect.kind, bisect.params = BISECT, params
    session.flush()
    return bisect


def again(*, session: Session, job: Job, settings: Settings, submitter: str | None) -> Job:
    """A bisect job's rerun: a new bisect of the same train job, pair and step."""
    params = job.params["bisect"]
    source = session.get(Job, params["job"])
    if source is None:
        raise InvalidJob(f"job {params['job']}, which bisect job {job.id} replayed, no longer exists")
    return create_bisect(session=session, job=source, data=BisectCreate(pair=params["pair"], step=params["step"]),
                         settings=settings, submitter=submitter)


def probe_step(job: Job) -> int | None:
    """The step a job's runs probe (a bisect job's), or None."""
    return kind_of(job.kind).probe_step(job)
