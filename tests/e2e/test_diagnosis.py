"""Diagnosis jobs on the distributed deployment: PostgreSQL, Redis, a Celery worker, real ranks on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.conftest import ROOT
from tests.e2e.conftest import Stack, read_job, wait_for
from tests.e2e.test_browser_diagnosis import SCATTER_OPS
from tests.e2e.test_cancel import GONE_WITHIN_S, gone_after


@pytest.fixture
def distributed(shared_distributed: Stack) -> Stack:
    """These tests look only at jobs of their own, by id: they share one deployment (tests/e2e/conftest.py)."""
    return shared_distributed


def diagnosis(stack: Stack, job_id: int) -> dict:
    resp = httpx.get(f"{stack.url}/api/v1/jobs/{job_id}/diagnosis", timeout=30)
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_op_audit_of_scatter_at_two_threads_finds_its_racing_ops_and_deterministic_mode_fixes_them(
        distributed: Stack) -> None:
    job = distributed.submit({"kind": "op-audit", "workload": "scatter", "diagnosis": {"reruns": 10}, "configs": [
        {"preset": "default", "threads": 2}, {"preset": "torch-deterministic", "threads": 2}]})
    done = distributed.wait_job(job["id"], timeout=300)
    assert done["status"] == "succeeded", distributed.logs()
    assert done["verdict"] == "nondeterministic"
    default, deterministic = diagnosis(distributed, job["id"])["configs"]
    racing = {o["op"] for o in default["ops"] if o["nondeterministic"]}
    assert racing and racing <= SCATTER_OPS
    assert default["torch_flags"]["num_threads"] == 2 and default["ineffective"] == []
    assert not any(o["nondeterministic"] for o in deterministic["ops"])
    assert deterministic["torch_flags"]["deterministic_algorithms"] is True and deterministic["ineffective"] == []
    assert {o["op"] for o in default["ops"]} == {o["op"] for o in deterministic["ops"]}  # the same step

    engine = create_engine(distributed.env["DETLAB_DATABASE_URL"])
    with engine.connect() as conn:
        cells = dict(conn.execute(text("SELECT config_index, min(identical) FROM finding_cells WHERE job_id = :j "
                                       "GROUP BY config_index"), {"j": job["id"]}).all())
    engine.dispose()
    assert cells == {0: 0, 1: 1}  # a default cell that differed; every deterministic one held


def test_batch_invariance_job_records_every_cell_and_the_models_first_module(distributed: Stack) -> None:
    job = distributed.submit({"kind": "batch-invariance", "configs": [{"preset": "default"}], "diagnosis": {
        "ops": ["mm", "sum", "softmax"], "dtypes": ["float32", "bfloat16"], "batch_sizes": [1, 2, 8],
        "features": 64, "workload": "mlp"}})
    done = distributed.wait_job(job["id"], timeout=300)
    assert done["status"] == "succeeded", distributed.logs()
    assert done["runs"][0]["steps_done"] == done["runs"][0]["steps_total"] == 3 * 2 * 3 + 3
    [config] = diagnosis(distributed, job["id"])["configs"]
    assert len(config["results"]) == 18 and config["device"].startswith("cpu") and config["tf32"] is True
    assert all(r["invariant"] for r in config["results"] if r["batch_size"] == 1)
    for s in config["summary"]:
        broken = [r["batch_size"] for r in config["results"]
                  if (r["op"], r["dtype"]) == (s["op"], s["dtype"]) and not r["invariant"]]
        assert s["first_break"] == (min(broken) if broken else None)
    model = config["model"]
    assert (model["workload"], model["batch_sizes"]) == ("mlp", [1, 2, 8])
    assert model["invariant"] == (model["first_module"] is None) == (model["first_break"] is None)
    expected = "invariant" if all(r["invariant"] for r in config["results"]) and model["invariant"] else "not-invariant"
    assert done["verdict"] == expected


def rank_envs(stack: Stack, run_id: int) -> int:
    engine = create_engine(stack.env["DETLAB_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM rank_envs WHERE run_id = :r"), {"r": run_id})
                       .scalar_one())
    finally:
        engine.dispose()


def test_cancelling_a_batch_invariance_job_kills_its_rank(distributed: Stack) -> None:
    # bfloat16 4096 × 4096 products on two CPU cores: minutes of work, cancelled long before.
    job = distributed.submit({"kind": "batch-invariance", "configs": [{"preset": "default"}], "diagnosis": {
        "ops": ["mm"], "dtypes": ["bfloat16", "float16"], "batch_sizes": [1, 4095, 4096], "features": 4096}})
    run_id = job["runs"][0]["id"]
    ranks = wait_for("the rank", lambda: distributed.ranks(run_id), distributed)
    # Past its start (torch imported, its environment recorded): cancelled while it computes.
    wait_for("the rank's environment record", lambda: rank_envs(distributed, run_id) >= 1, distributed)
    started = time.monotonic()
    resp = httpx.post(f"{distributed.url}/api/v1/jobs/{job['id']}/cancel", timeout=30)
    assert resp.status_code == 200, resp.text
    assert gone_after(distributed, run_id, set(ranks.values()), started) < GONE_WITHIN_S
    assert read_job(distributed, job["id"])["status"] == "cancelled"


def test_detlab_submit_waits_for_a_diagnosis_and_check_fails_on_a_break(distributed: Stack) -> None:
    def submit(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "detlab.cli", "submit", "--server", distributed.url, "--config",
                               "default", "--wait", "--json", "--check", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=300)

    # Batch size 1 alone: row 0 is the batch-1 result by definition, so the gate passes.
    out = submit("--kind", "batch-invariance", "--diagnosis", '{"ops": ["sum"], "batch_sizes": [1], "features": 16}')
    assert out.returncode == 0, out.stderr + distributed.logs()
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["job"]["verdict"] == "invariant"
    assert result["configs"][0]["summary"] == [{"op": "sum", "dtype": "float32", "first_break": None}]
    out = submit("--kind", "op-audit", "--workload", "mlp", "--diagnosis", '{"reruns": 1}')
    assert out.returncode == 2, out.stderr  # refused by the server, one line
    assert len(out.stderr.strip().splitlines()) == 1 and "diagnosis.reruns" in out.stderr, out.stderr
