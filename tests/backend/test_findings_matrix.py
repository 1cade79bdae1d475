"""The team history at work: finished train jobs land in findings; the config × stack matrix, its filters,
its trend and a cell's measurements linked to their jobs, through the API."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import SUCCEEDED, FindingCell, Job, RankEnv, StepRecord, TensorMeta
from detlab.backend.reports.findings import store
from detlab.backend.services.jobs import create_job
from detlab.backend.services.settle import settle
from detlab.core.settings import Settings

STEPS = 12  # 10 timed steps per run after warm-up: enough for a cost interval


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


def train_job(session: Session, settings: Settings, *, parted: dict[tuple[int, int], int] | None = None,
              device: str = "NVIDIA H200", torch: str = "2.11.0", slower: float = 2.0,
              configs: tuple[str, ...] = ("default", "full-deterministic"), steps: int = STEPS,
              repeats: int = 2) -> Job:
    """A finished train job with two repeats per config (or `repeats`), settled. `parted[(config, repeat)] = step`: that
    repeat's tensor t1 differs from that step on; config 1's steps take `slower` times as long."""
    body = {"workload": "mlp", "configs": [{"preset": c} for c in configs], "world_size": 1, "steps": steps,
            "repeats": repeats}
    job = create_job(session=session, data=JobCreate.model_validate(body), settings=settings, submitter=None)
    for run in job.runs:
        session.add_all(TensorMeta(run_id=run.id, index=i, name=f"t{i}", shape=[2], dtype="float32")
                        for i in range(2))
        session.add(RankEnv(run_id=run.id, rank=0, device=device, driver="580.1", cuda="13.0", torch=torch,
                            nccl="2.28.9", backend="nccl"))
        start = (parted or {}).get((run.config_index, run.repeat))
        for step in range(steps + 1):
            packed = bytes(16) + bytes([1 if start is not None and step >= start else 0]) * 16  # tensor 1 parts
            session.add(StepRecord(run_id=run.id, step=step, rank=0, attempt=1, fp_version="fp1",
                                   model_digest=f"fp1:{hashlib.md5(packed).hexdigest()}", digests=packed,
                                   loss_bits="0", loss=1.0,
                                   step_time_s=0.01 * (slower if run.config_index else 1.0) * (1 + 0.01 * step)))
        run.status, run.steps_done, run.device = SUCCEEDED, steps, device
    session.flush()
    settle(session=session, job=job)
    session.commit()
    return job


def cells_of(session: Session, job: Job) -> dict[str, FindingCell]:
    return {c.config: c for c in session.scalars(select(FindingCell).where(FindingCell.job_id == job.id))}


def test_a_finished_train_job_lands_in_the_history_per_config(session: Session, settings: Settings) -> None:
    job = train_job(session, settings, parted={(1, 1): 5})
    cells = cells_of(session, job)
    a, b = cells["default"], cells["full-deterministic"]
    assert (a.kind, a.workload, a.source) == ("train", "mlp", f"job {job.id}")
    assert (a.identical, a.comparable, a.first_divergent_step) == (1, 1, None)
    assert (b.identical, b.comparable, b.first_divergent_step) == (0, 1, 5)
    assert a.stack == "1 x NVIDIA H200 · driver 580.1 · CUDA 13.0 · torch 2.11.0 · NCCL 2.28.9"
    assert a.cost is None and b.cost == pytest.approx(0.5, abs=0.01)
    assert b.cost_lo is not None and b.cost_lo <= b.cost <= b.cost_hi  # type: ignore[operator]


@pytest.mark.parametrize(("parted", "identical", "first"), [({}, 1, None), ({(1, 0): 4}, 0, 4)])
def test_a_single_repeat_job_contributes_its_a_vs_b_result(client: TestClient, session: Session, settings: Settings,
                                                          parted: dict, identical: int, first: int | None) -> None:
    train_job(session, settings, repeats=1, parted=parted)
    cells = {c["config"]: c for c in client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()["cells"]}
    pair = cells["default vs full-deterministic"]
    assert (pair["identical"], pair["comparable"], pair["first_divergent_step"]) == (identical, 1, first)
    assert pair["lacks"] is None
    # a config's own cell says what it lacks and how to measure it, not "0/0 not measured"
    assert (cells["default"]["comparable"], cells["default"]["lacks"]) == (
        0, "reproducibility not measured: run the job with repeats >= 2")


def test_the_matrix_gives_rate_cost_divergence_and_the_latest_job(client: TestClient, session: Session,
                                                                  settings: Settings) -> None:
    train_job(session, settings, parted={(1, 1): 5})
    latest = train_job(session, settings)
    body = client.get("/api/v1/findings/matrix", params={"kind": "train", "workload": "mlp"}).json()
    cells = {c["config"]: c for c in body["cells"]}
    b = cells["full-deterministic"]
    assert (b["identical"], b["comparable"], b["rate"], b["measurements"]) == (1, 2, 0.5, 2)
    assert b["first_divergent_step"] == 5 and b["latest_job_id"] == latest.id
    assert re.fullmatch(r"\d+\.\d% slower \(95% CI \d+\.\d% to \d+\.\d%\)", b["cost_text"])
    assert cells["default"]["cost_text"] == "not measured"
    assert body["configs"] == ["default", "full-deterministic"] and len(body["stacks"]) == 1


def test_a_cost_whose_interval_spans_zero_reads_within_noise(client: TestClient, session: Session,
                                                              settings: Settings) -> None:
    train_job(session, settings, slower=1.0)
    [b] = [c for c in client.get("/api/v1/findings/matrix").json()["cells"] if c["config"] == "full-deterministic"]
    assert b["within_noise"] is True and b["cost_text"].startswith("within noise")


def test_stacks_are_columns_apart(client: TestClient, session: Session, settings: Settings) -> None:
    train_job(session, settings, torch="2.9.0")
    train_job(session, settings, device="AMD MI300X")
    stacks = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()["stacks"]
    assert len(stacks) == 2 and any("torch 2.9.0" in s for s in stacks) and any("MI300X" in s for s in stacks)


def test_the_matrix_filters_by_what_was_measured_and_by_date(client: TestClient, session: Session,
                                                              settings: Settings) -> None:
    old = train_job(session, settings, parted={(0, 1): 3})
    train_job(session, settings)
    session.execute(update(FindingCell).where(FindingCell.job_id == old.id)
                    .values(measured_at=datetime.now(UTC) - timedelta(days=30)))
    session.commit()
    yesterday = (datetime.now(UTC) - timedelta(days=1)).date().isoformat()
    recent = client.get("/api/v1/findings/matrix", params={"kind": "train", "since": yesterday}).json()
    everything = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()
    rate = {c["config"]: c["rate"] for c in recent["cells"]}
    assert rate["default"] == 1.0
    assert {c["config"]: c["rate"] for c in everything["cells"]}["default"] == 0.5
    assert client.get("/api/v1/findings/matrix", params={"kind": "train", "workload": "scatter"}).json()["cells"] == []
    bad = client.get("/api/v1/findings/matrix", params={"since": "2026-12-02", "until": "2026-12-01"})
    assert bad.status_code == 422


def test_the_trend_puts_old_and_new_measurements_in_their_slices(client: TestClient, session: Session,
                                                                 settings: Settings) -> None:
    old = train_job(session, settings, parted={(0, 1): 3})
    train_job(session, settings)
    session.execute(update(FindingCell).where(FindingCell.job_id == old.id)
                    .values(measured_at=datetime.now(UTC) - timedelta(days=30)))
    session.commit()
    body = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()
    [default] = [c for c in body["cells"] if c["config"] == "default"]
    assert default["trend"][0] == 0.0 and default["trend"][-1] == 1.0
    assert len(body["buckets"]) == len(default["trend"])


def test_without_a_kind_the_matrix_is_of_the_first_thing_measured(client: TestClient, session: Session,
                                                                  settings: Settings) -> None:
    train_job(session, settings)
    store(session=session, rows=[{"source": "f", "hardware": "2 x cpu", "library": "gloo", "world_size": 2,
                                  "config": "default", "config_env": {}, "op": "broadcast", "dtype": "float32",
                                  "bytes": 4096, "runs": 2, "reproducible": True, "busbw_gbps": 1.0}])
    session.commit()
    body = client.get("/api/v1/findings/matrix").json()
    assert body["scope"]["kind"] == "train" and body["scope"]["workload"] == "mlp"
    assert {o["kind"] for o in body["options"]} == {"train", "collective"}
    collective = client.get("/api/v1/findings/matrix", params={"kind": "collective", "op": "broadcast"}).json()
    [cell] = collective["cells"]
    assert (cell["identical"], cell["comparable"], cell["busbw_gbps"]) == (1, 1, 1.0)


def test_a_cells_history_links_each_measurement_to_its_job(client: TestClient, session: Session,
                                                           settings: Settings) -> None:
    first = train_job(session, settings)
    second = train_job(session, settings, parted={(1, 0): 2})
    stack = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()["stacks"][0]
    history = client.get("/api/v1/findings/history", params={"config": "full-deterministic", "stack": stack,
                                                             "kind": "train"}).json()["measurements"]
    assert [m["job_id"] for m in history] == [second.id, first.id]  # newest first
    assert history[0]["job_url"] == f"/jobs/{second.id}" and history[0]["first_divergent_step"] == 2
    assert client.get(history[0]["job_url"]).status_code == 200


def test_a_settled_job_settled_again_replaces_its_measurements(session: Session, settings: Settings) -> None:
    job = train_job(session, settings)
    job.result = None
    settle(session=session, job=job)
    session.commit()
    assert len(cells_of(session, job)) == 2


@pytest.mark.parametrize("params", [{"kind": "train\x00"}, {"config": "a\x00", "stack": "s"}])
def test_a_nul_in_a_filter_is_a_422(client: TestClient, params: dict[str, str]) -> None:
    path = "/api/v1/findings/history" if "config" in params else "/api/v1/findings/matrix"
    assert client.get(path, params=params).status_code == 422


def test_the_matrix_shows_a_job_finished_after_it_was_read(client: TestClient, session: Session,
                                                            settings: Settings) -> None:
    train_job(session, settings)
    before = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()
    train_job(session, settings, parted={(0, 1): 4})
    after = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()
    rate = {c["config"]: (c["identical"], c["comparable"]) for c in after["cells"]}
    assert {c["config"]: c["measurements"] for c in before["cells"]}["default"] == 1
    assert rate["default"] == (1, 2)


def test_the_matrix_is_revalidated_by_etag(client: TestClient, session: Session, settings: Settings) -> None:
    train_job(session, settings)
    first = client.get("/api/v1/findings/matrix", params={"kind": "train"})
    assert first.headers["cache-control"] == "no-cache"
    again = client.get("/api/v1/findings/matrix", params={"kind": "train"},
                       headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_a_source_whose_measurements_are_removed_leaves_the_matrix(client: TestClient, session: Session,
                                                                   settings: Settings) -> None:
    job = train_job(session, settings)
    assert client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()["cells"]
    store(session=session, rows=[], cells=[], sources={f"job {job.id}"})  # removed, nothing added
    session.commit()
    assert client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()["cells"] == []
