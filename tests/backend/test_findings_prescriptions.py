"""The findings' prescriptions through the API: per (stack, workload, world size), the latest settled fix job's
verdict, knobs, [k, n], cost and job, served with the matrix (GET /api/v1/findings/matrix), on SQLite and
PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from detlab.core.settings import Settings

pytestmark = pytest.mark.both_databases

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TENSORS = {"type": "tensors", "tensors": [{"index": 0, "name": "w", "shape": [4], "dtype": "float32"}]}
ENV = {"type": "env", "rank": 0, "device": "NVIDIA H200", "driver": "580.159.04", "cuda": "13.0",
       "torch": "2.11.0+cu130", "nccl": "2.28.9", "backend": "nccl"}
STACK = "1 x NVIDIA H200 · driver 580.159.04 · CUDA 13.0 · torch 2.11.0+cu130 · NCCL 2.28.9"
FIELDS = {"stack", "workload", "world_size", "verdict", "knobs", "reproducible", "cost", "cost_interval",
          "within_noise", "job"}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


def feed(client: TestClient, run_id: int, digest: str) -> None:
    """Claim the run, send its env and steps 0..5 (this digest from step 1 on), finish it."""
    attempt = client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "w"}, headers=AUTH).json()["attempt"]
    steps = [{"type": "step", "step": s, "rank": 0, "fp_version": "fp2", "digests": (digest if s else "ab") * 16,
              "model_digest": f"fp2:{(digest if s else 'ab') * 16}", "loss_bits": "3f800000", "loss": 1.0,
              "step_time_s": 0.01} for s in range(6)]
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": attempt,
                                                                      "records": [ENV, TENSORS, *steps]}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/finish", json={"attempt": attempt, "status": "succeeded"},
                       headers=AUTH)
    assert resp.status_code == 200, resp.text


def fix_job(client: TestClient, workload: str, *, base_parts: bool) -> int:
    """A fix job run to its end: the base's repeats part (or not); every later run is identical."""
    resp = client.post("/api/v1/jobs", json={"kind": "fix", "workload": workload, "steps": 5, "max_trials": 3,
                                             "configs": [{"preset": "default", "name": "two", "threads": 2}]})
    assert resp.status_code == 201, resp.text
    job_id = resp.json()["id"]
    fed: set[int] = set()
    while pending := [r["id"] for r in client.get(f"/api/v1/jobs/{job_id}").json()["runs"] if r["id"] not in fed]:
        for run_id in pending:
            feed(client, run_id, "ef" if base_parts and not fed else "cd")
            fed.add(run_id)
    assert client.get(f"/api/v1/jobs/{job_id}").json()["status"] == "succeeded"
    return job_id


def prescriptions(client: TestClient, **params: str) -> list[dict[str, Any]]:
    resp = client.get("/api/v1/findings/matrix", params=params)
    assert resp.status_code == 200, resp.text
    return resp.json()["prescriptions"]


def test_each_stack_and_workload_has_its_latest_fix_jobs_prescription(client: TestClient) -> None:
    first = fix_job(client, "scatter", base_parts=True)
    assert [p["job"] for p in prescriptions(client)] == [first]  # the matrix is rebuilt when a fix job settles
    latest = fix_job(client, "scatter", base_parts=True)
    already = fix_job(client, "mlp", base_parts=False)
    rows = prescriptions(client)
    assert all(set(r) == FIELDS for r in rows)
    assert rows == [
        {"stack": STACK, "workload": "mlp", "world_size": 1, "verdict": "already", "knobs": [],
         "reproducible": [2, 2], "cost": None, "cost_interval": None, "within_noise": None, "job": already},
        {"stack": STACK, "workload": "scatter", "world_size": 1, "verdict": "found",
         "knobs": ["deterministic-algorithms"], "reproducible": [2, 2], "cost": 0.0, "cost_interval": [0.0, 0.0],
         "within_noise": True, "job": latest}]  # equal step times, interleaved with the base: within noise
    assert [r["job"] for r in prescriptions(client, workload="scatter")] == [latest]
