"""The result of a `fix` job: each trial's runs (one config index per trial) loaded and compared as a train job's
repeats are, its cost against the base's runs, and the search's result from them (detlab.core.prescription)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.models import FAILED, FINISHED, SUCCEEDED, Job, Run
from detlab.backend.reports.train import load_run
from detlab.core import compare, prescription
from detlab.core.prescription import Outcome, Trial


def trials(job: Job) -> list[Trial]:
    return [Trial.from_json(t) for t in job.params["fix"]["trials"]]


def outcomes(*, session: Session, job: Job) -> list[Outcome | None]:
    """Each trial's outcome; None while any of its runs has not finished."""
    by_index: dict[int, list[Run]] = {}
    for run in sorted(job.runs, key=lambda r: (r.config_index, r.repeat)):
        by_index.setdefault(run.config_index, []).append(run)
    interval = int(job.params.get("fingerprint_interval", 1))
    batch = int(job.params.get("global_batch", 1))
    loaded: dict[int, list[Any]] = {}
    out: list[Outcome | None] = []
    for index in range(len(job.params["fix"]["trials"])):
        runs = by_index.get(index, [])
        if not runs or any(r.status not in FINISHED for r in runs):
            out.append(None)
            continue
        if failed := [r for r in runs if r.status != SUCCEEDED]:
            first = failed[0]
            out.append(Outcome(0, 0, failed=f"run {first.id} {first.status}"
                                             f"{': ' + first.error if first.status == FAILED and first.error else ''}"))
            continue
        loaded[index] = [load_run(session=session, run=r, workload=job.workload, interval=interval) for r in runs]
        rep = compare.reproducibility(loaded[index])
        cost: dict[str, Any] = {"cost": None, "interval": None, "within_noise": None}
        if index and 0 in loaded:
            cost = compare.cost_estimate(loaded[0], loaded[index], batch)
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
    """found | already | none; None while the search runs."""
    return result.get("verdict")
