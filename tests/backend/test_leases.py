"""A run belongs to its writer, through the API on PostgreSQL: claims need a worker credential and hand out a lease;
only the lease's holder writes, heartbeats or finishes that attempt; an SDK recording takes writes from the
identity that opened it only; a record for a step that holds one is a repeat when equal and a 409 when not."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import Run, StepRecord, User, Worker
from detlab.backend.services import auth
from detlab.backend.services.jobs import create_job
from detlab.core.settings import Settings
from detlab.core.wire import LEASE_HEADER
from tests.backend.test_recordings import opening, step

INGEST_TOKEN = "i" * 32
WORKER = {"Authorization": f"Bearer {INGEST_TOKEN}"}  # the server's token: the shared worker credential
PASSWORD = "correct horse battery"


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=INGEST_TOKEN, auth_mode="local")


@pytest.fixture
def client(client: TestClient) -> TestClient:
    """The shared client without the conftest's lease carrying: these tests send leases, or not, themselves."""
    client.event_hooks = {"request": [], "response": []}
    return client


def token_for(session: Session, *scopes: str, name: str = "mallory", role: str = "member") -> dict[str, str]:
    if session.scalar(select(User).where(User.name == name)) is None:
        auth.create_user(session=session, name=name, role=role, password=PASSWORD)
    _, token = auth.create_token(session=session, user_name=name, scopes=list(scopes))
    session.commit()
    return {"Authorization": f"Bearer {token}"}


def queued_run(session: Session, submitter: str = "ada") -> Run:
    body = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 2, "steps": 3}
    job = create_job(session=session, data=JobCreate.model_validate(body), settings=Settings(), submitter=submitter)
    session.commit()
    return job.runs[0]


def claim(client: TestClient, run: Run, headers: dict[str, str] = WORKER) -> Any:
    return client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "node:default"}, headers=headers)


def records(client: TestClient, run_id: int, attempt: int, *recs: dict, headers: dict[str, str]) -> Any:
    return client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": attempt, "records": list(recs)},
                       headers=headers)


def stored_digest(session: Session, run_id: int, n: int, rank: int) -> str:
    session.expire_all()
    return session.scalars(select(StepRecord.model_digest).where(
        StepRecord.run_id == run_id, StepRecord.step == n, StepRecord.rank == rank)).one()


# ---- the worker credential ---------------------------------------------------------------------------------------

