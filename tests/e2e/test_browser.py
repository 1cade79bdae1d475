"""A user in Chromium: submits a comparison on the page and finds the divergence marker."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from detlab.core.collective import DTYPES, OPS
from detlab.core.ingest_client import IngestClient
from detlab.core.wire import EnvRecord, StepRecord, TensorInfo, TensorsRecord
from tests.e2e.conftest import Stack

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--headless", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]

pytestmark = pytest.mark.browser


@pytest.fixture
def embedded(shared_embedded: Stack) -> Stack:
    """These tests look only at jobs of their own, by id: they share one `detlab up` (tests/e2e/conftest.py)."""
    return shared_embedded


def screenshot_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("DETLAB_SCREENSHOT_DIR", tmp_path))


def test_the_form_offers_the_servers_ops_and_dtypes(embedded: Stack) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(embedded.url)
        page.select_option("#kind", "collective")
        expect(page.locator("#op-checks input")).to_have_count(len(OPS))
        assert page.eval_on_selector_all("#op-checks input", "els => els.map(e => e.value)") == list(OPS)
        assert page.eval_on_selector_all("#dtype-checks input", "els => els.map(e => e.value)") == list(DTYPES)
        expect(page.locator("#op-all_reduce_sum")).to_be_checked()
        expect(page.locator("#op-all_reduce_sum").locator("..")).to_have_text("all_reduce (sum)")
        browser.close()


def test_submitting_on_the_page_shows_the_divergence_marker(embedded: Stack, tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(embedded.url)
        page.select_option("#workload", "mlp")
        page.fill("#world-size", "2")
        page.fill("#steps", "4")
        page.select_option("#preset-a", "default")
        page.select_option("#preset-b", "default")
        page.check("#edit-b")
        config_b = json.loads(page.input_value("#config-b"))
        page.fill("#config-b", json.dumps({**config_b, "name": "four-ranks", "world_size": 4}))
        page.click("#submit")
        page.wait_for_url("**/jobs/*")
        expect(page.locator("#verdict")).to_have_text("diverged", timeout=180_000)
        expect(page.locator("#first-step")).to_have_text("1")
        expect(page.locator("#divergent-tensors")).to_contain_text("0.weight")
        expect(page.locator("#config-diff")).to_contain_text("world_size")
        expect(page.locator("#environment")).to_contain_text("gloo")
        marker = page.wait_for_function("""() => {
            const traces = (document.getElementById('chart').data || []).filter(t => t.name === 'first divergence');
            return traces.length ? traces[0].x : null; }""", timeout=30_000).json_value()
        assert list(marker) == [1]
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "job.png"), full_page=True)
        browser.close()


def test_a_bad_config_on_the_page_shows_the_error_and_keeps_the_input(embedded: Stack) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(embedded.url)
        page.check("#edit-a")
        bad = json.dumps({"name": "evil", "env": {"LD_PRELOAD": "/tmp/evil.so"}})
        page.fill("#config-a", bad)
        page.click("#submit")
        expect(page.locator("#error")).to_contain_text("LD_PRELOAD is not an allowed variable")
        assert page.input_value("#config-a") == bad
        assert page.url.rstrip("/") == embedded.url
        browser.close()


def test_collective_job_page_shows_cells_charts_and_the_gloo_note(embedded: Stack, tmp_path: Path) -> None:
    job = embedded.submit({"kind": "collective", "world_size": 2, "configs": [{"preset": "default"}],
                           "collective": {"min_bytes": 4096, "max_bytes": 16384, "trials": 2, "warmup": 0}})
    embedded.wait_job(job["id"])
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#collective-verdict")).to_contain_text("2/2", timeout=30_000)
        expect(page.locator("#cells tbody tr")).to_have_count(2)
        expect(page.locator("#logs-note")).to_contain_text("gloo")
        page.wait_for_function("() => (document.getElementById('heatmap').data || []).length > 0")
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "collective.png"), full_page=True)
        browser.close()


def test_the_cancel_button_stops_a_running_job_and_the_page_shows_it_cancelled(embedded: Stack,
                                                                                tmp_path: Path) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 100_000, "world_size": 2, "configs": [{"preset": "default"}]})
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        dialogs: list[str] = []
        page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#job-status")).to_have_text("running", timeout=60_000)
        expect(page.locator("#queue-note")).to_be_hidden()  # the embedded worker is alive
        page.click("#cancel-job")
        expect(page.locator("#job-status")).to_have_text("cancelled", timeout=60_000)
        expect(page.locator("#runs tbody tr").first).to_contain_text("cancelled while running")
        expect(page.locator("#cancel-job")).to_be_hidden()
        assert dialogs == [f"Cancel job #{job['id']}? Its ranks are killed; what they recorded is kept."]
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "cancelled.png"), full_page=True)
        browser.close()


def test_a_job_on_a_queue_without_a_worker_says_so_on_its_page(embedded: Stack, tmp_path: Path) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 1, "configs": [{"preset": "default"}],
                           "queue": "nobody"})
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page()
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        expect(page.locator("#queue-note")).to_contain_text("no worker has ever been seen on queue 'nobody'")
        expect(page.locator("#cancel-job")).to_be_visible()  # queued: it can be cancelled
        page.screenshot(path=str(screenshot_dir(tmp_path) / "no-worker.png"))
        browser.close()


def open_job(pw: Playwright, embedded: Stack, job_id: int,
             ready: str = "#verdict-banner") -> tuple[Browser, Page, list[str]]:
    browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
    page = browser.new_page(viewport={"width": 1280, "height": 1600})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{embedded.url}/jobs/{job_id}")
    expect(page.locator(ready)).to_be_visible(timeout=30_000)
    return browser, page, errors


def banner_facts(page: Page) -> dict[str, str]:
    pairs = page.eval_on_selector_all("#banner-facts > div",
                                      "els => els.map(e => [...e.children].map(c => c.textContent))")
    return dict(pairs)


def test_an_identical_job_has_its_verdict_in_the_header(embedded: Stack) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 3, "world_size": 1,
                           "configs": [{"preset": "default"}, {"preset": "default"}]})
    embedded.wait_job(job["id"])
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, job["id"])
        banner = page.locator("#verdict-banner")
        expect(banner.locator("#banner-verdict")).to_have_text("identical")
        # 3 steps: the weights before training (step 0) and after each of the 3 (a count that adds up)
        expect(banner).to_contain_text("all 3 steps and the initial weights are bit-equal")
        facts = banner_facts(page)
        assert facts["First divergent step"] == "none"
        assert facts["Reproducibility A: default"] == "1 repeat, nothing to compare"
        assert facts["Cost B: default"] == embedded.comparison(job["id"])["throughput"][1]["cost_text"]
        # The banner sits in the header card, above the runs, not in the comparison below them.
        assert page.locator(".card").first.locator("#verdict-banner").count() == 1
        assert errors == []
        browser.close()


def test_a_diverged_job_has_its_verdict_step_and_cost_in_the_header(embedded: Stack, tmp_path: Path) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 3, "world_size": 2,
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "four", "world_size": 4}]})
    embedded.wait_job(job["id"])
    cmp = embedded.comparison(job["id"])
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, job["id"])
        banner = page.locator("#verdict-banner")
        expect(banner.locator("#banner-verdict")).to_have_text("diverged")
        expect(banner).to_contain_text(f"Diverged at step {cmp['first_divergent_step']}")
        facts = banner_facts(page)
        assert facts["First divergent step"] == str(cmp["first_divergent_step"])
        assert facts["Cost B: four @W4"] == cmp["throughput"][1]["cost_text"]
        page.wait_for_function("() => (document.getElementById('chart').data || []).length > 0")
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "job-banner.png"), full_page=True)
        browser.close()


def test_a_job_on_two_world_sizes_labels_each_config_with_its_own(embedded: Stack) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 2,
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "four", "world_size": 4}]})
    embedded.wait_job(job["id"])
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, job["id"], ready="#comparison")
        meta = page.locator("#job-meta")
        expect(meta).to_contain_text("A: default @W2 vs B: four @W4")
        expect(meta).to_contain_text("world sizes 2 vs 4")
        expect(meta).not_to_contain_text("world size 2 ")
        for table in ("#runs", "#throughput", "#reproducibility"):
            expect(page.locator(f"{table} tbody tr").first).to_contain_text("A: default @W2")
            expect(page.locator(f"{table} tbody tr").nth(1)).to_contain_text("B: four @W4")
        expect(page.locator("#config-b-name")).to_have_text("four @W4")
        assert errors == []
        browser.close()


def test_a_single_config_job_shows_the_reproducibility_of_its_repeats(embedded: Stack, tmp_path: Path) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 1, "repeats": 2,
                           "configs": [{"preset": "default"}]})
    embedded.wait_job(job["id"])
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, job["id"])
        expect(page.locator("#banner-verdict")).to_have_text("reproducible")
        expect(page.locator("#verdict-banner")).to_contain_text("1 of 1 comparable repeats identical to the first")
        expect(page.locator("#comparison-title")).to_have_text("Reproducibility")
        expect(page.locator("#pairwise")).to_be_hidden()
        expect(page.locator("#reproducibility tbody tr")).to_have_count(1)
        expect(page.locator("#reproducibility")).to_contain_text("1 of 1")
        expect(page.locator("body")).not_to_contain_text("undefined")
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "single-config.png"), full_page=True)
        browser.close()


def test_a_resume_job_is_exact_and_one_that_loses_the_optimizer_names_it_on_its_page(embedded: Stack) -> None:
    """The resume kind end to end: real rank processes stop after step 2, checkpoint, and fresh ones continue."""
    body = {"kind": "resume", "workload": "mlp", "steps": 4, "stop_at": 2, "world_size": 2,
            "configs": [{"preset": "default"}]}
    exact, lost = embedded.submit(body), embedded.submit({**body, "lose": "optimizer"})
    for job in (exact, lost):
        assert embedded.wait_job(job["id"], timeout=300)["status"] == "succeeded"
    result = httpx.get(f"{embedded.url}/api/v1/jobs/{exact['id']}/resume", timeout=30).json()
    assert (result["verdict"], result["comparison"]["resume"]["exact"]) == ("exact", True), result
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, lost["id"])
        expect(page.locator("#resume-verdict")).to_have_text("lost")
        expect(page.locator("#resume-component")).to_contain_text("optimizer: ")
        expect(page.locator("#resume-step")).to_have_text("2")
        expect(page.locator("#resume-restore")).to_contain_text("differs from the saved state")
        assert errors == []
        browser.close()


# Markup where the data holds names: none of it may become a link, a bold run or an element on a page or a figure.
LINK = '<a href="http://evil.example/">click</a>'
BOLD = "<b>bold</b>"


def feed_as_worker(embedded: Stack, run_id: int, digest: str) -> None:
    """Claim the run with the server's token, as a worker would, and send steps 0-2 of one rank whose tensors and
    host are named with markup; `digest` is tensor 0's from step 1 on, so two runs can part there."""
    token = (Path(embedded.env["DETLAB_DATA_DIR"]) / "ingest-token").read_text().strip()
    ingest = IngestClient(embedded.url, token)
    spec = ingest.claim(run_id, "markup:nobody")
    tensors = TensorsRecord(tensors=[TensorInfo(index=0, name=LINK, shape=[4], dtype="float32"),
                                     TensorInfo(index=1, name=BOLD, shape=[4], dtype="float32")])
    env = EnvRecord(rank=0, host=f"{BOLD}{LINK}", backend="gloo")
    steps = [StepRecord(step=n, rank=0, fp_version="fp2", model_digest=f"fp2:{(digest if n else 'aa') * 16}",
                        digests=(digest if n else "aa") * 16 + "bb" * 16, loss_bits="3f800000", loss=1.0,
                        step_time_s=0.01) for n in range(3)]
    ingest.records(run_id, spec.attempt, [tensors, env, *steps])
    ingest.finish(run_id, spec.attempt, "succeeded")


