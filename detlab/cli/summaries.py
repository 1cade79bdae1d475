"""What the CLI prints of a finished job and the gates `submit --check / --max-cost` hold it to: both come from
the job's typed result (detlab.core.results), which its kind's result path serves; no kind is named here."""

from __future__ import annotations

from typing import Any

from detlab.core.results import RESULTS, JobResult


def typed_result(result: dict[str, Any]) -> JobResult | None:
    """A finished job's result ({job, **result}) as its typed model (the one its kind's result path serves)."""
    path = (result.get("job") or {}).get("result_path") or ""
    model = RESULTS.get(path.rsplit("/", 1)[-1])
    body = {k: v for k, v in result.items() if k != "job"}
    return model.model_validate(body) if model and body else None


def job_lines(typed: JobResult | None, job: dict[str, Any], server: str) -> list[str]:
    """`submit --wait`'s summary of a finished job, as its result model words it."""
    url = f"{server}/jobs/{job['id']}"
    if typed is None:
        return [f"job {job['id']} {job['status']}: no result; {url}"]
    return typed.summary(job_id=job["id"], status=job["status"], verdict=job.get("verdict"), url=url)


def bisect_lines(result: dict[str, Any]) -> list[str]:
    """`bisect --wait`'s summary: the verdict at the probed step, then the module tree down to the first
    divergent module."""
    from detlab.core.bisect import tree_lines

    job, diagnosis = result["job"], result.get("diagnosis")
    return [f"bisect job {job['id']} {job['status']}: verdict {result.get('verdict')} at step {result.get('step')}; "
            + (diagnosis["summary"] if diagnosis else str(result.get("reason"))),
            *(tree_lines(diagnosis["tree"]) if diagnosis else [])]


def gate_failures(result: JobResult | None, job: dict[str, Any], *, check: bool, max_cost: float | None) -> list[str]:
    """Why a finished job fails `submit --check` / `--max-cost` (nothing: it passes); its result model says
    (JobResult.gate). A job with no result fails --check."""
    if result is None:
        return ["no result: nothing was measured"] if check else []
    return result.gate(check=check, max_cost=max_cost, verdict=job.get("verdict"))
