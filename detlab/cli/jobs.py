"""`detlab submit | cancel | bisect`: jobs on a detlab server, submitted, cancelled, waited for and judged."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any

import httpx
import typer

from detlab.cli import summaries
from detlab.cli.common import DEFAULT_SERVER, Server, config_ref, fail, json_option, server_client
from detlab.cli.root import app
from detlab.core.http import detail, wait_for_job


class SweepOver(StrEnum):
    collective = "collective"
    train = "train"


def _wait(http: httpx.Client, job: dict[str, Any], timeout: float, what: str = "job",
          progress: bool = False) -> dict[str, Any]:
    """The finished job; exit 3 when it is still running after `timeout` seconds."""
    def report(found: dict[str, Any]) -> None:
        typer.echo(f"job {found['id']}: {found['status']} {found['progress']:.0%}", err=True)

    try:
        return wait_for_job(http, job, timeout_s=timeout, on_poll=report if progress else None)
    except TimeoutError:
        typer.echo(f"timed out waiting for {what} {job['id']}", err=True)
        raise typer.Exit(3) from None


@app.command()
def submit(
    config: Annotated[list[str], typer.Option(help="preset name or path to a JSON config; give two to compare")],
    workload: Annotated[str | None, typer.Option(help="train: mlp, tiny-lm, scatter, ...")] = None,
    kind: Annotated[str, typer.Option(help="a job kind the server takes (GET /api/v1/meta `kinds`): train, "
                                           "collective, sweep, batch-invariance, op-audit, ...")] = "train",
    collective: Annotated[str | None, typer.Option(help='collective/sweep: JSON, e.g. {"ops": ["all_gather"]}')] = None,
    knobs: Annotated[str | None, typer.Option(
        help="sweep: JSON object, knob name to a list of values (null = the library default)")] = None,
    over: Annotated[SweepOver, typer.Option(help=(
        "sweep: what each cell runs, collective trials or train steps of --workload"))] = SweepOver.collective,
    diagnosis: Annotated[str | None, typer.Option(help=(
        'batch-invariance/op-audit: JSON, e.g. {"ops": ["mm"], "batch_sizes": [1, 2, 4], "features": 4096}'))] = None,
    server: Server = DEFAULT_SERVER,
    world_size: int = 1,
    steps: Annotated[int | None, typer.Option(help="default: the workload's")] = None,
    repeats: int = 1,
    tag: Annotated[list[str] | None, typer.Option(
        metavar="TAG", help="a label to find the job by (repeat for several): letters, digits and . _ : = + -")] = None,
    wait: Annotated[bool, typer.Option(help="wait for the job to finish")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object as the last line")] = False,
    check: Annotated[bool, typer.Option(help=(
        "with --wait: exit 1 unless the result is reproducible (two configs: identical; one: every repeat "
        "identical; collective: every cell)"))] = False,
    max_cost: Annotated[float | None, typer.Option(min=0, max=1000, metavar="PCT", help=(
        "with --wait: exit 1 when a config's cost against config 0 (the throughput it loses, as the job page "
        "shows it) is above PCT percent with its whole 95% interval"))] = None,
    timeout: float = 3600.0,
) -> None:
    """Submit a job; with --wait --json the last line is the job and its result as JSON
    (train: the verdict, first divergence, throughput and cost; collective/sweep: the cells).

    Exit 0 when submitted (--wait: when it succeeded and passed --check and --max-cost), 1 when the job
    failed or a gate did not pass (each reason is printed), 2 on an error, 3 when --wait timed out."""
    if (check or max_cost is not None) and not wait:
        fail("--check and --max-cost judge the finished job: add --wait")
    body: dict[str, Any] = {"kind": kind, "workload": workload, "configs": [config_ref(c) for c in config],
                            "world_size": world_size, "steps": steps, "repeats": repeats, "tags": tag or [],
                            "collective": json_option(collective, "--collective")}
    if kind == "sweep":
        body["sweep"] = {"over": over.value, "knobs": json_option(knobs, "--knobs")}
    if diagnosis is not None:
        body["diagnosis"] = json_option(diagnosis, "--diagnosis")
    with server_client(server) as http:
        resp = http.post("/api/v1/jobs", json=body)
        if resp.status_code != 201:
            fail(f"{server} refused the job ({resp.status_code}): {detail(resp)}")
        job = resp.json()
        if not wait:
            typer.echo(json.dumps(job) if as_json else f"job {job['id']} submitted: {server}/jobs/{job['id']}")
            return
        job = _wait(http, job, timeout, progress=not as_json)
        found = http.get(job["result_path"]) if job.get("result_path") else None  # its kind says where
        result = {"job": job, **(found.json() if found is not None and found.status_code == 200 else {})}
    typed = summaries.typed_result(result)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        for line in summaries.job_lines(typed, job, server):
            typer.echo(line)
    failures = summaries.gate_failures(typed, job, check=check, max_cost=max_cost)
    for failure in failures:
        typer.echo(f"gate: {failure}", err=True)
    if job["status"] != "succeeded" or failures:
        raise typer.Exit(1)


@app.command()
def cancel(
    job: Annotated[int, typer.Argument(help="the job's id")],
    server: Server = DEFAULT_SERVER,
) -> None:
    """Cancel a queued or running job: its ranks are killed within seconds, what they recorded is kept and
    the job's result is computed from it. Exit 0 when the job is cancelled (again: a no-op), 1 when it had
    already finished otherwise, 2 on any other error."""
    with server_client(server) as http:
        resp = http.post(f"/api/v1/jobs/{job}/cancel")
    if resp.status_code != 200:
        typer.echo(f"error {resp.status_code}: {detail(resp)}", err=True)
        raise typer.Exit(1 if resp.status_code == 409 else 2)
    found = resp.json()
    counts: dict[str, int] = {}
    for run in found["runs"]:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    runs = ", ".join(f"{n} {status}" for status, n in counts.items())
    typer.echo(f"job {job} {found['status']} (runs: {runs}); recorded steps are kept: {server}/jobs/{job}")


@app.command()
def bisect(
    job: Annotated[int, typer.Argument(help="a finished train job whose pair diverged")],
    pair: Annotated[str | None, typer.Option(metavar="I,J", help="two config indices (default 0,1)")] = None,
    step: Annotated[int | None, typer.Option(min=1, help="the step to probe (default the first divergent one)")] = None,
    server: Server = DEFAULT_SERVER,
    wait: Annotated[bool, typer.Option(help="wait for the bisect and print the first divergent module")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object as the last line")] = False,
    timeout: float = 3600.0,
) -> None:
    """Replay a diverged train pair up to its first divergent step with hooks on every module, and name the first
    module whose outputs or gradients differ, with whether its inputs matched (it introduced the difference) or
    not (it carried it). Exit 0 when submitted (--wait: when it finished), 1 when it failed, 2 on an error, 3 when
    --wait timed out."""
    try:
        body = {"pair": [int(i) for i in pair.split(",")] if pair else None, "step": step}
    except ValueError:
        fail(f"--pair {pair}: two config indices, e.g. 0,1")
    with server_client(server) as http:
        resp = http.post(f"/api/v1/jobs/{job}/bisect", json=body)
        if resp.status_code not in (201, 202):
            fail(f"{server} refused the bisect ({resp.status_code}): {detail(resp)}")
        found = resp.json()
        if wait:
            found = _wait(http, found, timeout, what="bisect job")
        got = http.get(f"/api/v1/jobs/{found['id']}/bisect") if wait else None
    result = {"job": found, **(got.json() if got is not None and got.status_code == 200 else {})}
    if as_json:
        typer.echo(json.dumps(result))
    elif not wait:
        typer.echo(f"bisect job {found['id']} submitted: {server}/jobs/{found['id']}")
    else:
        for line in summaries.bisect_lines(result):
            typer.echo(line)
    if wait and found["status"] != "succeeded":
        raise typer.Exit(1)
