"""The `detlab` command line: run the services, submit jobs, migrate the database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import httpx
import typer

from detlab.core.results import RESULTS, JobResult

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

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


LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command()
def api(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the API and the dashboard (distributed deployments; `up` does this and more)."""
    import uvicorn

    from detlab.backend.app import create_app
    from detlab.core.settings import get_settings

    settings = get_settings()
    if settings.auth_mode == "none" and host not in LOOPBACK:
        raise typer.BadParameter("auth mode 'none' listens on 127.0.0.1 only; set DETLAB_AUTH_MODE to expose it",
                                 param_hint="--host")
    name = host.lower().strip("[]")
    if name not in ("0.0.0.0", "::") and name not in settings.allowed_hosts:  # the name it is reached by
        settings = settings.model_copy(update={"allowed_hosts": [*settings.allowed_hosts, name]})
    if settings.auth_mode == "proxy":
        typer.echo(f"auth mode 'proxy': {settings.proxy_user_header} is trusted only from "
                   f"{', '.join(settings.trusted_proxies)} (DETLAB_TRUSTED_PROXIES)", err=True)
    # proxy_headers=False: the peer address is the connection's own, never one a client wrote in
    # X-Forwarded-For, so that the proxy check above sees who really connected.
    uvicorn.run(create_app(settings=settings), host=host, port=port, log_level="warning", proxy_headers=False)


@app.command()
def worker(
    queue: Annotated[str, typer.Option(help="the node pool's queue to consume")] = "default",
    scripts: Annotated[Path | None, typer.Option(envvar="DETLAB_SCRIPTS", help=(
        "a TOML file of this team's training scripts, run like built-in workloads (docs/sdk.md)"))] = None,
) -> None:
    """Run a Celery worker that executes runs on this node's GPUs (or CPU)."""
    if scripts is not None:
        from detlab.worker.scripts import ScriptsError, load

        try:
            found = load(scripts)
        except ScriptsError as exc:
            _fail(str(exc))
        os.environ["DETLAB_SCRIPTS"] = str(scripts.resolve())
        typer.echo(f"scripts: {', '.join(found) or 'none'} (from {scripts})", err=True)
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


Server = Annotated[str, typer.Option(envvar="DETLAB_SERVER", help="the detlab server (DETLAB_SERVER)")]


def _auth_headers() -> dict[str, str]:
    """`Authorization: Bearer $DETLAB_TOKEN` when the token is set (`detlab token create`)."""
    from detlab.core.settings import get_settings

    token = get_settings().token
    return {"Authorization": f"Bearer {token}"} if token else {}


