"""The pages a team reads at a glance, in Chromium on the shared embedded stack: a recording's own page (streamed
with no token, the embedded default), a diverged job's page in answer-first order, and the jobs list naming the
recording. Each test keeps its screenshots (DETLAB_SCREENSHOT_DIR, else pytest's tmp dir) and fails on any console
error, not only on uncaught exceptions."""

from __future__ import annotations

import os
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
SCRIPT = Path(__file__).resolve().parents[1] / "sdk" / "scripts" / "train.py"


@pytest.fixture
def embedded(shared_embedded: Stack) -> Stack:
    return shared_embedded


def watch(page: Page) -> list[str]:
    """Every console error and uncaught exception of the page, as they come."""
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(f"exception: {exc}"))
    page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    return errors


def test_a_recording_streamed_without_a_token_is_a_first_class_run(embedded: Stack, tmp_path: Path) -> None:
    check_recording_page(embedded, tmp_path)


def test_a_diverged_jobs_page_gives_the_answer_first(embedded: Stack, tmp_path: Path) -> None:
    check_job_page(embedded, tmp_path)


def check_recording_page(embedded: Stack, tmp_path: Path) -> None:
    """A run of tests/sdk/scripts/train.py streamed to `embedded` (auth none: no token), on the jobs list and its
    own page. Shared with tests/e2e/test_distributed.py."""
    env = {k: v for k, v in os.environ.items() if k not in ("DETLAB_TOKEN", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["DETLAB_SPOOL_DIR"] = str(tmp_path / "spool")
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "rec"), "--server", embedded.url,
                           "--name", "llama-sft-nightly", "--tags", "nightly", "sdk-demo", "--steps", "5"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    [job] = [j for j in httpx.get(f"{embedded.url}/api/v1/jobs", params={"kind": "recording", "limit": 100},
                                  timeout=30).json()["items"] if j["name"] == "llama-sft-nightly"]
    [run] = embedded.wait_job(job["id"])["runs"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors = watch(page)
        page.goto(f"{embedded.url}/jobs?kind=recording")
        row = page.locator("#jobs-list tbody tr", has_text="llama-sft-nightly")
        expect(row).to_contain_text("nightly")
        expect(row).to_contain_text("sdk-demo")
        row.get_by_role("link", name="llama-sft-nightly").click()
        page.wait_for_url(f"**/jobs/{job['id']}")
        facts = page.locator("#recording-facts")
        expect(facts).to_contain_text("llama-sft-nightly")
        facts_text = dict(page.eval_on_selector_all(
            "#recording-facts > div", "els => els.map(e => [...e.children].map(c => c.textContent))"))
        assert facts_text["Steps recorded"] == "5" and facts_text["Ranks"] == "1"
        assert facts_text["Status"] == "succeeded" and facts_text["Tags"] == "nightly, sdk-demo"
        loss = page.wait_for_function("""() => {
            const data = document.getElementById('recording-loss').data || [];
            return data.length ? data[0].x : null; }""", timeout=30_000).json_value()
        assert list(loss) == [0, 1, 2, 3, 4]
        expect(page.locator("#recording-env")).to_contain_text("torch")
        expect(page.locator("#rerun-job")).to_be_hidden()
        expect(page.locator("body")).not_to_contain_text("cannot show")
        page.screenshot(path=str(screenshot_dir(tmp_path) / "recording.png"), full_page=True)
        page.locator("#recording-compare").click()
        page.wait_for_url(f"**/compare?a={run['id']}")
        assert errors == []
        browser.close()


def check_job_page(embedded: Stack, tmp_path: Path) -> None:
    """A diverged job's page in answer-first order. Shared with tests/e2e/test_distributed.py."""
    job = embedded.submit({"workload": "mlp", "steps": 3, "world_size": 1,
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "seed1", "seed": 1}]})
    embedded.wait_job(job["id"])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors = watch(page)
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        # the count adds up: 3 steps, and step 0 holds the weights before training
        expect(page.locator("#verdict-banner")).to_contain_text("of the 4 compared (3 steps and the initial weights)",
                                                                timeout=60_000)
        expect(page.locator("#why li.why-item").first).to_be_visible(timeout=60_000)
        page.wait_for_function("() => (document.getElementById('divergence-map').data || []).length > 0",
                               timeout=30_000)
        page.wait_for_function("() => (document.getElementById('throughput-chart').layout || {}).title",
                               timeout=30_000)
        # verdict, first-divergence chart, where they differ, then why: top to bottom
        tops = [page.locator(s).bounding_box()["y"] for s in  # type: ignore[index]
                ("#verdict-banner", "#chart", "#divergence-map", "#why-block")]
        assert tops == sorted(tops), tops
        # the checklist: one line per item, the failing ones open
        items = page.eval_on_selector_all("#why li.why-item", "els => els.map(e => [e.dataset.status, "
                                                             "e.querySelector('details').open])")
        assert items and all(opened == (status == "fail") for status, opened in items), items
        # one rank: no colour bar that would mean nothing; the throughput title is not cut
        assert page.evaluate("document.getElementById('divergence-map').data[0].showscale") is False
        title = page.evaluate("document.getElementById('throughput-chart').layout.title.text")
        assert title.startswith("Throughput<br>")
        page.screenshot(path=str(screenshot_dir(tmp_path) / "job.png"), full_page=True)
        assert errors == []
        browser.close()


