"""The result of a `train` job: its runs loaded from the database and compared (the logic is in
detlab.core.compare)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import RECORDING, SUCCEEDED, CallsRecord, CommLog, Job, RankEnv, Run, StepRecord, TensorMeta
from detlab.core import collective_calls, commlog, compare, configs, divergence_map, drift, steps
from detlab.core.runs import RunData, StepData, recorded_steps, resumed

# Packed per-tensor digests are loaded for the first divergent step and at most this many others:
# model digests tell equal from different steps, so 100k steps never load 100k packed rows.
DETAIL_STEPS = 200
# Collective calls are loaded step by step from the first, up to this many (step, rank) rows per run: the first
# differing call of a long run is found within them, or the comparison says how far it looked.
MAX_CALL_ROWS = 20_000


def load_run(*, session: Session, run: Run, workload: str, interval: int = 1,
             between: tuple[int, int] | None = None) -> RunData:
    """A run's step records with model digests only (packed digests come later, where needed), and
    what it was meant to record, so that a run that stopped early compares `incomplete` (a registered
    script's or an SDK recording's steps are its own: judged against the other run, and by how the run ended,
    as `detlab compare` judges two directories). `between`: only the steps of that closed range (and nothing
    expected)."""
    tensors = list(session.scalars(select(TensorMeta).where(TensorMeta.run_id == run.id).order_by(TensorMeta.index)))
    data = RunData(run_id=run.id, workload=workload, world_size=run.world_size,
                           tensors=[(t.name, list(t.shape), t.dtype) for t in tensors],
                           expected_steps=None if between or run.job.params.get("script")
                           or run.job.kind == RECORDING else recorded_steps(run.steps_total, interval),
                           status=run.status)
    data.components = {t.name: t.component for t in tensors if t.component}
    # Core rows, not ORM rows: a long run has hundreds of thousands of them.
    rows = session.connection().execute(select(
        StepRecord.step, StepRecord.rank, StepRecord.model_digest, StepRecord.loss, StepRecord.step_time_s,
        StepRecord.fp_version, StepRecord.drift_version, StepRecord.state, StepRecord.segment,
        StepRecord.restored).where(StepRecord.run_id == run.id, *(
            [StepRecord.step.between(*between)] if between else []))).all()
    data.records, data.saved = resumed({
        (step, rank, segment): StepData(None, loss, seconds, digest, version, state=state, restored=restored,
                                        segment=segment)
        for step, rank, digest, loss, seconds, _, version, state, segment, restored in rows})
    _load_restores(session, data)
    data.fp_versions = {row[5] for row in rows} or data.fp_versions
    data.positions = {rank: dict(position) for rank, position in session.execute(
        select(RankEnv.rank, RankEnv.position).where(RankEnv.run_id == run.id, RankEnv.position.is_not(None)))}
    data.preflight = {rank: list(found) for rank, found in session.execute(
        select(RankEnv.rank, RankEnv.preflight).where(RankEnv.run_id == run.id, RankEnv.preflight.is_not(None)))}
    return data


def _load_restores(session: Session, data: RunData) -> None:
    """The packed digests of a resumed recording's restored records and of the records they restore: the resume
    check compares them digest by digest (a restored state holds no gradients)."""
    restores = [(key, d) for key, d in data.records.items() if d.restored]
    if not restores:
        return
    wanted = {(step, rank, d.segment): d for (step, rank), d in restores}
    wanted.update({(step, rank, d.segment): d for (step, rank), d in data.saved.items()})
    rows = session.execute(select(StepRecord.step, StepRecord.rank, StepRecord.segment, StepRecord.digests).where(
        StepRecord.run_id == data.run_id, StepRecord.step.in_(sorted({step for step, _, _ in wanted}))))
    for step, rank, segment, digests in rows:
        if (found := wanted.get((step, rank, segment))) is not None:
            found.digests = bytes(digests)


def load_calls(*, session: Session, runs: list[RunData]) -> None:
    """Fill in the runs' collective calls (the first MAX_CALL_ROWS (step, rank) rows of each) and parsed NCCL
    logs, for the comparison's first differing collective."""
    for data in runs:
        rows = session.execute(select(
            CallsRecord.step, CallsRecord.rank, CallsRecord.calls, CallsRecord.inputs, CallsRecord.outputs,
            CallsRecord.unread).where(CallsRecord.run_id == data.run_id)
            .order_by(CallsRecord.step, CallsRecord.rank).limit(MAX_CALL_ROWS))
        data.calls = {(step, rank): collective_calls.StepCalls([tuple(c) for c in calls], bytes(inputs),  # type: ignore[misc]
                                                               bytes(outputs), frozenset(unread))
                      for step, rank, calls, inputs, outputs, unread in rows}
        logs = list(session.scalars(select(CommLog.parsed).where(CommLog.run_id == data.run_id)))
        data.comm_logs = logs or None