def _fail(message: str) -> NoReturn:
    """An error the user caused: one line on stderr, exit 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def _detail(resp: httpx.Response) -> str:
    """A refusal's reason on one line (a 422's field errors joined)."""
    try:
        detail = resp.json().get("detail", resp.text)
    except ValueError:
        return resp.text[:500]
    if isinstance(detail, list):
        return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', ())[1:])}: {d.get('msg')}"
                         if isinstance(d, dict) else str(d) for d in detail)
    return str(detail)


def _config_ref(value: str) -> dict[str, Any]:
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            _fail(f"--config {value}: cannot read it as a JSON config ({exc})")
    return {"preset": value}


def _json_option(value: str | None, option: str) -> Any:
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        _fail(f"{option}: not JSON ({exc})")


@app.command()
def submit(
    config: Annotated[list[str], typer.Option(help="preset name or path to a JSON config; give two to compare")],
    workload: Annotated[str | None, typer.Option(help="train: mlp, tiny-lm, scatter, ...")] = None,
    kind: Annotated[str, typer.Option(help="a job kind the server takes (GET /api/v1/meta `kinds`): train, "
                                           "collective, sweep, batch-invariance, op-audit, ...")] = "train",
    collective: Annotated[str | None, typer.Option(help='collective/sweep: JSON, e.g. {"ops": ["all_gather"]}')] = None,
    knobs: Annotated[str | None, typer.Option(
        help="sweep: JSON object, knob name to a list of values (null = the library default)")] = None,
    diagnosis: Annotated[str | None, typer.Option(help=(
        'batch-invariance/op-audit: JSON, e.g. {"ops": ["mm"], "batch_sizes": [1, 2, 4], "features": 4096}'))] = None,
    server: Server = "http://127.0.0.1:8000",
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
        typer.echo("error: --check and --max-cost judge the finished job: add --wait", err=True)
        raise typer.Exit(2)
    body: dict[str, Any] = {"kind": kind, "workload": workload, "configs": [_config_ref(c) for c in config],
                            "world_size": world_size, "steps": steps, "repeats": repeats, "tags": tag or [],
                            "collective": _json_option(collective, "--collective")}  # null keys: not sent
    if kind == "sweep":
        body["sweep"] = {"over": "collective", "knobs": _json_option(knobs, "--knobs")}
    if diagnosis is not None:
        body["diagnosis"] = _json_option(diagnosis, "--diagnosis")
    try:
        with httpx.Client(base_url=server.rstrip("/"), timeout=60, headers=_auth_headers()) as http:
            resp = http.post("/api/v1/jobs", json=body)
            if resp.status_code != 201:
                _fail(f"{server} refused the job ({resp.status_code}): {_detail(resp)}")
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
            found = http.get(job["result_path"]) if job.get("result_path") else None  # its kind says where
            result = {"job": job, **(found.json() if found is not None and found.status_code == 200 else {})}
    except httpx.TransportError as exc:  # server down or unreachable: one line, not a traceback
        typer.echo(f"error: cannot reach {server}: {exc}", err=True)
        raise typer.Exit(2) from exc
    typed = typed_result(result)
    if as_json:
        typer.echo(json.dumps(result))
    else:
        url = f"{server}/jobs/{job['id']}"
        for line in typed.summary(job_id=job["id"], status=job["status"], verdict=job.get("verdict"), url=url) \
                if typed else [f"job {job['id']} {job['status']}: no result; {url}"]:
            typer.echo(line)
    failures = gate_failures(typed, result["job"], check=check, max_cost=max_cost)
    for failure in failures:
        typer.echo(f"gate: {failure}", err=True)
    if job["status"] != "succeeded" or failures:
        raise typer.Exit(1)


def typed_result(result: dict[str, Any]) -> JobResult | None:
    """A finished job's result ({job, **result}) as its typed model (the one its result path serves)."""
    path = (result.get("job") or {}).get("result_path") or ""
    model = RESULTS.get(path.rsplit("/", 1)[-1])
    body = {k: v for k, v in result.items() if k != "job"}
    return model.model_validate(body) if model and body else None


def gate_failures(result: JobResult | None, job: dict[str, Any], *, check: bool, max_cost: float | None) -> list[str]:
    """Why a finished job fails `submit --check` / `--max-cost` (nothing: it passes); its result says (JobResult.gate).
    A job with no result fails --check."""
    if result is None:
        return ["no result: nothing was measured"] if check else []
    return result.gate(check=check, max_cost=max_cost, verdict=job.get("verdict"))


@app.command()
def cancel(
    job: Annotated[int, typer.Argument(help="the job's id")],
    server: Server = "http://127.0.0.1:8000",
) -> None:
    """Cancel a queued or running job: its ranks are killed within seconds, what they recorded is kept and
    the job's result is computed from it. Exit 0 when the job is cancelled (again: a no-op), 1 when it had
    already finished otherwise, 2 on any other error."""
    try:
        resp = httpx.post(f"{server.rstrip('/')}/api/v1/jobs/{job}/cancel", timeout=60, headers=_auth_headers())
    except httpx.TransportError as exc:
        typer.echo(f"error: cannot reach {server}: {exc}", err=True)
        raise typer.Exit(2) from exc
    if resp.status_code != 200:
        typer.echo(f"error {resp.status_code}: {_detail(resp)}", err=True)
        raise typer.Exit(1 if resp.status_code == 409 else 2)
    found = resp.json()
    counts: dict[str, int] = {}
    for run in found["runs"]:
        counts[run["status"]] = counts.get(run["status"], 0) + 1
    runs = ", ".join(f"{n} {status}" for status, n in counts.items())
    typer.echo(f"job {job} {found['status']} (runs: {runs}); recorded steps are kept: {server}/jobs/{job}")


