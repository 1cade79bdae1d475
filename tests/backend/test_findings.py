"""Findings: the history built from finished jobs and from imported result files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session

from detlab.backend.models import SUCCEEDED, CollectiveTrial, Finding
from detlab.backend.reports import collective as collective_report
from detlab.backend.reports.findings import rows_from_result, store, summary
from detlab.backend.schemas import JobCreate
from detlab.backend.services.jobs import create_job
from detlab.backend.services.settle import settle
from detlab.core.settings import Settings
from tests.conftest import ROOT

RESULTS = ROOT / "results" / "2026-11-29-h200-nccl"


def result_file(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_rows_carry_hardware_library_and_config() -> None:
    data = result_file("sweep-4xH200.json")
    rows = rows_from_result("f", data["job"], data["result"])
    assert len(rows) == len(data["result"]["cells"]) == 40
    assert {r["hardware"] for r in rows} == {"4 x NVIDIA H200"}
    assert {r["library"] for r in rows} == {"NCCL 2.28.9"}
    assert {r["config"] for r in rows} == {"algo-Ring.proto-LL", "algo-Ring.proto-Simple", "algo-Tree.proto-LL",
                                           "algo-Tree.proto-Simple"}


def test_summary_puts_bandwidth_beside_the_verdict(session: Session) -> None:
    data = result_file("sweep-4xH200.json")
    store(session=session, rows=rows_from_result("f", data["job"], data["result"]))
    groups = {(g["config"], g["dtype"]): g for g in summary(session=session)}
    ring = groups[("algo-Ring.proto-Simple", "float32")]
    assert (ring["reproducible"], ring["cells"], ring["min_runs"]) == (5, 5, 2)
    assert ring["largest_bytes"] == 1 << 28 and 250 < ring["busbw_gbps_at_largest"] < 400


def test_storing_a_source_again_replaces_its_rows(session: Session) -> None:
    data = result_file("collective-w1-1xH200.json")
    rows = rows_from_result("same", data["job"], data["result"])
    store(session=session, rows=rows)
    store(session=session, rows=rows)
    assert sum(g["cells"] for g in summary(session=session)) == len(rows)


def test_import_results_command_fills_the_database(tmp_path: Path, pg_url: str) -> None:
    env = {"DETLAB_DATABASE_URL": pg_url, "DETLAB_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "detlab.cli", "import-results", str(RESULTS / "sweep-2xH200.json")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM findings")).scalar() == 480
    engine.dispose()


def test_import_results_refuses_a_file_that_is_not_a_result(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"job": {}}')
    env = {"DETLAB_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "detlab.cli", "import-results", str(bad)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "not a detlab result file" in out.stderr


def test_a_settled_collective_job_records_its_stored_result_built_once(session: Session, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    data = JobCreate.model_validate({"kind": "collective", "world_size": 2, "configs": [{}],
                                     "collective": {"min_bytes": 4096, "max_bytes": 16384}})
    job = create_job(session=session, data=data, settings=Settings(data_dir=tmp_path), submitter=None)
    [run] = job.runs
    session.add_all(CollectiveTrial(run_id=run.id, op="all_reduce_sum", dtype="float32", bytes=size, trial=0,
                                    rank=rank, digest="fp1:x", time_s=1e-4) for size in (4096, 16384)
                    for rank in range(2))
    run.status, run.device = SUCCEEDED, "cpu"
    builds: list[int] = []
    real = collective_report.build

    def counted(**kw: Any) -> Any:
        builds.append(1)
        return real(**kw)

    monkeypatch.setattr(collective_report, "build", counted)
    settle(session=session, job=job)
    settle(session=session, job=job)  # a job settles again without its result being rebuilt
    assert len(builds) == 1
    assert len((job.result or {})["cells"]) == 2
    assert session.scalar(select(func.count()).select_from(Finding).where(Finding.source == f"job {job.id}")) == 2
    assert {f.hardware for f in session.scalars(select(Finding))} == {"2 x cpu"}
