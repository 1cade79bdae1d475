"""The why-report through the API on SQLite and PostgreSQL, from data ingested through the real ingest API (NCCL
logs from tests/fixtures/commlogs) and, for the diagnosis jobs, finished jobs stored as their contract says."""

from __future__ import annotations

import base64
import zlib
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from detlab.backend.models import SUCCEEDED, Job, Run, utcnow
from detlab.core.settings import Settings
from detlab.core.wire import LEASE_HEADER
from tests.backend import test_diagnosis as diagnosis
from tests.backend.test_api import AUTH, TOKEN, make_run, step_record
from tests.conftest import FIXTURES

TWO = [{"preset": "default"}, {"preset": "default", "name": "b"}]


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def env_record(rank: int, backend: str = "gloo", **env: str) -> dict[str, Any]:
    return {"type": "env", "rank": rank, "host": "node1", "device": "cpu (x86_64)", "torch": "2.13.0",
            "backend": backend, "effective_env": {"NCCL_DEBUG": "INFO", **env}}


def record(client: TestClient | httpx.Client, run_id: int, *, digest: str, envs: list[dict[str, Any]],
           logs: dict[int, str] | None = None) -> None:
    """Through the ingest API: claim the run; send its ranks' envs, steps 0-3 of both ranks with this model digest
    from step 1 on, and their NCCL logs (fixture names); finish it."""
    spec = client.post(f"/api/v1/ingest/runs/{run_id}/claim", json={"worker": "w"}, headers=AUTH).json()
    writer = {**AUTH, LEASE_HEADER: spec["lease"]}  # the claim's lease, as a worker sends it (an e2e stack's client)
    steps = [{**step_record(s, r), "model_digest": "fp1:" + ("0" * 32 if s == 0 else digest)}
             for s in range(4) for r in range(2)]
    batch = {"attempt": spec["attempt"], "records": envs + steps}
    assert client.post(f"/api/v1/ingest/runs/{run_id}/records", json=batch, headers=writer).status_code == 200
    for rank, name in (logs or {}).items():
        text = (FIXTURES / "commlogs" / name).read_bytes()
        upload = {"attempt": spec["attempt"], "rank": rank, "raw_bytes": len(text),
                  "zlib_b64": base64.b64encode(zlib.compress(text)).decode()}
        assert client.post(f"/api/v1/ingest/runs/{run_id}/commlog", json=upload, headers=writer).status_code == 200
    done = {"attempt": spec["attempt"], "status": "succeeded"}
    assert client.post(f"/api/v1/ingest/runs/{run_id}/finish", json=done, headers=writer).status_code == 200


def diverged_job(client: TestClient, session: Session, settings: Settings, *, env_b: dict[str, str] | None = None,
                 logs: tuple[str, str] | None = None) -> tuple[Job, Run, Run]:
    """A finished two-config train job of world size 2 whose runs diverge at step 1."""
    job = make_run(session, settings, configs=TWO).job
    a, b = sorted(job.runs, key=lambda r: r.config_index)
    for run, digest, extra, log in ((a, "1" * 32, {}, logs and logs[0]), (b, "2" * 32, env_b or {}, logs and logs[1])):
        backend = "nccl" if log else "gloo"
        record(client, run.id, digest=digest, envs=[env_record(r, backend, **extra) for r in range(2)],
               logs={0: log} if log else None)
    return job, a, b


def item(report: dict[str, Any], key: str) -> dict[str, Any]:
    return next(i for i in report["items"] if i["key"] == key)


def why(client: TestClient, path: str) -> dict[str, Any]:
    resp = client.get(path)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_env_parity_fails_naming_the_variable_and_its_evidence_shows_it(client: TestClient, session: Session,
                                                                       settings: Settings) -> None:
    job, a, b = diverged_job(client, session, settings, env_b={"NCCL_SOCKET_IFNAME": "eth1"})
    report = why(client, f"/api/v1/jobs/{job.id}/why")
    assert (report["run_a"], report["run_b"], report["verdict"], report["note"]) == (a.id, b.id, "diverged", None)
    found = item(report, "env")
    assert found["status"] == "fail"
    assert found["found"] == "NCCL_SOCKET_IFNAME differs (A vs B): unset vs eth1"
    envs = client.get(found["evidence"][1]["href"]).json()
    assert [e["effective_env"]["NCCL_SOCKET_IFNAME"] for e in envs] == ["eth1", "eth1"]