user_app = typer.Typer(help="Users of auth mode 'local' (DETLAB_AUTH_MODE=local).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens for the CLI, CI and the SDK (DETLAB_TOKEN).", no_args_is_help=True)
app.add_typer(user_app, name="user")
app.add_typer(token_app, name="token")
DataDir = Annotated[Path, typer.Option(envvar="DETLAB_DATA_DIR",
                                       help="the data dir of `detlab up` (DETLAB_DATABASE_URL, when set, wins)")]


@contextmanager
def _auth_service(data_dir: Path) -> Iterator[tuple[Session, ModuleType]]:
    """A database session on the settings `detlab up` uses, migrated, committed on success; errors a user
    caused are one line and exit 2."""
    os.environ["DETLAB_DATA_DIR"] = str(data_dir)
    _migrate()
    from detlab.backend.db import get_sessionmaker
    from detlab.backend.services import auth

    with get_sessionmaker()() as session:
        try:
            yield session, auth
        except auth.AuthError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        session.commit()


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="the login name (also shown as the submitter of jobs)")],
    role: Annotated[str, typer.Option(help="viewer (read), member (read, submit, ingest) or admin")] = "member",
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from the first "
                                                 "line of stdin instead of prompting")] = False,
    data_dir: DataDir = Path(".detlab"),
) -> None:
    """Add a user who logs in to the dashboard (auth mode local). Exit 2 if the name exists or the role or
    password is refused (8 characters at least)."""
    password = (sys.stdin.readline().rstrip("\r\n") if password_stdin
                else typer.prompt("password", hide_input=True, confirmation_prompt=True))
    with _auth_service(data_dir) as (session, auth):
        user = auth.create_user(session=session, name=name, role=role, password=password)
    typer.echo(f"user {user.name} added ({user.role})")


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="the user the token acts as")],
    scope: Annotated[list[str], typer.Option(help="read, submit, ingest or admin; repeat for several")],
    data_dir: DataDir = Path(".detlab"),
) -> None:
    """Create an API token and print it once (only its hash is kept). Send it as 'Authorization: Bearer
    <token>', or set DETLAB_TOKEN for the CLI and the SDK. A token cannot grant more than its user's role."""
    with _auth_service(data_dir) as (session, auth):
        row, token = auth.create_token(session=session, user_name=user, scopes=scope)
    typer.echo(token)
    typer.echo(f"token {row.id} for {user} with scope {', '.join(row.scopes)}; shown once, keep it "
               f"(`detlab token revoke {row.id}` ends it)", err=True)


@token_app.command("list")
def token_list(data_dir: DataDir = Path(".detlab")) -> None:
    """List tokens: id, user, scopes, created (the tokens themselves are not kept)."""
    with _auth_service(data_dir) as (session, auth):
        for row in auth.list_tokens(session=session):
            typer.echo(f"{row.id}\t{row.user.name}\t{','.join(row.scopes)}\t{row.created_at:%Y-%m-%d %H:%M}")


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="the token's id (`detlab token list`)")],
                 data_dir: DataDir = Path(".detlab")) -> None:
    """Revoke a token: requests sending it are refused from now on. Exit 2 if there is no such token."""
    with _auth_service(data_dir) as (session, auth):
        row = auth.revoke_token(session=session, token_id=token_id)
        typer.echo(f"token {row.id} of {row.user.name} revoked")


def _checkpoint_fingerprints(path: Path, certificates: bool, version: str) -> dict[str, dict[str, Any]]:
    from detlab.worker.checkpoint import CheckpointError, fingerprints

    try:
        return fingerprints(path, certificates=certificates, version=version)
    except CheckpointError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


