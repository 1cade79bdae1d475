"""The API in process on SQLite and PostgreSQL: validation at the edge, ingest auth and idempotency."""

from __future__ import annotations

import json
from datetime import timedelta
from types import ModuleType
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.app import create_app
from detlab.backend.db import get_session, make_engine
from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import (
    FAILED,
    QUEUED,
    RUNNING,
    CollectiveTrial,
    CommLog,
    Job,
    Run,
    StepRecord,
    Worker,
    utcnow,
)
from detlab.backend.reports import train as train_report
from detlab.backend.services.jobs import create_job
from detlab.backend.services.reconcile import reconcile
from detlab.core.settings import Settings, get_settings
from tests.backend.conftest import LOCAL_URL
from tests.conftest import FIXTURES

TOKEN = "t" * 32


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


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


@pytest.mark.parametrize("body, key", [
    ({"kind": "collective", "configs": [{}], "world_size": 2, "inject_bitflip": {"step": 1, "tensor": "fc1.weight"}},
     "inject_bitflip"),
    ({"kind": "train", "workload": "mlp", "configs": [{}], "collective": {"ops": ["all_gather"]}}, "collective"),
    ({"kind": "op-audit", "workload": "mlp", "configs": [{}], "steps": 3}, "steps"),
    ({"kind": "sweep", "configs": [{}], "world_size": 2, "diagnosis": {},
      "sweep": {"over": "collective", "knobs": {"NCCL_ALGO": [None]}}}, "diagnosis"),
])
def test_a_key_that_the_kind_does_not_take_is_a_422_naming_it(client: TestClient, session: Session, body: dict,
                                                               key: str) -> None:
    """Each kind takes its own keys (detlab.backend.kinds): a collective job's bit flip was stored and never done,
    a train job's collective spec was stored and ignored."""
    resp = client.post("/api/v1/jobs", json=body)
    assert resp.status_code == 422, resp.text
    assert any(e["loc"][-1] == key and e["msg"] == "Extra inputs are not permitted" for e in resp.json()["detail"])
    assert session.scalars(select(Job)).first() is None


def test_a_key_sent_as_null_is_a_key_not_sent(client: TestClient) -> None:
    resp = client.post("/api/v1/jobs", json={"kind": "collective", "configs": [{}], "inject_bitflip": None,
                                             "workload": None, "steps": None})
    assert resp.status_code in (201, 202), resp.text


def test_a_sweep_over_collectives_refuses_the_keys_of_a_train_run(client: TestClient) -> None:
    resp = client.post("/api/v1/jobs", json={"kind": "sweep", "configs": [{}], "world_size": 2, "sweep": {
        "over": "collective", "knobs": {"NCCL_ALGO": ["Ring"]}}, "inject_bitflip": {"step": 1, "tensor": "w"}})
    assert resp.status_code == 422 and "a sweep over collectives takes no inject_bitflip" in resp.text


def test_oversized_body_is_refused(client: TestClient, settings: Settings) -> None:
    resp = client.post("/api/v1/jobs", content=b"x" * (settings.max_body_bytes + 1),
                       headers={"content-type": "application/json"})
    assert resp.status_code == 413


def test_ingest_refuses_a_wrong_token(client: TestClient, session: Session, settings: Settings) -> None:
    # (without one, auth mode none takes it: tests/backend/test_recordings.py; other modes refuse: test_auth.py)
    run = make_run(session, settings)
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


ENV_RECORD = {"type": "env", "rank": 0, "host": "node1", "device": "cpu", "torch": "2.13.0", "backend": "gloo"}


@pytest.mark.parametrize("bad, loc", [
    ({**step_record(1, 0), "digests": "zz"}, ["body", "records", 1, "step", "digests"]),
    ({**step_record(1, 0), "loss": float("nan")}, ["body", "records", 1, "step", "loss"]),
    ({**step_record(1, 0), "type": "gradient"}, ["body", "records", 1]),
    ({**ENV_RECORD, "host": "h" * 256}, ["body", "records", 1, "env", "host"]),  # a 500 on PostgreSQL before
    ({**step_record(1, 0), "step": "one"}, ["body", "records", 1, "step", "step"]),
])
def test_a_malformed_record_is_a_422_naming_it_and_stores_nothing(client: TestClient, session: Session,
                                                                  settings: Settings, bad: dict, loc: list) -> None:
    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    batch = {"attempt": spec["attempt"], "records": [step_record(0, 0), bad]}
    body = json.dumps(batch)  # as Python's json writes a NaN loss, which httpx's json= refuses to send
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", content=body,
                       headers={**AUTH, "content-type": "application/json"})
    assert resp.status_code == 422
    assert [e["loc"] for e in resp.json()["detail"]] == [loc]
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 0