def load_detail(*, session: Session, runs: list[RunData], steps: list[int]) -> None:
    """Fill in the packed per-tensor digests of these steps."""
    wanted = set(steps)
    # Many steps (a window's every differing step) are read as their range: one index range scan.
    where = StepRecord.step.between(min(steps), max(steps)) if len(steps) > 100 else StepRecord.step.in_(steps)
    for data in runs:
        rows = session.execute(select(StepRecord.step, StepRecord.rank, StepRecord.segment, StepRecord.digests).where(
            StepRecord.run_id == data.run_id, where))
        for step, rank, segment, digests in rows:
            if step in wanted and (record := data.records.get((step, rank))) is not None and record.segment == segment:
                record.digests = bytes(digests)


def load_drift(*, session: Session, runs: list[RunData]) -> None:
    """Fill in the packed statistics and sketches of the steps the drift estimate samples (detlab.core.drift)."""
    a, b = runs
    wanted = drift.steps_to_load(a, b)
    if not wanted:
        return
    # By their step numbers (at most drift.POINTS of them), never a range: rows between them are 30 KB each.
    for data in runs:
        rows = session.execute(select(StepRecord.step, StepRecord.rank, StepRecord.segment, StepRecord.stats,
                                      StepRecord.sketch).where(StepRecord.run_id == data.run_id,
                                                               StepRecord.step.in_(wanted),
                                                               StepRecord.drift_version.is_not(None)))
        for step, rank, segment, stats, sketch in rows:
            if (record := data.records.get((step, rank))) is not None and record.segment == segment:
                record.stats, record.sketch = bytes(stats), bytes(sketch)


def detail_steps(differing: list[int]) -> list[int]:
    """The first divergent step and an even sample of the later ones."""
    if len(differing) <= DETAIL_STEPS:
        return differing
    stride = len(differing) / DETAIL_STEPS
    return sorted({differing[0], *(differing[int(i * stride)] for i in range(DETAIL_STEPS))})


def effective_mismatches(*, session: Session, runs: list[Run]) -> list[dict[str, Any]]:
    """Requested vs effective knobs, per run and rank: a recipe that did not take effect is flagged."""
    out = []
    by_id = {r.id: r for r in runs}
    for env in session.scalars(select(RankEnv).where(RankEnv.run_id.in_(by_id)).order_by(RankEnv.run_id, RankEnv.rank)):
        body = by_id[env.run_id].config.body
        checks = [(f"env.{k}", v, env.effective_env.get(k)) for k, v in body["env"].items()]
        checks += [(f"torch.{k}", v, env.torch_flags.get(k)) for k, v in body["torch"].items()]
        if body.get("threads"):
            checks.append(("threads", body["threads"], env.torch_flags.get("num_threads")))
        out += [{"run_id": env.run_id, "rank": env.rank, "key": key, "requested": want, "effective": got}
                for key, want, got in checks if want != got]
    return out + log_flags(session=session, runs=runs)


def log_flags(*, session: Session, runs: list[Run]) -> list[dict[str, Any]]:
    """What the NCCL/RCCL logs say the library did, against what each run's config asked for."""
    logs: dict[int, list[dict[str, Any]]] = {}
    for log in session.scalars(select(CommLog).where(CommLog.run_id.in_([r.id for r in runs])).order_by(CommLog.rank)):
        logs.setdefault(log.run_id, []).append(log.parsed)
    return [{"run_id": run.id, "rank": None, **flag, "key": f"nccl.{flag['key']}"}
            for run in runs if run.id in logs for flag in commlog.check_effective(run.config.body["env"], logs[run.id])]


ENV_FACTS = ("host", "device", "driver", "cuda", "hip", "torch", "nccl", "backend")


def environment(*, session: Session, run_a: int, run_b: int) -> list[dict[str, Any]]:
    """The stack each compared run ran on (its lowest rank), fact by fact, with differences marked:
    two runs that part may simply have run on different hardware or library versions."""
    first: dict[int, RankEnv] = {}
    for env in session.scalars(select(RankEnv).where(RankEnv.run_id.in_([run_a, run_b])).order_by(RankEnv.rank)):
        first.setdefault(env.run_id, env)
    facts = []
    for key in ENV_FACTS:
        a, b = (getattr(first[r], key) if r in first else None for r in (run_a, run_b))
        facts.append({"key": key, "a": a, "b": b, "differs": a != b})
    return facts