def test_markup_in_tensor_and_host_names_is_text_on_the_job_page_and_its_figures(embedded: Stack,
                                                                                 tmp_path: Path) -> None:
    # A queue no worker serves: this test is the worker, so the names its records hold are its own.
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 1, "queue": "nobody-markup",
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "other"}]})
    for run, digest in zip(job["runs"], ("aa", "cc"), strict=True):
        feed_as_worker(embedded, run["id"], digest)
    with sync_playwright() as pw:
        browser, page, errors = open_job(pw, embedded, job["id"])
        expect(page.locator("#verdict")).to_have_text("diverged", timeout=60_000)
        expect(page.locator("#divergent-tensors")).to_contain_text(LINK)  # shown as the text it is
        expect(page.locator("#environment")).to_contain_text(f"{BOLD}{LINK}")
        # The divergence heatmap's axis names the tensor that parted, as the text it is.
        ticks = page.wait_for_function("""() => {
            const ticks = [...document.querySelectorAll('#divergence-map .ytick text')].map(t => t.textContent);
            return ticks.length ? ticks : null; }""", timeout=30_000).json_value()
        assert LINK in ticks, ticks
        # Nothing the data said became an element: no link off the site, no bold text, in the page or any SVG.
        assert page.locator('a[href*="evil.example"]').count() == 0
        assert page.locator("svg a, svg b, b").filter(has_text="bold").count() == 0
        assert errors == []
        page.screenshot(path=str(screenshot_dir(tmp_path) / "markup.png"), full_page=True)
        browser.close()