def test_findings_are_a_heatmap_with_cost_trends_links_and_how_to_measure(own_embedded: Stack,
                                                                          tmp_path: Path) -> None:
    # A server of its own: the other tests' settled jobs would be findings too.
    embedded = own_embedded
    result = ROOT / "results" / "2026-11-29-h200-nccl" / "sweep-4xH200.json"
    subprocess.run([sys.executable, "-m", "detlab.cli", "import-results", str(result)], env=embedded.env, cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    # one repeat of A against B: no reproducibility rate, but an A-vs-B verdict
    pair = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 1,
                            "configs": [{"preset": "default"}, {"preset": "default", "name": "seed1", "seed": 1}]})
    embedded.wait_job(pair["id"])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = watch(page)
        page.goto(f"{embedded.url}/findings?kind=collective&op=all_reduce_sum&dtype=float32")
        rows = page.locator("#matrix tbody tr")
        expect(rows).to_have_count(4)  # the sweep's four configs, on one stack
        expect(page.locator("#matrix thead")).to_contain_text("4 x NVIDIA H200 · NCCL 2.28.9")
        ring = page.locator("#matrix tbody tr", has_text="algo-Ring.proto-Simple").locator("td.matrix-cell")
        expect(ring).to_contain_text("100%")
        expect(ring).to_contain_text("5/5")
        # coloured by reproducibility (green at 100 %), the cost on hover, a sparkline of the trend
        assert ring.evaluate("td => getComputedStyle(td).backgroundColor") != "rgba(0, 0, 0, 0)"
        assert "cost:" in (ring.get_attribute("title") or "")
        expect(ring.locator("svg.sparkline")).to_have_count(1)
        page.screenshot(path=str(screenshot_dir(tmp_path) / "findings.png"), full_page=True)
        page.select_option("#colour-by", "cost")
        expect(ring.locator(".cell-main")).not_to_have_text("100%")
        ring.click()
        expect(page.locator("#history tbody tr")).to_have_count(1)
        expect(page.locator("#history")).to_contain_text("2026-11-29-h200-nccl/sweep-4xH200.json")
        # the single-repeat job: its A-vs-B verdict, a link to it, and how to measure its reproducibility
        page.select_option("#what", label="train · mlp")
        cell = page.locator("#matrix td.matrix-cell").first
        expect(cell.locator(".pair-verdict")).to_contain_text("A vs B (one repeat each): diverged")
        expect(cell.get_by_role("link", name=f"job #{pair['id']}")).to_have_attribute("href", f"/jobs/{pair['id']}")
        expect(cell).to_contain_text("repeats >= 2")
        # the prescriptions section waits for the field (its absence is no error)
        expect(page.locator("#prescriptions-card")).to_be_hidden()
        page.screenshot(path=str(screenshot_dir(tmp_path) / "findings-pair.png"), full_page=True)
        assert errors == []
        browser.close()
