"""The result of a `bisect` job: its two runs' probe steps compared entry by entry, and what the differing
entries say (the logic is in detlab.core.bisect and detlab.core.compare)."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from detlab.backend.models import Job
from detlab.backend.reports import train as train_report
from detlab.core import bisect, compare, configs

# Keys of the train comparator's answer that a one-step replay keeps.
KEPT = ("verdict", "reason", "mode", "run_a", "run_b", "first_divergent_step", "ranks", "missing")


def build(*, session: Session, job: Job) -> dict[str, Any] | None:
    """The replay's verdict and diagnosis, or None while neither run recorded its probe step."""
    params = job.params["bisect"]
    step = int(params["step"])
    runs = sorted(job.runs, key=lambda r: r.config_index)
    data = []
    for run in runs:
        loaded = train_report.load_run(session=session, run=run, workload=job.workload)
        # Model digests before the probe step, then the probe (a script's steps are its own: judged by the other run).
        loaded.expected_steps = None if job.params.get("script") else list(range(step + 1))
        data.append(loaded)
    a, b = data
    if not a.records and not b.records:
        return None
    train_report.load_detail(session=session, runs=data, steps=[step])
    result = {k: v for k, v in compare.compare_runs(a, b).stored().items() if k in KEPT}
    if result["verdict"] == "incomparable" and a.tensors and b.tensors:
        # Different entry lists: say where the runs' module calls part, not only which names differ.
        result["reason"] = bisect.call_list_difference(a.tensors, b.tensors) or result["reason"]
    diagnosis = None
    if result["verdict"] == "diverged":
        digests = [{rank: d.digests for (s, rank), d in run.records.items() if s == step and d.digests is not None}
                   for run in (a, b)]
        diagnosis = bisect.diagnose(a.tensors, bisect.differing_by_rank(*digests))
        parted = result["first_divergent_step"]
        if parted != step:
            # The runs' parameters parted at an earlier step of the replay (a probe past the first divergent step,
            # or nondeterminism that struck earlier this time): the probe sees that difference as it starts.
            result["reason"] = (f"the replay parted at step {parted}, before the probed step {step}: the probe's "
                                f"modules see parameters that already differ; bisect step {parted} for its cause")
    elif result["verdict"] == "identical":
        result["reason"] = (f"the difference did not appear again in the replay of step {step}: nondeterminism that "
                            "did not strike this time, or a difference that arises at another step")
    return {**result, "source": params, "step": step, "diagnosis": diagnosis,
            "config_diff": configs.diff(runs[0].config.body, runs[1].config.body),
            "environment": train_report.environment(session=session, run_a=a.run_id, run_b=b.run_id)}


def verdict(result: dict[str, Any]) -> str | None:
    """The replay's verdict, as a train pair's."""
    return str(result["verdict"]) if result.get("verdict") else None
