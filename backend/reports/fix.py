"""The result of a `fix` job: each trial's runs (one config index per trial) loaded and compared as a train job's
repeats are, its cost against the base's runs of its own round (interleaved), and the search's result from them
(detlab.core.prescription)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.models import FAILED, FINISHED, SUCCEEDED, Job, Run
from detlab.backend.reports.train import load_run
from detlab.core import compare, prescription
from detlab.core.prescription import Outcome, Trial


def trials(job: Job) -> list[Trial]:
    return [Trial.from_json(t) for t in job.params["fix"]["trials"]]


def base_round(job: Job, run: Run) -> int:
    """The round of a base run: round 0's are the base trial's repeats; round t's (t ≥ 1) run interleaved with trial
    t's and carry repeats t·R … t·R + R − 1 (R = the job's repeats)."""
    return run.repeat // max(1, job.repeats)


def outcomes(*, session: Session, job: Job) -> list[Outcome | None]:
    """Each trial's outcome; None while any of its runs, or of the base runs of its round, has not finished. A
    trial's cost is against the base runs of its own round (a job from before the base was interleaved has none:
    then against round 0's)."""
    rounds: dict[tuple[int, int], list[Run]] = {}
    for run in sorted(job.runs, key=lambda r: (r.config_index, r.repeat)):
        key = (0, base_round(job, run)) if run.config_index == 0 else (run.config_index, 0)
        rounds.setdefault(key, []).append(run)
    interval = int(job.params.get("fingerprint_interval", 1))
    batch = int(job.params.get("global_batch", 1))
    loaded: dict[tuple[int, int], list[Any]] = {}

    def load(key: tuple[int, int]) -> list[Any]:
        if key not in loaded:
            loaded[key] = [load_run(session=session, run=r, workload=job.workload, interval=interval)
                           for r in rounds.get(key, []) if r.status == SUCCEEDED]
        return loaded[key]

    out: list[Outcome | None] = []
    for index in range(len(job.params["fix"]["trials"])):
        runs = rounds.get((index, 0), [])
        beside = rounds.get((0, index), []) if index else []
        if not runs or any(r.status not in FINISHED for r in runs + beside):
            out.append(None)
            continue
        if failed := [r for r in runs if r.status != SUCCEEDED]:
            first = failed[0]
            why = f": {first.error}" if first.status == FAILED and first.error else ""
            out.append(Outcome(0, len(runs), failed=f"run {first.id} {first.status}{why}"))
            continue
        rep = compare.reproducibility(load((index, 0)))
        cost: dict[str, Any] = {"cost": None, "interval": None, "within_noise": None}
        if index:
            cost = compare.cost_estimate(load((0, index)) if beside else load((0, 0)), load((index, 0)), batch)
        # k of n: the first recorded repeat is identical to itself; n is every repeat, recorded or not.
        identical = rep["identical_to_first"] + (1 if rep["recorded"] else 0)
        out.append(Outcome(identical, rep["repeats"], rep["first_divergent_step"], cost["cost"],
                           cost["interval"], cost["within_noise"]))
    return out


def build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The search's result as it stands (verdict None while it runs)."""
    fix = job.params["fix"]
    return prescription.result(trials=trials(job), outcomes=outcomes(session=session, job=job),
                               bodies=[dict(c.body) for c in job.configs], order=fix.get("order") or [],
                               skipped=fix.get("skipped") or [], max_trials=int(fix["max_trials"]),
                               stack=fix.get("stack"))


def verdict(result: dict[str, Any]) -> str | None:
    """found | already | none | incomplete; None while the search runs."""
    return result.get("verdict")
