"""`POST /api/v1/jobs` with an `Idempotency-Key`: a retried submit returns the first job and creates nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from detlab.backend.models import IdempotencyKey, Job, utcnow
from detlab.backend.services import dispatch as dispatch_service
from detlab.backend.services.idempotency import MAX_KEY_LENGTH
from detlab.core.settings import Settings

pytestmark = pytest.mark.both_databases  # the store itself: SQLite (embedded) and PostgreSQL

JOB = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 1, "steps": 2}


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setattr(dispatch_service, "dispatch", lambda run_id, queue: None)  # no broker here
    return Settings(data_dir=tmp_path, ingest_token="t" * 32)


def jobs_stored(session: Session) -> int:
    session.expire_all()
    return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_the_same_key_and_body_returns_the_first_job(client: TestClient, session: Session) -> None:
    first = client.post("/api/v1/jobs", json=JOB, headers={"Idempotency-Key": "retry-1"})
    again = client.post("/api/v1/jobs", json=dict(reversed(JOB.items())), headers={"Idempotency-Key": "retry-1"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert jobs_stored(session) == 1


def test_the_same_key_with_another_body_is_refused(client: TestClient, session: Session) -> None:
    assert client.post("/api/v1/jobs", json=JOB, headers={"Idempotency-Key": "retry-2"}).status_code == 201
    resp = client.post("/api/v1/jobs", json={**JOB, "steps": 3}, headers={"Idempotency-Key": "retry-2"})
    assert resp.status_code == 422
    assert "Idempotency-Key 'retry-2' was used" in resp.json()["detail"]
    assert jobs_stored(session) == 1


def test_a_key_older_than_a_day_starts_a_new_job(client: TestClient, session: Session) -> None:
    first = client.post("/api/v1/jobs", json=JOB, headers={"Idempotency-Key": "daily"}).json()
    session.execute(update(IdempotencyKey).values(created_at=utcnow() - timedelta(days=1, seconds=1)))
    session.commit()
    again = client.post("/api/v1/jobs", json=JOB, headers={"Idempotency-Key": "daily"})
    assert again.status_code == 201
    assert again.json()["id"] != first["id"]
    assert jobs_stored(session) == 2


def test_a_key_too_long_is_a_422_and_stores_nothing(client: TestClient, session: Session) -> None:
    resp = client.post("/api/v1/jobs", json=JOB, headers={"Idempotency-Key": "k" * (MAX_KEY_LENGTH + 1)})
    assert resp.status_code == 422
    assert jobs_stored(session) == 0
