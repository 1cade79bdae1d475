"""Jobs have an owner, their submitter: only the owner or an admin edits a job's tags, cancels it, cancels one of its
runs or reruns it (403 with a message naming the owner); reads stay team-wide; a team that shares its jobs says so
(DETLAB_SHARED_JOBS). Through the API in auth mode local, on PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.models import Job
from detlab.backend.services import auth
from detlab.core.settings import Settings

PASSWORD = "correct horse battery"
JOB = {"workload": "mlp", "configs": [{}], "world_size": 1, "steps": 2, "tags": ["mine"]}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token="i" * 32, auth_mode="local")


def bearer(session: Session, name: str, role: str = "member") -> dict[str, str]:
    auth.create_user(session=session, name=name, role=role, password=PASSWORD)
    _, token = auth.create_token(session=session, user_name=name, scopes=["admin" if role == "admin" else "submit"])
    session.commit()
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def people(session: Session) -> dict[str, dict[str, str]]:
    return {name: bearer(session, name, role) for name, role in
            (("ada", "member"), ("bob", "member"), ("root", "admin"))}


def submitted(client: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    resp = client.post("/api/v1/jobs", json=JOB, headers=headers)
    assert resp.status_code in (201, 202), resp.text
    return dict(resp.json())


CHANGES = {
    "edit": lambda c, job, h: c.patch(f"/api/v1/jobs/{job['id']}", json={"tags": ["theirs"]}, headers=h),
    "cancel": lambda c, job, h: c.post(f"/api/v1/jobs/{job['id']}/cancel", headers=h),
    "cancel a run of": lambda c, job, h: c.post(f"/api/v1/runs/{job['runs'][0]['id']}/cancel", headers=h),
    "rerun": lambda c, job, h: c.post(f"/api/v1/jobs/{job['id']}/rerun", headers=h),
}


@pytest.mark.parametrize("change", CHANGES)
def test_another_member_may_not_change_a_job_and_it_stays_as_it_was(client: TestClient, session: Session,
                                                                     people: dict, change: str) -> None:
    job = submitted(client, people["ada"])
    resp = CHANGES[change](client, job, people["bob"])
    assert resp.status_code == 403, resp.text
    assert "job" in resp.json()["detail"] and "ada's" in resp.json()["detail"] and "bob" in resp.json()["detail"]
    after = client.get(f"/api/v1/jobs/{job['id']}", headers=people["bob"]).json()  # reads stay team-wide
    assert (after["tags"], after["status"], after["runs"][0]["status"]) == (["mine"], job["status"],
                                                                            job["runs"][0]["status"])
    session.expire_all()
    assert session.scalar(select(func.count()).select_from(Job)) == 1  # no rerun made


@pytest.mark.parametrize("who", ["ada", "root"])
@pytest.mark.parametrize("change", CHANGES)
def test_the_owner_and_an_admin_may_change_a_job(client: TestClient, people: dict, change: str, who: str) -> None:
    job = submitted(client, people["ada"])
    resp = CHANGES[change](client, job, people[who])
    assert resp.status_code in (200, 201, 202), resp.text


def test_a_team_that_shares_its_jobs_lets_any_member_change_them(client: TestClient, people: dict,
                                                                  settings: Settings) -> None:
    settings.shared_jobs = True
    job = submitted(client, people["ada"])
    assert CHANGES["edit"](client, job, people["bob"]).status_code == 200
