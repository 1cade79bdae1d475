"""Whole deployments for end-to-end tests: real processes started with detlab's own commands."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from detlab.worker.runner import SPOOL_PREFIX
from tests.conftest import ROOT, free_port, pg_database, unused_redis_url
from tests.services import RedisServer
from tests.waiting import wait_until


def wait_healthy(url: str, procs: list[subprocess.Popen], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        dead = [p.args for p in procs if p.poll() is not None]
        if dead:
            raise RuntimeError(f"process exited before detlab was healthy: {dead}")
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"{url} not healthy after {timeout} s")


@dataclass
class Stack:
    """API + worker processes started with detlab's own CLI (as docker-compose runs them)."""

    url: str
    env: dict[str, str]
    log_dir: Path
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "detlab.cli", *args], env=self.env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs[name] = proc
        return proc

    def kill(self, name: str) -> None:
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        for name in list(self.procs):
            proc = self.procs.pop(name)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()

    @property
    def spool_root(self) -> Path:
        """Where the stack's workers put their runs' folders (its TMPDIR): this test's, no one else's."""
        return Path(self.env["TMPDIR"])

    def ranks(self, run_id: int) -> dict[int, int]:
        """pid -> process group of the processes of this stack's run `run_id` (see rank_processes)."""
        return rank_processes(run_id, self.spool_root)

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.log_dir.glob("*.log"))

    def submit(self, body: dict) -> dict:
        resp = httpx.post(f"{self.url}/api/v1/jobs", json=body, timeout=30)
        assert resp.status_code == 201, resp.text
        return resp.json()

    def wait_job(self, job_id: int, timeout: float = 240.0) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = httpx.get(f"{self.url}/api/v1/jobs/{job_id}", timeout=10).json()
            if job["status"] in ("succeeded", "failed", "cancelled"):
                return job
            time.sleep(0.5)
        raise TimeoutError(f"job {job_id} did not finish in {timeout} s\n{self.logs()}")

    def comparison(self, job_id: int) -> dict:
        resp = httpx.get(f"{self.url}/api/v1/jobs/{job_id}/comparison", timeout=30)
        assert resp.status_code == 200, resp.text
        return resp.json()


# A worker without a heartbeat (every 0.5 s here) for this long is lost, and so are its runs: 30 heartbeats, so
# that a worker or API that a loaded machine starves for seconds is not judged dead (its run redone as attempt 2,
# its queue shown without a worker). A test of a lost worker sets its own, shorter.
RUN_STALE_AFTER_S = 15


def stack_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}
    # Runs' folders go under the test's own temp dir: another test's run 1 (other people's too) is not ours.
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp_path / "tmp")
    env.update({"DETLAB_DATA_DIR": str(tmp_path / "data"), "DETLAB_API_URL": f"http://127.0.0.1:{port}",
                "DETLAB_INGEST_TOKEN": secrets.token_urlsafe(24), "DETLAB_HEARTBEAT_INTERVAL_S": "0.5",
                "DETLAB_RECONCILE_INTERVAL_S": "1", "DETLAB_RUN_STALE_AFTER_S": str(RUN_STALE_AFTER_S),
                "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


def wait_for(what: str, check: Callable[[], Any], stack: Stack, timeout: float = 120.0) -> Any:
    """`check()`'s first truthy answer, asked every 0.2 s; past `timeout`, an error with the stack's logs."""
    return wait_until(check, timeout, what, interval=0.2, explain=stack.logs)


def read_job(stack: Stack, job_id: int) -> dict[str, Any]:
    return httpx.get(f"{stack.url}/api/v1/jobs/{job_id}", timeout=10).json()


@contextmanager
def distributed_stack(tmp_path: Path, database_url: str, broker_url: str, **extra: str) -> Iterator[Stack]:
    """Migrate, then an API and a worker on the given database and broker (`extra`: more environment)."""
    port = free_port()
    env = stack_env(tmp_path, port, DETLAB_MODE="distributed", DETLAB_DATABASE_URL=database_url,
                    DETLAB_BROKER_URL=broker_url, **extra)
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=tmp_path)
    subprocess.run([sys.executable, "-m", "detlab.cli", "migrate"], env=env, cwd=ROOT, check=True)
    stack.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    stack.start("worker", "worker", "--queue", "default")
    try:
        wait_healthy(stack.url, list(stack.procs.values()))
        yield stack
    finally:
        stack.stop()


@pytest.fixture
def distributed(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Stack]:
    """Distributed deployment without Docker: migrate, API and a worker on local PostgreSQL and Redis."""
    with distributed_stack(tmp_path, pg_url, redis_url) as stack:
        yield stack


@contextmanager
def embedded_stack(folder: Path) -> Iterator[Stack]:
    """`detlab up`, the README's run command: SQLite and the embedded broker, no services."""
    port = free_port()
    env = stack_env(folder, port)
    del env["DETLAB_INGEST_TOKEN"]  # `up` makes its own, as on a fresh laptop
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=folder)
    stack.start("up", "up", "--port", str(port), "--data-dir", str(folder / "data"))
    try:
        wait_healthy(stack.url, list(stack.procs.values()))
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def shared_distributed(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> Iterator[Stack]:
    """One distributed deployment for a whole module, for tests that only look at their own jobs (by id)."""
    with pg_database() as database, distributed_stack(tmp_path_factory.mktemp("distributed"), database,
                                                      unused_redis_url(redis_server)) as stack:
        yield stack


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Stack]:
    """A `detlab up` of this test's own, on an empty database."""
    with embedded_stack(tmp_path) as stack:
        yield stack


@pytest.fixture
def own_embedded(tmp_path: Path) -> Iterator[Stack]:
    """As `embedded`, under the name a module that shares one stack as `embedded` uses for a test that must not."""
    with embedded_stack(tmp_path) as stack:
        yield stack


@pytest.fixture(scope="module")
def shared_embedded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """One `detlab up` for a whole module, for tests that only look at their own jobs (by id): starting it per
    test was most of their time. A test that counts everything on the server takes `embedded` instead."""
    with embedded_stack(tmp_path_factory.mktemp("embedded")) as stack:
        yield stack


def rank_pids(run_id: int, under: Path) -> dict[int, int]:
    """rank -> pid of the run's rank processes, as the launcher wrote them into the run's folder (which lies
    `under` the stack's TMPDIR: another stack's run with the same id is not this one); running or not."""
    pids = {}
    for path in under.glob(f"{SPOOL_PREFIX}{run_id}-*/rank*.pid"):
        try:
            pids[int(path.stem.removeprefix("rank"))] = int(path.read_text())
        except (OSError, ValueError):
            continue  # being written, or its folder removed while we looked
    return pids


def rank_processes(run_id: int, under: Path) -> dict[int, int]:
    """pid -> process group of every running process of the run: its ranks (each leads a process group) and
    whatever shares their process groups."""
    groups = set(rank_pids(run_id, under).values())
    procs: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if stat[0] != "Z":  # a zombie is dead, waiting to be reaped
            procs[int(entry.name)] = int(stat[2])
    return {pid: pgid for pid, pgid in procs.items() if pgid in groups}
