"""No input gives a 500: integers past their columns, non-finite numbers, NUL and lone surrogates in strings,
unknown sweep knobs. Each is refused at the edge with a 422 that names the field, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json
import zlib
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import Job, RankEnv, Run, Worker
from detlab.backend.services.jobs import create_job
from detlab.core.settings import Settings
from tests.backend.conftest import LOCAL_PEER, LOCAL_URL, carry_leases

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JSON = {**AUTH, "content-type": "application/json"}
BIG_IDS = [2**31, 2**63, 2**70]


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


@pytest.fixture
def client(client: TestClient) -> TestClient:
    # An exception in the app comes back as the 500 a user would see, not as the exception.
    plain = TestClient(client.app, raise_server_exceptions=False, base_url=LOCAL_URL, client=LOCAL_PEER)
    carry_leases(plain)
    return plain


def claimed_run(client: TestClient, session: Session, settings: Settings) -> tuple[Run, int]:
    body = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 2, "steps": 3}
    run = create_job(session=session, data=JobCreate.model_validate(body), settings=settings, submitter=None).runs[0]
    session.commit()
    spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
    return run, spec["attempt"]


def step(**fields: Any) -> dict[str, Any]:
    return {"type": "step", "step": 1, "rank": 0, "fp_version": "fp1", "model_digest": "fp1:" + "0" * 32,
            "digests": "ab" * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01, **fields}


def locs(resp: Any) -> list[list[Any]]:
    return [e["loc"] for e in resp.json()["detail"]]


# ---- integers past their columns --------------------------------------------------------------------

@pytest.mark.parametrize("query", [f"offset={2**63}", f"offset={2**64}", f"limit={2**63}", "offset=-1"])
def test_a_page_past_a_bigint_is_a_422(client: TestClient, query: str) -> None:
    resp = client.get(f"/api/v1/jobs?{query}")
    assert resp.status_code == 422
    assert locs(resp) == [["query", query.split("=")[0]]]


def test_an_offset_past_the_jobs_is_an_empty_page(client: TestClient) -> None:
    resp = client.get(f"/api/v1/jobs?offset={2**63 - 1}")
    assert resp.status_code == 200 and resp.json()["items"] == []


READS = ["/api/v1/jobs/{id}", "/api/v1/jobs/{id}/comparison", "/api/v1/jobs/{id}/comparison/figure",
         "/api/v1/jobs/{id}/throughput/figure", "/api/v1/jobs/{id}/collective", "/api/v1/jobs/{id}/collective/figures",
         "/api/v1/runs/{id}/logdiff/1", "/api/v1/runs/1/logdiff/{id}", "/api/v1/runs/{id}/commlog/0",
         "/api/v1/runs/1/commlog/{id}", "/api/v1/jobs/{id}/why", "/api/v1/runs/{id}/envs"]


@pytest.mark.parametrize("path", READS)
def test_an_id_past_its_column_is_a_422_naming_it(client: TestClient, path: str) -> None:
    for big in BIG_IDS:
        resp = client.get(path.format(id=big))
        assert resp.status_code == 422, big
        assert locs(resp)[0][0] == "path"


def test_an_id_no_row_can_have_is_a_422(client: TestClient) -> None:
    for path in ["/api/v1/jobs/0", "/api/v1/jobs/-1", "/api/v1/runs/0/logdiff/1", "/api/v1/runs/1/commlog/-1"]:
        assert client.get(path).status_code == 422, path


def test_an_id_in_range_without_a_row_is_a_404(client: TestClient) -> None:
    resp = client.get(f"/api/v1/jobs/{2**31 - 1}")
    assert resp.status_code == 404 and resp.json()["detail"] == f"no job {2**31 - 1}"


INGEST = {"claim": {"worker": "w"}, "records": {"attempt": 1, "records": []},
          "commlog": {"attempt": 1, "rank": 0, "zlib_b64": "", "raw_bytes": 0},
          "finish": {"attempt": 1, "status": "failed"}}


@pytest.mark.parametrize("action", sorted(INGEST))
def test_an_ingest_run_id_past_its_column_is_a_422(client: TestClient, action: str) -> None:
    for big in BIG_IDS:
        resp = client.post(f"/api/v1/ingest/runs/{big}/{action}", json=INGEST[action], headers=AUTH)
        assert resp.status_code == 422 and locs(resp) == [["path", "run_id"]], big


@pytest.mark.parametrize("path", ["/api/v1/jobs/{id}/cancel", "/api/v1/runs/{id}/cancel"])
def test_a_cancel_of_an_id_past_its_column_is_a_422(client: TestClient, path: str) -> None:
    for big in BIG_IDS:
        resp = client.post(path.format(id=big))
        assert resp.status_code == 422 and locs(resp)[0][0] == "path", big


# ---- non-finite numbers -----------------------------------------------------------------------------

NON_FINITE = ["NaN", "Infinity", "-Infinity", "1e999"]  # as Python's json writes them (1e999 reads as inf)


def with_literal(body: Any, literal: str) -> str:
    return json.dumps(body).replace('"@"', literal)


@pytest.mark.parametrize("field", ["world_size", "steps", "repeats", "fingerprint_interval"])
def test_a_non_finite_number_in_a_job_is_a_422(client: TestClient, field: str) -> None:
    for literal in NON_FINITE:
        body = with_literal({"workload": "mlp", "configs": [{}], field: "@"}, literal)
        resp = client.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 422 and locs(resp) == [["body", "train", field]], literal  # the kind's field


@pytest.mark.parametrize("config", [{"seed": "@"}, {"world_size": "@"}, {"threads": "@"}, {"preset": "@"},
                                    {"env": {"NCCL_BUFFSIZE": "@"}}])
def test_a_non_finite_number_in_a_config_is_a_422(client: TestClient, config: dict) -> None:
    for literal in NON_FINITE:
        body = with_literal({"workload": "mlp", "configs": [config]}, literal)
        resp = client.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 422 and "config 0" in resp.json()["detail"], literal


@pytest.mark.parametrize("field", ["loss", "step_time_s"])
def test_a_non_finite_number_in_a_record_is_a_422(client: TestClient, session: Session, settings: Settings,
                                                 field: str) -> None:
    run, attempt = claimed_run(client, session, settings)
    for literal in NON_FINITE:
        body = with_literal({"attempt": attempt, "records": [step(**{field: "@"})]}, literal)
        resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", content=body, headers=JSON)
        assert resp.status_code == 422 and locs(resp) == [["body", "records", 0, "step", field]], literal


# ---- strings a database cannot store: NUL (PostgreSQL), lone surrogates (both) ---------------------------

BAD_TEXT = ["a\x00b", "a\ud800b", "\udfff"]


def send_with(client: TestClient, path: str, body: Any, text: str) -> Any:
    """POST `body` with "@" replaced by `text`, a lone surrogate written as the `\\ud800` escape a client
    sends (httpx's json= cannot encode one)."""
    return client.post(path, content=json.dumps(body).replace('"@"', json.dumps(text)), headers=JSON)


@pytest.mark.parametrize("beat, loc", [
    ({"worker": "@", "queue": "q"}, ["body", "worker"]),
    ({"worker": "w", "queue": "@"}, ["body", "queue"]),
    ({"worker": "w", "queue": "q", "info": {"workloads": [{"name": "x", "description": "@", "global_batch": 1,
                                                           "default_steps": 1}]}},
     ["body", "info", "workloads", 0, "description"]),
])
def test_unstorable_text_in_a_heartbeat_is_a_422(client: TestClient, session: Session, beat: dict,
                                                 loc: list) -> None:
    for text in BAD_TEXT:
        resp = send_with(client, "/api/v1/ingest/heartbeat", beat, text)
        assert resp.status_code == 422 and locs(resp) == [loc], repr(text)
    assert session.scalar(select(func.count()).select_from(Worker)) == 0


def test_unstorable_text_in_a_claim_is_a_422(client: TestClient, session: Session, settings: Settings) -> None:
    body = {"workload": "mlp", "configs": [{}], "world_size": 2, "steps": 3}
    run = create_job(session=session, data=JobCreate.model_validate(body), settings=settings, submitter=None).runs[0]
    session.commit()
    for text in BAD_TEXT:
        resp = send_with(client, f"/api/v1/ingest/runs/{run.id}/claim", {"worker": "@"}, text)
        assert resp.status_code == 422 and locs(resp) == [["body", "worker"]], repr(text)


ENV = {"type": "env", "rank": 0, "host": "node1"}
TENSOR = {"index": 0, "name": "w", "shape": [2], "dtype": "float32"}


@pytest.mark.parametrize("record, loc", [
    ({**ENV, "host": "@"}, ["env", "host"]),
    ({**ENV, "device": "@"}, ["env", "device"]),
    ({**ENV, "effective_env": {"NCCL_ALGO": "@"}}, ["env", "effective_env"]),
    ({**ENV, "effective_env": {"@": "1"}}, ["env", "effective_env"]),
    ({"type": "tensors", "tensors": [{**TENSOR, "name": "@"}]}, ["tensors", "tensors", 0, "name"]),
    ({"type": "tensors", "tensors": [{**TENSOR, "dtype": "@"}]}, ["tensors", "tensors", 0, "dtype"]),
])
def test_unstorable_text_in_a_record_is_a_422_naming_it(client: TestClient, session: Session, settings: Settings,
                                                       record: dict, loc: list) -> None:
    run, attempt = claimed_run(client, session, settings)
    expected = ["body", "records", 0, *loc]
    for text in BAD_TEXT:
        resp = send_with(client, f"/api/v1/ingest/runs/{run.id}/records", {"attempt": attempt, "records": [record]},
                         text)
        assert resp.status_code == 422 and locs(resp)[0][:len(expected)] == expected, repr(text)
    assert session.scalar(select(func.count()).select_from(RankEnv)) == 0


def test_unstorable_text_in_a_run_error_is_a_422_that_says_what(client: TestClient, session: Session,
                                                                settings: Settings) -> None:
    run, attempt = claimed_run(client, session, settings)
    for text in BAD_TEXT:
        body = {"attempt": attempt, "status": "failed", "error": "@"}
        resp = send_with(client, f"/api/v1/ingest/runs/{run.id}/finish", body, f"Traceback {text}")
        assert resp.status_code == 422 and locs(resp) == [["body", "error"]], repr(text)
    body = {"attempt": attempt, "status": "failed", "error": "Traceback a\x00b"}
    msg = client.post(f"/api/v1/ingest/runs/{run.id}/finish", json=body, headers=AUTH).json()["detail"][0]["msg"]
    assert "contains a NUL character (\\u0000) at position 11" in msg


@pytest.mark.parametrize("body", [
    {"workload": "@", "configs": [{}]},
    {"workload": "mlp", "configs": [{"name": "@"}]},
    {"workload": "mlp", "configs": [{"preset": "@"}]},
    {"workload": "mlp", "configs": [{"env": {"@": "1"}}]},
    {"workload": "mlp", "configs": [{"env": {"NCCL_ALGO": "@"}}]},
    {"workload": "mlp", "configs": [{"@": 1}]},
    {"workload": "mlp", "configs": [{}], "@": 1},
    {"workload": "mlp", "configs": [{}], "queue": "@"},
    {"kind": "sweep", "configs": [{}], "sweep": {"knobs": {"@": [None]}}},
    {"kind": "sweep", "configs": [{}], "sweep": {"knobs": {"NCCL_ALGO": ["@"]}}},
    {"workload": "mlp", "configs": [{}], "inject_bitflip": {"step": 1, "tensor": "@"}},
])
def test_unstorable_text_in_a_job_is_a_422_and_nothing_is_stored(client: TestClient, session: Session,
                                                                 body: dict) -> None:
    for text in BAD_TEXT:
        resp = send_with(client, "/api/v1/jobs", body, text)
        assert resp.status_code == 422, repr(text)
        resp.content.decode("utf-8")  # an unknown key is echoed in `loc`, escaped: the reply is valid UTF-8
    assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_a_proxy_user_with_a_nul_is_a_400(client: TestClient, session: Session, settings: Settings) -> None:
    settings.auth_mode = "proxy"  # the user header is stored as the job's submitter
    body = {"workload": "mlp", "configs": [{}]}
    resp = client.post("/api/v1/jobs", json=body, headers={settings.proxy_user_header: "ali\x00ce"})
    assert resp.status_code == 400 and "NUL" in resp.json()["detail"]
    assert session.scalar(select(func.count()).select_from(Job)) == 0


# ---- values a run would refuse later --------------------------------------------------------------------

@pytest.mark.parametrize("knobs, fragment", [
    ({"LD_PRELOAD": [None]}, "LD_PRELOAD is not an allowed variable"),
    ({"NCCL_DEBUG_FILE": [None]}, "set by the worker"),
    ({"NCCL_NET_PLUGIN": [None, None]}, "names a file or plugin"),
    ({"x" * 300: [None]}, "is not an allowed variable"),
])
def test_a_sweep_knob_is_validated_even_when_all_its_values_are_null(client: TestClient, session: Session,
                                                                     knobs: dict, fragment: str) -> None:
    body = {"kind": "sweep", "configs": [{}], "sweep": {"knobs": knobs}}
    resp = client.post("/api/v1/jobs", json=body)
    assert resp.status_code == 422 and fragment in resp.json()["detail"]
    assert session.scalar(select(func.count()).select_from(Job)) == 0


def test_a_preset_that_is_not_a_string_is_a_422(client: TestClient) -> None:
    for preset in [["default"], {"name": "default"}, 1, None, True]:
        resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{"preset": preset}]})
        assert resp.status_code == 422 and "config 0" in resp.json()["detail"], preset


