"""Cancel and guards through the API, on SQLite and PostgreSQL: cancelled runs are never claimed and their
workers are told to stop; jobs the workers of their queue cannot hold are refused with the limit named."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.models import CANCELLED, StepRecord, Worker, utcnow
from detlab.core.settings import Settings

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GLOO_2_CORES = {"device": "cpu", "gpus": 0, "cpu_cores": 2, "ranks_per_core": 4}
TWO_GPUS = {"device": "cuda", "gpus": 2, "cpu_cores": 32, "ranks_per_core": 4}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def submit(client: TestClient, **body: Any) -> dict[str, Any]:
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], "world_size": 2, "steps": 3,
                                             **body})
    assert resp.status_code == 201, resp.text
    return resp.json()


def beat(client: TestClient, *, worker: str = "node:default", queue: str = "default", run_id: int | None = None,
         attempt: int | None = None, capacity: dict[str, Any] | None = None) -> dict[str, Any]:
    body = {"worker": worker, "queue": queue, "run_id": run_id, "attempt": attempt,
            "info": {"capacity": capacity} if capacity else {}}
    resp = client.post("/api/v1/ingest/heartbeat", json=body, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def claim(client: TestClient, run_id: int) -> Any:
    return client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "node:default"}, headers=AUTH)


def steps(run_id: int, upto: int) -> list[dict[str, Any]]:
    return [{"type": "step", "step": s, "rank": r, "fp_version": "fp1", "model_digest": "fp1:" + "0" * 32,
             "digests": "ab" * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}
            for s in range(upto + 1) for r in range(2)]


# ---- cancel ---------------------------------------------------------------------------------------------

def test_a_cancelled_queued_job_is_cancelled_and_its_runs_are_never_claimed(client: TestClient) -> None:
    job = submit(client, repeats=2)
    resp = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert resp.status_code == 200
    cancelled = resp.json()
    assert cancelled["status"] == "cancelled"
    assert [r["status"] for r in cancelled["runs"]] == ["cancelled", "cancelled"]
    assert all(r["attempt"] == 0 and "before it started" in r["error"] for r in cancelled["runs"])
    refused = claim(client, cancelled["runs"][0]["id"])
    assert refused.status_code == 409 and "cancelled" in refused.json()["detail"]
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["runs"][0]["attempt"] == 0


def test_cancelling_twice_is_idempotent(client: TestClient) -> None:
    job = submit(client)
    first = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    second = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert first.status_code == second.status_code == 200
    assert second.json()["status"] == "cancelled" and second.json()["runs"] == first.json()["runs"]


def test_cancelling_a_finished_job_is_a_409_that_says_why(client: TestClient) -> None:
    job = submit(client)
    run_id = job["runs"][0]["id"]
    attempt = claim(client, run_id).json()["attempt"]
    client.post(f"/api/v1/ingest/runs/{run_id}/finish", json={"attempt": attempt, "status": "succeeded"},
                headers=AUTH)
    resp = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert resp.status_code == 409
    assert resp.json()["detail"] == (f"job {job['id']} already succeeded; only a queued or running job can be "
                                     "cancelled")
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "succeeded"


def test_cancelling_a_job_that_does_not_exist_is_a_404_naming_it(client: TestClient) -> None:
    for path, detail in (("jobs/999999/cancel", "no job 999999"), ("runs/999999/cancel", "no run 999999")):
        resp = client.post(f"/api/v1/{path}")
        assert (resp.status_code, resp.json()["detail"]) == (404, detail)


def test_a_cancelled_running_run_keeps_its_steps_and_the_job_compares_them_incomplete(
        client: TestClient, session: Session) -> None:
    job = submit(client, configs=[{}, {"name": "b"}])
    a, b = (r["id"] for r in job["runs"])
    for run_id in (a, b):
        attempt = claim(client, run_id).json()["attempt"]
        batch = {"attempt": attempt, "records": steps(run_id, 1)}
        assert client.post(f"/api/v1/ingest/runs/{run_id}/records", json=batch, headers=AUTH).status_code == 200
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel").json()["status"] == "cancelled"
    kept = session.scalar(select(func.count()).select_from(StepRecord).where(StepRecord.run_id.in_([a, b])))
    assert kept == 8  # steps 0 and 1 of 2 ranks of 2 runs
    result = client.get(f"/api/v1/jobs/{job['id']}/comparison").json()
    assert result["verdict"] == "incomplete" and f"run {a} cancelled" in result["missing"]
    late = client.post(f"/api/v1/ingest/runs/{a}/records", json={"attempt": 1, "records": steps(a, 2)}, headers=AUTH)
    assert late.status_code == 409  # the worker's next batch learns it too


def test_the_heartbeat_of_a_cancelled_run_tells_its_worker_to_stop(client: TestClient) -> None:
    job = submit(client)
    run_id = job["runs"][0]["id"]
    attempt = claim(client, run_id).json()["attempt"]
    assert beat(client, run_id=run_id, attempt=attempt)["stop"] is False
    client.post(f"/api/v1/jobs/{job['id']}/cancel")
    ack = beat(client, run_id=run_id, attempt=attempt)
    assert ack["stop"] is True and ack["reason"] == f"run {run_id} is cancelled"
    assert beat(client)["stop"] is False  # an idle worker has nothing to stop


def test_cancelling_one_run_leaves_the_others_and_the_job_ends_cancelled(client: TestClient) -> None:
    job = submit(client, repeats=2)
    first, second = (r["id"] for r in job["runs"])
    resp = client.post(f"/api/v1/runs/{first}/cancel")
    assert resp.status_code == 200 and resp.json()["status"] == "cancelled"
    assert client.post(f"/api/v1/runs/{first}/cancel").json()["status"] == "cancelled"  # idempotent
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["status"] == "running"  # one run is finished
    attempt = claim(client, second).json()["attempt"]
    client.post(f"/api/v1/ingest/runs/{second}/finish", json={"attempt": attempt, "status": "succeeded"},
                headers=AUTH)
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["status"] == CANCELLED
    resp = client.post(f"/api/v1/runs/{second}/cancel")
    assert resp.status_code == 409 and "already succeeded" in resp.json()["detail"]


def test_cancel_takes_the_same_identity_as_submission(client: TestClient, settings: Settings) -> None:
    settings.auth_mode = "proxy"
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], "world_size": 2, "steps": 3},
                       headers={"X-Forwarded-User": "ada"})  # ada's job: its owner may cancel it
    assert resp.status_code == 201, resp.text
    job = resp.json()
    for path in (f"/api/v1/jobs/{job['id']}/cancel", f"/api/v1/runs/{job['runs'][0]['id']}/cancel"):
        resp = client.post(path)
        assert resp.status_code == 401 and "X-Forwarded-User" in resp.json()["detail"]
    resp = client.post(f"/api/v1/jobs/{job['id']}/cancel", headers={"X-Forwarded-User": "ada"})
    assert resp.status_code == 200 and "cancelled by ada" in resp.json()["runs"][0]["error"]


# ---- guards ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("capacity, world, limit", [
    (GLOO_2_CORES, 16, "8 gloo ranks (2 CPU cores × 4 ranks per core) on node:default"),
    (TWO_GPUS, 4, "2 GPUs (nccl) on node:default"),
])
def test_a_world_size_above_what_the_queues_workers_report_is_a_422_naming_it(
        client: TestClient, capacity: dict[str, Any], world: int, limit: str) -> None:
    beat(client, capacity=capacity)
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], "world_size": world})
    assert resp.status_code == 422
    assert resp.json()["detail"] == (f"config 0 (custom): world_size {world} exceeds what the workers of queue "
                                     f"'default' can run: {limit}")


def test_a_configs_own_world_size_is_checked_against_the_queues_workers(client: TestClient) -> None:
    beat(client, capacity=GLOO_2_CORES)
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "world_size": 2,
                                             "configs": [{}, {"name": "big", "world_size": 16}]})
    assert resp.status_code == 422 and resp.json()["detail"].startswith("config 1 (big): world_size 16 exceeds")
    assert submit(client, world_size=8)["status"] == "queued"  # within 2 cores × 4


def test_the_capacity_of_one_queue_does_not_limit_another(client: TestClient) -> None:
    beat(client, capacity=GLOO_2_CORES)
    beat(client, worker="gpu:big", queue="big", capacity={**TWO_GPUS, "gpus": 16})
    assert submit(client, world_size=16, queue="big")["status"] == "queued"


def test_a_job_over_the_rank_steps_ceiling_is_a_422_naming_it(client: TestClient, settings: Settings) -> None:
    settings.max_rank_steps = 100
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}, {"name": "b"}], "world_size": 2,
                                             "steps": 10, "repeats": 3})
    assert resp.status_code == 422
    assert resp.json()["detail"] == ("the job is 3 repeat(s) × 2 config(s) at world sizes [2] × 10 steps = 120 "
                                     "rank-steps; this server takes at most 100 (max_rank_steps): ask for fewer "
                                     "repeats, configs, ranks or steps")


def test_the_default_ceiling_takes_the_readmes_sweep_and_refuses_the_runaway_job(client: TestClient) -> None:
    beat(client, capacity=GLOO_2_CORES)
    sweep = {"kind": "sweep", "configs": [{"preset": "default"}], "world_size": 4, "repeats": 3,
             "collective": {"ops": ["all_reduce_sum"], "dtypes": ["bfloat16"], "max_bytes": 1073741824},
             "sweep": {"over": "collective", "knobs": {"NCCL_ALGO": [None, "Ring", "Tree"],
                                                       "NCCL_PROTO": [None, "LL", "Simple"], "channels": [None, "1"]}}}
    assert client.post("/api/v1/jobs", json=sweep).status_code == 201
    runaway = {"workload": "mlp", "configs": [{"name": f"c{i}"} for i in range(8)], "world_size": 8,
               "steps": 100_000, "repeats": 20}
    resp = client.post("/api/v1/jobs", json=runaway)
    assert resp.status_code == 422 and "max_rank_steps" in resp.json()["detail"]


def test_a_job_for_a_queue_no_worker_was_ever_seen_on_is_accepted_and_flagged(client: TestClient) -> None:
    job = submit(client, queue="nobody", world_size=64)
    assert job["live_workers"] == 0
    assert job["queue_note"].startswith("no worker has ever been seen on queue 'nobody'")
    assert "world size could not be checked" in job["queue_note"]
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["queue_note"] == job["queue_note"]


def test_a_job_whose_queues_workers_went_silent_says_so_and_one_with_a_live_worker_does_not(
        client: TestClient, session: Session) -> None:
    beat(client, capacity=GLOO_2_CORES)
    job = submit(client)
    assert (job["live_workers"], job["queue_note"]) == (1, None)
    worker = session.get(Worker, "node:default")
    assert worker is not None
    worker.last_seen = utcnow() - timedelta(minutes=5)
    session.commit()
    read = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert read["live_workers"] == 0 and "no live worker on queue 'default'" in read["queue_note"]
    # The silent worker's last report still stands: a node restarting is the node that will run the job.
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], "world_size": 16})
    assert resp.status_code == 422 and "node:default" in resp.json()["detail"]
    client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["queue_note"] is None  # finished: nothing to wait for