def build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The comparison of a job's first two configs, or None while nothing is recorded yet."""
    cfgs = job.configs
    groups: dict[int, list[RunData]] = {}
    runs_by_index: dict[int, list[Run]] = {}
    for run in sorted(job.runs, key=lambda r: (r.config_index, r.repeat)):
        runs_by_index.setdefault(run.config_index, []).append(run)
        groups.setdefault(run.config_index, []).append(load_run(
            session=session, run=run, workload=job.workload, interval=int(job.params.get("fingerprint_interval", 1))))
    if not any(d.records for g in groups.values() for d in g):
        return None
    if len(cfgs) >= 2:
        a, b = groups[0][0], groups[1][0]
        load_calls(session=session, runs=[a, b])
        differing = compare.differing_steps(a, b)
        detail = detail_steps(differing)
        load_detail(session=session, runs=[a, b], steps=detail)  # by the ranks' own numbers, before lining up
        load_drift(session=session, runs=[a, b])
        result = compare.compare_runs(a, b).stored()
        if result["verdict"] == "diverged":  # the page's tensor × step heatmap; bounded, apart from per_step
            result["divergence_map"] = divergence_map.tensor_step_map(
                a, compare.line_up(a, b)[0], detail, steps_differing=len(differing))
        result["config_diff"] = configs.diff(cfgs[0].body, cfgs[1].body)
        result["environment"] = environment(session=session, run_a=a.run_id, run_b=b.run_id)
    else:
        result = {"verdict": None, "reason": "a single config: see the reproducibility of its repeats",
                  "config_diff": []}
    batch = int(job.params.get("global_batch", 1))
    timed = {i: [d for d, r in zip(groups[i], runs_by_index[i], strict=True) if r.status == SUCCEEDED]
             for i in groups}
    result["throughput"] = []
    for i in sorted(groups):
        # Cost against config 0 with a bootstrap 95 % interval; "within noise" when it spans 0.
        estimate = compare.cost_estimate(timed.get(0, []), timed[i], batch) if i else None
        result["throughput"].append({"config_index": i, "name": cfgs[i].name,
                                     "world_size": runs_by_index[i][0].world_size,
                                     **compare.throughput(timed[i], batch),
                                     "cost": estimate and estimate["cost"],
                                     "cost_interval": estimate and estimate["interval"],
                                     "within_noise": estimate and estimate["within_noise"],
                                     "cost_text": compare.cost_text(estimate)})
    result["reproducibility"] = [{"config_index": i, "name": cfgs[i].name, **compare.reproducibility(g)}
                                 for i, g in sorted(groups.items())]
    result["effective_mismatches"] = effective_mismatches(session=session, runs=list(job.runs))
    return result


def window(*, session: Session, job: Job, result: dict[str, Any], from_step: int, to_step: int) -> dict[str, Any]:
    """The comparison with `per_step` and `loss` in full for the steps from_step..to_step, computed from the
    two compared runs' rows (thinned again when the window holds more than steps.MAX_POINTS steps)."""
    runs = {r.id: r for r in job.runs}
    ids = [result.get("run_a"), result.get("run_b")]
    detail: dict[str, Any] = {"per_step": [], "loss": {"a": [], "b": []}}
    if all(i in runs for i in ids) and result.get("verdict") != "incomparable":
        interval = int(job.params.get("fingerprint_interval", 1))
        a, b = (load_run(session=session, run=runs[i], workload=job.workload, interval=interval,
                         between=(from_step, to_step)) for i in ids)
        if a.records and b.records:
            # Tensor counts for every differing step of a window that is shown whole; a longer one is thinned,
            # so a sample does.
            differing = compare.differing_steps(a, b)
            whole = len(set(a.steps()) | set(b.steps())) <= steps.MAX_POINTS
            load_detail(session=session, runs=[a, b], steps=differing if whole else detail_steps(differing))
            load_drift(session=session, runs=[a, b])
            detail = compare.compare_runs(a, b).stored()
    thinned = steps.downsample({"per_step": detail["per_step"], "loss": detail["loss"]})
    windowed = {"drift": detail["drift"]} if "drift" in detail else {}
    return {**result, **thinned, **windowed, "downsampled": thinned.get("downsampled"),
            "window": {"from_step": from_step, "to_step": to_step}}



def verdict(result: dict[str, Any]) -> str | None:
    """The result in one word for the jobs list: the pair's verdict; for a single config, reproducible or
    not-reproducible (every repeat identical to the first); None when no repeat was compared."""
    if result.get("verdict"):
        return str(result["verdict"])
    measured = [r for r in result.get("reproducibility") or [] if r.get("comparable")]
    if not measured:
        return None
    return "reproducible" if all(r["identical_to_first"] == r["comparable"] for r in measured) else "not-reproducible"