def test_gloo_runs_say_the_log_item_does_not_apply(client: TestClient, session: Session, settings: Settings) -> None:
    job, _, _ = diverged_job(client, session, settings)
    found = item(why(client, f"/api/v1/jobs/{job.id}/why"), "logs")
    assert (found["status"], found["found"]) == ("not-applicable", "not applicable (gloo: no NCCL)")
    assert found["evidence"][0]["href"] == f"/jobs/{job.id}#environment"


def test_logs_that_chose_another_algorithm_for_a_size_fail_naming_it(client: TestClient, session: Session,
                                                                    settings: Settings) -> None:
    job, a, b = diverged_job(client, session, settings, logs=("nccl-2.27.5-tuning-by-name-interleaved-sglang.log",
                                                              "nccl-2.27.5-tree-ll-by-name-sglang.log"))
    found = item(why(client, f"/api/v1/jobs/{job.id}/why"), "logs")
    assert found["status"] == "fail"
    assert found["found"].startswith("AllReduce 4 B differs (A vs B, rank 0): RING/SIMPLE/0..0 vs TREE/LL/0..0")
    assert client.get(found["evidence"][0]["href"]).json()["a"] == a.id
    assert "TREE" in client.get(found["evidence"][2]["href"]).text


def finished(session: Session, kind: str, config_id: int, result: dict[str, Any], workload: str = "mlp") -> Job:
    """A finished diagnosis job as the diag helper's settle stores it (contract.md)."""
    job = Job(kind=kind, workload=workload, world_size=1, steps=0, repeats=1, config_ids=[config_id],
              status=SUCCEEDED, result=result, finished_at=utcnow())
    session.add(job)
    session.commit()
    return job


def op_audit(nondeterministic: bool, workload: str = "mlp") -> dict[str, Any]:
    return {"kind": "op-audit", "workload": workload, "configs": [{
        "index": 0, "label": "default", "device": "cpu", "torch_flags": {}, "threads": 1, "ineffective": [],
        "ops": [{"op": "aten::addmm", "count": 4, "nondeterministic": False, "evidence": "re-run: 1 result in 5"},
                {"op": "aten::index_add_", "count": 1, "nondeterministic": nondeterministic,
                 "evidence": "re-run: 2 distinct results in 5" if nondeterministic else "re-run: 1 result in 5"}]}]}


def test_the_latest_op_audit_of_the_workload_names_the_nondeterministic_op(client: TestClient, session: Session,
                                                                           settings: Settings) -> None:
    job, a, _ = diverged_job(client, session, settings)
    finished(session, "op-audit", a.config_id, op_audit(False))
    audit = finished(session, "op-audit", a.config_id, op_audit(True))
    finished(session, "op-audit", a.config_id, op_audit(False, "tiny-lm"), workload="tiny-lm")  # not this workload
    found = item(why(client, f"/api/v1/jobs/{job.id}/why"), "ops")
    assert found["status"] == "fail"
    assert found["found"] == (f"aten::index_add_ nondeterministic (re-run: 2 distinct results in 5); job #{audit.id}, "
                              "config default on cpu")
    assert found["evidence"][0]["href"] == f"/jobs/{audit.id}" and found["source"]["same_config"] is True


def test_an_op_audit_settled_from_its_records_is_what_the_checklist_reads(client: TestClient, session: Session,
                                                                         settings: Settings) -> None:
    """The contract between the two sides, end to end: an op-audit job submitted and run through the ingest API
    (its result built by reports.diagnosis when it settles), then read by the why-report."""
    job, _, _ = diverged_job(client, session, settings)
    audit = diagnosis.submit(client, kind="op-audit", workload="mlp")
    ops = [{"type": "audit-op", "op": "aten.index_add_", "count": 2, "nondeterministic": True, "alert": False,
            "distinct": 4, "reruns": 5, "evidence": "re-run: 4 distinct results in 5 (first 2 calls)"}]
    diagnosis.run_records(client, audit["runs"][0]["id"], [diagnosis.ENV, *ops])
    found = item(why(client, f"/api/v1/jobs/{job.id}/why"), "ops")
    assert found["status"] == "fail"
    assert found["found"].startswith("aten.index_add_ nondeterministic (re-run: 4 distinct results in 5")
    assert found["evidence"][0]["href"] == f"/jobs/{audit['id']}"