def test_a_record_of_a_rank_outside_the_run_is_a_422(client: TestClient, session: Session,
                                                     settings: Settings) -> None:
    run = make_run(session, settings)  # world_size 2
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    batch = {"attempt": spec["attempt"], "records": [step_record(0, 0), step_record(0, 2)]}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH)
    assert resp.status_code == 422 and resp.json()["detail"] == "records.1: rank 2 is outside the run's world_size 2"
    assert session.scalar(select(func.count()).select_from(StepRecord)) == 0


def test_the_claim_reply_is_a_typed_run_spec(client: TestClient, session: Session, settings: Settings) -> None:
    from detlab.core.wire import RunSpec

    run = make_run(session, settings, inject_bitflip={"step": 2, "tensor": "0.weight", "rank": 1})
    reply = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    spec = RunSpec.model_validate(reply)
    assert (spec.run_id, spec.attempt, spec.kind, spec.workload, spec.world_size, spec.steps) == \
        (run.id, 1, "train", "mlp", 2, 3)
    assert spec.collective is None and spec.inject_bitflip is not None and spec.inject_bitflip.rank == 1
    assert spec.torch is not None and spec.torch.cudnn_benchmark is True  # the default preset's


def test_a_collective_claim_nests_its_parameters(client: TestClient, session: Session, settings: Settings) -> None:
    from detlab.core.wire import RunSpec

    run = make_run(session, settings, kind="collective", workload=None, steps=None,
                   collective={"ops": ["broadcast"], "min_bytes": 4096, "max_bytes": 16384, "trials": 2})
    reply = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    spec = RunSpec.model_validate(reply)
    assert spec.kind == "collective" and spec.collective is not None
    assert (spec.collective.ops, spec.collective.sizes, spec.collective.trials) == (["broadcast"], [4096, 16384], 2)
    assert "sizes" not in reply and "min_bytes" not in reply["collective"]  # nested, and only what ranks use


def test_an_env_record_is_stored_with_its_typed_torch_flags(client: TestClient, session: Session,
                                                            settings: Settings) -> None:
    from detlab.backend.models import RankEnv

    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    flags = {"deterministic_algorithms": True, "cudnn_deterministic": True, "cudnn_benchmark": False,
             "allow_tf32": False, "num_threads": 4}
    record = {**ENV_RECORD, "fingerprint_impl": "torch-cpu", "torch_flags": flags,
              "effective_env": {"NCCL_ALGO": "Ring"}}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json={"attempt": spec["attempt"], "records": [record]},
                       headers=AUTH)
    assert resp.status_code == 200 and resp.json() == {"accepted": 1}
    stored = session.scalars(select(RankEnv).where(RankEnv.run_id == run.id)).one()
    assert (stored.host, stored.torch_flags, stored.effective_env) == ("node1", flags, {"NCCL_ALGO": "Ring"})
    session.refresh(run)
    assert (run.fingerprint_impl, run.device) == ("torch-cpu", "cpu")


def test_a_heartbeat_with_a_bad_workload_is_a_422_and_not_stored(client: TestClient, session: Session) -> None:
    beat = {"worker": "node:q", "queue": "q", "info": {"workloads": [{"name": "has space", "global_batch": 8,
                                                                      "default_steps": 1}]}}
    resp = client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH)
    assert resp.status_code == 422
    assert resp.json()["detail"][0]["loc"] == ["body", "info", "workloads", 0, "name"]
    assert session.get(Worker, "node:q") is None


def test_every_ingest_endpoint_declares_its_response_model() -> None:
    from fastapi.routing import APIRoute

    from detlab.backend.api import ingest as ingest_api

    routes = list(ingest_api.router.routes)
    assert len(routes) == 7 and all(isinstance(r, APIRoute) and r.response_model is not None for r in routes)


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


def test_reconciler_does_not_count_heartbeats_missed_while_the_database_was_down(session: Session,
                                                                                  settings: Settings) -> None:
    run = make_run(session, settings)
    _go_silent(session, run, attempt=settings.max_attempts)  # silent 60 s: its last attempt, were it judged lost
    back = utcnow() - timedelta(seconds=settings.run_stale_after_s / 2)  # the store came back since
    assert reconcile(session=session, settings=settings, store_back_at=back) == []
    assert (run.status, run.attempt) == (RUNNING, settings.max_attempts)


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


