"""Broker faults seen from the API: a submit while Redis is down, and /health reporting the broker.

Each test starts its own redis-server on a free port and stops it; the machine's shared Redis is never touched."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.models import Job, Run
from detlab.backend.services import dispatch as dispatch_service
from detlab.backend.services.reconcile import reconcile
from detlab.core.settings import Settings, get_settings
from tests.conftest import free_port

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 1, "steps": 2, "repeats": 2}


@dataclass
class OwnRedis:
    """A redis-server of this test's own, on a free port, that the test may stop and start again."""

    folder: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--save", "", "--appendonly", "no", "--dir", str(self.folder)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(self.url).ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise TimeoutError(f"redis-server on port {self.port} did not answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    # scripts/test-services.sh installs redis-server: its absence is a broken setup, not a skip.
    assert shutil.which("redis-server"), "redis-server is not installed (make services installs it)"
    server = OwnRedis(folder=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def settings(tmp_path: Path, own_redis: OwnRedis, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings whose broker is this test's Redis, for the routes and for the Celery app that sends."""
    monkeypatch.setenv("DETLAB_BROKER_URL", own_redis.url)
    get_settings.cache_clear()
    dispatch_service.celery_app.cache_clear()
    yield Settings(data_dir=tmp_path, ingest_token=TOKEN, broker_url=own_redis.url, run_stale_after_s=5)
    monkeypatch.delenv("DETLAB_BROKER_URL")
    get_settings.cache_clear()
    dispatch_service.celery_app.cache_clear()


def test_submit_with_the_broker_down_is_accepted_once_and_dispatched_when_it_is_back(
        client: TestClient, session: Session, settings: Settings, own_redis: OwnRedis) -> None:
    own_redis.stop()
    resp = client.post("/api/v1/jobs", json=JOB)
    assert resp.status_code == 202, resp.text
    session.expire_all()
    assert session.scalar(select(func.count()).select_from(Job)) == 1
    runs = session.scalars(select(Run).order_by(Run.id)).all()
    assert [r.dispatched_at for r in runs] == [None, None]

    own_redis.start()
    pending = reconcile(session=session, settings=settings)
    session.commit()
    assert sorted(pending) == [(r.id, "default") for r in runs]
    assert dispatch_service.send(pending) == []
    assert redis.Redis.from_url(own_redis.url).llen("default") == 2


def test_health_is_503_naming_the_broker_while_it_is_down(client: TestClient, own_redis: OwnRedis) -> None:
    beat = {"worker": "w", "queue": "default"}
    assert client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH).status_code == 200
    up = client.get("/api/v1/health")
    assert (up.status_code, up.json()["broker"], up.json()["database"]) == (200, "ok", "ok")

    own_redis.stop()
    started = time.monotonic()
    down = client.get("/api/v1/health")
    assert time.monotonic() - started < dispatch_service.CONNECT_TIMEOUT_S + 1
    assert down.status_code == 503
    assert (down.json()["status"], down.json()["database"]) == ("unavailable", "ok")
    assert down.json()["broker"].startswith("unreachable")
