"""Bisect end to end on `detlab up` (a real worker, 2 gloo ranks per run): a scatter job whose pair diverges of
its own accord (index_add_ on 2 CPU threads) is bisected from its page in Chromium and from the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.e2e.conftest import Stack
from tests.e2e.test_browser import ARGS, CHROMIUM, screenshot_dir


@pytest.fixture
def embedded(shared_embedded: Stack) -> Stack:
    """These tests look only at jobs of their own, by id: they share one `detlab up` (tests/e2e/conftest.py)."""
    return shared_embedded


# Two threads and no deterministic mode: index_add_ adds in an order that varies, so the pair parts at step 1.
SCATTER = {"workload": "scatter", "steps": 1, "world_size": 2,
           "configs": [{"preset": "default", "name": name, "threads": 2} for name in ("a", "b")]}


def diverged_job(stack: Stack) -> int:
    job = stack.submit(SCATTER)
    assert stack.wait_job(job["id"], timeout=300)["status"] == "succeeded"
    cmp = stack.comparison(job["id"])
    assert (cmp["verdict"], cmp["first_divergent_step"]) == ("diverged", 1), cmp
    return int(job["id"])


@pytest.mark.browser
def test_the_button_on_a_diverged_job_bisects_it_and_the_tree_marks_the_first_difference(
        embedded: Stack, tmp_path: Path) -> None:
    job_id = diverged_job(embedded)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{embedded.url}/jobs/{job_id}")
        button = page.locator("#bisect-job")
        expect(button).to_be_visible(timeout=60_000)
        button.click()
        link = page.locator("#bisect-link")
        expect(link).to_contain_text("bisect job #")
        link.click()
        page.wait_for_url("**/jobs/*")
        expect(page.locator("#job-title")).to_contain_text("bisect")
        expect(page.locator("#bisect-verdict")).to_have_text("diverged", timeout=300_000)
        first = page.locator("#module-tree .mod-row.mod-first")
        expect(first).to_have_count(1)
        expect(first).to_contain_text("out")
        expect(first).to_contain_text("first difference")
        expect(first).to_contain_text("carried")
        expect(page.locator("#bisect-facts")).to_contain_text("differed (in0): it carried the difference")
        expect(page.locator("#bisect-summary")).to_contain_text("in (model)'s own forward")
        expect(page.locator("#module-tree .mod-row", has_text="msg")).to_contain_text("Linear")
        expect(page.locator("#banner-headline")).to_contain_text("First divergent module: out (forward)")
        page.screenshot(path=str(screenshot_dir(tmp_path) / "bisect.png"), full_page=True)
        assert errors == []
        browser.close()


def test_detlab_bisect_waits_and_prints_the_first_divergent_module(embedded: Stack) -> None:
    job_id = diverged_job(embedded)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}, "DETLAB_SERVER": embedded.url}
    run = subprocess.run([sys.executable, "-m", "detlab.cli", "bisect", str(job_id), "--wait", "--json"],
                         capture_output=True, text=True, timeout=400, env=env)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["job"]["kind"] == "bisect" and result["source"]["job"] == job_id and result["step"] == 1
    first = result["diagnosis"]["first_module"]
    assert (first["module"], first["verdict"], first["arose_in"]) == ("out", "carried", ["(model)"])
    # Asked again, in words: the summary line, then the tree with the first difference marked.
    text = subprocess.run([sys.executable, "-m", "detlab.cli", "bisect", str(job_id), "--pair", "1,0", "--wait"],
                          capture_output=True, text=True, timeout=400, env=env)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert "first divergent module: forward call #0 of out (Linear)" in lines[0]
    assert "> " + "  out (Linear): first difference [carried;" in "\n".join(lines)


@pytest.mark.parametrize("args, message", [
    (["--pair", "0,x"], "error: --pair 0,x: two config indices, e.g. 0,1"),
    (["--pair", "0,1"], "refused the bisect (422): job {job} is queued; bisect it once it has finished"),
])
def test_detlab_bisect_errors_are_one_line_and_exit_2(embedded: Stack, args: list[str], message: str) -> None:
    job = embedded.submit({"workload": "mlp", "steps": 1, "configs": [{}, {}], "queue": "nobody"})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}, "DETLAB_SERVER": embedded.url}
    run = subprocess.run([sys.executable, "-m", "detlab.cli", "bisect", str(job["id"]), *args],
                         capture_output=True, text=True, timeout=60, env=env)
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1
    assert message.format(job=job["id"]) in run.stderr
