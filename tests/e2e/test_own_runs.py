"""A team's own training in the distributed setup (API + PostgreSQL + Redis + a separate worker process):
a script registered on the worker runs from the browser like a built-in workload, and runs recorded offline,
uploaded with `detlab upload`, are found and compared on the compare page."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.conftest import ROOT
from tests.e2e.conftest import Stack, distributed_stack
from tests.e2e.test_browser import ARGS, CHROMIUM

SCRIPT = ROOT / "tests" / "sdk" / "scripts" / "train.py"

pytestmark = pytest.mark.browser


@pytest.fixture
def team(tmp_path: Path, pg_url: str, redis_url: str) -> Iterator[Stack]:
    scripts = tmp_path / "scripts.toml"
    scripts.write_text(f"""
[[script]]
name = "sdk-train"
description = "tests/sdk/scripts/train.py: a plain PyTorch loop with detlab.Recorder"
command = ["{sys.executable}", "{SCRIPT}", "-", "--steps", "3"]
workdir = "{tmp_path}"
world_sizes = [1, 2]
steps = 3
""")
    with distributed_stack(tmp_path, pg_url, redis_url, DETLAB_SCRIPTS=str(scripts)) as stack:
        yield stack


def test_a_registered_script_runs_from_the_browser(team: Stack) -> None:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(team.url)
        expect(page.locator("#workload option[value='sdk-train']")).to_have_text("sdk-train (script)",
                                                                                 timeout=30_000)
        page.select_option("#workload", "sdk-train")
        expect(page.locator("#workload-description")).to_contain_text("world sizes 1, 2")
        page.fill("#world-size", "2")
        page.select_option("#preset-a", "default")
        page.select_option("#preset-b", "default")
        page.click("#submit")
        page.wait_for_url("**/jobs/*")
        expect(page.locator("#verdict")).to_have_text("identical", timeout=240_000)
        assert errors == []
        browser.close()
    job_id = int(page.url.rsplit("/", 1)[1])
    cmp = team.comparison(job_id)
    assert (cmp["verdict"], cmp["steps_compared"]) == ("identical", 3)


def record_and_upload(team: Stack, tmp_path: Path, name: str, flip: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if flip:
        env["DETLAB_TEST_FLIP"] = flip
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / name), "--steps", "3"], env=env, check=True,
                   timeout=300)
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "upload", str(tmp_path / name), "--name", name],
                          env={**env, "DETLAB_SERVER": team.url, "DETLAB_TOKEN": team.env["DETLAB_INGEST_TOKEN"]},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_uploaded_runs_are_found_and_compared_in_the_browser(team: Stack, tmp_path: Path) -> None:
    record_and_upload(team, tmp_path, "ci-base")
    record_and_upload(team, tmp_path, "ci-flipped", flip="1:0:0.weight")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1400})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{team.url}/compare")
        page.fill("#q", "ci-")
        rows = page.locator("#runs tbody tr")
        expect(rows).to_have_count(2)
        rows.filter(has_text="ci-base").locator("button[data-side='a']").click()
        rows.filter(has_text="ci-flipped").locator("button[data-side='b']").click()
        page.click("#go")
        expect(page.locator("#banner .badge")).to_have_text("diverged", timeout=30_000)
        expect(page.locator("#banner")).to_contain_text("0.weight")
        expect(page.locator("#pair tbody tr")).to_have_count(2)
        assert "/compare?a=" in page.url
        assert errors == []
        browser.close()
