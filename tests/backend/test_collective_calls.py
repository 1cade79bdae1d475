"""Collective calls through the ingest API into the comparison (SQLite and PostgreSQL): stored per step and rank,
lined up by position, the first differing call diagnosed with the NCCL facts of the run's uploaded log."""

from __future__ import annotations

import base64
import zlib
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.models import CallsRecord, Run
from detlab.backend.reports import train as train_report
from detlab.core.settings import Settings
from tests.backend.test_api import AUTH, TOKEN, make_run, step_record
from tests.conftest import FIXTURES

BUCKET = {"op": "ddp_allreduce", "dtype": "float32", "count": 193, "group_size": 2}
LOSS = {"op": "all_reduce", "dtype": "float32", "count": 1, "group_size": 2}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def calls_record(step: int, rank: int, inputs: str, outputs: str) -> dict:
    """Two calls (a DDP bucket, the loss): `inputs`/`outputs` one hex digit per call, repeated to a digest."""
    return {"type": "calls", "step": step, "rank": rank, "fp_version": "fp1", "calls": [BUCKET, LOSS],
            "inputs": "".join(c * 32 for c in inputs), "outputs": "".join(c * 32 for c in outputs)}


def send(client: TestClient, run: Run, records: list[dict], log: str | None = None) -> None:
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    assert spec["record_collectives"] is True
    if log:
        raw = (FIXTURES / "commlogs" / log).read_bytes()
        upload = {"attempt": spec["attempt"], "rank": 0, "zlib_b64": base64.b64encode(zlib.compress(raw)).decode(),
                  "raw_bytes": len(raw)}
        assert client.post(f"/api/v1/ingest/runs/{run.id}/commlog", json=upload, headers=AUTH).status_code == 200
    for _ in range(2):  # a batch sent twice stores once
        batch = {"attempt": spec["attempt"], "records": records}
        resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH)
        assert resp.status_code == 200, resp.text


def env(rank: int, dp: int) -> dict:
    return {"type": "env", "rank": rank, "device": "cpu", "backend": "gloo", "position": {"dp": dp}}


def two_runs(client: TestClient, session: Session, settings: Settings) -> tuple[Run, Run]:
    """Run A as ranks 0, 1 at dp 0, 1; run B numbers them the other way round. Rank-local inputs ("1" at dp 0,
    "2" at dp 1), the bucket's output "5" on both; the loss's output differs (7 vs 8) from equal inputs."""
    run = make_run(session, settings, configs=[{"preset": "default"}, {"preset": "default", "name": "b"}],
                   record_collectives=True)
    a, b = sorted(run.job.runs, key=lambda r: r.config_index)
    steps = [step_record(s, r) for s in (0, 1) for r in (0, 1)]
    send(client, a, [env(0, 0), env(1, 1), *steps, calls_record(1, 0, "13", "57"), calls_record(1, 1, "24", "57")],
         "nccl-2.27.5-tuning-by-name-interleaved-sglang.log")
    send(client, b, [env(0, 1), env(1, 0), *steps, calls_record(1, 0, "24", "58"), calls_record(1, 1, "13", "58")],
         "nccl-2.27.5-tree-ll-by-name-sglang.log")
    session.expire_all()
    return a, b


def test_the_first_differing_call_is_diagnosed_with_the_nccl_choice_at_its_size(client: TestClient,
                                                                                 session: Session,
                                                                                 settings: Settings) -> None:
    a, b = two_runs(client, session, settings)
    assert session.scalar(select(func.count()).select_from(CallsRecord).where(CallsRecord.run_id == a.id)) == 2
    result = train_report.build(session=session, job=a.job)
    first = result["collectives"]["first"]
    assert (first["step"], first["seq"], first["op"], first["bytes"]) == (1, 1, "all_reduce", 4)
    assert first["cause"] == "reduction-order" and first["positions"] == {"0": {"dp": 0}, "1": {"dp": 1}}
    assert [(c["algo"], c["proto"]) for c in first["nccl"]["a"]] == [("RING", "SIMPLE")]
    assert [(c["algo"], c["proto"]) for c in first["nccl"]["b"]] == [("TREE", "LL")]


def test_any_two_runs_compare_their_collectives_through_the_api(client: TestClient, session: Session,
                                                                 settings: Settings) -> None:
    a, b = two_runs(client, session, settings)
    result = client.get("/api/v1/compare", params={"a": a.id, "b": b.id}).json()
    assert result["collectives"]["status"] == "differs"
    assert "inputs matched → reduction order/topology" in result["collectives"]["text"]
    assert "RING/SIMPLE channels 0..0" in result["collectives"]["text"]


