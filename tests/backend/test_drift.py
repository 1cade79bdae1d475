"""Drift on real ranks: two gloo DDP runs of the built-in MLP recorded by the train ranks, ingested and
stored on SQLite and PostgreSQL, compared as any two runs: identical runs are at distance exactly 0 at every
step, a run with one flipped bit drifts from its step on, and records without statistics give no chart."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.figures.drift import ROUNDING
from detlab.backend.models import StepRecord
from detlab.core.settings import Settings
from detlab.core.wire import BitFlip, RankSpec, Record
from detlab.core.wire import StepRecord as StepWire
from detlab.worker.launch import launch_ranks
from tests.backend.test_api import AUTH, make_run
from tests.backend.test_api import settings as settings  # noqa: F401  (the fixture, with the ingest token)

STEPS = 5


def ranks(folder: Path, flip: BitFlip | None = None, world_size: int = 2) -> list[Record]:
    spec = RankSpec(kind="train", workload="mlp", world_size=world_size, steps=STEPS, threads=1, device="cpu",
                    inject_bitflip=flip, spool_dir=str(folder))
    got: list[Record] = []
    launch_ranks(spec, folder, env=lambda _rank: dict(os.environ), on_records=got.extend, timeout_s=300)
    return got


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Record]]:
    return {name: ranks(tmp_path_factory.mktemp(name), flip, world) for name, flip, world in
            [("a", None, 2), ("b", None, 2), ("flipped", BitFlip(step=2, tensor="0.weight", rank=1), 2),
             ("wide", None, 4)]}


def ingest(client: TestClient, session: Session, settings: Settings, records: list[Record], world_size: int = 2) -> int:
    run = make_run(session, settings, steps=STEPS, world_size=world_size)
    attempt = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()["attempt"]
    body = {"attempt": attempt, "records": [r.model_dump(mode="json") for r in records]}
    assert client.post(f"/api/v1/ingest/runs/{run.id}/records", json=body, headers=AUTH).status_code == 200
    done = client.post(f"/api/v1/ingest/runs/{run.id}/finish", json={"attempt": attempt, "status": "succeeded"},
                       headers=AUTH)
    assert done.status_code == 200
    return run.id


def test_stats_and_sketches_are_stored_packed_as_the_ranks_recorded_them(
        client: TestClient, session: Session, settings: Settings, recorded: dict[str, list[Record]]) -> None:
    run_id = ingest(client, session, settings, recorded["a"])
    sent = {(r.step, r.rank): r.drift for r in recorded["a"] if isinstance(r, StepWire)}
    rows = session.execute(select(StepRecord.step, StepRecord.rank, StepRecord.drift_version, StepRecord.stats,
                                  StepRecord.sketch).where(StepRecord.run_id == run_id)).all()
    assert len(rows) == len(sent) == 2 * (STEPS + 1)
    for step, rank, version, stats, sk in rows:
        drift = sent[(step, rank)]
        assert drift is not None and (version, bytes(stats).hex(), bytes(sk).hex()) == \
            ("cs1", drift.stats, drift.sketch)


def test_identical_runs_are_at_distance_zero_at_every_step(
        client: TestClient, session: Session, settings: Settings, recorded: dict[str, list[Record]]) -> None:
    a, b = (ingest(client, session, settings, recorded[n]) for n in ("a", "b"))
    result = client.get(f"/api/v1/compare?a={a}&b={b}").json()
    assert result["verdict"] == "identical"
    assert result["drift"]["available"] and result["drift"]["points"] == [[s, 0.0] for s in range(STEPS + 1)]


def test_a_flipped_bit_is_measured_at_rounding_level_on_its_rank(
        client: TestClient, session: Session, settings: Settings, recorded: dict[str, list[Record]]) -> None:
    a, c = (ingest(client, session, settings, recorded[n]) for n in ("a", "flipped"))
    result = client.get(f"/api/v1/compare?a={a}&b={c}").json()
    assert (result["verdict"], result["first_divergent_step"]) == ("diverged", 2)
    drift = result["drift"]
    # One ulp of one element, relative to the whole model: far below one ulp relative; 0 before the flip.
    points = dict(drift["points"])
    assert points[0] == points[1] == 0.0 and 0 < points[2] < 2.0**-23
    assert drift["verdict"].startswith("stays at rounding level")
    assert drift["ranks"]["1"][2][1] == points[2] and drift["ranks"]["0"][2][1] == 0.0  # the flipped rank apart
    # Where the runs' digests agree again (the optimizer rounded the flip away), the distance is exactly 0.
    differing = {row["step"] for row in result["per_step"] if row["tensors_differing"]}
    assert all((v == 0.0) == (s not in differing) for s, v in drift["points"])


def test_another_reduction_order_drifts_and_is_charted_with_the_rounding_level(
        client: TestClient, session: Session, settings: Settings, recorded: dict[str, list[Record]]) -> None:
    a = ingest(client, session, settings, recorded["a"])
    wide = ingest(client, session, settings, recorded["wide"], world_size=4)
    result = client.get(f"/api/v1/compare?a={a}&b={wide}").json()
    assert (result["verdict"], result["mode"]) == ("diverged", "rank-consensus")
    drift = result["drift"]
    first = result["first_divergent_step"]
    assert all(v == 0.0 for s, v in drift["points"] if s < first)
    assert all(v > 0 for s, v in drift["points"] if s >= first)
    assert drift["dtype"] == "float32" and drift["rounding_level"] == 2.0**-23
    figure = client.get(f"/api/v1/compare/drift/figure?a={a}&b={wide}").json()
    line = next(t for t in figure["data"] if t["name"].startswith(ROUNDING))
    assert line["y"] == [2.0**-23, 2.0**-23]
    assert figure["layout"]["yaxis"]["type"] == "log" and drift["verdict"] in figure["layout"]["title"]["text"]


def test_records_without_statistics_give_no_drift_and_say_which_run(
        client: TestClient, session: Session, settings: Settings, recorded: dict[str, list[Record]]) -> None:
    old = [r.model_copy(update={"drift": None}) if isinstance(r, StepWire) else r for r in recorded["b"]]
    a, b = ingest(client, session, settings, recorded["a"]), ingest(client, session, settings, old)
    result = client.get(f"/api/v1/compare?a={a}&b={b}").json()
    assert result["verdict"] == "identical"  # the digests still compare
    assert not result["drift"]["available"] and f"run {b} recorded no parameter statistics" in result["drift"]["reason"]
    figure = client.get(f"/api/v1/compare/drift/figure?a={a}&b={b}").json()
    assert figure["data"] == [] and "No drift estimate" in figure["layout"]["title"]["text"]


def test_a_record_whose_drift_data_holds_a_nan_is_a_422_naming_it_and_stores_nothing(
        client: TestClient, session: Session, settings: Settings) -> None:
    import numpy as np

    from detlab.core import sketch

    run = make_run(session, settings, steps=STEPS)
    attempt = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()["attempt"]
    stats = np.ones((1, sketch.STATS))
    stats[0, 1] = np.nan
    record = {"type": "step", "step": 1, "rank": 0, "fp_version": "fp2", "model_digest": "fp2:" + "0" * 32,
              "digests": "ab" * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01,
              "drift": {"stats": sketch.pack(stats).hex(), "sketch": sketch.pack(np.zeros((1, sketch.K))).hex()}}
    resp = client.post(f"/api/v1/ingest/runs/{run.id}/records", json={"attempt": attempt, "records": [record]},
                       headers=AUTH)
    assert resp.status_code == 422 and "NaN or an infinity" in resp.text and "drift" in resp.text
    assert session.scalar(select(StepRecord.id).where(StepRecord.run_id == run.id)) is None
