"""Broker faults seen from the API: a submit while Redis is down, and /health reporting the broker.

Each test starts its own redis-server on a free port and stops it; the machine's shared Redis is never touched."""

from __future__ import annotations

import time
from collections.abc import Iterator
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
from tests.services import RedisServer

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOB = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 1, "steps": 2, "repeats": 2}


@pytest.fixture
def settings(tmp_path: Path, own_redis: RedisServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """Settings whose broker is this test's Redis, for the routes and for the Celery app that sends."""
    monkeypatch.setenv("DETLAB_BROKER_URL", own_redis.url())
    get_settings.cache_clear()
    dispatch_service.celery_app.cache_clear()
    yield Settings(data_dir=tmp_path, ingest_token=TOKEN, broker_url=own_redis.url(), run_stale_after_s=5)
    monkeypatch.delenv("DETLAB_BROKER_URL")
    get_settings.cache_clear()
    dispatch_service.celery_app.cache_clear()


def test_submit_with_the_broker_down_is_accepted_once_and_dispatched_when_it_is_back(
        client: TestClient, session: Session, settings: Settings, own_redis: RedisServer) -> None:
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
    assert redis.Redis.from_url(own_redis.url()).llen("default") == 2


def test_health_is_503_naming_the_broker_while_it_is_down(client: TestClient, own_redis: RedisServer) -> None:
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
