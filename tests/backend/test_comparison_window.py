"""A long comparison is served thinned (bounded bytes, no difference hidden), a step window in full from
the rows on demand, and a finished job's responses are cached, gzipped and revalidated by ETag."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session

from detlab.backend.models import RUNNING, SUCCEEDED, StepRecord
from detlab.backend.reports import train as train_report
from detlab.backend.services.settle import settle
from detlab.core import steps
from detlab.core.settings import Settings
from tests.backend.test_findings_matrix import train_job

STEPS = 300
POINTS = 50


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture(autouse=True)
def few_points(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(steps, "MAX_POINTS", POINTS)  # 300 steps stand for 100k


def long_job(session: Session, settings: Settings) -> int:
    """Config B's first run parts from A at step 150 (tensor t1); repeats of A are identical."""
    return train_job(session, settings, parted={(1, 0): 150}, steps=STEPS).id


def test_a_long_comparison_is_stored_and_served_thinned(client: TestClient, session: Session,
                                                       settings: Settings) -> None:
    cmp = client.get(f"/api/v1/jobs/{long_job(session, settings)}/comparison").json()
    assert cmp["verdict"] == "diverged" and cmp["first_divergent_step"] == 150
    assert cmp["steps_compared"] == STEPS + 1 and cmp["steps_differing"] == STEPS - 149
    assert len(cmp["per_step"]) <= POINTS and len(cmp["loss"]["a"]) <= POINTS
    assert cmp["downsampled"] == {"steps": STEPS + 1, "points": POINTS, "steps_per_point": 7}
    # Every differing step is counted in its bucket; none before the divergence.
    assert sum(b["steps_differing"] for b in cmp["per_step"]) == STEPS - 149
    assert all(b["tensors_differing"] == 0 for b in cmp["per_step"] if b["to_step"] < 150)


def test_a_step_window_comes_in_full_from_the_rows(client: TestClient, session: Session, settings: Settings) -> None:
    job_id = long_job(session, settings)
    window = client.get(f"/api/v1/jobs/{job_id}/comparison", params={"from_step": 140, "to_step": 169}).json()
    assert [r["step"] for r in window["per_step"]] == list(range(140, 170))
    assert [r["tensors_differing"] for r in window["per_step"]] == [0] * 10 + [1] * 20
    assert window["window"] == {"from_step": 140, "to_step": 169} and window["downsampled"] is None
    assert window["first_divergent_step"] == 150  # the verdict stays the whole run's
    assert [s for s, _ in window["loss"]["a"]] == list(range(140, 170))


def test_a_window_longer_than_the_points_is_thinned_again(client: TestClient, session: Session,
                                                          settings: Settings) -> None:
    window = client.get(f"/api/v1/jobs/{long_job(session, settings)}/comparison",
                        params={"from_step": 0, "to_step": 199}).json()
    assert len(window["per_step"]) <= POINTS and window["downsampled"]["steps"] == 200


def test_a_window_backwards_is_a_422(client: TestClient, session: Session, settings: Settings) -> None:
    resp = client.get(f"/api/v1/jobs/{long_job(session, settings)}/comparison", params={"from_step": 9, "to_step": 3})
    assert resp.status_code == 422 and "before from_step" in resp.json()["detail"]


def test_the_figure_of_a_window_shows_those_steps(client: TestClient, session: Session, settings: Settings) -> None:
    job_id = long_job(session, settings)
    whole = client.get(f"/api/v1/jobs/{job_id}/comparison/figure").json()
    window = client.get(f"/api/v1/jobs/{job_id}/comparison/figure", params={"from_step": 145, "to_step": 154}).json()
    assert len(whole["data"][0]["x"]) <= POINTS and "zoom in for every step" in whole["layout"]["title"]["text"]
    assert window["data"][0]["x"] == list(range(145, 155))
    assert "steps 145-154" in window["layout"]["title"]["text"]


def test_an_old_full_stored_result_is_thinned_once_on_read(client: TestClient, session: Session,
                                                           settings: Settings) -> None:
    from detlab.backend.models import Job

    job_id = long_job(session, settings)
    job = session.get(Job, job_id)
    assert job is not None
    job.result = {**train_report.build(session=session, job=job), "downsampled": None}  # as stored before
    session.commit()
    assert len(client.get(f"/api/v1/jobs/{job_id}/comparison").json()["per_step"]) <= POINTS
    session.refresh(job)
    assert len((job.result or {})["per_step"]) <= POINTS


def test_a_finished_jobs_comparison_is_gzipped_and_revalidated_by_etag(client: TestClient, session: Session,
                                                                      settings: Settings) -> None:
    url = f"/api/v1/jobs/{long_job(session, settings)}/comparison/figure"
    first = client.get(url, headers={"Accept-Encoding": "gzip"})
    assert first.headers["content-encoding"] == "gzip" and first.headers["cache-control"] == "no-cache"
    assert int(first.headers["content-length"]) < len(first.content)  # httpx unzipped what came compressed
    again = client.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304 and again.content == b""
    plain = client.get(url, headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers and plain.json() == first.json()
    assert gzip.decompress(gzip.compress(plain.content)) == plain.content


def test_a_job_finished_again_is_not_answered_from_its_first_result(client: TestClient, session: Session,
                                                                     settings: Settings) -> None:
    job = train_job(session, settings, parted={(1, 0): 150}, steps=STEPS)
    url = f"/api/v1/jobs/{job.id}/comparison"
    assert client.get(url).json()["verdict"] == "diverged"  # and cached
    [run] = [r for r in job.runs if (r.config_index, r.repeat) == (1, 0)]
    run.status = RUNNING  # re-dispatched: the job reopens
    settle(session=session, job=job)
    session.commit()
    assert (job.status, job.finished_at, job.result) == (RUNNING, None, None)
    same = bytes(32)  # recorded again, this time equal to config A's
    session.execute(update(StepRecord).where(StepRecord.run_id == run.id).values(
        digests=same, model_digest=f"fp1:{hashlib.md5(same).hexdigest()}"))
    run.status = SUCCEEDED
    settle(session=session, job=job)
    session.commit()
    assert client.get(url).json()["verdict"] == "identical"
