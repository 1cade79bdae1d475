"""The jobs list (filters, search, sort, paging, verdicts of every kind), tags, and rerunning a job."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import delete, event, select, text
from sqlalchemy.orm import Session

from detlab.backend.kinds.base import REPORTS, ReportName
from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import FAILED, RUNNING, SUCCEEDED, Job, JobTag, utcnow
from detlab.backend.services.jobs import create_job, set_tags
from detlab.core.settings import Settings
from tests.backend.test_api import AUTH, TOKEN, TWO_CONFIGS, finish_collective_job, record_steps

pytestmark = pytest.mark.both_databases  # the store itself: SQLite (embedded) and PostgreSQL


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=5, max_attempts=2)


def add_job(session: Session, settings: Settings, *, tags: tuple[str, ...] = (), submitter: str | None = None,
            status: str | None = None, verdict: str | None = None, age_h: float = 0, **body: Any) -> Job:
    data = {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 2, "steps": 3,
            "tags": list(tags), **body}
    job = create_job(session=session, data=JobCreate.model_validate(data), settings=settings, submitter=submitter)
    job.status = status or job.status
    job.verdict = verdict
    job.created_at = utcnow() - timedelta(hours=age_h)
    session.commit()
    return job


def ids(client: TestClient, query: str = "") -> list[int]:
    resp = client.get(f"/api/v1/jobs?{query}")
    assert resp.status_code == 200, resp.text
    return [item["id"] for item in resp.json()["items"]]


@pytest.fixture
def jobs(session: Session, settings: Settings) -> dict[str, Job]:
    """Five jobs of different kinds, workloads, configs, users, tags, states and ages (oldest first)."""
    return {
        "mlp": add_job(session, settings, tags=("h200", "paper"), submitter="ana", status=SUCCEEDED,
                       verdict="identical", age_h=50, configs=TWO_CONFIGS),
        "lm": add_job(session, settings, workload="tiny-lm", tags=("h200",), submitter="bo", status=SUCCEEDED,
                      verdict="diverged", age_h=30, configs=[{"preset": "default"}, {"preset": "full-deterministic"}]),
        "coll": add_job(session, settings, kind="collective", workload=None, steps=None, tags=("nccl",),
                        submitter="ana", status=FAILED, verdict="not-reproducible", age_h=20,
                        configs=[{"preset": "nccl-ring-simple"}]),
        "sweep": add_job(session, settings, kind="sweep", workload=None, steps=None, status=RUNNING, age_h=10,
                         sweep={"knobs": {"NCCL_PROTO": ["LL", "Simple"]}}),
        "new": add_job(session, settings, tags=("paper",), submitter="bo"),
    }


def test_the_list_is_newest_first_with_the_total(client: TestClient, jobs: dict[str, Job]) -> None:
    page = client.get("/api/v1/jobs?limit=2").json()
    assert page["total"] == 5 and (page["limit"], page["offset"]) == (2, 0)
    assert [i["id"] for i in page["items"]] == [jobs["new"].id, jobs["sweep"].id]
    assert ids(client, "limit=2&offset=4") == [jobs["mlp"].id]
    assert ids(client, "offset=5") == []


@pytest.mark.parametrize("query, expected", [
    ("workload=tiny-lm", ["lm"]),
    ("config=full-deterministic", ["lm"]),
    ("config=default", ["new", "lm", "mlp"]),
    ("kind=collective&kind=sweep", ["sweep", "coll"]),
    ("status=succeeded", ["lm", "mlp"]),
    ("verdict=diverged&verdict=identical", ["lm", "mlp"]),
    ("verdict=none", ["new", "sweep"]),
    ("tag=h200", ["lm", "mlp"]),
    ("tag=h200&tag=paper", ["mlp"]),
    ("submitter=ana", ["coll", "mlp"]),
    ("q=LM", ["lm"]),  # the workload, any case
    ("q=ring", ["coll"]),  # a config name
    ("q=pap", ["new", "mlp"]),  # a tag
    ("q=100%25", []),  # % is a character, not a wildcard
    ("status=succeeded&submitter=bo", ["lm"]),
])
def test_filters_and_search(client: TestClient, jobs: dict[str, Job], query: str, expected: list[str]) -> None:
    assert ids(client, query) == [jobs[name].id for name in expected]
    assert client.get(f"/api/v1/jobs?{query}").json()["total"] == len(expected)


def test_search_finds_a_job_by_its_number(client: TestClient, jobs: dict[str, Job]) -> None:
    assert ids(client, f"q=%23{jobs['coll'].id}") == [jobs["coll"].id]


def test_a_date_range_takes_offsets_and_dates(client: TestClient, jobs: dict[str, Job]) -> None:
    after = (utcnow() - timedelta(hours=25)).astimezone().replace(microsecond=0).isoformat()
    before = (utcnow() - timedelta(hours=5)).replace(microsecond=0, tzinfo=None).isoformat()  # naive: UTC
    query = f"created_after={after.replace('+', '%2B')}&created_before={before}"
    assert ids(client, query) == [jobs["sweep"].id, jobs["coll"].id]
    assert ids(client, f"created_before={utcnow().date() - timedelta(days=30)}") == []


@pytest.mark.parametrize("sort, expected", [
    ("sort=created&order=asc", ["mlp", "lm", "coll", "sweep", "new"]),
    ("sort=workload&order=asc", ["coll", "sweep", "mlp", "new", "lm"]),  # collective, collective, mlp, mlp, tiny-lm
    ("sort=status&order=desc", ["lm", "mlp", "sweep", "new", "coll"]),
    ("sort=kind&order=asc", ["coll", "sweep", "mlp", "lm", "new"]),
])
def test_sorts_break_ties_on_the_id(client: TestClient, jobs: dict[str, Job], sort: str, expected: list[str]) -> None:
    assert ids(client, sort) == [jobs[name].id for name in expected]


def test_pages_of_a_sort_neither_repeat_nor_skip(client: TestClient, jobs: dict[str, Job]) -> None:
    for sort in ("status", "verdict", "workload"):
        pages = [ids(client, f"sort={sort}&limit=2&offset={o}") for o in (0, 2, 4)]
        assert sorted(sum(pages, [])) == sorted(j.id for j in jobs.values())


@pytest.mark.parametrize("query", ["sort=params", "sort=result", "order=up", "limit=201", "limit=0", "offset=-1",
                                   "status=done", "kind=nonsense", "verdict=maybe", "tag=no%20spaces", "stauts=queued",
                                   "created_after=yesterday", f"q={'x' * 65}"])
def test_a_bad_query_is_a_422(client: TestClient, query: str) -> None:
    assert client.get(f"/api/v1/jobs?{query}").status_code == 422


def test_list_rows_carry_configs_world_sizes_tags_and_user(client: TestClient, session: Session,
                                                         settings: Settings) -> None:
    job = add_job(session, settings, tags=("a", "b"), submitter="ana",
                  configs=[{"preset": "default"}, {"preset": "default", "name": "four", "world_size": 4}])
    [item] = client.get("/api/v1/jobs").json()["items"]
    assert item["id"] == job.id
    assert (item["config_names"], item["world_sizes"]) == (["default", "four"], [2, 4])
    assert (item["tags"], item["submitter"], item["queue"]) == (["a", "b"], "ana", "default")


def count_queries(session: Session) -> list[str]:
    statements: list[str] = []
    event.listen(session.get_bind(), "before_cursor_execute",
                 lambda _c, _cur, statement, *_: statements.append(statement))
    return statements


def test_the_list_takes_the_same_few_queries_for_any_page_size(client: TestClient, session: Session,
                                                              settings: Settings) -> None:
    for i in range(30):
        add_job(session, settings, configs=TWO_CONFIGS, tags=(f"t{i}",), verdict="identical")
    statements = count_queries(session)
    client.get("/api/v1/jobs?limit=2")
    small = len(statements)
    statements.clear()
    page = client.get("/api/v1/jobs?limit=30").json()
    assert len(page["items"]) == 30 and len(statements) == small <= 3
    assert not any("result" in s.split("FROM")[0] for s in statements if "FROM jobs" in s)  # results stay unread


def test_every_kind_has_its_verdict_in_the_list(client: TestClient, session: Session, settings: Settings) -> None:
    collective = finish_collective_job(client, session, settings)  # the two configs' outputs differ
    single = add_job(session, settings, repeats=2)
    for run in single.runs:
        record_steps(client, run)
    verdicts = {i["id"]: i["verdict"] for i in client.get("/api/v1/jobs").json()["items"]}
    assert verdicts == {collective.id: "reproducible", single.id: "reproducible"}
    assert ids(client, "verdict=reproducible") == [single.id, collective.id]


@pytest.mark.parametrize("report, result, verdict", [
    ("train", {"verdict": "diverged"}, "diverged"),
    ("train", {"verdict": None, "reproducibility": [{"comparable": 1, "identical_to_first": 0}]}, "not-reproducible"),
    ("train", {"verdict": None, "reproducibility": [{"comparable": 0, "identical_to_first": 0}]}, None),
    ("collective", {"cells": [{"reproducible": True}, {"reproducible": False}]}, "not-reproducible"),
    ("collective", {"cells": [{"reproducible": True}]}, "reproducible"),
    ("collective", {"cells": []}, None),
])
def test_list_verdict_of_a_result(report: ReportName, result: dict, verdict: str | None) -> None:
    assert REPORTS[report].verdict(result) == verdict


# ---- tags ---------------------------------------------------------------------------------------

def test_tags_are_kept_in_order_without_repeats(client: TestClient) -> None:
    body = {"workload": "mlp", "configs": [{}], "tags": ["h200", "nccl-2.28", "h200", "run:3"]}
    job = client.post("/api/v1/jobs", json=body).json()
    assert job["tags"] == ["h200", "nccl-2.28", "run:3"]


@pytest.mark.parametrize("tags, fragment", [
    (["has space"], "pattern"),
    (["-leading"], "pattern"),
    (["<b>"], "pattern"),
    (["x" * 33], "at most 32 characters"),
    ([""], "at least 1 character"),
    ([f"t{i}" for i in range(17)], "at most 16 items"),
    ("h200", "valid list"),
])
def test_bad_tags_are_a_clear_422(client: TestClient, tags: Any, fragment: str) -> None:
    resp = client.post("/api/v1/jobs", json={"workload": "mlp", "configs": [{}], "tags": tags})
    assert resp.status_code == 422 and fragment in str(resp.json()["detail"])
    assert client.patch("/api/v1/jobs/1", json={"tags": tags}).status_code == 422


def test_tags_can_be_replaced_after_submission(client: TestClient, session: Session, settings: Settings) -> None:
    job = add_job(session, settings, tags=("old", "keep"))
    resp = client.patch(f"/api/v1/jobs/{job.id}", json={"tags": ["keep", "new"]})
    assert resp.status_code == 200 and resp.json()["tags"] == ["keep", "new"]
    assert ids(client, "tag=new") == [job.id] and ids(client, "tag=old") == []
    rows = session.execute(select(JobTag.tag).where(JobTag.job_id == job.id).order_by(JobTag.tag)).scalars().all()
    assert rows == ["keep", "new"]
    assert client.patch(f"/api/v1/jobs/{job.id}", json={"tags": []}).json()["tags"] == []
    assert client.patch(f"/api/v1/jobs/{job.id}", json={"status": "succeeded", "tags": []}).status_code == 422
    assert client.patch("/api/v1/jobs/999999", json={"tags": []}).status_code == 404


def test_a_jobs_tags_go_with_it(session: Session, settings: Settings) -> None:
    job = add_job(session, settings, tags=("a",))
    set_tags(session=session, job=job, tags=["b", "c"])
    session.commit()
    assert session.scalar(text("SELECT count(*) FROM job_tags")) == 2
    session.execute(delete(Job).where(Job.id == job.id))
    session.commit()
    assert session.scalar(text("SELECT count(*) FROM job_tags")) == 0


# ---- rerun --------------------------------------------------------------------------------------

def test_the_spec_of_a_job_submits_the_same_job(client: TestClient) -> None:
    body = {"workload": "mlp", "steps": 4, "world_size": 2, "repeats": 2, "tags": ["x"],
            "configs": [{"preset": "default"}, {"preset": "full-deterministic", "world_size": 4}]}
    first = client.post("/api/v1/jobs", json=body).json()
    spec = client.get(f"/api/v1/jobs/{first['id']}/spec").json()
    assert (spec["workload"], spec["steps"], spec["world_size"], spec["repeats"], spec["tags"]) == ("mlp", 4, 2, 2,
                                                                                                  ["x"])
    assert [c["name"] for c in spec["configs"]] == ["default", "full-deterministic"]
    assert spec["configs"][1]["world_size"] == 4
    again = client.post("/api/v1/jobs", json=spec).json()
    assert [c["hash"] for c in again["configs"]] == [c["hash"] for c in first["configs"]]


def test_rerun_submits_a_new_job_like_the_old(client: TestClient) -> None:
    body = {"kind": "collective", "world_size": 2, "tags": ["nightly"], "configs": [{"preset": "nccl-ring-simple"}],
            "collective": {"ops": ["all_gather"], "min_bytes": 4096, "max_bytes": 16384, "trials": 3}}
    first = client.post("/api/v1/jobs", json=body).json()
    resp = client.post(f"/api/v1/jobs/{first['id']}/rerun")
    assert resp.status_code in (201, 202), resp.text
    again = resp.json()
    assert again["id"] != first["id"] and again["tags"] == ["nightly"]
    assert again["params"]["collective"] == first["params"]["collective"]
    assert [c["hash"] for c in again["configs"]] == [c["hash"] for c in first["configs"]]
    assert client.post("/api/v1/jobs/999999/rerun").status_code == 404


def test_a_sweeps_spec_has_its_base_config_and_knobs(client: TestClient) -> None:
    base = {"preset": "nccl-tree-simple-1ch", "name": "mine"}
    body = {"kind": "sweep", "world_size": 2, "configs": [base],
            "sweep": {"over": "collective", "knobs": {"NCCL_PROTO": ["LL", None]}}}
    job = client.post("/api/v1/jobs", json=body).json()
    assert len(job["configs"]) == 2
    spec = client.get(f"/api/v1/jobs/{job['id']}/spec").json()
    assert spec["sweep"] == body["sweep"] and len(spec["configs"]) == 1
    assert spec["configs"][0]["name"] == "mine" and spec["configs"][0]["env"]["NCCL_PROTO"] == "Simple"
    again = client.post("/api/v1/jobs", json=spec).json()
    assert [c["hash"] for c in again["configs"]] == [c["hash"] for c in job["configs"]]


# ---- the divergence heatmap's data --------------------------------------------------------------

def test_a_diverged_comparison_maps_its_differing_tensors_steps_and_ranks(client: TestClient, session: Session,
                                                                         settings: Settings) -> None:
    job = add_job(session, settings, configs=TWO_CONFIGS)
    tensors = {"type": "tensors", "tensors": [{"index": i, "name": n, "shape": [2], "dtype": "float32"}
                                              for i, n in enumerate(("w", "b"))]}
    for run in job.runs:
        spec = client.post(f"/api/v1/ingest/runs/{run.id}/claim", json={"worker": "w"}, headers=AUTH).json()
        records: list[dict[str, Any]] = [tensors]
        for step in range(4):
            for rank in range(2):
                differs = run.config_index == 1 and step >= 2 and rank == 1  # B's rank 1 parts at step 2 in w
                records.append({"type": "step", "step": step, "rank": rank, "fp_version": "fp1",
                                "model_digest": "fp1:" + ("1" if differs else "0") * 32,
                                "digests": ("cd" if differs else "ab") * 16 + "ab" * 16, "loss_bits": "3f800000",
                                "loss": 1.0, "step_time_s": 0.01})
        batch = {"attempt": spec["attempt"], "records": records}
        assert client.post(f"/api/v1/ingest/runs/{run.id}/records", json=batch, headers=AUTH).status_code == 200
        done = {"attempt": spec["attempt"], "status": "succeeded"}
        assert client.post(f"/api/v1/ingest/runs/{run.id}/finish", json=done, headers=AUTH).status_code == 200
    cmp = client.get(f"/api/v1/jobs/{job.id}/comparison").json()
    assert cmp["verdict"] == "diverged"
    found = cmp["divergence_map"]
    assert (found["steps"], found["rank_sets"], found["cells"]) == ([2, 3], [[1]], [[2, 0, 0], [3, 0, 0]])
    assert found["tensors"] == ["w"] and found["truncated"] is False and found["mode"] == "per-rank"
    figure = client.get(f"/api/v1/jobs/{job.id}/comparison/divergence/figure").json()
    [heatmap] = figure["data"]
    assert heatmap["type"] == "heatmap" and heatmap["y"] == ["w"] and heatmap["text"][0] == ["rank 1", "rank 1"]
