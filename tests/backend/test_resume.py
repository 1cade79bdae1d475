"""Resumed recordings through the ingest API (SQLite and PostgreSQL): both records of the restored step are stored,
and GET /compare reads them as `detlab compare` reads a directory (one code path: detlab.core.components)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.models import StepRecord
from detlab.core.settings import Settings
from tests.backend.test_recordings import AUTH, TOKEN, opening, step

pytestmark = pytest.mark.both_databases


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


TENSORS = {"type": "tensors", "tensors": [
    {"index": 0, "name": "w", "shape": [4], "dtype": "float32", "component": "parameters"},
    {"index": 1, "name": "w.exp_avg", "shape": [4], "dtype": "float32", "component": "optimizer"}]}


def stepped(n: int, *, rng: str = "aa", segment: int = 0, restored: bool = False, moment: str = "cd") -> dict:
    record = step(n, 0, "ab")
    digests = "ab" * 16 + moment * 16
    return {**record, "digests": digests, "model_digest": "fp2:" + (moment * 16 if moment != "cd" else "ef" * 16),
            "state": {"rng": {"torch cpu": rng * 16}, "optimizer": {"param_groups[0].lr": "0.01"}},
            "segment": segment, "restored": restored, **({"loss": None, "loss_bits": ""} if restored else {})}


def recorded(client: TestClient, recording: str, records: list[dict]) -> int:
    run_id = client.post("/api/v1/ingest/recordings", json={**opening(world_size=1), "recording": recording},
                         headers=AUTH).json()["run_id"]
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": 1, "records": [TENSORS, *records]},
                       headers=AUTH)
    assert resp.status_code == 200, resp.text
    client.post(f"/api/v1/ingest/runs/{run_id}/close", json={"rank": 0, "status": "succeeded"}, headers=AUTH)
    return run_id


def test_a_restore_that_lost_the_rng_is_named_at_its_step(client: TestClient, session: Session) -> None:
    straight = recorded(client, "rec-straight00", [stepped(n) for n in range(4)])
    resumed = recorded(client, "rec-resumed000", [stepped(0), stepped(1), stepped(2),  # the first process
                                                  stepped(1, rng="bb", segment=1, restored=True),
                                                  stepped(2, rng="bb", segment=1), stepped(3, rng="bb", segment=1)])
    assert session.scalar(select(func.count()).where(StepRecord.run_id == resumed, StepRecord.step == 1)) == 2
    result = client.get(f"/api/v1/compare?a={straight}&b={resumed}").json()
    assert (result["verdict"], result["first_divergent_step"]) == ("diverged", 1)
    assert result["first_divergent_component"]["text"] == "rng: torch cpu"
    assert {k: result["resume"][k] for k in ("run", "step", "exact", "components")} == \
        {"run": resumed, "step": 1, "exact": False, "components": ["rng"]}


def test_a_restore_that_lost_optimizer_state_names_the_optimizer(client: TestClient) -> None:
    straight = recorded(client, "rec-straight00", [stepped(n) for n in range(3)])
    resumed = recorded(client, "rec-resumed000", [stepped(0), stepped(1), stepped(1, segment=1, restored=True,
                                                                                  moment="00"), stepped(2, segment=1)])
    result = client.get(f"/api/v1/compare?a={straight}&b={resumed}").json()
    assert result["first_divergent_component"]["text"] == "optimizer: w.exp_avg"
    assert result["resume"]["exact"] is False


RESUME_JOB = {"kind": "resume", "workload": "mlp", "configs": [{"preset": "default"}], "steps": 3, "stop_at": 1,
              "lose": "rng"}


def test_a_resume_job_runs_straight_and_resumed_and_its_result_names_the_lost_part(client: TestClient) -> None:
    made = client.post("/api/v1/jobs", json=RESUME_JOB)
    assert made.status_code == 201, made.text
    job = made.json()
    runs = sorted(job["runs"], key=lambda r: r["repeat"])
    plans = []
    for run, records in zip(runs, ([stepped(n) for n in range(4)],
                                   [stepped(0), stepped(1), stepped(1, rng="bb", segment=1, restored=True),
                                    stepped(2, rng="bb", segment=1), stepped(3, rng="bb", segment=1)]), strict=True):
        claimed = client.post(f"/api/v1/ingest/runs/{run['id']}/claim", json={"worker": "w"}, headers=AUTH).json()
        plans.append(claimed["resume"])
        body = {"attempt": claimed["attempt"], "records": [TENSORS, *records]}
        assert client.post(f"/api/v1/ingest/runs/{run['id']}/records", json=body, headers=AUTH).status_code == 200
        client.post(f"/api/v1/ingest/runs/{run['id']}/finish", json={"attempt": claimed["attempt"],
                                                                     "status": "succeeded"}, headers=AUTH)
    assert [(p["stop_at"], p["lose"]) for p in plans] == [(None, None), (1, "rng")]
    result = client.get(f"/api/v1/jobs/{job['id']}/resume").json()
    assert (result["verdict"], result["comparison"]["first_divergent_component"]["text"]) == ("lost", "rng: torch cpu")
    assert client.get(f"/api/v1/jobs/{job['id']}/spec").json()["stop_at"] == 1


def test_a_resume_after_the_last_step_is_refused(client: TestClient) -> None:
    resp = client.post("/api/v1/jobs", json={**RESUME_JOB, "stop_at": 3})
    assert resp.status_code == 422 and "before the last step" in resp.text
