"""Shared test fixtures: real PostgreSQL and Redis, real processes started with detlab's own commands."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import pytest
import redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from backend.db import make_engine
from backend.models import Base

PG_ADMIN = os.environ.get("DETLAB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("DETLAB_TEST_REDIS", "redis://127.0.0.1:6379")
ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"detlab_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'detlab.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with sessionmaker(engine, expire_on_commit=False)() as s:
        yield s


@pytest.fixture
def redis_url() -> str:
    """A Redis database index of its own, emptied first (Redis keeps 16)."""
    db = 1 + int(uuid.uuid4().int % 14)
    url = f"{REDIS_URL}/{db}"
    redis.Redis.from_url(url).flushdb()
    return url


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
        proc = subprocess.Popen([sys.executable, "-m", "backend.cli", *args], env=self.env, cwd=ROOT,
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
            if job["status"] in ("succeeded", "failed"):
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
    subprocess.run([sys.executable, "-m", "backend.cli", "migrate"], env=env, cwd=ROOT, check=True)
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