class FpVersion(StrEnum):
    fp2 = "fp2"
    fp1 = "fp1"


@app.command()
def fingerprint(
    path: Annotated[Path, typer.Argument(help="a .safetensors file or a torch.save checkpoint")],
    as_json: Annotated[bool, typer.Option("--json")] = False,
    certificate: Annotated[bool, typer.Option(help="add a sha256 of the same bytes (audits, exports)")] = False,
    fp_version: Annotated[FpVersion, typer.Option(help="fingerprint version: fp2 (current) or fp1, to check "
                                                       "digests recorded before fp2")] = FpVersion.fp2,
) -> None:
    """Print the fingerprint (fp2; fp1 on request) of every tensor in a checkpoint. Exit 2 when the file or a
    tensor cannot be read (sparse, quantized, nested or meta tensors are refused: the message names the tensor
    and what to do)."""
    found = _checkpoint_fingerprints(path, certificate, fp_version.value)
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
    tensor cannot be read (a CI gate). Tensors are compared by dtype, shape and digest: fp2 under a random key
    drawn for this run, so collisions prepared against fp2's public constants do not carry over, or with
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
        how = {"keyed": "fp2 under a random key drawn for this run", "strict": "sha256 of each tensor's bytes"}
        typer.echo(f"mode: {result['mode']} ({how[result['mode']]})")
        for label, names in zip(("differs", f"only in {a}", f"only in {b}"), found, strict=True):
            for name in names:
                typer.echo(f"{label}: {name}")
        counts = f"{len(result['differ'])} differ, {len(result['only_a'])} only in A, {len(result['only_b'])} only in B"
        typer.echo("identical" if not any(found) else counts)
    raise typer.Exit(1 if any(found) else 0)


@app.command("import-results")
def import_results(
    files: Annotated[list[Path], typer.Argument(help="result files as in results/*/: {job, result} of a collective, "
                                                     "sweep or train job, or a train comparison beside its job")],
) -> None:
    """Add results measured elsewhere to this database's findings (the team history).

    Each file is imported whole or not at all: a file that is not a detlab job result is named, nothing of
    it is kept, and the others are still imported. Importing a file again replaces what it gave before.
    Exits 2 when a file was refused."""
    from sqlalchemy.exc import SQLAlchemyError

    from detlab.backend.db import get_sessionmaker
    from detlab.backend.reports.findings import from_file, store

    _migrate()
    refused = 0
    with get_sessionmaker()() as session:
        for path in files:
            # The source names the data set, not this machine's paths.
            source = f"{path.resolve().parent.name}/{path.name}"
            try:
                rows, cells = from_file(source, json.loads(path.read_text()))
                store(session=session, rows=rows, cells=cells, sources={source})
                session.commit()
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, SQLAlchemyError) as exc:
                session.rollback()
                refused += 1
                typer.echo(f"error: {path}: not a detlab result file, nothing of it imported "
                           f"({type(exc).__name__}: {exc})", err=True)
                continue
            kinds = sorted({c["kind"] for c in cells}) or ["nothing"]
            typer.echo(f"{path}: {len(cells)} measurements ({', '.join(kinds)})"
                       + (f", {len(rows)} collective cells" if rows else ""))
    if refused:
        typer.echo(f"{refused} of {len(files)} file(s) refused; the others were imported", err=True)
        raise typer.Exit(2)


@app.command("parse-log")
def parse_log(
    files: Annotated[list[Path], typer.Argument(help="NCCL/RCCL debug log files (NCCL_DEBUG=INFO)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per file")] = False,
) -> None:
    """Print the facts in NCCL/RCCL debug logs: version, ranks, channels, transports, algorithm choices."""
    from detlab.core.commlog import main

    raise typer.Exit(main([*map(str, files), *(["--json"] if as_json else [])]))


