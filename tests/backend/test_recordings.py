"""Recordings: SDK runs opened, fed and closed through the ingest API, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.api import ingest as api_ingest
from detlab.backend.api.deps import IngestCaller
from detlab.backend.models import Job, Run, StepRecord
from detlab.backend.services import recordings
from detlab.backend.services.reconcile import reconcile
from detlab.core.settings import Settings
from detlab.core.wire import RecordingClose

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=0.01, max_attempts=2)


def opening(world_size: int = 2, **extra: object) -> dict:
    return {"recording": "rec-0123456789", "name": "nightly", "tags": ["ci", "sdk"], "world_size": world_size,
            **extra}


def step(n: int, rank: int, digest: str = "ab") -> dict:
    return {"type": "step", "step": n, "rank": rank, "fp_version": "fp2", "model_digest": "fp2:" + digest * 16,
            "digests": digest * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}


def tensors() -> dict:
    return {"type": "tensors", "tensors": [{"index": 0, "name": "w", "shape": [4], "dtype": "float32"}]}


def test_every_rank_and_retry_opens_the_same_run(client: TestClient, session: Session) -> None:
    first = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH)
    assert first.status_code == 200, first.text
    again = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH)
    assert again.json() == first.json()
    assert session.scalar(select(func.count()).select_from(Job)) == 1
    job = session.get(Job, first.json()["job_id"])
    assert (job.kind, job.workload, job.status, job.tags, job.params["name"]) == \
        ("recording", "sdk", "running", ["ci", "sdk"], "nightly")


def test_in_auth_mode_none_a_recording_streams_without_a_token(client: TestClient, session: Session) -> None:
    """The embedded default (auth none, loopback only): `detlab.Recorder(server=...)` needs no set-up."""
    opened = client.post("/api/v1/ingest/recordings", json=opening(world_size=1))
    assert opened.status_code == 200, opened.text
    run_id, attempt = opened.json()["run_id"], opened.json()["attempt"]
    batch = {"attempt": attempt, "records": [tensors(), step(0, 0)]}
    assert client.post(f"/api/v1/ingest/runs/{run_id}/records", json=batch).status_code == 200
    assert client.post(f"/api/v1/ingest/runs/{run_id}/close", json={"rank": 0, "status": "succeeded"}).json() == \
        {"status": "succeeded"}
    # a token that is sent is still checked
    wrong = client.post("/api/v1/ingest/recordings", json=opening(), headers={"Authorization": "Bearer wrong"})
    assert wrong.status_code == 401


def test_a_recording_is_fed_closed_by_every_rank_and_then_judged(client: TestClient, session: Session) -> None:
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH).json()
    run_id, attempt = opened["run_id"], opened["attempt"]
    for rank in (0, 1):
        batch = {"attempt": attempt, "records": [tensors(), step(0, rank), step(1, rank)]}
        resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json=batch, headers=AUTH)
        assert resp.status_code == 200, resp.text
        # a batch sent twice (a retry after a lost reply, or `detlab upload` after online mode) is stored once
        client.post(f"/api/v1/ingest/runs/{run_id}/records", json=batch, headers=AUTH)
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 4
    closed = client.post(f"/api/v1/ingest/runs/{run_id}/close", json={"rank": 0, "status": "succeeded"}, headers=AUTH)
    assert closed.json() == {"status": "running"}  # rank 1 has not closed yet
    closed = client.post(f"/api/v1/ingest/runs/{run_id}/close", json={"rank": 1, "status": "succeeded"}, headers=AUTH)
    assert closed.json() == {"status": "succeeded"}
    job = client.get(f"/api/v1/jobs/{opened['job_id']}").json()
    assert job["status"] == "succeeded"


@pytest.mark.both_databases
def test_two_ranks_closing_at_once_both_count(client: TestClient, engine: Engine,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 closes while rank 0's close is between reading the closed ranks and committing. Each request has its
    own session, as the server gives it. Before the run was locked on SQLite (the embedded default), rank 1 read
    the ranks closed so far before rank 0 committed, and the last commit dropped the other's rank: the recording
    stayed running for good (CI, tests/sdk/test_online.py)."""
    run_id = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH).json()["run_id"]
    caller = IngestCaller(name=None, worker=True)
    inside, real = threading.Event(), recordings.close_rank

    def slow_close(**kw: Any) -> None:
        real(**kw)
        if kw["body"].rank == 0:
            inside.set()
            time.sleep(1.0)  # rank 1's request arrives meanwhile

    monkeypatch.setattr(recordings, "close_rank", slow_close)

    def close(rank: int) -> None:
        with sessionmaker(engine, expire_on_commit=False)() as own:
            api_ingest.close_recording(run_id, RecordingClose(rank=rank, status="succeeded"), own, caller)

    first = threading.Thread(target=close, args=(0,))
    first.start()
    assert inside.wait(30)
    close(1)
    first.join(30)
    with sessionmaker(engine)() as fresh:
        assert fresh.get(Run, run_id).status == "succeeded"


def test_one_failed_rank_fails_the_recording_with_its_error(client: TestClient) -> None:
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH).json()
    url = f"/api/v1/ingest/runs/{opened['run_id']}/close"
    client.post(url, json={"rank": 1, "status": "failed", "error": "CUDA error"}, headers=AUTH)
    done = client.post(url, json={"rank": 0, "status": "succeeded"}, headers=AUTH)
    assert done.json() == {"status": "failed"}
    run = client.get(f"/api/v1/jobs/{opened['job_id']}").json()["runs"][0]
    assert run["error"] == "rank 1: CUDA error"


