"""The `detlab` command line: run the services, submit jobs, migrate the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

app = typer.Typer(help="detlab: where two training runs diverge, and what reproducibility costs.",
                  no_args_is_help=True, add_completion=False)


def _migrate() -> None:
    from alembic import command

    from detlab.migrations import alembic_config

    command.upgrade(alembic_config(), "head")


@app.command()
def migrate() -> None:
    """Upgrade the database to the latest schema."""
    _migrate()
    typer.echo("database is at the latest revision")


@app.command()
def api(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the API and the dashboard (distributed deployments; `up` does this and more)."""
    import uvicorn

    from detlab.backend.app import create_app
    from detlab.core.settings import get_settings

    if get_settings().auth_mode == "none" and host not in ("127.0.0.1", "localhost", "::1"):
        raise typer.BadParameter("auth mode 'none' listens on 127.0.0.1 only; set DETLAB_AUTH_MODE to expose it",
                                 param_hint="--host")
    uvicorn.run(create_app(), host=host, port=port, log_level="warning")


@app.command()
def worker(queue: Annotated[str, typer.Option(help="the node pool's queue to consume")] = "default") -> None:
    """Run a Celery worker that executes runs on this node's GPUs (or CPU)."""
    os.environ["DETLAB_QUEUE"] = queue
    from detlab.worker.tasks import app as celery
    from detlab.worker.tasks import worker_name

    celery.worker_main(["worker", "-Q", queue, "-n", worker_name(), "--pool", "solo", "--loglevel", "WARNING",
                        "--without-gossip", "--without-mingle", "--without-heartbeat"])


@app.command()
def up(port: int = 8000,
       data_dir: Annotated[Path, typer.Option(envvar="DETLAB_DATA_DIR")] = Path(".detlab")) -> None:
    """Embedded detlab: SQLite, an embedded broker and one local worker. No services needed."""
    os.environ["DETLAB_DATA_DIR"] = str(data_dir)
    os.environ["DETLAB_API_URL"] = f"http://127.0.0.1:{port}"
    from detlab.core.settings import get_settings

    get_settings().resolved_ingest_token()  # created once, read by the worker from the data dir
    _migrate()
    from detlab.worker.launch import die_with_parent

    # uvicorn re-raises SIGTERM after its shutdown, so `finally` below may never run: the worker
    # also learns of our death from the kernel (a warm shutdown; its ranks die with it).
    worker_proc = subprocess.Popen([sys.executable, "-m", "detlab.cli", "worker"], env=dict(os.environ),
                                   preexec_fn=lambda: die_with_parent(signal.SIGTERM))
    typer.echo(f"detlab is starting at http://127.0.0.1:{port} (data in {data_dir.resolve()})")
    try:
        api(host="127.0.0.1", port=port)
    finally:
        worker_proc.terminate()  # Celery's warm shutdown: finishes nothing new, exits
        try:
            worker_proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            worker_proc.kill()  # the reconciler re-dispatches whatever it was running
            worker_proc.wait()


def _config_ref(value: str) -> dict[str, Any]:
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise typer.BadParameter(f"cannot read config {value}: {exc}", param_hint="--config") from exc
    return {"preset": value}


def _json_option(value: str | None, option: str) -> Any:
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc}", param_hint=option) from exc


