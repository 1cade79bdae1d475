"""Loading a why-report: the two runs' configs, per-rank stacks and NCCL/RCCL logs, and the latest finished
op-audit and batch-invariance jobs of their workload (the checklist itself is detlab.core.why)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.kinds import batch_invariance, op_audit
from detlab.backend.kinds.diagnosis import DiagnosisKind
from detlab.backend.models import FINISHED, CommLog, Config, Job, RankEnv, Run
from detlab.backend.reports import pair
from detlab.backend.services.settle import job_result, report_kind
from detlab.core import why

# The audits a why-report cites (detlab.core.why.WhyInput names each).
AUDIT_KINDS: tuple[DiagnosisKind, ...] = (op_audit.KIND, batch_invariance.KIND)
# Finished audit jobs looked at, newest first, to find one of the workload: a bound on a busy server's history.
AUDIT_SCAN = 200
_ENV_COLUMNS = ("rank", "host", "device", "driver", "cuda", "hip", "torch", "nccl", "backend", "effective_env",
                "torch_flags")


def run_facts(*, session: Session, run: Run, side: str) -> why.RunFacts:
    """A compared run as the checklist reads it: its config, each rank's recorded stack and parsed log."""
    envs = session.scalars(select(RankEnv).where(RankEnv.run_id == run.id).order_by(RankEnv.rank))
    logs = session.execute(select(CommLog.rank, CommLog.parsed).where(CommLog.run_id == run.id)).all()
    return why.RunFacts(run_id=run.id, job_id=run.job_id, side=side, config_name=run.config.name,
                        config_hash=run.config.hash, config=run.config.body, workload=run.job.workload,
                        world_size=run.world_size, envs=[{k: getattr(e, k) for k in _ENV_COLUMNS} for e in envs],
                        logs={rank: parsed for rank, parsed in logs})


def latest_audit(*, session: Session, kind: DiagnosisKind, workload: str,
                 config_hashes: set[str]) -> why.AuditJob | None:
    """The latest finished job of this kind about this workload, one that ran a compared run's config when there
    is one; None when there is none."""
    jobs = session.scalars(select(Job).where(Job.kind == kind.name, Job.status.in_(FINISHED), Job.result.is_not(None))
                           .order_by(func.coalesce(Job.finished_at, Job.created_at).desc(), Job.id.desc())
                           .limit(AUDIT_SCAN)).all()
    ids = {i for job in jobs for i in job.config_ids}
    hashes = {row.id: row.hash for row in session.execute(select(Config.id, Config.hash).where(Config.id.in_(ids)))}
    found = []
    for job in jobs:
        result = job_result(session=session, job=job)
        if result and result.get("kind") == kind.name and kind.about_workload(job, result, workload):
            found.append(why.AuditJob(job_id=job.id, kind=kind.name, result=result,
                                      config_hashes=[hashes.get(i, "") for i in job.config_ids],
                                      finished_at=job.finished_at and job.finished_at.isoformat()))
    return next((a for a in found if config_hashes & set(a.config_hashes)), found[0] if found else None)


def build(*, session: Session, run_a: Run, run_b: Run, verdict: str | None, first_divergent_step: int | None,
          job_id: int | None, first_component: dict[str, Any] | None = None) -> dict[str, Any]:
    """The why-report of run A against run B. `job_id`: the train job whose page shows this pair (its evidence
    links point there), or None for any two runs (the compare page)."""
    a, b = run_facts(session=session, run=run_a, side="A"), run_facts(session=session, run=run_b, side="B")
    hashes = {a.config_hash, b.config_hash}
    audits = {kind.name: latest_audit(session=session, kind=kind, workload=a.workload, config_hashes=hashes)
              for kind in AUDIT_KINDS}
    return why.build(why.WhyInput(a=a, b=b, verdict=verdict, first_divergent_step=first_divergent_step,
                                  job_id=job_id, op_audit=audits[op_audit.KIND.name],
                                  batch_invariance=audits[batch_invariance.KIND.name], first_component=first_component))


class BadPair(ValueError):
    """Runs that cannot be asked about together (a 422)."""


class NoPair(LookupError):
    """Nothing to compare yet (a 404)."""


def _verdict(session: Session, run_a: Run, run_b: Run) -> tuple[str | None, int | None, dict[str, Any] | None]:
    found = pair.build(session=session, run_a=run_a, run_b=run_b)
    return found.get("verdict"), found.get("first_divergent_step"), found.get("first_divergent_component")


def for_job(*, session: Session, job: Job, a: int | None, b: int | None) -> dict[str, Any]:
    """The why-report of two runs of a training job: runs a and b, or by default the pair its verdict is about
    (the first runs of its first two configs; of a single config, its first two repeats)."""
    if report_kind(job) != "train":
        raise BadPair(f"job {job.id} is a {job.kind} job: the why-report compares training runs")
    if (a is None) != (b is None):
        raise BadPair("give both a and b (two runs of the job), or neither for the pair its verdict is about")
    runs = {r.id: r for r in job.runs}
    if a is not None and b is not None:
        for run_id in (a, b):
            if run_id not in runs:
                raise BadPair(f"run {run_id} is not a run of job {job.id} (its runs: {sorted(runs)})")
        if a == b:
            raise BadPair("a and b are the same run: pick two")
        verdict, step, first = _verdict(session, runs[a], runs[b])
        return build(session=session, run_a=runs[a], run_b=runs[b], verdict=verdict, first_divergent_step=step,
                     job_id=None, first_component=first)
    result = job_result(session=session, job=job) or {}
    if result.get("run_a") in runs and result.get("run_b") in runs:
        return build(session=session, run_a=runs[result["run_a"]], run_b=runs[result["run_b"]],
                     verdict=result.get("verdict"), first_divergent_step=result.get("first_divergent_step"),
                     job_id=job.id, first_component=result.get("first_divergent_component"))
    ordered = sorted(runs.values(), key=lambda r: (r.config_index, r.repeat))
    if len(ordered) < 2:
        raise NoPair(f"job {job.id} has a single run: nothing to compare it with (GET /compare/why?a=&b= takes "
                     "runs of any jobs)")
    verdict, step, first = _verdict(session, ordered[0], ordered[1])
    return build(session=session, run_a=ordered[0], run_b=ordered[1], verdict=verdict, first_divergent_step=step,
                 job_id=None, first_component=first)
