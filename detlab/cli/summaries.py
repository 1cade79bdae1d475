"""What the CLI prints of a finished job, per kind, and the gates `submit --check / --max-cost` hold it to.

The job kinds' CLI summaries in one place, so that they can move into the kinds' own modules in one piece."""

from __future__ import annotations

from typing import Any

DIAGNOSIS_KINDS = ("batch-invariance", "op-audit")


def report_of(kind: str, over: str | None = None) -> str:
    """Which report a job of this kind gets (as the server's settle decides it): train (train jobs and sweeps
    over train), diagnosis (batch-invariance, op-audit) or collective (collective jobs and sweeps over it)."""
    if kind == "train" or (kind == "sweep" and over == "train"):
        return "train"
    return "diagnosis" if kind in DIAGNOSIS_KINDS else "collective"


def result_path(report: str) -> str:
    """The job's result under /api/v1/jobs/{id}/ for a report kind."""
    return {"train": "comparison", "diagnosis": "diagnosis"}.get(report, "collective")


def job_lines(report: str, job: dict[str, Any], result: dict[str, Any], server: str) -> list[str]:
    """`submit --wait`'s summary of a finished job (train: verdict, first divergence, cost; diagnosis: its
    verdict; collective: the reproducible cells)."""
    if report == "train":
        return [f"job {job['id']} {job['status']}: verdict {result.get('verdict')}, first divergent step "
                f"{result.get('first_divergent_step')}, tensors {result.get('first_divergent_tensors')}",
                *(f"  missing: {missing}" for missing in result.get("missing") or []),
                *(f"  config {row['config_index']} {row['name']}: cost {row.get('cost_text') or '—'}"
                  for row in result.get("throughput") or [])]
    if report == "diagnosis":
        return [f"job {job['id']} {job['status']}: {job.get('verdict') or 'nothing measured'}; "
                f"{server}/jobs/{job['id']}"]
    cells = result.get("cells", [])
    return [f"job {job['id']} {job['status']}: {sum(c['reproducible'] for c in cells)}/{len(cells)} "
            f"cells reproducible; {server}/jobs/{job['id']}"]


def bisect_lines(result: dict[str, Any]) -> list[str]:
    """`bisect --wait`'s summary: the verdict at the probed step, then the module tree down to the first
    divergent module."""
    from detlab.core.bisect import tree_lines

    job, diagnosis = result["job"], result.get("diagnosis")
    return [f"bisect job {job['id']} {job['status']}: verdict {result.get('verdict')} at step {result.get('step')}; "
            + (diagnosis["summary"] if diagnosis else str(result.get("reason"))),
            *(tree_lines(diagnosis["tree"]) if diagnosis else [])]


def gate_failures(result: dict[str, Any], kind: str, *, check: bool, max_cost: float | None) -> list[str]:
    """Why a finished job fails `submit --check` / `--max-cost` (nothing: it passes). `kind` is the job's kind,
    or its report's (a sweep over train is judged as train). A cost fails only when its whole 95 % interval
    lies above the limit: noise never fails a gate, and neither does a cost measured on too few steps for an
    interval (said, so the gate is not mistaken for a pass on evidence)."""
    failures = []
    if check and kind == "train" and result.get("verdict") is not None:  # two configs: their pair
        if result["verdict"] != "identical":
            failures.append(f"verdict {result['verdict']}" + (f": {result['reason']}" if result.get("reason") else ""))
    elif check and kind == "train":  # one config: its repeats
        for row in result.get("reproducibility") or [{"config_index": 0, "name": "?", "comparable": 0}]:
            if not row.get("comparable"):
                failures.append(f"config {row['config_index']} {row['name']}: no comparable repeats")
            elif row.get("identical_to_first") != row["comparable"]:
                failures.append(f"config {row['config_index']} {row['name']}: {row.get('identical_to_first')} of "
                                f"{row['comparable']} comparable repeats identical to the first")
    elif check and kind in (*DIAGNOSIS_KINDS, "diagnosis"):
        verdict = (result.get("job") or {}).get("verdict")
        if verdict not in ("invariant", "deterministic"):
            failures.append(f"verdict {verdict or 'none: nothing was measured'}")
    elif check:
        bad = [c for c in result.get("cells") or [] if not c.get("reproducible")]
        if bad or not result.get("cells"):
            failures.append(f"{len(bad)} of {len(result.get('cells') or [])} cells not reproducible")
    if max_cost is not None:
        for row in result.get("throughput") or []:
            interval = row.get("cost_interval")
            if row.get("config_index") == 0:
                continue
            if interval is None:
                failures.append(f"config {row['config_index']} {row['name']}: cost {row.get('cost_text')}; no "
                                "interval to hold against --max-cost")
            elif interval[0] * 100 > max_cost:
                failures.append(f"config {row['config_index']} {row['name']}: {row.get('cost_text')}, above "
                                f"--max-cost {max_cost:g}%")
    return failures