def test_the_reconciler_never_dispatches_a_silent_recording(client: TestClient, session: Session,
                                                           settings: Settings) -> None:
    opened = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH).json()
    assert reconcile(session=session, settings=settings) == []
    run = session.get(Run, opened["run_id"])
    session.refresh(run)
    assert (run.status, run.attempt) == ("running", 1)


@pytest.mark.parametrize(("body", "status", "fragment"), [
    (opening(world_size=0), 422, "world_size"),
    (opening(tags=["no spaces"]), 422, "tags"),
    (opening(recording="short"), 422, "recording"),
    ({**opening(), "recording": "x" * 65}, 422, "recording"),
])
def test_bad_openings_are_a_clear_422(client: TestClient, body: dict, status: int, fragment: str) -> None:
    resp = client.post("/api/v1/ingest/recordings", json=body, headers=AUTH)
    assert resp.status_code == status and fragment in resp.text


def test_reopening_with_another_world_size_is_a_409(client: TestClient) -> None:
    client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH)
    resp = client.post("/api/v1/ingest/recordings", json=opening(world_size=4), headers=AUTH)
    assert resp.status_code == 409 and "world_size 2" in resp.json()["detail"]


def test_a_workers_run_cannot_be_closed_as_a_recording(client: TestClient, session: Session,
                                                        settings: Settings) -> None:
    from tests.backend.test_api import make_run

    run = make_run(session, settings)
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/close", json={"rank": 0, "status": "succeeded"}, headers=AUTH)
    assert resp.status_code == 409 and "not a recording" in resp.json()["detail"]


def recorded(client: TestClient, recording: str, digests: list[str], **opening_extra: object) -> int:
    """A finished one-rank recording with a step per digest; returns its run id."""
    body = {**opening(world_size=1), "recording": recording, **opening_extra}
    run_id = client.post("/api/v1/ingest/recordings", json=body, headers=AUTH).json()["run_id"]
    records = [tensors()] + [step(n, 0, d) for n, d in enumerate(digests)]
    client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": 1, "records": records}, headers=AUTH)
    client.post(f"/api/v1/ingest/runs/{run_id}/close", json={"rank": 0, "status": "succeeded"}, headers=AUTH)
    return run_id


def test_any_two_runs_compare_across_jobs(client: TestClient) -> None:
    a = recorded(client, "rec-aaaaaaaaaa", ["ab", "ab", "ab"])
    b = recorded(client, "rec-bbbbbbbbbb", ["ab", "ab", "ab"], name="other", tags=["ci"])
    c = recorded(client, "rec-cccccccccc", ["ab", "cd", "cd"])
    same = client.get(f"/api/v1/compare?a={a}&b={b}").json()
    assert (same["verdict"], same["steps_compared"]) == ("identical", 3)
    assert [(r["id"], r["name"], r["kind"], r["tags"]) for r in same["runs"]] == \
        [(a, "nightly", "recording", ["ci", "sdk"]), (b, "other", "recording", ["ci"])]
    parted = client.get(f"/api/v1/compare?a={a}&b={c}").json()
    assert (parted["verdict"], parted["first_divergent_step"], parted["ranks"], parted["steps_differing"]) == \
        ("diverged", 1, [0], 2)
    assert parted["first_divergent_tensors"] == ["w"]


def test_runs_are_found_by_name_workload_config_and_tag(client: TestClient) -> None:
    a = recorded(client, "rec-aaaaaaaaaa", ["ab"], name="llama-nightly", tags=["nightly"])
    b = recorded(client, "rec-bbbbbbbbbb", ["ab"], name="gpt-ci", tags=["ci"])

    def ids(query: str) -> list[int]:
        return [r["id"] for r in client.get(f"/api/v1/runs?{query}").json()["items"]]

    assert ids("") == [b, a]  # newest first
    assert ids("q=LLAMA") == [a] and ids("q=sdk") == [b, a] and ids("q=recorded") == [b, a]
    assert ids("tag=ci") == [b] and ids("q=100%25") == []  # % is a character, not a wildcard
    assert client.get("/api/v1/runs?limit=1").json()["total"] == 2


def test_a_search_the_database_cannot_hold_is_a_422(client: TestClient) -> None:
    recorded(client, "rec-aaaaaaaaaa", ["ab"])
    resp = client.get("/api/v1/runs?q=a%00b")  # PostgreSQL text cannot hold NUL: it was a 500 there
    assert resp.status_code == 422 and "q" in resp.text


@pytest.mark.parametrize(("query", "status"), [("a=1&b=999", 404), ("a=0&b=1", 422), ("a=1", 422),
                                               ("a=1&b=2147483648", 422)])
def test_bad_compare_queries_are_clear(client: TestClient, query: str, status: int) -> None:
    recorded(client, "rec-aaaaaaaaaa", ["ab"])
    assert client.get(f"/api/v1/compare?{query}").status_code == status


def test_a_recording_has_no_spec_and_no_rerun_but_says_why(client: TestClient) -> None:
    job_id = client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH).json()["job_id"]
    for resp in (client.get(f"/api/v1/jobs/{job_id}/spec"), client.post(f"/api/v1/jobs/{job_id}/rerun")):
        assert resp.status_code == 409, resp.text
        assert "recording" in resp.json()["detail"] and "run the script again" in resp.json()["detail"]


def test_the_jobs_list_names_each_recording(client: TestClient) -> None:
    client.post("/api/v1/ingest/recordings", json=opening(), headers=AUTH)
    [item] = client.get("/api/v1/jobs").json()["items"]
    assert (item["kind"], item["name"], item["tags"]) == ("recording", "nightly", ["ci", "sdk"])
