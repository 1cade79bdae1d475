"""A user in Chromium sees how far two runs drift: the job page and the compare page chart ‖A−B‖/‖A‖ on a log
axis beside |Δloss|, with the float32 rounding level drawn across, and say whether it stays there or grows."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.e2e.conftest import Stack
from tests.e2e.test_browser import ARGS, CHROMIUM, screenshot_dir

pytestmark = pytest.mark.browser


def chart_traces(page: Page, target: str) -> list[str]:
    page.wait_for_function(f"() => (document.getElementById('{target}').data || []).length > 0", timeout=30_000)
    return page.eval_on_selector(f"#{target}", "el => el.data.map(t => t.name)")


def test_the_drift_chart_appears_with_the_rounding_level_on_the_job_and_compare_pages(embedded: Stack,
                                                                                      tmp_path: Path) -> None:
    # Two world sizes: another reduction order, so the runs part at rounding level and the drift is measured.
    job = embedded.submit({"workload": "mlp", "steps": 4, "world_size": 2,
                           "configs": [{"preset": "default"}, {"preset": "default", "name": "four", "world_size": 4}]})
    done = embedded.wait_job(job["id"])
    cmp = embedded.comparison(job["id"])
    assert cmp["verdict"] == "diverged" and cmp["drift"]["available"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 2400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        names = chart_traces(page, "drift-chart")
        assert "‖A−B‖/‖A‖ (estimate)" in names and "|Δloss|" in names
        assert any(n.startswith("rounding level (one float32 ulp") for n in names)
        expect(page.locator("#drift-verdict")).to_contain_text(cmp["drift"]["verdict"])
        axis = page.eval_on_selector("#drift-chart", "el => el.layout.yaxis.type")
        assert axis == "log"
        page.locator("#drift-chart").screenshot(path=str(screenshot_dir(tmp_path) / "drift-job.png"))
        runs = sorted(done["runs"], key=lambda r: r["config_index"])
        page.goto(f"{embedded.url}/compare?a={runs[0]['id']}&b={runs[1]['id']}")
        expect(page.locator("#banner .badge")).to_have_text("diverged", timeout=30_000)
        assert any(n.startswith("rounding level") for n in chart_traces(page, "drift-chart"))
        expect(page.locator("#drift-verdict")).to_contain_text(cmp["drift"]["verdict"])
        assert errors == []
        browser.close()