def test_without_a_diagnosis_job_the_items_are_not_checked_with_the_form_prefilled(
        client: TestClient, session: Session, settings: Settings) -> None:
    job, _, _ = diverged_job(client, session, settings)
    report = why(client, f"/api/v1/jobs/{job.id}/why")
    for key, kind in (("ops", "op-audit"), ("batch", "batch-invariance")):
        assert item(report, key)["status"] == "not-checked"
        assert item(report, key)["evidence"] == [{"text": f"new {kind} job of mlp",
                                                  "href": f"/?kind={kind}&workload=mlp"}]


def test_a_batch_invariant_model_passes_from_its_batch_invariance_job(client: TestClient, session: Session,
                                                                      settings: Settings) -> None:
    job, a, _ = diverged_job(client, session, settings)
    model = {"workload": "mlp", "batch_sizes": [1, 2, 4], "invariant": True, "first_module": None,
             "first_break": None}
    config = {"index": 0, "label": "default", "device": "cpu", "tf32": False, "results": [], "summary": [],
              "model": model}
    audit = finished(session, "batch-invariance", a.config_id,
                     {"kind": "batch-invariance", "workload": None, "configs": [config]}, workload="")
    found = item(why(client, f"/api/v1/jobs/{job.id}/why"), "batch")
    assert found["status"] == "pass"
    assert found["found"] == f"the same bits at batch sizes 1, 2, 4 (job #{audit.id}, config default on cpu)"


def test_any_two_runs_get_the_checklist_with_links_to_the_compare_page(client: TestClient, session: Session,
                                                                      settings: Settings) -> None:
    _, a, _ = diverged_job(client, session, settings)
    _, _, d = diverged_job(client, session, settings, env_b={"NCCL_SOCKET_IFNAME": "eth1"})
    report = why(client, f"/api/v1/compare/why?a={a.id}&b={d.id}")
    assert (report["run_a"], report["run_b"], report["job_id"], report["verdict"]) == (a.id, d.id, None, "diverged")
    assert item(report, "env")["status"] == "fail"
    assert item(report, "stack")["evidence"][0]["href"] == f"/compare?a={a.id}&b={d.id}#environment"


def test_a_pair_of_the_job_can_be_asked_for(client: TestClient, session: Session, settings: Settings) -> None:
    job = make_run(session, settings, configs=TWO, repeats=2).job
    runs = sorted(job.runs, key=lambda r: (r.config_index, r.repeat))
    for run in runs:
        record(client, run.id, digest="1" * 32, envs=[env_record(r) for r in range(2)])
    report = why(client, f"/api/v1/jobs/{job.id}/why?a={runs[0].id}&b={runs[1].id}")
    assert (report["run_a"], report["run_b"], report["verdict"]) == (runs[0].id, runs[1].id, "identical")
    assert "this pair is identical" in report["note"]


@pytest.mark.parametrize("query, status, fragment", [
    ("?a=1", 422, "give both a and b"),
    ("?a=1&b=1", 422, "the same run"),
    ("?a=1&b=99", 422, "run 99 is not a run of job"),
    ("?a=0&b=1", 422, "greater than or equal to 1"),
])
def test_a_bad_pair_is_a_clear_422(client: TestClient, session: Session, settings: Settings, query: str,
                                   status: int, fragment: str) -> None:
    job, _, _ = diverged_job(client, session, settings)
    resp = client.get(f"/api/v1/jobs/{job.id}/why{query}")
    assert resp.status_code == status and fragment in str(resp.json()["detail"])


def test_a_single_run_or_a_collective_job_has_no_checklist(client: TestClient, session: Session,
                                                          settings: Settings) -> None:
    single = make_run(session, settings).job
    assert "single run" in client.get(f"/api/v1/jobs/{single.id}/why").json()["detail"]
    collective = make_run(session, settings, kind="collective", workload=None, steps=None,
                          collective={"min_bytes": 4096, "max_bytes": 4096})
    resp = client.get(f"/api/v1/jobs/{collective.job_id}/why")
    assert resp.status_code == 422 and "compares training runs" in resp.json()["detail"]
    assert client.get("/api/v1/jobs/999/why").status_code == 404
    assert client.get("/api/v1/runs/999/envs").status_code == 404
