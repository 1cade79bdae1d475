"""The result of a `resume` job: its straight run and its resumed run (repeat 0 and repeat 1 of its one config)
loaded and compared (detlab.core.compare; the resumed run is read from the state it continued from)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.models import Job
from detlab.backend.reports import train
from detlab.core import compare

STRAIGHT, RESUMED = 0, 1  # the repeat of each run


def build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The comparison of the straight and the resumed run, and the verdict from it; None before either recorded."""
    runs = {r.repeat: r for r in job.runs}
    straight, resumed = runs.get(STRAIGHT), runs.get(RESUMED)
    result: dict[str, Any] = {"verdict": None, "steps": job.steps, "stop_at": job.params["resume"]["stop_at"],
                              "lose": job.params["resume"].get("lose"),
                              "straight_run": straight and straight.id, "resumed_run": resumed and resumed.id}
    if straight is None or resumed is None or not straight.steps_done:
        return result if straight is not None and straight.steps_done else None
    interval = int(job.params.get("fingerprint_interval", 1))
    a, b = (train.load_run(session=session, run=r, workload=job.workload, interval=interval)
            for r in (straight, resumed))
    differing = compare.differing_steps(a, b) if a.records and b.records else []
    train.load_detail(session=session, runs=[a, b], steps=train.detail_steps(differing))
    comparison = compare.compare_runs(a, b).stored()
    comparison.pop("per_step", None)  # the page shows where and what, not a series
    comparison.pop("loss", None)
    result["comparison"] = comparison
    result["verdict"] = {"identical": "exact", "diverged": "lost"}.get(comparison["verdict"], comparison["verdict"])
    return result


def verdict(result: dict[str, Any]) -> str | None:
    """exact | lost | incomplete | incomparable; None until both runs recorded."""
    return result.get("verdict")