@app.command("verify-collective", add_help_option=False,
             context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def verify_collective(ctx: typer.Context) -> None:
    """Check that collectives give the same bits on identical inputs, without a server.

    Options are passed on: --backend gloo|nccl --world-size N --ops ... --dtypes ... --min-bytes
    --max-bytes --step-factor --trials --seed --json (see `detlab verify-collective --help`).
    Exits 0 when every size is reproducible, 1 otherwise."""
    from detlab.worker.verify import main

    raise typer.Exit(main(list(ctx.args)))


_PASS_ON = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("batch-invariance", add_help_option=False, context_settings=_PASS_ON)
def batch_invariance(ctx: typer.Context) -> None:
    """Does row 0 of a batched op equal the batch-1 result bitwise? No server needed.

    Options: --device auto|cpu|cuda --ops mm,linear,... --dtypes float32,bfloat16,float16 --batch-sizes 1,2,4
    --features N --workload NAME --config PRESET|JSON --threads N --json (see `detlab batch-invariance --help`).
    Exits 0 when everything is invariant, 1 otherwise, 2 for bad options."""
    from detlab.worker.diagnose.cli import main

    raise typer.Exit(main("batch-invariance", list(ctx.args)))


@app.command("audit", add_help_option=False, context_settings=_PASS_ON)
def audit(ctx: typer.Context) -> None:
    """Every aten op of one training step of a workload, checked for nondeterminism on this device.

    Options: --workload NAME --device auto|cpu|cuda --threads N --config PRESET|JSON --reruns K --json.
    Exits 0 when no op was found nondeterministic, 1 otherwise, 2 for bad options."""
    from detlab.worker.diagnose.cli import main

    raise typer.Exit(main("op-audit", list(ctx.args)))


# What `compare --json` prints of a verdict (per-step rows and loss curves stay out: they grow with the run).
_COMPARE_KEYS = ("verdict", "reason", "mode", "first_divergent_step", "first_divergent_tensors", "ranks",
                 "steps_differing", "steps_compared", "missing", "replica_disagreements", "collectives")
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


def _verdict_text(result: dict[str, Any], tensors: int, world_size: int) -> list[str]:
    verdict = result["verdict"]
    if verdict == "incomparable":
        calls = result.get("collectives") or {}
        return [f"incomparable: {result['reason']}", *([f"  {calls['text']}"] if calls.get("text") else []),
                *_replica_text(result.get("replica_disagreements") or [])]
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
    if (calls := result.get("collectives")) and calls.get("text"):
        lines.append(f"  {calls['text']}")
    lines += _replica_text(result.get("replica_disagreements") or [])
    if verdict == "diverged" and (drift := result.get("drift")):
        lines.append(f"  drift (‖A−B‖/‖A‖, estimated): {drift['verdict']}" if drift.get("available")
                     else f"  drift: not estimated: {drift.get('reason')}")
    return lines


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
                                          "replica_disagreements, collectives")] = False,
    server: Server = "http://127.0.0.1:8000",
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
    url = f"{server.rstrip('/')}/api/v1/compare"
    try:
        resp = httpx.get(url, params={"a": a, "b": b}, headers=_auth_headers(), timeout=120)
    except httpx.TransportError as exc:
        raise ValueError(f"cannot reach {server}: {exc}") from exc
    if resp.status_code != 200:
        raise ValueError(f"{server} answered {resp.status_code}: {_detail(resp)}")
    result = resp.json()
    return result, int(result.get("tensors", 0)), int(result["runs"][0]["world_size"])

@app.command()
def why(
    job: Annotated[int, typer.Argument(help="a train job's id")],
    pair: Annotated[str | None, typer.Option(help="two run ids of the job, I,J (default: the pair its verdict "
                                                  "is about)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the report's JSON")] = False,
    server: Server = "http://127.0.0.1:8000",
) -> None:
    """Why two runs of a train job may part: the checklist in the order to debug it (logs, env parity,
    nondeterministic ops, stack and topology, batch invariance), ✓ pass, ✗ fail, ? not checked, - not
    applicable, each with its evidence. Exit 0 with the report, 2 on any error."""
    from detlab import cli_why

    try:
        report = cli_why.fetch(server.rstrip("/"), job, cli_why.parse_pair(pair), _auth_headers(), _detail)
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps(report) if as_json else "\n".join(cli_why.text(report, server.rstrip("/"))))


