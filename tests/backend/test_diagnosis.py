"""Diagnosis jobs through the API: what is refused, a run's records in, the result, figure and findings out."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import DiagnosisRecord, FindingCell
from detlab.backend.reports import findings
from detlab.core.settings import Settings

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
ENV = {"type": "env", "rank": 0, "device": "cpu (x86_64)", "torch": "2.13.0", "backend": "none",
       "torch_flags": {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
                       "allow_tf32": False, "num_threads": 2}}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def submit(client: TestClient, **body: Any) -> dict[str, Any]:
    resp = client.post("/api/v1/jobs", json={"configs": [{"preset": "default"}], **body})
    assert resp.status_code in (201, 202), resp.text
    return resp.json()


def run_records(client: TestClient, run_id: int, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Claim the run as a worker would, send its records (twice: stored once) and finish it."""
    spec = client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "w"}, headers=AUTH).json()
    for _ in range(2):
        resp = client.post(f"/api/v1/ingest/runs/{run_id}/records", json={"attempt": spec["attempt"],
                                                                           "records": records}, headers=AUTH)
        assert resp.status_code == 200, resp.text
    resp = client.post(f"/api/v1/ingest/runs/{run_id}/finish", json={"attempt": spec["attempt"],
                                                                      "status": "succeeded"}, headers=AUTH)
    assert resp.status_code == 200, resp.text
    return spec


def cell(op: str, batch: int, invariant: bool, ulp: int = 0, dtype: str = "float32") -> dict[str, Any]:
    return {"type": "invariance", "op": op, "dtype": dtype, "batch_size": batch, "features": 64,
            "invariant": invariant, "max_ulp": ulp}


@pytest.mark.parametrize(("body", "fragment"), [
    ({"kind": "batch-invariance", "diagnosis": {"features": 8192, "batch_sizes": [1, 4096]}},
     "largest batch × features is 33,554,432; at most 16,777,216"),
    ({"kind": "batch-invariance", "diagnosis": {"features": 100}}, "features must be a multiple of 16"),
    ({"kind": "batch-invariance", "diagnosis": {"ops": ["conv2d"]}}, "Input should be 'mm'"),
    ({"kind": "batch-invariance", "diagnosis": {"batch_sizes": list(range(1, 130))}}, "at most 128 items"),
    ({"kind": "batch-invariance", "world_size": 2}, "runs one rank per config: world_size must be 1"),
    ({"kind": "batch-invariance", "diagnosis": {"workload": "nope"}}, "unknown workload 'nope' for batch-invariance"),
    ({"kind": "op-audit"}, "an op-audit needs a workload"),
    ({"kind": "op-audit", "workload": "mlp", "steps": 3}, '"loc":["body","op-audit","steps"],"msg":"Extra inputs'),
    ({"kind": "op-audit", "workload": "mlp", "diagnosis": {"reruns": 1000}}, "less than or equal to 50"),
    ({"workload": "mlp", "diagnosis": {}}, '"loc":["body","train","diagnosis"],"msg":"Extra inputs'),
])
def test_a_diagnosis_the_workers_cannot_hold_is_a_clear_422(client: TestClient, body: dict, fragment: str) -> None:
    resp = client.post("/api/v1/jobs", json={"configs": [{"preset": "default"}], **body})
    assert resp.status_code == 422 and fragment in resp.text, resp.text


def test_batch_invariance_run_claims_its_spec_and_settles_into_the_contract(client: TestClient,
                                                                            session: Session) -> None:
    job = submit(client, kind="batch-invariance", diagnosis={"ops": ["mm", "sum"], "batch_sizes": [1, 2, 4],
                                                             "features": 64, "workload": "mlp"})
    assert (job["workload"], job["steps"], job["world_size"]) == ("mlp", 2 * 3 + 3, 1)
    records = [ENV, cell("mm", 1, True), cell("mm", 2, False, 17), cell("mm", 4, False, 3), cell("sum", 1, True),
               cell("sum", 2, True), cell("sum", 4, True),
               *({"type": "model-invariance", "workload": "mlp", "batch_size": b, "invariant": b == 1,
                  "first_module": None if b == 1 else "0", "modules_compared": 6} for b in (1, 2, 4))]
    spec = run_records(client, job["runs"][0]["id"], records)
    assert spec["kind"] == "batch-invariance" and spec["diagnosis"]["workload"] == "mlp"
    assert session.scalar(select(DiagnosisRecord.id).where(DiagnosisRecord.key == "mm/float32/2")) is not None

    read = client.get(f"/api/v1/jobs/{job['id']}").json()
    assert (read["status"], read["verdict"], read["runs"][0]["steps_done"]) == ("succeeded", "not-invariant", 9)
    result = client.get(f"/api/v1/jobs/{job['id']}/diagnosis").json()
    [config] = result["configs"]
    assert (result["kind"], result["workload"]) == ("batch-invariance", "mlp")
    assert set(config) == {"index", "label", "device", "tf32", "results", "summary", "model"}
    assert (config["label"], config["device"], config["tf32"]) == ("default", "cpu (x86_64)", False)
    assert config["summary"] == [{"op": "mm", "dtype": "float32", "first_break": 2},
                                 {"op": "sum", "dtype": "float32", "first_break": None}]
    assert config["model"] == {"workload": "mlp", "batch_sizes": [1, 2, 4], "invariant": False, "first_module": "0",
                               "first_break": 2}
    figure = client.get(f"/api/v1/jobs/{job['id']}/diagnosis/figure").json()
    [heat] = figure["data"]
    assert heat["type"] == "heatmap" and heat["y"] == ["mm · float32", "sum · float32"] and heat["x"] == ["1", "2", "4"]
    assert heat["text"][0] == ["", "✕", ""] and "max ULP 17" in heat["customdata"][0][1]

    cells = {(c.op, c.dtype): (c.identical, c.comparable) for c in session.scalars(
        select(FindingCell).where(FindingCell.job_id == job["id"]))}
    assert cells == {("mm", "float32"): (1, 3), ("sum", "float32"): (3, 3), ("model", ""): (0, 1)}


