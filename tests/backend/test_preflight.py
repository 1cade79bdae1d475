"""Preflight through the API: a job any of whose configs sets a known-broken or no-op setting is refused with a 422
that names the setting and its fix, whatever its kind; what works is accepted. And a fix job's request is held to
its own rules."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from detlab.core import configs, preflight
from detlab.core.settings import Settings

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
TRAIN = {"workload": "mlp", "world_size": 2, "steps": 3}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


def post(client: TestClient, body: dict[str, Any]) -> tuple[int, str]:
    resp = client.post("/api/v1/jobs", json=body)
    return resp.status_code, resp.json().get("detail", "") if resp.status_code == 422 else ""


def beat(client: TestClient, device: str, queue: str, **stack: str) -> None:
    capacity = {"device": device, "gpus": 2 if device == "cuda" else 0, "cpu_cores": 8, **stack}
    resp = client.post("/api/v1/ingest/heartbeat", json={"worker": f"node-{queue}", "queue": queue,
                                                          "info": {"capacity": capacity}}, headers=AUTH)
    assert resp.status_code == 200, resp.text


def test_a_global_tree_algorithm_is_refused_with_its_fix_for_every_kind_that_gathers(client: TestClient) -> None:
    tree = {"preset": "default", "name": "tree", "env": {"NCCL_ALGO": "Tree"}}
    status, detail = post(client, {**TRAIN, "configs": [{"preset": "default"}, tree]})
    assert status == 422
    assert "config tree: NCCL_ALGO=Tree leaves allgather only ['tree']" in detail
    assert "NCCL_ALGO=allreduce:tree" in detail and "nccl-algo-tree-gathers" in detail
    sweep = {"kind": "sweep", "configs": [{}], "world_size": 2, "collective": {"ops": ["all_gather"]},
             "sweep": {"over": "collective", "knobs": {"NCCL_ALGO": ["Ring", "Tree"]}}}
    assert post(client, sweep)[0] == 422
    # all_reduce has a Tree algorithm: a collective test of all_reduce alone runs it, as the per-function form does
    assert post(client, {**sweep, "collective": {"ops": ["all_reduce_sum"]}})[0] == 201
    fixed = {**tree, "env": {"NCCL_ALGO": "allreduce:tree"}}
    assert post(client, {**TRAIN, "configs": [{"preset": "default"}, fixed]})[0] == 201
    assert post(client, {**TRAIN, "configs": [{"env": {"NCCL_ALGO": "Tree;allgather:ring;reducescatter:ring"}}]})[0] \
        == 201


def test_a_variable_no_nccl_reads_is_refused(client: TestClient) -> None:
    status, detail = post(client, {**TRAIN, "configs": [{"env": {"NCCL_DETERMINISTIC": "1"}}]})
    assert status == 422 and "NCCL_DETERMINISTIC=1: no NCCL release reads this variable" in detail


def test_deterministic_algorithms_without_a_cublas_workspace_is_refused_where_the_queue_runs_torch_2_9_on_cuda(
        client: TestClient) -> None:
    beat(client, "cuda", "gpu", torch="2.9.1+cu128", cuda="12.8")
    beat(client, "cuda", "new", torch="2.11.0+cu130", cuda="13.0")
    beat(client, "cuda", "unsaid")
    beat(client, "cpu", "cpu")
    bare = {"torch": {"deterministic_algorithms": True}}
    status, detail = post(client, {**TRAIN, "queue": "gpu", "configs": [bare]})
    assert status == 422 and "CUBLAS_WORKSPACE_CONFIG=:4096:8" in detail and "torch 2.9.1+cu128" in detail
    assert post(client, {**TRAIN, "queue": "gpu", "configs": [{"preset": "torch-deterministic"}]})[0] == 201
    # torch >= 2.10 dropped the check (measured on an H200, torch 2.11+cu130: reproducible, no alert)
    assert post(client, {**TRAIN, "queue": "new", "configs": [bare]})[0] == 201
    assert post(client, {**TRAIN, "queue": "unsaid", "configs": [bare]})[0] == 201  # versions not known: no claim
    assert post(client, {**TRAIN, "queue": "cpu", "configs": [bare]})[0] == 201  # no cuBLAS on a CPU


def test_a_fix_job_takes_one_base_config_and_two_repeats_at_least(client: TestClient) -> None:
    fix = {"kind": "fix", "workload": "scatter", "configs": [{"threads": 2}], "steps": 4}
    assert post(client, {**fix, "repeats": 1})[0] == 422
    status, detail = post(client, {**fix, "configs": [{}, {}]})
    assert status == 422 and "exactly one base config" in detail
    status, detail = post(client, {**fix, "max_trials": 32, "steps": 100_000, "repeats": 20})
    assert status == 422 and "max_rank_steps" in detail
    resp = client.post("/api/v1/jobs", json=fix)
    assert resp.status_code == 201, resp.text
    job = resp.json()
    assert job["kind"] == "fix" and len(job["runs"]) == 2 and job["repeats"] == 2
    assert client.get(f"/api/v1/jobs/{job['id']}/spec").json()["max_trials"] == 8
    assert client.get(f"/api/v1/jobs/{job['id']}/comparison").status_code == 404  # its result is at /fix


def test_the_table_has_a_reason_a_fix_and_a_source_for_every_rule() -> None:
    rows = preflight.table()
    assert len(rows) == len(preflight.RULES) >= 3
    assert all(row["reason"] and row["fix"] and row["source"].startswith("https://") for row in rows)
    ctx = preflight.Context()
    assert preflight.check(configs.preset("full-deterministic"), ctx) == []
    assert [f.rule for f in preflight.check(configs.resolve({"env": {"NCCL_ALGO": "^ring"}}), ctx)] == []
    only_tree = configs.resolve({"env": {"NCCL_ALGO": "^ring,nvls,pat,collnetdirect"}})
    assert [f.rule for f in preflight.check(only_tree, ctx)] == ["nccl-algo-tree-gathers"]