@app.command()
def upload(
    out: Annotated[Path, typer.Argument(help="a recording directory, written by detlab.Recorder(out=...)")],
    server: Server = "http://127.0.0.1:8000",
    name: Annotated[str | None, typer.Option(help="the run's name on the server (default: run.json's)")] = None,
) -> None:
    """Send a recording to a detlab server, where it can be compared with any other run (token: DETLAB_TOKEN,
    scope ingest). Idempotent: a recording streamed in part (online mode), or uploaded before, gets only what
    the server lacks, on the same run. Exit 0 when sent, 2 on any error."""
    import httpx

    from detlab.sdk.store import RecordsError
    from detlab.sdk.upload import upload as send
    from detlab.worker.client import IngestError

    try:
        done = send(out, server.rstrip("/"), name=name)
    except (RecordsError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (httpx.TransportError, IngestError) as exc:
        typer.echo(f"error: {server} did not take the recording ({type(exc).__name__}: {exc}); nothing is lost, "
                   "run the same command again", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"uploaded {out}: {done.records} records to run {done.run_id} ({done.status}): "
               f"{server.rstrip('/')}/jobs/{done.job_id}")


@app.command()
def bisect(
    job: Annotated[int, typer.Argument(help="a finished train job whose pair diverged")],
    pair: Annotated[str | None, typer.Option(metavar="I,J", help="two config indices (default 0,1)")] = None,
    step: Annotated[int | None, typer.Option(min=1, help="the step to probe (default the first divergent one)")] = None,
    server: Server = "http://127.0.0.1:8000",
    wait: Annotated[bool, typer.Option(help="wait for the bisect and print the first divergent module")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="print one JSON object as the last line")] = False,
    timeout: float = 3600.0,
) -> None:
    """Replay a diverged train pair up to its first divergent step with hooks on every module, and name the first
    module whose outputs or gradients differ, with whether its inputs matched (it introduced the difference) or
    not (it carried it). Exit 0 when submitted (--wait: when it finished), 1 when it failed, 2 on an error, 3 when
    --wait timed out."""
    from detlab.core.bisect import tree_lines

    try:
        body = {"pair": [int(i) for i in pair.split(",")] if pair else None, "step": step}
    except ValueError:
        _fail(f"--pair {pair}: two config indices, e.g. 0,1")
    try:
        with httpx.Client(base_url=server.rstrip("/"), timeout=60, headers=_auth_headers()) as http:
            resp = http.post(f"/api/v1/jobs/{job}/bisect", json=body)
            if resp.status_code not in (201, 202):
                _fail(f"{server} refused the bisect ({resp.status_code}): {_detail(resp)}")
            found = resp.json()
            deadline = time.monotonic() + timeout
            while wait and found["status"] not in ("succeeded", "failed", "cancelled"):
                if time.monotonic() > deadline:
                    typer.echo(f"timed out waiting for bisect job {found['id']}", err=True)
                    raise typer.Exit(3)
                time.sleep(1.0)
                found = http.get(f"/api/v1/jobs/{found['id']}").json()
            got = http.get(f"/api/v1/jobs/{found['id']}/bisect") if wait else None
    except httpx.TransportError as exc:
        _fail(f"cannot reach {server}: {exc}")
    result = {"job": found, **(got.json() if got is not None and got.status_code == 200 else {})}
    if as_json:
        typer.echo(json.dumps(result))
    elif not wait:
        typer.echo(f"bisect job {found['id']} submitted: {server}/jobs/{found['id']}")
    else:
        diagnosis = result.get("diagnosis")
        typer.echo(f"bisect job {found['id']} {found['status']}: verdict {result.get('verdict')} at step "
                   f"{result.get('step')}; " + (diagnosis["summary"] if diagnosis else str(result.get("reason"))))
        for line in tree_lines(diagnosis["tree"]) if diagnosis else []:
            typer.echo(line)
    if wait and found["status"] != "succeeded":
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
