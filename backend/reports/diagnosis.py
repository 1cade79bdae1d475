"""Results of `batch-invariance` and `op-audit` jobs, per config: where it ran (device, TF32 and deterministic
flags in effect, threads) and what its first run that recorded measured (detlab.core.diagnosis).

Shapes (fixed, another report reads them):
- batch-invariance: {"kind", "workload": str|null, "configs": [{"index", "label", "device", "tf32",
  "results": [{"op","dtype","batch_size","invariant","max_ulp"}...], "summary": [{"op","dtype","first_break"}...],
  "model": {"workload","batch_sizes","invariant","first_module","first_break"}|null}]}
- op-audit: {"kind", "workload", "configs": [{"index", "label", "device", "torch_flags", "threads",
  "ops": [{"op","count","nondeterministic","evidence"}...], "ineffective": [op...]}]}
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import DiagnosisRecord, Job, RankEnv, Run
from detlab.core import diagnosis


def _records(session: Session, run_ids: list[int]) -> dict[int, dict[str, list[dict[str, Any]]]]:
    out: dict[int, dict[str, list[dict[str, Any]]]] = {r: {} for r in run_ids}
    rows = session.execute(select(DiagnosisRecord.run_id, DiagnosisRecord.type, DiagnosisRecord.body)
                           .where(DiagnosisRecord.run_id.in_(run_ids)).order_by(DiagnosisRecord.id))
    for run_id, kind, body in rows:
        out[run_id].setdefault(kind, []).append(body)
    return out


def _envs(session: Session, run_ids: list[int]) -> dict[int, RankEnv]:
    rows = session.scalars(select(RankEnv).where(RankEnv.run_id.in_(run_ids)).order_by(RankEnv.rank))
    found: dict[int, RankEnv] = {}
    for env in rows:
        found.setdefault(env.run_id, env)
    return found


def _measured(runs: list[Run], records: dict[int, dict[str, list[dict[str, Any]]]]) -> dict[int, Run]:
    """Per config index, its first run (by repeat) that recorded a result."""
    out: dict[int, Run] = {}
    for run in sorted(runs, key=lambda r: (r.config_index, r.repeat)):
        if records[run.id] and run.config_index not in out:
            out[run.config_index] = run
    return out


Config = Callable[[Run, RankEnv | None, dict[str, list[dict[str, Any]]]], dict[str, Any]]


def _flags(env: RankEnv | None) -> dict[str, Any] | None:
    return dict(env.torch_flags) if env and env.torch_flags else None


def invariance_config(run: Run, env: RankEnv | None, found: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """A batch-invariance config's measurements, in the order the rank measured them: dtype, op, batch size."""
    flags = _flags(env)
    return {"tf32": bool(flags["allow_tf32"]) if flags else None,
            **diagnosis.invariance_json(found.get("invariance", [])),
            "model": diagnosis.model_summary(found.get("model-invariance", []))}


def audit_config(run: Run, env: RankEnv | None, found: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """An op-audit config's ops, and those its deterministic flag did not make deterministic."""
    flags = _flags(env)
    ops = found.get("audit-op", [])
    claims = bool(run.config.body.get("torch", {}).get("deterministic_algorithms"))
    return {"torch_flags": flags, "threads": flags.get("num_threads") if flags else None,
            **diagnosis.audit_json(ops), "ineffective": sorted(diagnosis.ineffective(ops, claims))}


def build(*, session: Session, job: Job, config: Config) -> dict[str, Any] | None:
    """The job's result from its records as they are now, each config's measurements as its kind reads them
    (`config`); None before any config recorded a result."""
    runs = list(job.runs)
    records = _records(session, [r.id for r in runs])
    measured = _measured(runs, records)
    if not measured:
        return None
    envs = _envs(session, [r.id for r in measured.values()])
    names = job.config_names
    configs = []
    for i, run in sorted(measured.items()):
        env = envs.get(run.id)
        configs.append({"index": i, "label": names[i], "device": (env.device if env else None) or run.device,
                        **config(run, env, records[run.id])})
    workload = None if job.workload == "batch-invariance" else job.workload
    return {"kind": job.kind, "workload": workload, "configs": configs}