@app.command()
def submit(
    config: Annotated[list[str], typer.Option(help="preset name or path to a JSON config; give two to compare")],
    workload: Annotated[str | None, typer.Option(help="train: mlp, tiny-lm, scatter, ...")] = None,
    kind: Annotated[str, typer.Option(help="train, collective or sweep")] = "train",
    collective: Annotated[str | None, typer.Option(help='collective/sweep: JSON, e.g. {"ops": ["all_gather"]}')] = None,
    knobs: Annotated[str | None, typer.Option(
        help="sweep: JSON object, knob name to a list of values (null = the library default)")] = None,
    server: str = "http://127.0.0.1:8000",
    world_size: int = 1,
    steps: Annotated[int | None, typer.Option(help="default: the workload's")] = None,
    repeats: int = 1,
    wait: Annotated[bool, typer.Option(help="wait for the job to finish")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object as the last line")] = False,
    timeout: float = 3600.0,
) -> None:
    """Submit a job; with --wait --json the last line is the job and its result as JSON
    (train: the verdict, first divergence, throughput and cost; collective/sweep: the cells)."""
    body: dict[str, Any] = {"kind": kind, "workload": workload, "configs": [_config_ref(c) for c in config],
                            "world_size": world_size, "steps": steps, "repeats": repeats,
                            "collective": _json_option(collective, "--collective")}
    if kind == "sweep":
        body["sweep"] = {"over": "collective", "knobs": _json_option(knobs, "--knobs")}
    try:
        with httpx.Client(base_url=server.rstrip("/"), timeout=60) as http:
            resp = http.post("/api/v1/jobs", json=body)
            if resp.status_code != 201:
                typer.echo(f"error {resp.status_code}: {resp.json().get('detail', resp.text)}", err=True)
                raise typer.Exit(2)
            job = resp.json()
            if not wait:
                typer.echo(json.dumps(job) if as_json else f"job {job['id']} submitted: {server}/jobs/{job['id']}")
                return
            deadline = time.monotonic() + timeout
            while job["status"] not in ("succeeded", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    typer.echo(f"timed out waiting for job {job['id']}", err=True)
                    raise typer.Exit(3)
                time.sleep(1.0)
                job = http.get(f"/api/v1/jobs/{job['id']}").json()
                if not as_json:
                    typer.echo(f"job {job['id']}: {job['status']} {job['progress']:.0%}", err=True)
            found = http.get(f"/api/v1/jobs/{job['id']}/{'comparison' if kind == 'train' else 'collective'}")
            result = {"job": job, **(found.json() if found.status_code == 200 else {})}
    except httpx.TransportError as exc:  # server down or unreachable: one line, not a traceback
        typer.echo(f"error: cannot reach {server}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if as_json:
        typer.echo(json.dumps(result))
    elif kind == "train":
        typer.echo(f"job {job['id']} {job['status']}: verdict {result.get('verdict')}, first divergent step "
                   f"{result.get('first_divergent_step')}, tensors {result.get('first_divergent_tensors')}")
        for missing in result.get("missing") or []:
            typer.echo(f"  missing: {missing}")
        for row in result.get("throughput") or []:
            typer.echo(f"  config {row['config_index']} {row['name']}: cost {row.get('cost_text') or '—'}")
    else:
        cells = result.get("cells", [])
        typer.echo(f"job {job['id']} {job['status']}: {sum(c['reproducible'] for c in cells)}/{len(cells)} "
                   f"cells reproducible; {server}/jobs/{job['id']}")
    if job["status"] != "succeeded":
        raise typer.Exit(1)


@app.command()
def cancel(
    job: Annotated[int, typer.Argument(help="the job's id")],
    server: str = "http://127.0.0.1:8000",
) -> None:
    """Cancel a queued or running job: its ranks are killed within seconds, what they recorded is kept and
    the job's result is computed from it. Exit 0 when the job is cancelled (again: a no-op), 1 when it had
    already finished otherwise, 2 on any other error."""
    try:
        resp = httpx.post(f"{server.rstrip('/')}/api/v1/jobs/{job}/cancel", timeout=60)
    except httpx.TransportError as exc:
        typer.echo(f"error: cannot reach {server}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if resp.status_code != 200:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text
        typer.echo(f"error {resp.status_code}: {detail}", err=True)
        raise typer.Exit(1 if resp.status_code == 409 else 2)
    found = resp.json()
    counts: dict[str, int] = {}
    for run in found["runs"]:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    runs = ", ".join(f"{n} {status}" for status, n in counts.items())
    typer.echo(f"job {job} {found['status']} (runs: {runs}); recorded steps are kept: {server}/jobs/{job}")


def _checkpoint_fingerprints(path: Path, certificates: bool = False) -> dict[str, dict[str, Any]]:
    from detlab.worker.checkpoint import CheckpointError, fingerprints

    try:
        return fingerprints(path, certificates=certificates)
    except CheckpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def fingerprint(
    path: Annotated[Path, typer.Argument(help="a .safetensors file or a torch.save checkpoint")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
    certificate: Annotated[bool, typer.Option(help="add a sha256 of the same bytes (audits, exports)")] = False,
) -> None:
    """Print the fp1 fingerprint of every tensor in a checkpoint. Exit 2 when the file or a tensor cannot be read
    (sparse, quantized, nested or meta tensors are refused: the message names the tensor and what to do)."""
    found = _checkpoint_fingerprints(path, certificate)
    if as_json:
        typer.echo(json.dumps(found))
        return
    for name, info in found.items():
        sha = f"  sha256:{info['sha256']}" if certificate else ""
        typer.echo(f"{info['digest']}  {name}  {info['dtype']}{info['shape']}{sha}")


@app.command()
def diff(
    a: Annotated[Path, typer.Argument(help="checkpoint A")],
    b: Annotated[Path, typer.Argument(help="checkpoint B")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object: mode, differ, only_a, only_b")] = False,
    strict: Annotated[bool, typer.Option(help="compare sha256 of each tensor's bytes, not keyed digests")] = False,
) -> None:
    """List tensors that differ between two checkpoints. Exit 0 when identical, 1 otherwise, 2 when a file or a
    tensor cannot be read (a CI gate). Tensors are compared by dtype, shape and digest: fp1 under a random key
    drawn for this run, so collisions prepared against fp1's public constants do not carry over, or with
    --strict sha256 (docs/fingerprint.md, "Threat model")."""
    from detlab.worker.checkpoint import CheckpointError, diff_files

    try:
        result = diff_files(a, b, strict=strict)
    except CheckpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    found = [result["differ"], result["only_a"], result["only_b"]]
    if as_json:
        typer.echo(json.dumps(result))
    else:
        how = {"keyed": "fp1 under a random key drawn for this run", "strict": "sha256 of each tensor's bytes"}
        typer.echo(f"mode: {result['mode']} ({how[result['mode']]})")
        for label, names in zip(("differs", f"only in {a}", f"only in {b}"), found, strict=True):
            for name in names:
                typer.echo(f"{label}: {name}")
        counts = f"{len(result['differ'])} differ, {len(result['only_a'])} only in A, {len(result['only_b'])} only in B"
        typer.echo("identical" if not any(found) else counts)
    raise typer.Exit(1 if any(found) else 0)


@app.command("import-results")
def import_results(
    files: Annotated[list[Path], typer.Argument(help="result files: {job, result} as in results/*/")],
) -> None:
    """Add collective/sweep results measured elsewhere to this database's findings (the history)."""
    from detlab.backend.db import get_sessionmaker
    from detlab.backend.reports.findings import rows_from_result, store

    _migrate()
    with get_sessionmaker()() as session:
        for path in files:
            try:
                data = json.loads(path.read_text())
                # The source names the data set, not this machine's paths.
                rows = rows_from_result(f"{path.resolve().parent.name}/{path.name}", data["job"], data["result"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                typer.echo(f"error: {path}: not a detlab result file ({type(exc).__name__}: {exc})", err=True)
                raise typer.Exit(2) from exc
            typer.echo(f"{path}: {store(session=session, rows=rows)} cells")
        session.commit()


@app.command("parse-log")
def parse_log(
    files: Annotated[list[Path], typer.Argument(help="NCCL/RCCL debug log files (NCCL_DEBUG=INFO)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per file")] = False,
) -> None:
    """Print the facts in NCCL/RCCL debug logs: version, ranks, channels, transports, algorithm choices."""
    from detlab.core.commlog import main

    raise typer.Exit(main([*map(str, files), *(["--json"] if as_json else [])]))


@app.command("verify-collective", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify_collective(ctx: typer.Context) -> None:
    """Check that collectives give the same bits on identical inputs, without a server.

    Options are passed on: --backend gloo|nccl --world-size N --ops ... --dtypes ... --min-bytes
    --max-bytes --step-factor --trials --seed --json (see `detlab verify-collective --help`).
    Exits 0 when every size is reproducible, 1 otherwise."""
    from detlab.worker.verify import main

    raise typer.Exit(main(list(ctx.args)))


# What `compare --json` prints of a verdict (per-step rows and loss curves stay out: they grow with the run).
_COMPARE_KEYS = ("verdict", "reason", "mode", "first_divergent_step", "first_divergent_tensors", "ranks",
                 "steps_differing", "steps_compared", "missing")


def _verdict_text(result: dict[str, Any], tensors: int, world_size: int) -> list[str]:
    verdict = result["verdict"]
    if verdict == "incomparable":
        return [f"incomparable: {result['reason']}"]
    if verdict == "identical":
        lines = [f"identical: {result['steps_compared']} steps x {world_size} rank(s) x {tensors} tensors equal"]
    elif verdict == "diverged":
        names = result["first_divergent_tensors"]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        where = f" on rank(s) {', '.join(map(str, result['ranks']))}" if result["ranks"] else ""
        lines = [f"diverged at step {result['first_divergent_step']}{where}: {shown or 'tensors not known'}; "
                 f"{result['steps_differing']} of {result['steps_compared']} compared steps differ"]
    else:
        lines = [f"incomplete: the {result['steps_compared']} steps both runs recorded are equal, but data is missing"]
    lines += [f"  missing: {m}" for m in result["missing"]]
    if result["reason"]:
        lines.append(f"  note: {result['reason']}")
    return lines


@app.command()
def compare(
    a: Annotated[Path, typer.Argument(help="record directory A, written by detlab.Recorder(out=A)")],
    b: Annotated[Path, typer.Argument(help="record directory B")],
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object: verdict, first_divergent_step, "
                                          "first_divergent_tensors, ranks, steps_differing, missing")] = False,
) -> None:
    """Compare two runs recorded with detlab.Recorder, without a server (a CI gate, docs/sdk.md).

    Exit 0 when identical, 1 when they diverged (the first step, its tensors and ranks are printed), 2 when
    they are incomplete or incomparable, or a directory cannot be read. In messages, run 1 is A and run 2 is B."""
    from detlab.core.train import compare_runs
    from detlab.sdk.store import RecordsError, load_run

    try:
        run_a, run_b = load_run(a, run_id=1), load_run(b, run_id=2)
    except RecordsError as exc:
        typer.echo(f"error: {exc}", err=True)
        if as_json:
            typer.echo(json.dumps({"verdict": "error", "error": str(exc)}))
        raise typer.Exit(2) from None
    result = compare_runs(run_a, run_b)
    if as_json:
        typer.echo(json.dumps({**{k: result[k] for k in _COMPARE_KEYS}, "a": str(a), "b": str(b)}))
    else:
        for line in _verdict_text(result, len(run_a.tensors), run_a.world_size):
            typer.echo(line)
    raise typer.Exit({"identical": 0, "diverged": 1}.get(result["verdict"], 2))


if __name__ == "__main__":
    app()
