"""The first differing collective, in Chromium: on the compare page for two uploaded SDK recordings whose
allreduce summed in other orders (tests/sdk/scripts/train_collectives.py), and on the job page of a built-in
DDP job submitted on the form with "record collective calls" ticked."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.e2e.conftest import Stack
from tests.e2e.test_browser import ARGS, CHROMIUM
from tests.sdk.test_collectives import record


@pytest.fixture
def distributed(shared_distributed: Stack) -> Stack:
    """These tests look only at jobs of their own, by id: they share one deployment (tests/e2e/conftest.py)."""
    return shared_distributed


pytestmark = pytest.mark.browser


def upload(stack: Stack, out: Path, name: str) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "upload", str(out), "--name", name],
                          env={**env, "DETLAB_SERVER": stack.url, "DETLAB_TOKEN": stack.env["DETLAB_INGEST_TOKEN"]},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    found = re.search(r"to run (\d+)", done.stdout)
    assert found, done.stdout
    return int(found[1])


def test_the_compare_page_names_the_first_collective_whose_inputs_matched(distributed: Stack,
                                                                          tmp_path: Path) -> None:
    """What is planted: run B's allreduce sums the 3 ranks' tensors in reverse rank order (see the script)."""
    a = upload(distributed, record(tmp_path / "f", "--reduce-order", "forward", ranks=3), "sum-forward")
    b = upload(distributed, record(tmp_path / "r", "--reduce-order", "reverse", ranks=3), "sum-reverse")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{distributed.url}/compare?a={a}&b={b}")
        expect(page.locator("#banner .badge")).to_have_text("diverged", timeout=30_000)
        line = page.locator("#banner #collectives")
        expect(line).to_contain_text("first differing collective: step 0 call 0 ddp_allreduce float32 x193 over 3 "
                                     "ranks on rank(s) 0, 1, 2: inputs matched → reduction order/topology")
        expect(line).to_contain_text("NCCL at 772 bytes: run A no NCCL log")
        assert errors == []
        browser.close()


def test_a_job_submitted_with_record_collectives_on_the_form_shows_them_on_its_page(distributed: Stack) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(distributed.url)
        page.select_option("#workload", "mlp")
        page.fill("#world-size", "2")
        page.fill("#steps", "2")
        page.select_option("#preset-a", "default")
        page.select_option("#preset-b", "default")
        page.check("#record-collectives")
        page.click("#submit")
        page.wait_for_url("**/jobs/*")
        expect(page.locator("#verdict")).to_have_text("identical", timeout=240_000)
        job_id = int(page.url.rsplit("/", 1)[1])
        calls = distributed.comparison(job_id)["collectives"]
        assert calls["status"] == "identical" and calls["calls_compared"] == 6  # 1 + 2 DDP buckets x 2 ranks
        expect(page.locator("#collectives")).to_have_text(calls["text"])
        expect(page.locator("#collectives")).to_contain_text("calls compared on 2 rank(s), every output equal")
        assert errors == []
        browser.close()
