"""Findings: the history built from finished jobs and from imported result files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, inspect, select, text
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import SUCCEEDED, CollectiveTrial, Finding
from detlab.backend.reports import collective as collective_report
from detlab.backend.reports import matrix
from detlab.backend.reports.findings import rows_from_result, store
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


def test_the_matrix_puts_bandwidth_beside_the_verdict(session: Session) -> None:
    data = result_file("sweep-4xH200.json")
    store(session=session, rows=rows_from_result("f", data["job"], data["result"]))
    scope = matrix.Scope(kind="collective", op="all_reduce_sum", dtype="float32")
    [ring] = [c for c in matrix.matrix(session=session, scope=scope)["cells"]
              if c["config"] == "algo-Ring.proto-Simple"]
    assert (ring["identical"], ring["comparable"]) == (5, 5)
    assert 250 < ring["busbw_gbps"] < 400
    [measured] = matrix.history(session=session, scope=scope, config=ring["config"], stack=ring["stack"])
    assert (measured["runs"], measured["largest_bytes"]) == (2, 1 << 28)


def test_storing_a_source_again_replaces_its_rows(session: Session) -> None:
    data = result_file("collective-w1-1xH200.json")
    rows = rows_from_result("same", data["job"], data["result"])
    store(session=session, rows=rows)
    store(session=session, rows=rows)
    assert session.scalar(select(func.count()).select_from(Finding)) == len(rows)


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


def import_results(pg_url: str, tmp_path: Path, *files: Path) -> subprocess.CompletedProcess[str]:
    env = {"DETLAB_DATABASE_URL": pg_url, "DETLAB_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "detlab.cli", "import-results", *map(str, files)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def count_cells(pg_url: str, where: str = "true") -> dict[str, int]:
    engine = create_engine(pg_url)
    with engine.connect() as conn:
        rows = conn.execute(text(f"SELECT source, count(*) FROM finding_cells WHERE {where} GROUP BY source")).all()
    engine.dispose()
    return {source: n for source, n in rows}


def test_import_results_takes_every_result_kind(tmp_path: Path, pg_url: str) -> None:
    files = [RESULTS / "sweep-4xH200.json", RESULTS / "train-tiny-lm-2xH200.json",
             ROOT / "results" / "2026-12-01-h200-w1-train" / "scatter.json"]  # a train comparison beside its job
    out = import_results(pg_url, tmp_path, *files)
    assert out.returncode == 0, out.stderr
    assert count_cells(pg_url, "kind = 'train'") == {"2026-11-29-h200-nccl/train-tiny-lm-2xH200.json": 2,
                                                     "2026-12-01-h200-w1-train/scatter.json": 2}
    assert count_cells(pg_url, "kind = 'collective'") == {"2026-11-29-h200-nccl/sweep-4xH200.json": 8}


def test_import_results_is_all_or_nothing_per_file(tmp_path: Path, pg_url: str) -> None:
    good = RESULTS / "collective-w1-1xH200.json"
    data = result_file("sweep-4xH200.json")
    data["result"]["configs"][-1]["name"] = "x" * 100  # too long for the column: the database refuses its rows
    broken = tmp_path / "sweep-4xH200.json"
    broken.write_text(json.dumps(data))
    assert import_results(pg_url, tmp_path, RESULTS / "sweep-4xH200.json").returncode == 0
    before = count_cells(pg_url)

    out = import_results(pg_url, tmp_path, good, broken, tmp_path / "missing.json")

    assert out.returncode == 2
    assert f"{broken}: not a detlab result file, nothing of it imported" in out.stderr
    assert "2 of 3 file(s) refused" in out.stderr
    assert str(broken) not in out.stdout and f"{good}: 4 measurements" in out.stdout
    after = count_cells(pg_url)
    # The refused file kept nothing, and the earlier import of the file of that name is kept whole.
    assert after.pop("2026-11-29-h200-nccl/collective-w1-1xH200.json") == 4
    assert after == before


def test_migration_0008_carries_the_history_over_and_back(db_url: str) -> None:
    from alembic import command

    from detlab.migrations import alembic_config

    config = alembic_config(db_url)
    command.upgrade(config, "0007")
    engine = create_engine(db_url)
    with engine.begin() as conn:
        for size, ok in ((4096, True), (65536, False)):
            conn.execute(text("INSERT INTO findings (source, recorded_at, hardware, library, world_size, config, "
                              "config_env, op, dtype, bytes, runs, reproducible, busbw_gbps) VALUES ('f.json', "
                              "'2026-11-29 12:00:00+00:00', '2 x NVIDIA H200', 'NCCL 2.28.9', 2, 'ring', '{}', "
                              "'all_reduce_sum', 'float32', :size, 3, :ok, :bw)"),
                         {"size": size, "ok": ok, "bw": size / 1e3})
    command.upgrade(config, "0008")
    with engine.connect() as conn:
        cell = conn.execute(text("SELECT kind, identical, comparable, largest_bytes, busbw_gbps, stack "
                                 "FROM finding_cells")).one()
    assert tuple(cell) == ("collective", 1, 2, 65536, 65.536, "2 x NVIDIA H200 · NCCL 2.28.9")
    command.downgrade(config, "0007")
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM findings")).scalar() == 2
    assert "finding_cells" not in inspect(engine).get_table_names()
    engine.dispose()