def test_a_users_ingest_token_cannot_claim_a_run(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    resp = claim(client, run, token_for(session, "ingest"))
    assert resp.status_code == 403 and "worker credential" in resp.json()["detail"]
    session.refresh(run)
    assert (run.status, run.attempt) == ("queued", 0)


def test_a_users_ingest_token_cannot_heartbeat_as_a_worker(client: TestClient, session: Session) -> None:
    beat = {"worker": "evil:default", "queue": "default", "info": {"capacity": None}}
    resp = client.post("/api/v1/ingest/heartbeat", json=beat, headers=token_for(session, "ingest"))
    assert resp.status_code == 403
    session.expire_all()
    assert session.scalars(select(Worker)).all() == []  # not shown on /health or in the new-job form


def test_a_token_with_scope_worker_claims_and_gets_a_lease(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    resp = claim(client, run, token_for(session, "worker", name="node-7", role="worker"))
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["lease"]) >= 32
    session.refresh(run)
    assert run.lease_hash and resp.json()["lease"] not in run.lease_hash  # only its sha256 is kept


@pytest.mark.parametrize("role", ["member", "admin"])
def test_no_persons_role_holds_a_worker_token(session: Session, role: str) -> None:
    auth.create_user(session=session, name="bob", role=role, password=PASSWORD)
    with pytest.raises(auth.AuthError, match="cannot hold scope worker"):
        auth.create_token(session=session, user_name="bob", scopes=["worker"])


# ---- the lease -----------------------------------------------------------------------------------------------

def test_records_without_the_claims_lease_are_refused_and_not_stored(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    attempt = claim(client, run).json()["attempt"]
    for lease in ({}, {LEASE_HEADER: "not-the-lease"}):
        resp = records(client, run.id, attempt, step(5, 0, "ee"), headers={**WORKER, **lease})
        assert resp.status_code == 403 and "leased" in resp.json()["detail"], resp.text
    assert session.scalars(select(StepRecord)).all() == []


def test_a_users_ingest_token_cannot_write_a_workers_run(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    spec = claim(client, run).json()
    # Even knowing the lease, a user's token is not a worker's.
    resp = records(client, run.id, spec["attempt"], step(5, 0, "ee"),
                   headers={**token_for(session, "ingest"), LEASE_HEADER: spec["lease"]})
    assert resp.status_code == 403
    assert session.scalars(select(StepRecord)).all() == []


def test_the_lease_holder_writes_and_finishes(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    spec = claim(client, run).json()
    holder = {**WORKER, LEASE_HEADER: spec["lease"]}
    assert records(client, run.id, spec["attempt"], step(0, 0), headers=holder).status_code == 200
    finish = {"attempt": spec["attempt"], "status": "succeeded"}
    assert client.post(f"/api/v1/ingest/runs/{run.id}/finish", json=finish, headers=holder).status_code == 200
    session.refresh(run)
    assert run.status == "succeeded"


def test_a_finish_without_the_lease_leaves_the_run_running(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    attempt = claim(client, run).json()["attempt"]
    forged = {"attempt": attempt, "status": "failed", "error": "tampered"}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/finish", json=forged, headers={**WORKER, LEASE_HEADER: "x"})
    assert resp.status_code == 403
    session.refresh(run)
    assert (run.status, run.error) == ("running", None)


def test_a_heartbeat_for_a_run_needs_its_lease(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    attempt = claim(client, run).json()["attempt"]
    beat = {"worker": "evil:default", "queue": "default", "run_id": run.id, "attempt": attempt}
    resp = client.post("/api/v1/ingest/heartbeat", json=beat, headers={**WORKER, LEASE_HEADER: "x"})
    assert resp.status_code == 403 and "lease" in resp.json()["detail"]


def test_a_new_claim_voids_the_previous_attempts_lease(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    first = claim(client, run).json()
    session.refresh(run)
    run.status = "queued"  # as the reconciler leaves a run whose worker went silent
    session.commit()
    second = claim(client, run).json()
    # The old holder is told it is stale (409: its worker stops), and cannot write the new attempt either.
    assert records(client, run.id, first["attempt"], step(0, 0),
                   headers={**WORKER, LEASE_HEADER: first["lease"]}).status_code == 409
    assert records(client, run.id, second["attempt"], step(0, 0),
                   headers={**WORKER, LEASE_HEADER: first["lease"]}).status_code == 403


# ---- one record per step ----------------------------------------------------------------------------------------

def test_a_record_sent_again_unchanged_is_an_idempotent_repeat(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    spec = claim(client, run).json()
    holder = {**WORKER, LEASE_HEADER: spec["lease"]}
    for _ in range(2):
        assert records(client, run.id, spec["attempt"], step(1, 0, "ab"), headers=holder).status_code == 200
    assert stored_digest(session, run.id, 1, 0) == "fp2:" + "ab" * 16


def test_a_different_record_for_a_stored_step_is_a_409_and_the_first_stays(client: TestClient,
                                                                           session: Session) -> None:
    run = queued_run(session)
    spec = claim(client, run).json()
    holder = {**WORKER, LEASE_HEADER: spec["lease"]}
    assert records(client, run.id, spec["attempt"], step(1, 0, "ab"), headers=holder).status_code == 200
    resp = records(client, run.id, spec["attempt"], step(1, 0, "cd"), headers=holder)
    assert resp.status_code == 409
    assert "step 1, rank 0" in resp.json()["detail"] and "model_digest" in resp.json()["detail"]
    assert stored_digest(session, run.id, 1, 0) == "fp2:" + "ab" * 16


def test_two_different_records_for_one_step_in_one_batch_are_a_409(client: TestClient, session: Session) -> None:
    run = queued_run(session)
    spec = claim(client, run).json()
    holder = {**WORKER, LEASE_HEADER: spec["lease"]}
    assert records(client, run.id, spec["attempt"], step(1, 0, "ab"), step(1, 0, "cd"),
                   headers=holder).status_code == 409
    session.expire_all()
    assert session.scalars(select(StepRecord)).all() == []  # the batch is refused whole


# ---- recordings -------------------------------------------------------------------------------------------------

def test_a_recording_takes_records_from_its_opener_only(client: TestClient, session: Session) -> None:
    ada = token_for(session, "ingest", name="ada")
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=ada).json()
    mallory = token_for(session, "ingest")
    for headers in (mallory, WORKER):  # another user, and the server's token
        resp = records(client, opened["run_id"], opened["attempt"], step(1, 0, "ee"), headers=headers)
        assert resp.status_code == 403 and "recording of ada" in resp.json()["detail"]
    assert records(client, opened["run_id"], opened["attempt"], step(1, 0), headers=ada).status_code == 200
    assert stored_digest(session, opened["run_id"], 1, 0) == "fp2:" + "ab" * 16


def test_another_user_can_neither_reopen_nor_close_a_recording(client: TestClient, session: Session) -> None:
    ada = token_for(session, "ingest", name="ada")
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=ada).json()
    mallory = token_for(session, "ingest")
    assert client.post("/api/v1/ingest/recordings", json=opening(), headers=mallory).status_code == 403
    close = {"rank": 0, "status": "failed", "error": "tampered"}
    assert client.post(f"/api/v1/ingest/runs/{opened['run_id']}/close", json=close, headers=mallory).status_code == 403
    session.expire_all()
    assert "closed" not in session.get(Run, opened["run_id"]).job.params


def test_ranks_tensor_lists_that_differ_are_not_a_conflict(client: TestClient, session: Session) -> None:
    """Each SDK rank sends its own tensor list (a sharded model's shapes differ by rank): not a record for a step."""
    ada = token_for(session, "ingest", name="ada")
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=ada).json()
    for rank, shape in ((0, [4]), (1, [2])):
        tensors = {"type": "tensors", "tensors": [{"index": 0, "name": "w", "shape": shape, "dtype": "float32"}]}
        resp = records(client, opened["run_id"], opened["attempt"], tensors, step(0, rank), headers=ada)
        assert resp.status_code == 200, resp.text
