"""`detlab compare A [B]`: two runs' verdict, from record directories without a server or from run ids on one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from detlab.cli.common import DEFAULT_SERVER, Server, token
from detlab.cli.root import app
from detlab.core import http
from detlab.core.results import PreflightNote

# What `compare --json` prints of a verdict (per-step rows and loss curves stay out: they grow with the run).
_COMPARE_KEYS = ("verdict", "reason", "mode", "first_divergent_step", "first_divergent_tensors", "ranks",
                 "steps_differing", "steps_compared", "missing", "replica_disagreements", "collectives", "preflight",
                 "first_divergent_component", "resume")
# ... and of its drift: the summary, not the per-step points.
_DRIFT_KEYS = ("available", "reason", "verdict", "max", "max_step", "dtype", "rounding_level", "sampled", "k",
               "relative_error")


def _replica_text(rows: list[dict[str, Any]]) -> list[str]:
    """`replicas disagree: run 1 step 3 tensor 0.weight ranks {0: 1f0c2a9e, 1: 77d0b3c1}` (digests cut to 8 hex)."""
    lines = []
    for row in rows:
        digests = ", ".join(f"{rank}: {digest.partition(':')[2][:8]}" for rank, digest in row["ranks"].items())
        lines.append(f"replicas disagree: run {row['run']} step {row['step']} tensor {row['tensor']} "
                     f"ranks {{{digests}}}")
    return lines


def _preflight_text(result: dict[str, Any]) -> list[str]:
    """What the preflight table found in either run's processes, one line each (the same from directories and
    from a server: both come from detlab.core.compare)."""
    return [f"  {PreflightNote.model_validate(row).text()}" for row in result.get("preflight") or []]


def _verdict_text(result: dict[str, Any], tensors: int, world_size: int) -> list[str]:
    verdict = result["verdict"]
    if verdict == "incomparable":
        calls = result.get("collectives") or {}
        return [f"incomparable: {result['reason']}", *([f"  {calls['text']}"] if calls.get("text") else []),
                *_replica_text(result.get("replica_disagreements") or []), *_preflight_text(result)]
    if verdict == "identical":
        lines = [f"identical: {result['steps_compared']} steps x {world_size} rank(s) x {tensors} tensors equal"]
    elif verdict == "diverged":
        names = result["first_divergent_tensors"]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        if not names and (first := result.get("first_divergent_component")):
            shown = f"no tensor, the {first['component']}"  # the random state or a hyperparameter parted first
        where = f" on rank(s) {', '.join(map(str, result['ranks']))}" if result["ranks"] else ""
        lines = [f"diverged at step {result['first_divergent_step']}{where}: {shown or 'tensors not known'}; "
                 f"{result['steps_differing']} of {result['steps_compared']} compared steps differ"]
        if first := result.get("first_divergent_component"):
            lines.append(f"  first divergent component: {first['text']}")
    else:
        lines = [f"incomplete: the {result['steps_compared']} steps both runs recorded are equal, but data is missing"]
    lines += [f"  missing: {m}" for m in result["missing"]]
    if resume := result.get("resume"):
        lines.append(f"  {resume_text(resume)}")
    if result["reason"]:
        lines.append(f"  note: {result['reason']}")
    if (calls := result.get("collectives")) and calls.get("text"):
        lines.append(f"  {calls['text']}")
    lines += _replica_text(result.get("replica_disagreements") or [])
    if verdict == "diverged" and (drift := result.get("drift")):
        lines.append(f"  drift (‖A−B‖/‖A‖, estimated): {drift['verdict']}" if drift.get("available")
                     else f"  drift: not estimated: {drift.get('reason')}")
    return lines + _preflight_text(result)


def resume_text(resume: dict[str, Any]) -> str:
    """`resume of run 2 at step 5: not exact (rng: torch cpu)` (also the resume kind's summary)."""
    said = {True: "exact", False: f"not exact ({resume.get('text')})",
            None: "not checked (the first process did not record that step)"}[resume.get("exact")]
    return f"resume of run {resume['run']} at step {resume['step']}: {said}"


def _check_replicas(a: Path, as_json: bool) -> int:
    """`detlab compare A`: one run's replicas alone. 0 when they agree, 1 when they disagree, 2 with none."""
    from detlab.core import shards
    from detlab.core.compare import replica_disagreements
    from detlab.sdk.store import RecordsError, load_run

    try:
        run = load_run(a, run_id=1)
    except RecordsError as exc:
        typer.echo(f"error: {exc}", err=True)
        if as_json:
            typer.echo(json.dumps({"verdict": "error", "error": str(exc)}))
        return 2
    rows, count = replica_disagreements(run), shards.replicated_count(run.rank_tensors)
    verdict = "replicas-disagree" if rows else "replicas-agree" if count else "no-replicas"
    if as_json:
        typer.echo(json.dumps({"verdict": verdict, "replicated_tensors": count, "steps": len(run.steps()),
                               "replica_disagreements": rows, "a": str(a)}))
    elif rows:
        for line in _replica_text(rows):
            typer.echo(line)
    elif count:
        typer.echo(f"replicas agree: {len(run.steps())} steps x {count} replicated tensors equal on every rank "
                   "that holds them")
    else:
        typer.echo("no replicated tensors: nothing to check (a DDP model's parameters, or DTensors placed "
                   "Replicate(), are replicas; record with torchrun and more than one rank)")
    return {"replicas-agree": 0, "replicas-disagree": 1}.get(verdict, 2)


@app.command()
def compare(
    a: Annotated[str, typer.Argument(help="run A: a record directory (detlab.Recorder(out=A)), or a run id on "
                                          "the server")],
    b: Annotated[str | None, typer.Argument(help="run B: a directory, or a run id (without it: check the "
                                                 "replicas of directory A alone)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: verdict, first_divergent_step, "
                                          "first_divergent_tensors, ranks, steps_differing, missing, "
                                          "replica_disagreements, collectives, preflight")] = False,
    server: Server = DEFAULT_SERVER,
) -> None:
    """Compare two runs: two record directories without a server (a CI gate, docs/sdk.md), or two run ids of
    any jobs, recordings or uploads on a detlab server (`--server`, DETLAB_SERVER; token: DETLAB_TOKEN).

    Where the runs recorded their collective calls (Recorder(collectives=True)), the first call whose output
    differs is named, with whether its inputs matched (then the reduction order or topology made the difference).
    Exit 0 when identical, 1 when they diverged (the first step, its tensors and ranks are printed) or when,
    within either run, ranks that must hold equal replicas of a tensor (DDP) do not; 2 when they are incomplete
    or incomparable, or a run cannot be read. In messages, run 1 is A and run 2 is B. With directory A alone:
    its replicas only (exit 0 agree, 1 disagree, 2 none recorded)."""
    if b is None:
        raise typer.Exit(_check_replicas(Path(a), as_json))
    remote = all(x.isdigit() and not Path(x).exists() for x in (a, b))
    try:
        result, tensors, world = _remote_pair(int(a), int(b), server) if remote else _local_pair(Path(a), Path(b))
    except (ValueError, OSError) as exc:
        typer.echo(f"error: {exc}", err=True)
        if as_json:
            typer.echo(json.dumps({"verdict": "error", "error": str(exc)}))
        raise typer.Exit(2) from None
    if as_json:
        drift = result.get("drift") or {"available": False, "reason": "the server did not estimate it"}
        typer.echo(json.dumps({**{k: result.get(k) for k in _COMPARE_KEYS}, "a": a, "b": b,
                               "drift": {k: drift.get(k) for k in _DRIFT_KEYS}}))
    else:
        for line in _verdict_text(result, tensors, world):
            typer.echo(line)
    code = {"identical": 0, "diverged": 1}.get(result["verdict"], 2)
    raise typer.Exit(1 if code == 0 and result.get("replica_disagreements") else code)


def _local_pair(a: Path, b: Path) -> tuple[dict[str, Any], int, int]:
    from detlab.core.compare import compare_runs
    from detlab.sdk.store import load_run

    run_a, run_b = load_run(a, run_id=1), load_run(b, run_id=2)  # RecordsError is a ValueError
    return compare_runs(run_a, run_b).stored(), len(run_a.tensors), run_a.world_size


def _remote_pair(a: int, b: int, server: str) -> tuple[dict[str, Any], int, int]:
    try:
        with http.connect(server, token(), timeout_s=120) as client:
            resp = client.get("/api/v1/compare", params={"a": a, "b": b})
    except httpx.TransportError as exc:
        raise ValueError(f"cannot reach {server}: {exc}") from exc
    if resp.status_code != 200:
        raise ValueError(f"{server} answered {resp.status_code}: {http.detail(resp)}")
    result = resp.json()
    return result, int(result.get("tensors", 0)), int(result["runs"][0]["world_size"])
