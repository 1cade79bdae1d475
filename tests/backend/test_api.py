"""The API in process on SQLite and PostgreSQL: validation at the edge, ingest auth and idempotency."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.app import create_app
from detlab.backend.db import get_session
from detlab.backend.models import FAILED, QUEUED, RUNNING, Run, StepRecord, Worker, utcnow
from detlab.backend.schemas import JobCreate
from detlab.backend.services.jobs import create_job
from detlab.backend.services.reconcile import reconcile
from detlab.core.settings import Settings, get_settings
from tests.conftest import FIXTURES

TOKEN = "t" * 32


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


@pytest.fixture
def client(session: Session, settings: Settings) -> Iterator[TestClient]:
    app = create_app(reconciler=False)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app) as c:
        yield c


def make_run(session: Session, settings: Settings, **job: object) -> Run:
    body = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 2, "steps": 3, **job}
    created = create_job(session=session, data=JobCreate.model_validate(body), settings=settings, submitter=None)
    session.commit()
    return created.runs[0]


def step_record(step: int, rank: int) -> dict:
    return {"type": "step", "step": step, "rank": rank, "fp_version": "fp1", "model_digest": "fp1:" + "0" * 32,
            "digests": "ab" * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}


AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.mark.parametrize("config, fragment", [
    ({"env": {"LD_PRELOAD": "/tmp/x.so"}}, "LD_PRELOAD is not an allowed variable"),
    ({"env": {"PATH": "/usr/bin"}}, "PATH is not an allowed variable"),
    ({"env": {"NCCL_ALGO": "Tree; rm -rf /"}}, "has characters outside"),
    ({"env": {"NCCL_DEBUG_FILE": "/etc/passwd"}}, "set by the worker"),
    ({"env": {"NCCL_NET_PLUGIN": "evil"}}, "names a file or plugin"),
    ({"env": {"NCCL_PROTO": "Fast"}}, "unknown value"),
    ({"preset": "no-such-preset"}, "unknown preset"),
    ({"torch": {"deterministic": True}}, "Extra inputs are not permitted"),
])
def test_bad_config_is_a_clear_422(client: TestClient, config: dict, fragment: str) -> None:
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [config]})
    assert resp.status_code == 422
    assert fragment in str(resp.json()["detail"])


@pytest.mark.parametrize("body, fragment", [
    ({"workload": "no-such", "configs": [{}]}, "unknown workload"),
    ({"workload": "mlp", "configs": [{}], "world_size": 3}, "does not split evenly"),
    ({"workload": "mlp", "configs": [{}], "steps": 10**9}, "steps must be"),
    ({"workload": "mlp", "configs": []}, "at least 1 item"),
    ({"workload": "mlp", "configs": [{}], "shell": "ls"}, "Extra inputs are not permitted"),
])
def test_bad_job_is_a_clear_422(client: TestClient, body: dict, fragment: str) -> None:
    resp = client.post("/api/v1/jobs", json=body)
    assert resp.status_code == 422
    assert fragment in str(resp.json()["detail"])


def test_oversized_body_is_refused(client: TestClient, settings: Settings) -> None:
    resp = client.post("/api/v1/jobs", content=b"x" * (settings.max_body_bytes + 1),
                       headers={"content-type": "application/json"})
    assert resp.status_code == 413


def test_ingest_needs_the_token(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    assert client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}).status_code == 401
    bad = {"Authorization": "Bearer wrong"}
    assert client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=bad).status_code == 401


def test_a_batch_sent_twice_is_stored_once(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    batch = {"attempt": spec["attempt"], "records": [step_record(s, r) for s in range(3) for r in range(2)]}
    for _ in range(2):
        assert client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH).status_code == 200
    count = session.scalar(select(func.count()).select_from(StepRecord).where(StepRecord.run_id == run.id))
    assert count == 6


def test_a_stale_attempt_is_refused(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH)
    batch = {"attempt": 7, "records": [step_record(0, 0)]}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH)
    assert resp.status_code == 409 and "stale" in resp.json()["detail"]


def test_a_malformed_record_is_a_422_and_stores_nothing(client: TestClient, session: Session,
                                                        settings: Settings) -> None:
    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    batch = {"attempt": spec["attempt"], "records": [step_record(0, 0), {**step_record(1, 0), "digests": "zz"}]}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH)
    assert resp.status_code == 422 and "bad step record" in resp.json()["detail"]
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 0


def test_a_running_run_cannot_be_claimed_twice(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    assert client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "a"}, headers=AUTH).status_code == 200
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "b"}, headers=AUTH)
    assert resp.status_code == 409


def test_health_is_503_without_a_worker_and_200_with_one(client: TestClient, session: Session) -> None:
    assert client.get("/api/v1/health").status_code == 503
    session.add(Worker(name="w", queue="default"))
    session.commit()
    assert client.get("/api/v1/health").status_code == 200


def _go_silent(session: Session, run: Run, attempt: int) -> None:
    run.status, run.attempt, run.node = RUNNING, attempt, "dead-node"
    run.heartbeat_at = utcnow() - timedelta(seconds=60)
    session.commit()


def test_reconciler_requeues_a_run_whose_worker_went_silent(session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    _go_silent(session, run, attempt=1)
    pending = reconcile(session=session, settings=settings)
    assert pending == [(run.id, "default")]
    assert run.status == QUEUED


def test_reconciler_fails_a_run_out_of_attempts_and_keeps_it_unstuck(session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    _go_silent(session, run, attempt=settings.max_attempts)
    assert reconcile(session=session, settings=settings) == []
    assert run.status == FAILED and "gave up after 2 attempt(s)" in (run.error or "")
    assert run.job.status == FAILED


def test_reconciler_redispatches_a_lost_message_only_when_a_worker_idles(session: Session,
                                                                         settings: Settings) -> None:
    run = make_run(session, settings)
    run.dispatched_at = utcnow() - timedelta(seconds=60)
    session.commit()
    assert reconcile(session=session, settings=settings) == []  # no idle worker: it may be waiting in line
    session.add(Worker(name="w", queue="default", info={"run_id": None}))
    session.commit()
    assert reconcile(session=session, settings=settings) == [(run.id, "default")]


def test_proxy_mode_refuses_a_submission_without_the_user_header(client: TestClient, settings: Settings) -> None:
    settings.auth_mode = "proxy"
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}]})
    assert resp.status_code == 401 and "X-Forwarded-User" in resp.json()["detail"]


def test_live_answers_without_a_worker(client: TestClient) -> None:
    assert client.get("/api/v1/live").status_code == 200


def test_a_log_showing_ring_under_a_tree_request_is_flagged(client: TestClient, session: Session,
                                                            settings: Settings) -> None:
    import base64
    import zlib

    from detlab.backend.reports import train as train_report

    run = make_run(session, settings, configs=[{"preset": "nccl-tree-simple-1ch"}])
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    log = (FIXTURES / "commlogs/nccl-2.27.5-tuning-by-name-interleaved-sglang.log").read_bytes()
    upload = {"attempt": spec["attempt"], "rank": 0, "zlib_b64": base64.b64encode(zlib.compress(log)).decode(),
              "raw_bytes": len(log)}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/commlog", json=upload, headers=AUTH)
    assert resp.status_code == 200 and resp.json()["library"] == "NCCL"
    batch = {"attempt": spec["attempt"], "records": [step_record(0, 0)]}
    client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH)
    session.expire_all()
    result = train_report.build(session=session, job=run.job)
    flags = {(f["key"], f.get("kind")) for f in result["effective_mismatches"]}
    assert ("nccl.NCCL_ALGO", "not-honoured") in flags
    assert client.get(f"/api/v1/runs/{run.id}/commlog/0").text == log.decode()
    assert client.get(f"/api/v1/runs/{run.id}/commlog/1").status_code == 404


def test_a_log_upload_that_is_not_zlib_is_a_422(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    upload = {"attempt": spec["attempt"], "rank": 0, "zlib_b64": "bm90IHpsaWI=", "raw_bytes": 8}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/commlog", json=upload, headers=AUTH)
    assert resp.status_code == 422 and "bad log upload" in resp.json()["detail"]


def test_an_oversized_chunked_body_without_content_length_is_refused(client: TestClient,
                                                                     settings: Settings) -> None:
    def chunks():  # a generator body is sent chunked, with no Content-Length header
        for _ in range(settings.max_body_bytes // 65536 + 2):
            yield b" " * 65536

    resp = client.post("/api/v1/jobs", content=chunks(), headers={"content-type": "application/json"})
    assert resp.status_code == 413


def test_comparison_sets_the_stacks_of_both_runs_side_by_side(client: TestClient, session: Session,
                                                              settings: Settings) -> None:
    from detlab.backend.reports import train as train_report

    run = make_run(session, settings, configs=[{"preset": "default"}, {"preset": "default", "name": "b"}])
    runs = sorted(run.job.runs, key=lambda r: r.config_index)
    for r, torch_version in zip(runs, ["2.13.0", "2.14.1"], strict=True):
        spec = client.post(f"/api/v1/ingest/runs/{r.id}/claim", json={"worker": "w"}, headers=AUTH).json()
        env = {"type": "env", "rank": 0, "host": "node1", "device": "cpu", "torch": torch_version, "backend": "gloo"}
        batch = {"attempt": spec["attempt"], "records": [env, step_record(0, 0)]}
        assert client.post(f"/api/v1/ingest/runs/{r.id}/records", json=batch, headers=AUTH).status_code == 200
    session.expire_all()
    facts = {f["key"]: f for f in train_report.build(session=session, job=run.job)["environment"]}
    assert facts["torch"] == {"key": "torch", "a": "2.13.0", "b": "2.14.1", "differs": True}
    assert facts["host"]["differs"] is False


def test_a_bad_config_error_names_the_field_without_validator_boilerplate(client: TestClient) -> None:
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}, {"seed": -1}]})
    assert resp.status_code == 422
    assert resp.json()["detail"] == "config 1: seed: Input should be greater than or equal to 0"


def test_a_finished_jobs_comparison_is_built_once(client: TestClient, session: Session, settings: Settings,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from detlab.backend.reports import train as train_report

    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    client.post(f"/api/v1/ingest/runs/{run.id}/records", json={"attempt": spec["attempt"],
                                                                "records": [step_record(0, 0)]}, headers=AUTH)
    client.post(f"/api/v1/ingest/runs/{run.id}/finish", json={"attempt": spec["attempt"], "status": "succeeded"},
                headers=AUTH)
    builds = []
    real = train_report.build
    monkeypatch.setattr(train_report, "build", lambda **kw: builds.append(1) or real(**kw))
    for path in ("comparison", "comparison/figure", "throughput/figure"):
        assert client.get(f"/api/v1/jobs/{run.job_id}/{path}").status_code == 200
    assert len(builds) == 1