def record_steps(client: TestClient, run: Run, steps: int = 3, *, finish: bool = True) -> None:
    """Claim the run, send steps 0 (initial weights) to `steps` of both ranks, and (by default) finish it."""
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    batch = {"attempt": spec["attempt"], "records": [step_record(s, r) for s in range(steps + 1) for r in range(2)]}
    assert client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH).status_code == 200
    if finish:
        done = {"attempt": spec["attempt"], "status": "succeeded"}
        assert client.post(f"/api/v1/ingest/runs/{run.id}/finish", json=done, headers=AUTH).status_code == 200


def count_builds(monkeypatch: pytest.MonkeyPatch, report: ModuleType) -> list[int]:
    builds: list[int] = []
    real = report.build

    def counted(**kw: Any) -> Any:
        builds.append(1)
        return real(**kw)

    monkeypatch.setattr(report, "build", counted)
    return builds


def reread(session: Session, job_id: int) -> Job:
    """The job as the database holds it now."""
    session.expire_all()
    job = session.get(Job, job_id)
    assert job is not None
    return job


TWO_CONFIGS = [{"preset": "default"}, {"preset": "default", "name": "b"}]
RESULT_PATHS = ("comparison", "comparison/figure", "throughput/figure")


def test_a_finished_jobs_pages_read_its_stored_result_without_rebuilding(
        client: TestClient, session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    builds = count_builds(monkeypatch, train_report)
    for path in RESULT_PATHS:
        assert client.get(f"/api/v1/jobs/{run.job_id}/{path}").status_code == 200
    assert builds == []
    stored = reread(session, run.job_id).result or {}
    assert stored["verdict"] == "identical" and stored["steps_compared"] == 4  # steps 0-3


def test_the_comparison_served_is_the_report_as_built(client: TestClient, session: Session,
                                                      settings: Settings) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    built = json.loads(json.dumps(train_report.build(session=session, job=reread(session, run.job_id))))
    assert client.get(f"/api/v1/jobs/{run.job_id}/comparison").json() == built


def test_a_single_config_comparison_leaves_the_two_run_keys_out(client: TestClient, session: Session,
                                                                settings: Settings) -> None:
    run = make_run(session, settings)
    record_steps(client, run)
    served = client.get(f"/api/v1/jobs/{run.job_id}/comparison").json()
    assert served["verdict"] is None and "mode" not in served and "environment" not in served
    assert served == json.loads(json.dumps(train_report.build(session=session, job=run.job)))


def test_the_stored_result_survives_an_api_restart(client: TestClient, session: Session, settings: Settings,
                                                   db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    before = client.get(f"/api/v1/jobs/{run.job_id}/comparison").json()
    engine = make_engine(db_url)
    app = create_app(reconciler=False, settings=settings)  # a new process: nothing of the first one's memory
    with sessionmaker(engine)() as fresh:
        app.dependency_overrides[get_session] = lambda: fresh
        app.dependency_overrides[get_settings] = lambda: settings
        builds = count_builds(monkeypatch, train_report)
        with TestClient(app, base_url=LOCAL_URL) as restarted:
            assert restarted.get(f"/api/v1/jobs/{run.job_id}/comparison").json() == before
            assert restarted.get("/api/v1/jobs").json()["items"][0]["verdict"] == "identical"
    engine.dispose()
    assert builds == []


def test_a_running_job_shows_a_partial_comparison_built_on_each_read(
        client: TestClient, session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    a, b = sorted(run.job.runs, key=lambda r: r.config_index)
    record_steps(client, a, steps=1, finish=False)
    record_steps(client, b, steps=0, finish=False)
    builds = count_builds(monkeypatch, train_report)
    partial = client.get(f"/api/v1/jobs/{run.job_id}/comparison").json()
    assert partial["steps_compared"] == 1 and partial["verdict"] == "incomplete"
    assert client.get(f"/api/v1/jobs/{run.job_id}/throughput/figure").status_code == 200
    assert len(builds) == 2
    assert reread(session, run.job_id).result is None
    assert client.get("/api/v1/jobs").json()["items"][0]["verdict"] is None


def test_a_job_finished_before_results_were_stored_gets_its_result_on_first_read(
        client: TestClient, session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    job = reread(session, run.job_id)
    job.result, job.params = None, {**job.params, "verdict": "identical"}  # as the migration leaves it
    session.commit()
    assert client.get("/api/v1/jobs").json()["items"][0]["verdict"] == "identical"
    builds = count_builds(monkeypatch, train_report)
    for path in RESULT_PATHS:
        assert client.get(f"/api/v1/jobs/{run.job_id}/{path}").status_code == 200
    assert len(builds) == 1
    assert (reread(session, run.job_id).result or {}).get("verdict") == "identical"


def test_a_finished_job_that_recorded_nothing_is_a_404_without_rebuilding(
        client: TestClient, session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    run = make_run(session, settings)
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    client.post(f"/api/v1/ingest/runs/{run.id}/finish", json={"attempt": spec["attempt"], "status": "failed",
                                                               "error": "died"}, headers=AUTH)
    builds = count_builds(monkeypatch, train_report)
    resp = client.get(f"/api/v1/jobs/{run.job_id}/comparison")
    assert resp.status_code == 404 and "no recorded steps" in resp.json()["detail"]
    assert builds == []


def test_listings_take_the_verdict_from_the_stored_result(client: TestClient, session: Session,
                                                          settings: Settings) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    [item] = client.get("/api/v1/jobs").json()["items"]
    assert item["verdict"] == "identical" and item["config_names"] == ["default", "b"]
    assert "verdict" not in client.get(f"/api/v1/jobs/{run.job_id}").json()["params"]


def test_a_train_job_has_no_collective_result(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings)
    record_steps(client, run)
    resp = client.get(f"/api/v1/jobs/{run.job_id}/collective")
    assert resp.status_code == 404 and "no collective trials" in resp.json()["detail"]


def test_job_read_keeps_its_shape(client: TestClient, session: Session, settings: Settings) -> None:
    run = make_run(session, settings, configs=TWO_CONFIGS)
    record_steps(client, run, steps=1, finish=False)
    job = client.get(f"/api/v1/jobs/{run.job_id}").json()
    assert list(job) == ["id", "kind", "workload", "status", "world_size", "steps", "repeats", "params",
                         "created_at", "configs", "runs", "progress", "queue", "tags", "verdict", "submitter",
                         "live_workers", "queue_note", "result_path"]
    assert job["result_path"] == f"/api/v1/jobs/{run.job_id}/comparison"  # its kind says which report
    assert [list(c) for c in job["configs"]] == [["id", "name", "hash", "body"]] * 2
    assert set(job["runs"][0]) == {"id", "config_index", "repeat", "status", "steps_done", "steps_total", "attempt",
                                   "error", "node", "device", "fingerprint_impl"}
    assert job["progress"] == 1 / 6 and job["runs"][0]["node"] == "w"
    stored = reread(session, run.job_id)
    assert job["created_at"] == stored.created_at.isoformat()


def test_every_jobs_endpoint_declares_its_response_model() -> None:
    from fastapi.routing import APIRoute

    from detlab.backend.api import jobs as jobs_api

    routes = [r for router in (jobs_api.router, jobs_api.runs_router) for r in router.routes]
    assert routes and all(isinstance(r, APIRoute) and r.response_model is not None for r in routes)


def test_served_figures_are_those_of_the_stored_result(client: TestClient, session: Session,
                                                       settings: Settings) -> None:
    from detlab.backend.figures import train as train_figures

    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r in run.job.runs:
        record_steps(client, r)
    stored = reread(session, run.job_id).result or {}
    for path, figure in (("comparison/figure", train_figures.comparison_figure),
                         ("throughput/figure", train_figures.throughput_figure)):
        assert client.get(f"/api/v1/jobs/{run.job_id}/{path}").json() == json.loads(json.dumps(figure(stored)))


def finish_collective_job(client: TestClient, session: Session, settings: Settings) -> Job:
    """A two-config collective job whose configs give different all_reduce outputs; both runs finished."""
    run = make_run(session, settings, kind="collective", workload=None, steps=None, configs=TWO_CONFIGS,
                   collective={"min_bytes": 4096, "max_bytes": 16384, "trials": 2})
    job = run.job
    for r in job.runs:
        spec = client.post(f"/api/v1/ingest/runs/{r.id}/claim", json={"worker": "w"}, headers=AUTH).json()
        session.add_all(CollectiveTrial(run_id=r.id, op="all_reduce_sum", dtype="float32", bytes=size, trial=t,
                                        rank=rank, digest=f"fp1:{r.config_index}{size}", time_s=1e-4)
                        for size in (4096, 16384) for t in range(2) for rank in range(2))
        session.commit()
        done = {"attempt": spec["attempt"], "status": "succeeded"}
        assert client.post(f"/api/v1/ingest/runs/{r.id}/finish", json=done, headers=AUTH).status_code == 200
    return job


def test_a_finished_collective_job_is_read_from_its_stored_result(
        client: TestClient, session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from detlab.backend.figures import collective as collective_figures
    from detlab.backend.reports import collective as collective_report

    job = finish_collective_job(client, session, settings)
    built = json.loads(json.dumps(collective_report.build(session=session, job=reread(session, job.id))))
    builds = count_builds(monkeypatch, collective_report)
    served = client.get(f"/api/v1/jobs/{job.id}/collective").json()
    assert served == built and served["equality"][0]["equal"] == [[True, False], [False, True]]
    figures = client.get(f"/api/v1/jobs/{job.id}/collective/figures").json()
    assert figures == json.loads(json.dumps(collective_figures.collective_figures(built)))
    assert builds == []
    assert client.get(f"/api/v1/jobs/{job.id}/comparison").status_code == 404
    # The list's verdict of a collective job: every cell gave one digest (the configs differ from each other).
    assert client.get("/api/v1/jobs").json()["items"][0]["verdict"] == "reproducible"


def test_log_diff_lists_the_facts_that_differ(client: TestClient, session: Session, settings: Settings) -> None:
    import base64
    import zlib

    from detlab.core import commlog

    run = make_run(session, settings, configs=TWO_CONFIGS)
    for r, name in zip(sorted(run.job.runs, key=lambda r: r.config_index),
                       ["default", "tree-simple-1ch"], strict=True):
        spec = client.post(f"/api/v1/ingest/runs/{r.id}/claim", json={"worker": "w"}, headers=AUTH).json()
        log = (FIXTURES / f"commlogs/nccl-2.28.9-h200-w1-ddp-{name}-detlab.log").read_bytes()
        upload = {"attempt": spec["attempt"], "rank": 0, "zlib_b64": base64.b64encode(zlib.compress(log)).decode(),
                  "raw_bytes": len(log)}
        assert client.post(f"/api/v1/ingest/runs/{r.id}/commlog", json=upload, headers=AUTH).status_code == 200
    a, b = (r.id for r in sorted(run.job.runs, key=lambda r: r.config_index))
    parsed = [session.scalars(select(CommLog).where(CommLog.run_id == i)).one().parsed for i in (a, b)]
    served = client.get(f"/api/v1/runs/{a}/logdiff/{b}").json()
    assert served == {"a": a, "b": b, "diff": json.loads(json.dumps(commlog.diff_facts(*parsed)))}
    assert served["diff"]


def test_a_running_collective_job_shows_its_cells_so_far(client: TestClient, session: Session, settings: Settings,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from detlab.backend.reports import collective as collective_report

    run = make_run(session, settings, kind="collective", workload=None, steps=None,
                   collective={"min_bytes": 4096, "max_bytes": 16384})
    client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH)
    session.add_all(CollectiveTrial(run_id=run.id, op="all_reduce_sum", dtype="float32", bytes=4096, trial=0,
                                    rank=rank, digest="fp1:x", time_s=1e-4) for rank in range(2))
    session.commit()
    builds = count_builds(monkeypatch, collective_report)
    assert [c["bytes"] for c in client.get(f"/api/v1/jobs/{run.job_id}/collective").json()["cells"]] == [4096]
    assert client.get(f"/api/v1/jobs/{run.job_id}/collective/figures").status_code == 200
    assert len(builds) == 2 and reread(session, run.job_id).result is None


@pytest.mark.parametrize("body", ['{"workload": "mlp", "configs": [{}], "world_size": NaN}',
                                  '{"workload": "mlp", "configs": [{}], "steps": Infinity}',
                                  '{"workload": "mlp", "configs": [{}], "repeats": 1e999}'])
def test_a_non_finite_number_in_a_job_is_a_422_not_a_500(client: TestClient, body: str) -> None:
    resp = client.post("/api/v1/jobs", content=body, headers={"Content-Type": "application/json"})
    assert resp.status_code == 422, resp.text
    assert resp.json()["detail"][0]["loc"][0] == "body"
