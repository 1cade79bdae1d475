"""Bisect jobs through the API, on SQLite and PostgreSQL: made from a diverged train pair (and refused, with the
reason, for anything else), run through the train run lifecycle with a probe step, and reported from what their
runs ingest."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from detlab.backend.models import Job
from detlab.core.settings import Settings

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
# A probe's entries as detlab/tensors/probe.py writes them, for a Sequential(Linear, ReLU) (shapes need only agree).
ENTRIES = ["state:", "state:0", "state:1", "fwd:#0:in0", "fwd:0#0:in0", "fwd:0#0:out0", "fwd:1#0:in0",
           "fwd:1#0:out0", "fwd:#0:out0", "loss", "grad:0.weight", "param:0.weight"]
TYPES = {"state:": "Sequential", "state:0": "Linear", "state:1": "ReLU"}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def submit(client: TestClient, **body: Any) -> dict[str, Any]:
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{"name": "a"}, {"name": "b"}],
                                             "world_size": 2, "steps": 3, **body})
    assert resp.status_code == 201, resp.text
    return resp.json()


def claim(client: TestClient, run_id: int) -> dict[str, Any]:
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "w"}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return resp.json()


def feed(client: TestClient, run_id: int, records: list[dict[str, Any]]) -> None:
    attempt = claim(client, run_id)["attempt"]
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": attempt, "records": records},
                       headers=AUTH)
    assert resp.status_code == 200, resp.text
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/finish", json={"attempt": attempt, "status": "succeeded"},
                       headers=AUTH)
    assert resp.status_code == 200, resp.text


def step(n: int, rank: int, digests: str) -> dict[str, Any]:
    model = f"fp2:{abs(hash(digests)) % 16**32:032x}"
    return {"type": "step", "step": n, "rank": rank, "fp_version": "fp2", "model_digest": model, "digests": digests,
            "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}


def train_job(client: TestClient, *, parts_at: int | None, **body: Any) -> dict[str, Any]:
    """A finished train job of two configs whose runs record steps 0..3 of one tensor, run B's parting from
    `parts_at` on (None: never)."""
    job = submit(client, **body)
    tensors = {"type": "tensors", "tensors": [{"index": 0, "name": "0.weight", "shape": [4], "dtype": "float32"}]}
    for run in job["runs"]:
        differs = run["config_index"] == 1 and parts_at is not None
        feed(client, run["id"], [tensors, *(step(s, r, ("cd" if differs and s >= parts_at else "ab") * 16)
                                            for s in range(4) for r in range(2))])
    return client.get(f"/api/v1/jobs/{job['id']}").json()


def probe_records(differing: set[str], rank: int) -> list[dict[str, Any]]:
    """A probe run's records on one rank: steps 0 and 1 by their model digests alone, then the probe step (2) of
    the entries, `differing` ones changed."""
    digests = "".join(("cd" if name in differing else "ab") * 16 for name in ENTRIES)
    return [step(0, rank, ""), step(1, rank, ""), step(2, rank, digests)]


def entry_list() -> dict[str, Any]:
    return {"type": "tensors", "tensors": [{"index": i, "name": n, "shape": [1] if n.startswith("state") else [4],
                                            "dtype": TYPES.get(n, "float32")} for i, n in enumerate(ENTRIES)]}


def test_a_diverged_pair_is_bisected_at_its_first_divergent_step(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2, inject_bitflip={"step": 1, "tensor": "0.weight", "rank": 1})
    assert source["verdict"] == "diverged"
    resp = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={})
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert (job["kind"], job["workload"], job["world_size"], job["steps"]) == ("bisect", "mlp", 2, 2)
    assert [c["name"] for c in job["configs"]] == ["a", "b"]
    assert [(r["config_index"], r["steps_total"]) for r in job["runs"]] == [(0, 2), (1, 2)]
    assert job["params"]["bisect"] == {"job": source["id"], "runs": [r["id"] for r in source["runs"]],
                                       "pair": [0, 1], "step": 2, "first_divergent_step": 2}
    spec = claim(client, job["runs"][0]["id"])
    assert (spec["kind"], spec["steps"], spec["probe_step"]) == ("train", 2, 2)
    assert spec["inject_bitflip"] == {"step": 1, "tensor": "0.weight", "rank": 1}  # as the source ran


def test_a_bisect_reports_the_first_divergent_module_and_its_tree(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2)
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    a, b = job["runs"]
    feed(client, a["id"], [entry_list(), *probe_records(set(), 0), *probe_records(set(), 1)])
    changed = {"fwd:1#0:in0", "fwd:1#0:out0", "fwd:#0:out0", "loss"}  # 1's input differs though 0's output does not
    feed(client, b["id"], [entry_list(), *probe_records(set(), 0), *probe_records(changed, 1)])
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["verdict"] == "diverged"
    result = client.get(f"/api/v1/jobs/{job['id']}/bisect").json()
    assert (result["verdict"], result["step"], result["ranks"]) == ("diverged", 2, [1])
    first = result["diagnosis"]["first_module"]
    assert (first["module"], first["type"], first["verdict"]) == ("1", "ReLU", "carried")
    assert first["arose_in"] == ["(model)"]
    assert [(r["shown"], r["status"]) for r in result["diagnosis"]["tree"]] == [
        ("(model)", "differs"), ("0", "equal"), ("1", "first difference")]
    assert client.get(f"/api/v1/jobs/{job['id']}/comparison").status_code == 404
    assert client.get(f"/api/v1/jobs/{source['id']}/bisect").status_code == 404


def test_runs_that_made_other_calls_are_incomparable_naming_where(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2)
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    a, b = job["runs"]
    feed(client, a["id"], [entry_list(), *probe_records(set(), 0), *probe_records(set(), 1)])
    other = entry_list()
    other["tensors"][5]["name"] = "fwd:0#1:out0"
    feed(client, b["id"], [other, *probe_records(set(), 0), *probe_records(set(), 1)])
    result = client.get(f"/api/v1/jobs/{job['id']}/bisect").json()
    assert result["verdict"] == "incomparable" and result["diagnosis"] is None
    assert result["reason"].startswith("the runs' module calls part at entry 5 (call): fwd:0#0:out0")


def test_a_replay_that_does_not_diverge_says_so(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2)
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    for run in job["runs"]:
        feed(client, run["id"], [entry_list(), *probe_records(set(), 0), *probe_records(set(), 1)])
    result = client.get(f"/api/v1/jobs/{job['id']}/bisect").json()
    assert result["verdict"] == "identical" and "did not appear again in the replay of step 2" in result["reason"]


@pytest.mark.parametrize("body, fragment", [
    ({"pair": [0, 0]}, "two different configs"),
    ({"pair": [0, 5]}, "each in 0..1"),
    ({"pair": [0]}, "at least 2 items"),
    ({"step": 4}, "past the runs' 3 steps"),
    ({"step": 0}, "greater than or equal to 1"),
    ({"at": 1}, "Extra inputs are not permitted"),
])
def test_a_bad_bisect_request_is_a_422(client: TestClient, session: Session, body: dict, fragment: str) -> None:
    source = train_job(client, parts_at=1)
    resp = client.post(f"/api/v1/jobs/{source['id']}/bisect", json=body)
    assert resp.status_code == 422 and fragment in str(resp.json()["detail"])


def test_a_pair_that_did_not_diverge_is_refused(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=None)
    resp = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={})
    assert resp.status_code == 422
    assert "compare identical; only a diverged pair has a first divergent step" in resp.json()["detail"]


def test_runs_parting_at_their_initial_weights_have_no_step_to_replay(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=0)
    resp = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={})
    assert resp.status_code == 422 and "already differ at step 0" in resp.json()["detail"]


def test_an_sdk_recording_cannot_be_bisected(client: TestClient, session: Session) -> None:
    opened = client.post("/api/v1/ingest/recordings", json={"recording": "rec-0123456789", "world_size": 1},
                         headers=AUTH).json()
    resp = client.post(f"/api/v1/jobs/{opened['job_id']}/bisect", json={})
    assert resp.status_code == 422 and "is an SDK recording: detlab cannot run your training again" in resp.text


def test_a_collective_job_cannot_be_bisected(client: TestClient, session: Session) -> None:
    job = client.post("/api/v1/jobs", json={"kind": "collective", "configs": [{}, {}], "world_size": 2}).json()
    resp = client.post(f"/api/v1/jobs/{job['id']}/bisect", json={})
    assert resp.status_code == 422 and "is a collective job; bisect replays the pair of a train job" in resp.text


def test_an_unfinished_job_is_bisected_once_it_has_finished(client: TestClient, session: Session) -> None:
    job = submit(client)
    resp = client.post(f"/api/v1/jobs/{job['id']}/bisect", json={})
    assert resp.status_code == 422 and "is queued; bisect it once it has finished" in resp.text


def test_pairs_at_different_world_sizes_are_refused(client: TestClient, session: Session) -> None:
    job = submit(client, configs=[{"name": "a"}, {"name": "b", "world_size": 1}])
    for run in job["runs"]:
        feed(client, run["id"], [])
    resp = client.post(f"/api/v1/jobs/{job['id']}/bisect", json={})
    assert resp.status_code == 422 and "world sizes 2 and 1" in resp.text


def test_a_bisect_is_cancelled_like_any_job(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2)
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    claim(client, job["runs"][0]["id"])
    cancelled = client.post(f"/api/v1/jobs/{job['id']}/cancel").json()
    assert cancelled["status"] == "cancelled" and {r["status"] for r in cancelled["runs"]} == {"cancelled"}


def test_a_bisect_reruns_as_a_new_bisect_of_the_same_pair_and_step(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=1)
    first = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={"pair": [1, 0], "step": 2}).json()
    again = client.post(f"/api/v1/jobs/{first['id']}/rerun")
    assert again.status_code == 201, again.text
    assert again.json()["params"]["bisect"] == {**first["params"]["bisect"], "pair": [1, 0], "step": 2}
    assert [c["name"] for c in again.json()["configs"]] == ["b", "a"]
    assert client.get(f"/api/v1/jobs/{first['id']}/spec").status_code == 409
    assert session.get(Job, again.json()["id"]).kind == "bisect"  # type: ignore[union-attr]


def test_a_replay_that_parted_before_its_probe_step_says_where(client: TestClient, session: Session) -> None:
    source = train_job(client, parts_at=2)
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    a, b = job["runs"]
    feed(client, a["id"], [entry_list(), *probe_records(set(), 0), *probe_records(set(), 1)])
    early = [step(1, 1, "") | {"model_digest": "fp2:" + "e" * 32} if (r["step"], r["rank"]) == (1, 1) else r
             for r in probe_records({"state:0", "fwd:0#0:out0"}, 1)]
    feed(client, b["id"], [entry_list(), *probe_records(set(), 0), *early])
    result = client.get(f"/api/v1/jobs/{job['id']}/bisect").json()
    assert result["verdict"] == "diverged" and result["first_divergent_step"] == 1
    assert "the replay parted at step 1, before the probed step 2" in result["reason"]
    assert result["diagnosis"]["first"]["entry"] == "state:0"  # the probe sees the earlier difference as it starts


def test_a_registered_scripts_pair_is_bisected_and_its_runs_told_the_probe_step(client: TestClient,
                                                                              session: Session) -> None:
    script = {"name": "sft", "global_batch": 16, "default_steps": 5, "script": True}
    beat = {"worker": "node:default", "queue": "default", "info": {"workloads": [script]}}
    assert client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH).status_code == 200
    source = train_job(client, parts_at=2, workload="sft")
    assert source["params"]["script"] is True
    job = client.post(f"/api/v1/jobs/{source['id']}/bisect", json={}).json()
    assert (job["kind"], job["workload"], job["params"]["bisect"]["step"]) == ("bisect", "sft", 2)
    assert claim(client, job["runs"][1]["id"])["probe_step"] == 2  # the worker hands it to the script's Recorder
