"""`detlab fix`: submit a search for the cheapest reproducible config of a workload (a `fix` job), wait for it and
print the prescription."""

from __future__ import annotations

import json
from typing import Annotated, Any

import httpx
import typer

from detlab.cli.common import DEFAULT_SERVER, Server, config_ref, server_client
from detlab.cli.root import app
from detlab.core.http import detail, wait_for_job
from detlab.core.results import FixResult


def _error(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _from_job(http: httpx.Client, job_id: int) -> dict[str, Any]:
    """A train job's config A, workload and world size (steps too), as a fix job's keys."""
    resp = http.get(f"/api/v1/jobs/{job_id}/spec")
    if resp.status_code != 200:
        _error(f"job {job_id}: {resp.status_code}: {detail(resp)}")
    spec = resp.json()
    if spec.get("kind") not in ("train", "sweep") or not spec.get("workload"):
        _error(f"job {job_id} is a {spec.get('kind')} job: `detlab fix --job` takes a train job")
    return {"workload": spec["workload"], "configs": spec["configs"][:1], "world_size": spec["world_size"],
            "steps": spec.get("steps")}


def _lines(job: dict[str, Any], result: dict[str, Any], server: str) -> list[str]:
    typed = FixResult.model_validate(result)
    return typed.summary(job_id=job["id"], status=job["status"], verdict=typed.verdict, url=server) + [
        f"  page: {server}/jobs/{job['id']}"]


@app.command()
def fix(
    workload: Annotated[str | None, typer.Option(help="mlp, tiny-lm, scatter, or a registered script")] = None,
    config: Annotated[str, typer.Option(help="the base config: a preset name or a path to a JSON config")] = "default",
    job: Annotated[int | None, typer.Option(help="a diverged train job: its config A, workload and world size")] = None,
    world_size: Annotated[int | None, typer.Option(min=1)] = None,
    steps: Annotated[int | None, typer.Option(min=1, help="default: the workload's")] = None,
    repeats: Annotated[int, typer.Option(min=2, help="runs per trial, each in fresh processes")] = 2,
    max_trials: Annotated[int, typer.Option(min=1, help="the most configs run, the base included")] = 8,
    server: Server = DEFAULT_SERVER,
    wait: Annotated[bool, typer.Option(help="wait for the search and print the prescription")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object as the last line")] = False,
    timeout: float = 3600.0,
) -> None:
    """Find the cheapest config that makes a workload reproducible: the base, then knobs added cheapest first
    until the repeats are bit-identical, then each knob dropped in turn to keep only those that are needed.

    Exit 0 when a reproducible config was found (or the base already is; without --wait: submitted), 1 when none
    was or a trial's run failed (incomplete), 2 on an error, 3 when --wait timed out."""
    with server_client(server) as http:
        body: dict[str, Any] = {"kind": "fix", "repeats": repeats, "max_trials": max_trials}
        if job is not None:
            body.update(_from_job(http, job))
        elif workload is None:
            _error("give --workload (or --job ID of a diverged train job)")
        else:
            body.update(workload=workload, configs=[config_ref(config)], world_size=1, steps=None)
        if workload is not None:
            body["workload"] = workload
        if world_size is not None:
            body["world_size"] = world_size
        if steps is not None:
            body["steps"] = steps
        resp = http.post("/api/v1/jobs", json=body)
        if resp.status_code != 201:
            _error(f"{server} refused the job ({resp.status_code}): {detail(resp)}")
        found = resp.json()
        if not wait:
            typer.echo(json.dumps({"job": found}) if as_json else
                       f"fix job {found['id']} submitted: {server}/jobs/{found['id']}")
            return
        try:
            found = wait_for_job(http, found, timeout_s=timeout)
        except TimeoutError:
            typer.echo(f"timed out waiting for fix job {found['id']}", err=True)
            raise typer.Exit(3) from None
        got = http.get(f"/api/v1/jobs/{found['id']}/fix")
    if got.status_code != 200:
        _error(f"fix job {found['id']} {found['status']}: {detail(got)}")
    result = got.json()
    if as_json:
        typer.echo(json.dumps({"job": found, **result}))
    else:
        for line in _lines(found, result, server):
            typer.echo(line)
    if result.get("verdict") not in ("found", "already"):
        raise typer.Exit(1)