def test_a_job_integer_past_its_column_is_a_422(client: TestClient) -> None:
    # fingerprint_interval was stored unchecked, and every claim of the job's runs was a 500
    for field in ["fingerprint_interval", "steps", "world_size", "repeats"]:
        resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], field: 2**31})
        assert resp.status_code == 422 and locs(resp) == [["body", "train", field]], field


def test_a_huge_integer_is_a_4xx_not_a_500(client: TestClient) -> None:
    body = '{"workload": "mlp", "configs": [{}], "steps": ' + "9" * 5000 + "}"
    resp = client.post("/api/v1/jobs", content=body, headers={"content-type": "application/json"})
    assert 400 <= resp.status_code < 500


# ---- found by the fuzz test -------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [b"", zlib.compress(b"NCCL INFO NCCL version 2.21.5+cuda12.4\n" * 20)[:-9]])
def test_a_log_that_is_no_complete_zlib_stream_is_a_422_and_reads_stay_200(client: TestClient, session: Session,
                                                                           settings: Settings,
                                                                           payload: bytes) -> None:
    run, attempt = claimed_run(client, session, settings)
    upload = {"attempt": attempt, "rank": 0, "zlib_b64": base64.b64encode(payload).decode(), "raw_bytes": 780}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/commlog", json=upload, headers=AUTH)
    assert resp.status_code == 422 and "not a complete zlib stream" in resp.json()["detail"]
    assert client.get(f"/api/v1/runs/{run.id}/commlog/0").status_code == 404
