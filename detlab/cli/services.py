"""`detlab up | api | worker | migrate`: the services of a deployment, embedded or distributed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from detlab.cli.common import fail, migrate_database
from detlab.cli.root import app

LOOPBACK = ("127.0.0.1", "localhost", "::1")


@app.command()
def migrate() -> None:
    """Upgrade the database to the latest schema."""
    migrate_database()
    typer.echo("database is at the latest revision")


@app.command()
def api(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Serve the API and the dashboard (distributed deployments; `up` does this and more)."""
    serve(host, port)


def serve(host: str, port: int, on_ready: Callable[[], None] = lambda: None) -> None:
    """Serve the API until stopped; once it answers, print the one line that says where and call `on_ready`."""
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
    address = f"http://{'[' + name + ']' if ':' in name else name}:{port}"

    class Announcing(uvicorn.Server):
        """uvicorn's server, saying once that it answers (uvicorn's own lines are below log level warning)."""

        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets=sockets)
            if self.started:
                typer.echo(f"detlab ready at {address}")
                on_ready()

    # proxy_headers=False: the peer address is the connection's own, never one a client wrote in
    # X-Forwarded-For, so that the proxy check above sees who really connected.
    Announcing(uvicorn.Config(create_app(settings=settings), host=host, port=port, log_level="warning",
                              proxy_headers=False)).run()


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
            fail(str(exc))
        os.environ["DETLAB_SCRIPTS"] = str(scripts.resolve())
        typer.echo(f"scripts: {', '.join(found) or 'none'} (from {scripts})", err=True)
    os.environ["DETLAB_QUEUE"] = queue
    from celery.exceptions import SecurityWarning

    from detlab.worker.tasks import app as celery
    from detlab.worker.tasks import worker_name

    # JSON-only tasks (Celery's default), so running as a superuser is not the risk Celery's SecurityWarning is
    # about (pickled tasks); --quiet drops the banner: `detlab up`'s output is its one ready line.
    warnings.filterwarnings("ignore", category=SecurityWarning)
    celery.worker_main(["--quiet", "worker", "-Q", queue, "-n", worker_name(), "--pool", "solo",
                        "--loglevel", "WARNING", "--without-gossip", "--without-mingle", "--without-heartbeat"])


@app.command()
def up(port: int = 8000,
       data_dir: Annotated[Path, typer.Option(envvar="DETLAB_DATA_DIR")] = Path(".detlab")) -> None:
    """Embedded detlab: SQLite, an embedded broker and one local worker. No services needed.

    Data (the database, the broker's folder, the ingest token) is kept in --data-dir."""
    os.environ["DETLAB_DATA_DIR"] = str(data_dir)
    os.environ["DETLAB_API_URL"] = f"http://127.0.0.1:{port}"
    from detlab.core.settings import get_settings

    get_settings().resolved_ingest_token()  # created once, read by the worker from the data dir
    migrate_database()
    from detlab.worker.launch import die_with_parent

    workers: list[subprocess.Popen] = []

    def start_worker() -> None:
        # Started once the API answers: the worker's imports (torch) would otherwise compete with the API's for
        # the CPU, and a job submitted meanwhile waits in the broker anyway.
        # uvicorn re-raises SIGTERM after its shutdown, so `finally` below may never run: the worker also learns of
        # our death from the kernel, and is killed (its ranks die with it). Not a warm shutdown: a run in progress
        # would keep it waiting out its ingest retries (minutes) against the API that is gone; the run is re-sent
        # at the next start, as after a crash.
        workers.append(subprocess.Popen([sys.executable, "-m", "detlab.cli", "worker"], env=dict(os.environ),
                                        preexec_fn=lambda: die_with_parent(signal.SIGKILL)))

    try:
        serve("127.0.0.1", port, on_ready=start_worker)
    finally:
        for worker_proc in workers:
            worker_proc.terminate()  # Celery's warm shutdown: finishes nothing new, exits
            try:
                worker_proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                worker_proc.kill()  # the reconciler re-dispatches whatever it was running
                worker_proc.wait()
