"""Whole deployments for end-to-end tests: real processes started with detlab's own commands."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.conftest import ROOT, free_port


def wait_healthy(url: str, procs: list[subprocess.Popen], timeout: float = 60.0) -> None:
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


def stack_env(tmp_path: Path, port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}
    env.update({"DETLAB_DATA_DIR": str(tmp_path / "data"), "DETLAB_API_URL": f"http://127.0.0.1:{port}",
                "DETLAB_INGEST_TOKEN": secrets.token_urlsafe(24), "DETLAB_HEARTBEAT_INTERVAL_S": "0.5",
                "DETLAB_RECONCILE_INTERVAL_S": "1", "DETLAB_RUN_STALE_AFTER_S": "6", "PYTHONUNBUFFERED": "1",
                "OMP_NUM_THREADS": "1"})
    env.update(extra)
    return env


@pytest.fixture
def distributed(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Stack]:
    """Distributed deployment without Docker: migrate, API and a worker on local PostgreSQL and Redis."""
    port = free_port()
    env = stack_env(tmp_path, port, DETLAB_MODE="distributed", DETLAB_DATABASE_URL=pg_url,
                    DETLAB_BROKER_URL=redis_url)
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
def embedded(tmp_path: Path) -> Iterator[Stack]:
    """`detlab up`, the README's run command: SQLite and the embedded broker, no services."""
    port = free_port()
    env = stack_env(tmp_path, port)
    del env["DETLAB_INGEST_TOKEN"]  # `up` makes its own, as on a fresh laptop
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=tmp_path)
    stack.start("up", "up", "--port", str(port), "--data-dir", str(tmp_path / "data"))
    try:
        wait_healthy(stack.url, list(stack.procs.values()))
        yield stack
    finally:
        stack.stop()
