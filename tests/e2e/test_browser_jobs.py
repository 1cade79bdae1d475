"""A user in Chromium: the jobs list (search, filters, sort, pages), tags, rerun, per-config world sizes, the
tensor × step map of a divergence, and the navigation every page shares."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.conftest import ROOT
from tests.e2e.conftest import Stack
from tests.e2e.test_browser import ARGS, CHROMIUM, screenshot_dir

pytestmark = pytest.mark.browser

NOBODY = {"queue": "nobody"}  # no worker: the job stays queued, which is all a list test needs


@pytest.fixture
def embedded(shared_embedded: Stack) -> Stack:
    """These tests look only at jobs of their own (by id, or by tags no other test here uses): they share one
    `detlab up` (tests/e2e/conftest.py). The list tests, which count every job, take `own_embedded`."""
    return shared_embedded


def cancel(stack: Stack, job_id: int) -> None:
    """Stop a job the test no longer needs, so that its ranks do not run on in the shared stack's worker (409:
    it finished already)."""
    resp = httpx.post(f"{stack.url}/api/v1/jobs/{job_id}/cancel", timeout=30)
    assert resp.status_code in (200, 409), resp.text


def new_page(pw, errors: list[str]) -> tuple:  # type: ignore[no-untyped-def]
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    return browser, page


def listed(page: Page) -> list[int]:
    return [int(t.lstrip("#")) for t in page.locator("#jobs-list tbody tr td:first-child a").all_inner_texts()]


def test_the_jobs_page_searches_filters_sorts_and_pages(own_embedded: Stack, tmp_path: Path) -> None:
    embedded = own_embedded
    mlp = [embedded.submit({"workload": "mlp", "steps": 2, "configs": [{"preset": "default"}], "tags": tags,
                            **NOBODY})["id"] for tags in (["h200", "paper"], ["h200"], [])]
    lm = embedded.submit({"workload": "tiny-lm", "steps": 2, "tags": ["paper"], **NOBODY,
                          "configs": [{"preset": "default"}, {"preset": "full-deterministic", "world_size": 2}]})["id"]
    coll = embedded.submit({"kind": "collective", "world_size": 2, "configs": [{"preset": "default"}],
                            "collective": {"min_bytes": 4096, "max_bytes": 4096, "trials": 2, "warmup": 0}})["id"]
    embedded.wait_job(coll)
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/jobs")
        expect(page.locator("#page-info")).to_have_text("1–5 of 5 jobs")
        assert listed(page) == [coll, lm, *reversed(mlp)]
        # Every kind shows its verdict: the collective job's comes from its stored result.
        expect(page.locator("#jobs-list tbody tr").first).to_contain_text("reproducible")
        expect(page.locator("#jobs-list tbody tr").nth(1)).to_contain_text("pending")
        # @W labels where a job's configs run on different world sizes.
        expect(page.locator("#jobs-list tbody tr").nth(1)).to_contain_text("default @W1 vs full-deterministic @W2")

        page.fill("#q", "tiny")
        expect(page.locator("#page-info")).to_have_text("1–1 of 1 job")
        assert listed(page) == [lm]
        page.fill("#q", "")
        page.select_option("#f-kind", "train")
        page.select_option("#f-workload", "mlp")
        expect(page.locator("#page-info")).to_have_text("1–3 of 3 jobs")
        page.locator("#jobs-list button.tag", has_text="h200").first.click()  # a tag chip filters
        expect(page.locator("#page-info")).to_have_text("1–2 of 2 jobs")
        assert listed(page) == [mlp[1], mlp[0]]
        assert re.search(r"tag=h200", page.url) and "workload=mlp" in page.url

        page.reload()  # the address keeps the filters
        expect(page.locator("#page-info")).to_have_text("1–2 of 2 jobs")
        expect(page.locator("#f-tag")).to_have_value("h200")
        page.click("#jobs-list th[data-sort=created] button")  # newest first -> oldest first
        expect(page.locator("#jobs-list th[data-sort=created]")).to_have_attribute("aria-sort", "ascending")
        expect(page.locator("#jobs-list tbody tr td:first-child a").first).to_have_text(f"#{mlp[0]}")

        page.click("#clear-filters")
        expect(page.locator("#page-info")).to_have_text("1–5 of 5 jobs")
        page.fill("#f-tag", "has space")
        expect(page.locator("#list-error")).to_contain_text("tag")
        page.fill("#f-tag", "")
        expect(page.locator("#list-error")).to_be_hidden()
        page.select_option("#f-verdict", "reproducible")
        expect(page.locator("#page-info")).to_have_text("1–1 of 1 job")
        assert listed(page) == [coll]
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "jobs.png"), full_page=True)
        browser.close()


def test_paging_walks_the_whole_list_once(own_embedded: Stack) -> None:
    embedded = own_embedded
    ids = [embedded.submit({"workload": "mlp", "steps": 2, "configs": [{}], **NOBODY})["id"] for _ in range(5)]
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        seen: list[int] = []
        page.goto(f"{embedded.url}/jobs?limit=2")
        expect(page.locator("#prev-page")).to_be_disabled()
        for expected in ("1–2 of 5 jobs", "3–4 of 5 jobs", "5–5 of 5 jobs"):
            expect(page.locator("#page-info")).to_have_text(expected)
            seen += listed(page)
            if expected.startswith("5"):
                expect(page.locator("#next-page")).to_be_disabled()
            else:
                page.click("#next-page")
        assert seen == sorted(ids, reverse=True)
        assert errors == []
        browser.close()


def test_every_page_has_the_same_navigation(embedded: Stack) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "configs": [{}], **NOBODY})
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        navs = []
        for path, current in (("/", "new job"), ("/jobs", "jobs"), ("/findings", "findings"),
                              (f"/jobs/{job['id']}", "jobs")):
            page.goto(f"{embedded.url}{path}")
            expect(page.locator("#site-nav a[aria-current=page]")).to_have_text(current)
            navs.append(page.locator("#site-nav a").evaluate_all(
                "els => els.map(e => [e.textContent, e.getAttribute('href')])"))
        assert all(nav == navs[0] for nav in navs)  # one navigation, the same everywhere
        assert {("jobs", "/jobs"), ("new job", "/"), ("findings", "/findings")} <= {tuple(link) for link in navs[0]}
        page.goto(embedded.url)
        page.click("#site-nav >> text=jobs")
        page.wait_for_url("**/jobs")
        expect(page.locator("h1")).to_have_text("Jobs")
        assert errors == []
        browser.close()


def test_rerun_opens_the_form_filled_in_and_submits_the_edited_job(embedded: Stack, tmp_path: Path) -> None:
    custom = {"preset": "default", "name": "seed7", "seed": 7, "world_size": 2}
    job = embedded.submit({"workload": "mlp", "steps": 3, "world_size": 1, "repeats": 2, "tags": ["first", "h200"],
                           "configs": [{"preset": "default"}, custom], **NOBODY})
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        page.click("#rerun-job")
        page.wait_for_url(f"**/?rerun={job['id']}")
        expect(page.locator("#rerun-note")).to_contain_text(f"Filled in from job #{job['id']}")
        expect(page.locator("#rerun-note")).to_contain_text("queue nobody")
        expect(page.locator("#workload")).to_have_value("mlp")
        expect(page.locator("#steps")).to_have_value("3")
        expect(page.locator("#world-size")).to_have_value("1")
        expect(page.locator("#repeats")).to_have_value("2")
        expect(page.locator("#tags")).to_have_value("first, h200")
        expect(page.locator("#preset-a")).to_have_value("default")
        expect(page.locator("#edit-a")).not_to_be_checked()  # the preset itself: no JSON to read
        expect(page.locator("#world-a")).to_have_value("")
        expect(page.locator("#edit-b")).to_be_checked()  # seed 7 is no preset: its JSON, editable
        expect(page.locator("#preset-b")).to_have_value("default")  # what JSON without a preset starts from
        assert '"seed": 7' in page.input_value("#config-b")
        expect(page.locator("#world-b")).to_have_value("2")
        page.screenshot(path=str(screenshot_dir(tmp_path) / "rerun-form.png"), full_page=True)
        page.fill("#world-b", "4")
        page.fill("#tags", "second h200")
        page.fill("#steps", "2")
        page.click("#submit")
        page.wait_for_url(re.compile(r".*/jobs/\d+$"))
        new_id = int(page.url.rsplit("/", 1)[1])
        assert new_id != job["id"]
        expect(page.locator("#job-meta")).to_contain_text("A: default @W1 vs B: seed7 @W4")
        expect(page.locator("#job-tags .tag")).to_have_text(["second", "h200"])
        spec = httpx.get(f"{embedded.url}/api/v1/jobs/{new_id}/spec").json()
        assert (spec["steps"], spec["repeats"], spec["queue"]) == (2, 2, "nobody")
        assert spec["configs"][1]["seed"] == 7 and spec["configs"][1]["world_size"] == 4
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "rerun.png"), full_page=True)
        browser.close()


def test_a_config_world_size_from_the_form_labels_the_job(embedded: Stack) -> None:
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(embedded.url)
        page.select_option("#workload", "mlp")
        page.fill("#world-size", "2")
        page.fill("#steps", "2")
        page.select_option("#preset-b", "default")
        page.fill("#world-b", "4")  # no JSON editing
        page.fill("#tags", "bad tag!")
        page.click("#submit")
        expect(page.locator("#error")).to_contain_text('Tag "tag!"')
        page.fill("#tags", "")
        page.click("#submit")
        page.wait_for_url(re.compile(r".*/jobs/\d+$"))
        expect(page.locator("#job-meta")).to_contain_text("A: default @W2 vs B: default @W4")
        expect(page.locator("#job-meta")).to_contain_text("world sizes 2 vs 4")
        assert errors == []
        cancel(embedded, int(page.url.rsplit("/", 1)[1]))
        browser.close()


def test_tags_are_edited_on_the_job_page(embedded: Stack) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "configs": [{}], "tags": ["before-edit"], **NOBODY})
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#job-tags .tag")).to_have_text(["before-edit"])
        page.click("#edit-tags")
        expect(page.locator("#tags-input")).to_have_value("before-edit")
        page.fill("#tags-input", "x" * 33)
        page.click("#tags-form button[type=submit]")
        expect(page.locator("#tags-error")).to_contain_text("at most 32 characters")
        page.fill("#tags-input", "edited, a100")
        page.click("#tags-form button[type=submit]")
        expect(page.locator("#job-tags .tag")).to_have_text(["edited", "a100"])
        expect(page.locator("#tags-form")).to_be_hidden()
        assert httpx.get(f"{embedded.url}/api/v1/jobs?tag=edited").json()["total"] == 1
        page.click("#job-tags >> text=a100")  # a tag leads to the jobs that carry it
        page.wait_for_url("**/jobs?tag=a100")
        expect(page.locator("#page-info")).to_have_text("1–1 of 1 job")
        assert errors == []
        browser.close()


def test_a_cancelled_fix_search_says_where_it_stopped(embedded: Stack) -> None:
    """A fix search cancelled before its base ran: its page says it stopped there, not that it is searching."""
    job = embedded.submit({"kind": "fix", "workload": "scatter", "steps": 2, "repeats": 2,
                           "configs": [{"preset": "default", "threads": 2}], **NOBODY})
    cancel(embedded, job["id"])
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#verdict-banner")).to_contain_text(
            f"The search stopped at trial 0 (the base): run {job['runs'][0]['id']} cancelled")
        expect(page.locator("#fix-verdict")).to_have_text("incomplete")
        expect(page.locator("#fix-not-tried")).to_contain_text("known once the base has run")  # not "all tried"
        assert errors == []
        browser.close()


def test_cli_submit_tags_the_job(embedded: Stack) -> None:
    out = subprocess.run([sys.executable, "-m", "detlab.cli", "submit", "--workload", "mlp", "--config", "default",
                          "--steps", "1", "--tag", "ci", "--tag", "nightly", "--server", embedded.url, "--json"],
                         env=embedded.env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    job = httpx.get(f"{embedded.url}/api/v1/jobs?tag=ci&tag=nightly").json()["items"]
    assert len(job) == 1 and job[0]["tags"] == ["ci", "nightly"]
    cancel(embedded, job[0]["id"])


def test_a_diverged_job_maps_the_differing_tensors_and_ranks(embedded: Stack, tmp_path: Path) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 2,
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "seed1", "seed": 1}]})
    embedded.wait_job(job["id"])
    found = embedded.comparison(job["id"])["divergence_map"]
    assert found["mode"] == "per-rank" and found["steps"][0] == 0 and found["rank_sets"] == [[0, 1]]
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#divergence-map")).to_be_visible(timeout=30_000)
        trace = page.wait_for_function("""() => {
            const data = document.getElementById('divergence-map').data || [];
            return data.length ? {y: data[0].y, text: data[0].text} : null; }""", timeout=30_000).json_value()
        assert trace["y"] == found["tensors"] and "0.weight" in trace["y"]
        assert trace["text"][0][0] == "ranks 0, 1"
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "divergence-map.png"), full_page=True)
        browser.close()


def test_rerun_of_a_sweep_fills_in_its_knobs_collectives_and_base_config(embedded: Stack) -> None:
    job = embedded.submit({"kind": "sweep", "world_size": 2, "configs": [{"preset": "nccl-ring-simple"}], **NOBODY,
                           "collective": {"ops": ["all_gather"], "dtypes": ["bfloat16"], "min_bytes": 4096,
                                          "max_bytes": 65536, "step_factor": 16, "trials": 3, "warmup": 1},
                           "sweep": {"over": "collective", "knobs": {"NCCL_PROTO": ["LL", None]}}})
    with sync_playwright() as pw:
        errors: list[str] = []
        browser, page = new_page(pw, errors)
        page.goto(f"{embedded.url}/?rerun={job['id']}")
        expect(page.locator("#rerun-note")).to_be_visible()
        expect(page.locator("#kind")).to_have_value("sweep")
        expect(page.locator("#sweep-fields")).to_be_visible()
        assert page.eval_on_selector_all("#op-checks input:checked", "els => els.map(e => e.value)") == ["all_gather"]
        assert page.eval_on_selector_all("#dtype-checks input:checked", "els => els.map(e => e.value)") == ["bfloat16"]
        for field, value in (("#min-bytes", "4096"), ("#max-bytes", "65536"), ("#step-factor", "16"),
                             ("#trials", "3"), ("#warmup", "1"), ("#world-size", "2")):
            expect(page.locator(field)).to_have_value(value)
        expect(page.locator("#cell-count")).to_contain_text("2 cells")
        expect(page.locator("#preset-a")).to_have_value("nccl-ring-simple")
        expect(page.locator("#edit-a")).not_to_be_checked()
        page.click("#submit")
        page.wait_for_url(re.compile(r".*/jobs/\d+$"))
        new_id = int(page.url.rsplit("/", 1)[1])
        old, new = (httpx.get(f"{embedded.url}/api/v1/jobs/{i}").json() for i in (job["id"], new_id))
        assert [c["hash"] for c in new["configs"]] == [c["hash"] for c in old["configs"]]
        assert new["params"]["collective"] == old["params"]["collective"]
        assert errors == []
        browser.close()
