"""A user in Chromium submits a batch-invariance test and an op audit on the form and reads their pages."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from detlab.core.diagnosis import INVARIANCE_OPS
from tests.e2e.conftest import Stack
from tests.e2e.test_browser import ARGS, CHROMIUM, screenshot_dir

pytestmark = pytest.mark.browser
# The scatter workload's ops that race at 2 threads (which of them a given run catches varies)
SCATTER_OPS = {"aten.index_put_", "aten.index_put", "aten.index_add_"}


def finished(stack: Stack, wait: Callable[[], None]) -> None:
    """`wait` for a job's verdict on its page; if it never comes, say what the server and its worker logged (the
    op-audit job once stayed queued in CI with its worker silent: the embedded broker race that
    backend/services/embedded_broker.py closes)."""
    try:
        wait()
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{stack.logs()}") from None


def test_both_diagnosis_kinds_from_the_form_to_the_heatmap_and_the_audit_table(embedded: Stack,
                                                                                 tmp_path: Path) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))

        page.goto(embedded.url)
        page.select_option("#kind", "batch-invariance")
        expect(page.locator("#world-size-field")).to_be_hidden()
        # the boxes come with GET /api/v1/meta, which may answer after the kind is chosen
        expect(page.locator("#bi-op-checks input")).to_have_count(len(INVARIANCE_OPS))
        assert page.eval_on_selector_all("#bi-op-checks input", "els => els.map(e => e.value)") == list(INVARIANCE_OPS)
        page.fill("#features", "100")  # not a multiple of 16: refused on the page, nothing sent
        page.click("#submit")
        expect(page.locator("#error")).to_contain_text("Features must be a multiple of 16")
        for op in ("matmul", "log_softmax", "layer_norm", "rms_norm"):
            page.uncheck(f"#bi-op-{op}")
        page.uncheck("#bi-dtype-bfloat16")
        page.fill("#features", "64")
        page.fill("#batch-sizes", "1, 2, 4")
        page.select_option("#bi-workload", "mlp")
        page.select_option("#preset-b", "torch-deterministic")
        page.click("#submit")
        page.wait_for_url("**/jobs/*")
        finished(embedded, lambda: expect(page.locator("#banner-verdict")).to_contain_text("invariant",
                                                                                         timeout=180_000))
        expect(page.locator("#diagnosis-title")).to_have_text("Batch invariance")
        expect(page.locator("#first-breaks tbody tr")).to_have_count(4)  # (mm, sum) × two configs
        expect(page.locator("#model-invariance li")).to_have_count(2)
        heat = page.wait_for_function("""() => {
            const data = document.getElementById('invariance-heatmap').data || [];
            return data.length ? {type: data[0].type, x: data[0].x, y: data[0].y} : null; }""",
                                      timeout=30_000).json_value()
        assert heat["type"] == "heatmap" and list(heat["x"]) == ["1", "2", "4"]
        assert list(heat["y"]) == ["default: mm · float32", "default: sum · float32",
                                   "torch-deterministic: mm · float32", "torch-deterministic: sum · float32"]
        expect(page.locator("#diagnosis-env")).to_contain_text("TF32")
        page.screenshot(path=str(screenshot_dir(tmp_path) / "batch-invariance.png"), full_page=True)

        page.goto(embedded.url)
        page.select_option("#kind", "op-audit")
        page.select_option("#workload", "scatter")
        page.fill("#diag-threads", "2")
        page.fill("#reruns", "10")
        page.select_option("#preset-a", "default")
        page.select_option("#preset-b", "torch-deterministic")
        page.click("#submit")
        page.wait_for_url("**/jobs/*")
        finished(embedded, lambda: expect(page.locator("#banner-verdict")).to_have_text("nondeterministic",
                                                                                      timeout=180_000))
        expect(page.locator("#diagnosis-title")).to_have_text("Op audit of scatter")
        page.check("#audit-only-nondet")
        rows = page.locator("#audit-ops tbody tr")
        expect(rows.first).to_contain_text("distinct results in 10")
        # Only the default config's scatter ops gave different bits: deterministic mode holds.
        assert set(rows.locator("td:first-child").all_inner_texts()) == {"default"}
        assert set(rows.locator("td:nth-child(2)").all_inner_texts()) <= SCATTER_OPS
        expect(page.locator("#ineffective li")).to_have_count(0)
        page.screenshot(path=str(screenshot_dir(tmp_path) / "op-audit.png"), full_page=True)

        # Both jobs joined the team's findings: the audit's op, config × stack.
        page.goto(f"{embedded.url}/findings")
        page.select_option("#what", label="op-audit · scatter · aten.index_put_")
        expect(page.locator("#matrix tbody tr")).to_have_count(2)
        expect(page.locator("#matrix tbody tr", has_text="torch-deterministic")).to_contain_text("1/1")
        assert page.locator("#what option", has_text="batch-invariance · mm · float32").count() == 1
        assert errors == []
        browser.close()