def test_op_audit_lists_ops_whose_bits_change_although_the_config_claims_determinism(client: TestClient,
                                                                                     session: Session) -> None:
    job = submit(client, kind="op-audit", workload="scatter",
                 configs=[{"preset": "torch-deterministic", "threads": 2}])
    ops = [{"type": "audit-op", "op": "aten.index_put_", "count": 8, "nondeterministic": True, "alert": False,
            "distinct": 3, "reruns": 5, "evidence": "re-run: 3 distinct results in 5 (first 2 calls)"},
           {"type": "audit-op", "op": "aten.addmm", "count": 16, "nondeterministic": False, "alert": False,
            "distinct": 1, "reruns": 5, "evidence": "re-run: 1 distinct result in 5 (first 2 calls)"},
           {"type": "audit-op", "op": "aten.empty", "count": 1, "nondeterministic": None,
            "evidence": "not compared: its output is uninitialized memory"}]
    spec = run_records(client, job["runs"][0]["id"], [ENV, *ops])
    assert (spec["kind"], spec["workload"], spec["threads"]) == ("op-audit", "scatter", 2)
    assert spec["torch"]["deterministic_algorithms"] is True
    result = client.get(f"/api/v1/jobs/{job['id']}/diagnosis").json()
    [config] = result["configs"]
    assert set(config) == {"index", "label", "device", "torch_flags", "threads", "ops", "ineffective"}
    assert [o["op"] for o in config["ops"]] == ["aten.addmm", "aten.index_put_", "aten.empty"]
    assert all(set(o) == {"op", "count", "nondeterministic", "evidence"} for o in config["ops"])
    assert (config["ineffective"], config["threads"]) == (["aten.index_put_"], 2)
    assert client.get(f"/api/v1/jobs/{job['id']}").json()["verdict"] == "nondeterministic"
    cells = {c.op: c.identical for c in session.scalars(select(FindingCell).where(FindingCell.job_id == job["id"]))}
    assert cells == {"aten.index_put_": 0, "aten.addmm": 1}  # the op not compared is not counted either way

    spec_body = client.get(f"/api/v1/jobs/{job['id']}/spec").json()
    assert (spec_body["kind"], spec_body["workload"]) == ("op-audit", "scatter")
    assert client.post(f"/api/v1/jobs/{job['id']}/rerun").status_code in (201, 202)


def test_a_train_job_has_no_diagnosis_and_a_diagnosis_no_comparison(client: TestClient) -> None:
    audit = submit(client, kind="op-audit", workload="mlp")
    train = submit(client, workload="mlp", steps=2)
    assert client.get(f"/api/v1/jobs/{train['id']}/diagnosis").status_code == 404
    assert client.get(f"/api/v1/jobs/{audit['id']}/comparison").status_code == 404
    resp = client.get(f"/api/v1/jobs/{audit['id']}/diagnosis")
    assert resp.status_code == 404 and "no diagnosis results yet" in resp.text


def test_an_exported_diagnosis_result_imports_as_findings_cells() -> None:
    job = {"workload": "batch-invariance", "created_at": "2026-12-01T20:00:00+00:00", "world_size": 1,
           "configs": [{"name": "default", "body": {"env": {}}}],
           "runs": [{"device": "NVIDIA H200"}]}
    result = {"kind": "batch-invariance", "workload": None, "configs": [{
        "index": 0, "label": "default", "device": "NVIDIA H200", "tf32": False, "model": None,
        "results": [{"op": "mm", "dtype": "bfloat16", "batch_size": b, "invariant": b <= 32, "max_ulp": 0 if b <= 32
                     else 4} for b in (1, 32, 128)],
        "summary": [{"op": "mm", "dtype": "bfloat16", "first_break": 128}]}]}
    rows, cells = findings.from_file("h200/bi.json", {"job": job, "result": result})
    assert rows == []
    [found] = cells
    assert (found["kind"], found["op"], found["dtype"], found["identical"], found["comparable"]) == (
        "batch-invariance", "mm", "bfloat16", 2, 3)
    assert found["hardware"] == "1 x NVIDIA H200"


def test_an_op_audit_and_a_batch_invariance_of_a_registered_script_are_accepted(client: TestClient) -> None:
    script = {"name": "sft", "global_batch": 16, "default_steps": 5, "script": True}
    beat = {"worker": "node:default", "queue": "default", "info": {"workloads": [script]}}
    assert client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH).status_code == 200
    job = submit(client, kind="op-audit", workload="sft", diagnosis={"reruns": 3})
    assert (job["workload"], job["params"]["script"]) == ("sft", True)
    spec = client.post(f"/api/v1/ingest/runs/{job['runs'][0]['id']}/claim", json={"worker": "w"}, headers=AUTH).json()
    assert (spec["kind"], spec["workload"], spec["diagnosis"]["reruns"]) == ("op-audit", "sft", 3)
    job = submit(client, kind="batch-invariance", diagnosis={"workload": "sft", "ops": ["mm"], "batch_sizes": [1, 2]})
    assert (job["workload"], job["params"]["script"]) == ("sft", True)
