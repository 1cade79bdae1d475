"""A fix job through the API with the records its runs would send: the search advances round by round as its runs
finish (settle → Kind.advance), on SQLite and PostgreSQL, and its result is served at GET /jobs/{id}/fix."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import Run
from detlab.core.settings import Settings

pytestmark = pytest.mark.both_databases

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TENSORS = {"type": "tensors", "tensors": [{"index": 0, "name": "w", "shape": [4], "dtype": "float32"}]}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


def feed(client: TestClient, run_id: int, digest: str, step_time_s: float = 0.01) -> None:
    """Claim the run as worker w, send steps 0..5 of rank 0 with this digest from step 1 on, finish it."""
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "w"}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    attempt = resp.json()["attempt"]
    steps = [{"type": "step", "step": s, "rank": 0, "fp_version": "fp2", "digests": (digest if s else "ab") * 16,
              "model_digest": f"fp2:{(digest if s else 'ab') * 16}", "loss_bits": "3f800000", "loss": 1.0,
              "step_time_s": step_time_s} for s in range(6)]
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": attempt,
                                                                      "records": [TENSORS, *steps]}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/finish", json={"attempt": attempt, "status": "succeeded"},
                       headers=AUTH)
    assert resp.status_code == 200, resp.text


def job_of(client: TestClient, job_id: int) -> dict[str, Any]:
    return client.get(f"/api/v1/jobs/{job_id}").json()


def test_the_search_adds_a_round_when_one_finishes_and_settles_on_the_prescription(client: TestClient,
                                                                                   session: Session) -> None:
    capacity = {"device": "cpu", "gpus": 0, "cpu_cores": 2}
    beat = {"worker": "w", "queue": "default", "info": {"capacity": capacity}}
    assert client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH).status_code == 200
    resp = client.post("/api/v1/jobs", json={"kind": "fix", "workload": "scatter", "steps": 3, "max_trials": 4,
                                             "configs": [{"preset": "default", "name": "two", "threads": 2}]})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    base = [r["id"] for r in job["runs"]]
    feed(client, base[0], "cd")
    assert job_of(client, job["id"])["status"] == "running"
    feed(client, base[1], "ef")  # the base's repeats part at step 1: the first candidate is added
    job = job_of(client, job["id"])
    assert job["status"] == "running" and len(job["runs"]) == 6  # finished the round, not the job
    assert [c["name"] for c in job["configs"]] == ["two", "fix.deterministic-algorithms"]
    assert job["params"]["fix"]["stack"] == "cpu, gloo, world size 1"
    session.expire_all()  # the round's runs were sent by the finish that added them, not left to the reconciler
    added = session.scalars(select(Run).where(Run.job_id == job["id"], Run.id.not_in(base)).order_by(Run.id)).all()
    assert all(r.dispatched_at is not None for r in added)
    # A B A B: each candidate run follows a base run of the same round (repeats 2 and 3 of the base)
    assert [(r.config_index, r.repeat) for r in added] == [(0, 2), (1, 0), (0, 3), (1, 1)]
    assert job["params"]["fix"]["order"] == ["deterministic-algorithms", "threads-1"]
    live = client.get(f"/api/v1/jobs/{job['id']}/fix").json()
    assert live["verdict"] is None and live["trials"][1]["reproducible"] is None
    for run in added:
        feed(client, run.id, "cd")  # identical repeats: reproducible
    job = job_of(client, job["id"])
    assert job["status"] == "succeeded" and len(job["runs"]) == 6 and job["verdict"] == "found"
    result = client.get(f"/api/v1/jobs/{job['id']}/fix").json()
    assert result["prescription"]["knobs"] == ["deterministic-algorithms"]
    assert result["prescription"]["config"]["torch"]["deterministic_algorithms"] is True
    assert result["prescription"]["config"]["threads"] == 2
    assert result["necessary"]["deterministic-algorithms"]["trial"] == 0
    # k of n: n the trial's repeats, k those identical to the first, the first counting as itself; the base's
    # runs of later rounds time the cost and do not count as its repeats
    assert [t["reproducible"] for t in result["trials"]] == [[1, 2], [2, 2]]
    assert result["trials"][0]["first_divergent_step"] == 1
    listed = client.get("/api/v1/jobs", params={"kind": "fix", "verdict": "found"}).json()
    assert [j["id"] for j in listed["items"]] == [job["id"]]


def test_a_trials_cost_is_against_the_base_runs_of_its_own_round(client: TestClient, session: Session) -> None:
    """The machine slows down twofold after round 0: base and candidate, run in the same round, cost the same."""
    resp = client.post("/api/v1/jobs", json={"kind": "fix", "workload": "scatter", "steps": 5, "max_trials": 2,
                                             "configs": [{"preset": "default", "name": "two", "threads": 2}]})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    base = [r["id"] for r in job["runs"]]
    feed(client, base[0], "cd", 0.01)
    feed(client, base[1], "ef", 0.01)
    added = session.scalars(select(Run).where(Run.job_id == job["id"], Run.id.not_in(base)).order_by(Run.id)).all()
    assert len(added) == 4
    for run in added:
        feed(client, run.id, "cd", 0.02)
    result = client.get(f"/api/v1/jobs/{job['id']}/fix").json()
    assert result["verdict"] == "found"
    assert result["trials"][1]["cost"] == pytest.approx(0.0)  # against round 0's base it would read 50 % slower


def test_a_trial_whose_run_failed_ends_the_search_incomplete_without_judging_a_knob(client: TestClient,
                                                                                    session: Session) -> None:
    """deterministic-algorithms' run raises: no further candidate is sent on the strength of it, the job fails with
    verdict incomplete and the failure, and the team's prescriptions do not list it as an answer."""
    resp = client.post("/api/v1/jobs", json={"kind": "fix", "workload": "scatter", "steps": 3, "max_trials": 6,
                                             "configs": [{"preset": "default", "name": "two", "threads": 2}]})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    base = [r["id"] for r in job["runs"]]
    feed(client, base[0], "cd")
    feed(client, base[1], "ef")
    added = session.scalars(select(Run).where(Run.job_id == job["id"], Run.id.not_in(base)).order_by(Run.id)).all()
    for run in added:
        if run.config_index == 0:
            feed(client, run.id, "cd")
            continue
        attempt = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"},
                              headers=AUTH).json()["attempt"]
        resp = client.post(f"/api/v1/ingest/runs/{run.id}/finish", headers=AUTH,
                           json={"attempt": attempt, "status": "failed", "error": "rank 0: RuntimeError: no"})
        assert resp.status_code == 200, resp.text
    job = job_of(client, job["id"])
    assert job["status"] == "failed" and job["verdict"] == "incomplete" and len(job["runs"]) == 6
    result = client.get(f"/api/v1/jobs/{job['id']}/fix").json()
    assert result["verdict"] == "incomplete" and result["prescription"] is None and result["necessary"] == {}
    assert result["failed"]["index"] == 1 and "RuntimeError: no" in result["failed"]["failed"]
    assert {"knob": "threads-1", "reason": "the search stopped at trial 1", "knobs": None} in result["not_tried"]
    assert client.get("/api/v1/findings/matrix").json()["prescriptions"] == []


def test_a_cancelled_search_is_incomplete_not_left_searching(client: TestClient) -> None:
    """Cancelled before its base ran: the job is cancelled and its search says where it stopped (it read as still
    searching, verdict null, for good)."""
    resp = client.post("/api/v1/jobs", json={"kind": "fix", "workload": "scatter", "steps": 3,
                                             "configs": [{"preset": "default", "name": "two", "threads": 2}]})
    assert resp.status_code == 201, resp.text
    job = client.post(f"/api/v1/jobs/{resp.json()['id']}/cancel").json()
    assert job["status"] == "cancelled" and job["verdict"] == "incomplete"
    result = client.get(f"/api/v1/jobs/{job['id']}/fix").json()
    assert result["verdict"] == "incomplete" and [t["knobs"] for t in result["trials"]] == [[]]
    assert result["failed"]["failed"] == f"run {job['runs'][0]['id']} cancelled"