def test_a_calls_record_with_a_digest_short_is_a_422_and_stores_nothing(client: TestClient, session: Session,
                                                                        settings: Settings) -> None:
    run = make_run(session, settings, record_collectives=True)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    bad = {**calls_record(1, 0, "12", "34"), "outputs": "3" * 32}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json={"attempt": spec["attempt"], "records": [bad]},
                       headers=AUTH)
    assert resp.status_code == 422 and "one digest (32 hex) per call" in resp.text
    assert session.scalar(select(func.count()).select_from(CallsRecord)) == 0


def test_record_collectives_takes_a_boolean(client: TestClient) -> None:
    body = {"workload": "mlp", "configs": [{"preset": "default"}], "record_collectives": "maybe"}
    assert client.post("/api/v1/jobs", json=body).status_code == 422


@pytest.mark.parametrize("body", [
    {"kind": "collective", "configs": [{"preset": "default"}], "world_size": 2},
    {"kind": "sweep", "configs": [{"preset": "default"}], "world_size": 2,
     "sweep": {"over": "collective", "knobs": {"NCCL_ALGO": ["Ring", None]}}},
    {"kind": "op-audit", "workload": "mlp", "configs": [{"preset": "default"}]},
])
def test_record_collectives_is_refused_where_nothing_would_record_them(client: TestClient,
                                                                       body: dict[str, Any]) -> None:
    resp = client.post("/api/v1/jobs", json={**body, "record_collectives": True})
    assert resp.status_code == 422 and "record_collectives" in resp.text


def step_of(step: int, rank: int, digests: str) -> dict:
    """A step record of two tensors: `digests` two hex digits each, repeated to a digest."""
    packed = "".join(d * 16 for d in (digests[:2], digests[2:]))
    return {"type": "step", "step": step, "rank": rank, "fp_version": "fp1", "model_digest": f"fp1:{packed[16:48]}",
            "digests": packed, "loss_bits": "", "step_time_s": 0.01}


def test_a_divergence_between_runs_numbered_otherwise_is_told_at_run_as_rank_and_tensor(
        client: TestClient, session: Session, settings: Settings) -> None:
    """Run B numbers its ranks the other way round; at step 1 its rank 0 (dp 1) differs from run A's rank 1 in
    tensor w2 alone (the packed digests must be read by the ranks' own numbers, then lined up)."""
    run = make_run(session, settings, configs=[{"preset": "default"}, {"preset": "default", "name": "b"}],
                   record_collectives=True)
    a, b = sorted(run.job.runs, key=lambda r: r.config_index)
    tensors = {"type": "tensors", "tensors": [{"index": i, "name": f"w{i + 1}", "shape": [4], "dtype": "float32"}
                                              for i in range(2)]}
    send(client, a, [env(0, 0), env(1, 1), tensors, step_of(0, 0, "a1a2"), step_of(0, 1, "b1b2"),
                     step_of(1, 0, "c1c2"), step_of(1, 1, "d1d2")])
    send(client, b, [env(0, 1), env(1, 0), tensors, step_of(0, 0, "b1b2"), step_of(0, 1, "a1a2"),
                     step_of(1, 0, "d1e2"), step_of(1, 1, "c1c2")])
    session.expire_all()
    result = client.get("/api/v1/compare", params={"a": a.id, "b": b.id}).json()
    assert (result["verdict"], result["first_divergent_step"], result["ranks"]) == ("diverged", 1, [1])
    assert result["first_divergent_tensors"] == ["w2"] and "lined up by logical position" in result["reason"]
    assert result["collectives"] is None  # neither run recorded its collective calls


def test_a_rerun_records_collectives_as_the_job_did(client: TestClient) -> None:
    first = client.post("/api/v1/jobs", json={"workload": "mlp", "steps": 2, "world_size": 2,
                                              "configs": [{"preset": "default"}], "record_collectives": True}).json()
    assert client.get(f"/api/v1/jobs/{first['id']}/spec").json()["record_collectives"] is True
    plain = client.post("/api/v1/jobs", json={"workload": "mlp", "steps": 2, "configs": [{"preset": "default"}]})
    assert client.get(f"/api/v1/jobs/{plain.json()['id']}/spec").json()["record_collectives"] is False
