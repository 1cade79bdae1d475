"""The why-report where users meet it: `detlab why` against a running server, and the job and compare pages in
Chromium on a job whose ranks really ran (gloo on CPU)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.backend.test_why import TOKEN, env_record, record
from tests.conftest import ROOT, free_port
from tests.e2e.conftest import Stack, stack_env, wait_for
from tests.e2e.test_browser import ARGS, CHROMIUM, screenshot_dir


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Stack]:
    """`detlab api` alone on SQLite, with a known ingest token: the test feeds the runs through the ingest API."""
    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}", env=stack_env(tmp_path, port, DETLAB_INGEST_TOKEN=TOKEN),
                  log_dir=tmp_path)
    subprocess.run([sys.executable, "-m", "detlab.cli", "migrate"], env=stack.env, cwd=ROOT, check=True, timeout=120)
    stack.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    try:
        # /health says 503 without a worker; /live answers once the API serves.
        wait_for("the API", lambda: _live(stack.url), stack, timeout=90)
        yield stack
    finally:
        stack.stop()


def _live(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v1/live", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def cli(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "detlab.cli", "why", *args], env={**stack.env,
                          "DETLAB_SERVER": stack.url}, capture_output=True, text=True, timeout=120)


def test_detlab_why_prints_the_checklist_with_marks_and_evidence(api: Stack) -> None:
    body = {"workload": "mlp", "world_size": 2, "steps": 3, "queue": "nobody",
            "configs": [{"preset": "default"}, {"preset": "default", "name": "b"}]}
    job = httpx.post(f"{api.url}/api/v1/jobs", json=body, timeout=30).json()
    a, b = sorted(job["runs"], key=lambda r: r["config_index"])
    with httpx.Client(base_url=api.url, timeout=30) as client:
        record(client, a["id"], digest="1" * 32, envs=[env_record(r) for r in range(2)])
        record(client, b["id"], digest="2" * 32, envs=[env_record(r, NCCL_SOCKET_IFNAME="eth1") for r in range(2)])
    done = cli(api, str(job["id"]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"why job {job['id']}: run {a['id']} (A) vs run {b['id']} (B), diverged at step 1"
    assert [line.split(" ", 2)[1] for line in lines if line[:1].isdigit()] == ["-", "✗", "?", "✓", "?", "?"]
    assert "     NCCL_SOCKET_IFNAME differs (A vs B): unset vs eth1" in lines
    assert f"     evidence: run {b['id']} (B) env per rank: {api.url}/api/v1/runs/{b['id']}/envs" in lines
    report = json.loads(cli(api, str(job["id"]), "--json", "--pair", f"{b['id']},{a['id']}").stdout)
    assert (report["run_a"], report["run_b"], report["items"][1]["status"]) == (b["id"], a["id"], "fail")
    wrong = cli(api, str(job["id"]), "--pair", f"{a['id']},999")
    assert wrong.returncode == 2
    assert wrong.stderr == f"error: {api.url} answered 422: run 999 is not a run of job {job['id']} " \
                           f"(its runs: {sorted([a['id'], b['id']])})\n"


@pytest.mark.browser
def test_a_diverged_jobs_page_shows_the_checklist_and_its_evidence_opens(embedded: Stack, tmp_path: Path) -> None:
    tree = {"preset": "default", "name": "tree-seed1", "seed": 1, "env": {"NCCL_ALGO": "Ring"}}
    job = embedded.submit({"workload": "mlp", "steps": 2, "world_size": 2, "configs": [{"preset": "default"}, tree]})
    embedded.wait_job(job["id"])
    cmp = embedded.comparison(job["id"])
    assert cmp["verdict"] == "diverged"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(f"{embedded.url}/jobs/{job['id']}")
        items = page.locator("#why li.why-item")
        expect(items).to_have_count(6, timeout=60_000)
        assert [items.nth(i).get_attribute("data-status") for i in range(6)] == [
            "not-applicable", "pass", "not-checked", "pass", "not-checked", "not-checked"]
        expect(items.nth(0)).to_contain_text("not applicable (gloo: no NCCL)")
        env = page.locator("#why li[data-key=env]")
        # the config's own NCCL_ALGO is the experiment, not a parity failure (the seed makes the runs part)
        expect(env).to_contain_text("only the differences their configs ask for: NCCL_ALGO (A: unset, B: Ring)")
        # one line per item, the failing ones open: a passed item opens on a click
        assert page.locator("#why details.why-fold[open]").count() == 0
        page.screenshot(path=str(screenshot_dir(tmp_path) / "why.png"), full_page=True)
        env.locator("summary.why-head").click()
        env.get_by_role("link", name=f"run {cmp['run_b']} (B) env per rank").click()
        page.wait_for_url(f"**/api/v1/runs/{cmp['run_b']}/envs")
        shown = json.loads(page.locator("body").inner_text())
        assert {e["effective_env"]["NCCL_ALGO"] for e in shown} == {"Ring"} and len(shown) == 2
        page.goto(f"{embedded.url}/compare?a={cmp['run_a']}&b={cmp['run_b']}")
        expect(page.locator("#why li[data-key=env]")).to_have_attribute("data-status", "pass", timeout=30_000)
        page.locator("#why li[data-key=ops] summary.why-head").click()
        page.locator("#why li[data-key=ops]").get_by_role("link", name="new op-audit job of mlp").click()
        page.wait_for_url("**/?kind=op-audit&workload=mlp")
        expect(page.locator("#rerun-note")).to_be_visible()
        expect(page.locator("#workload")).to_have_value("mlp")
        assert errors == []
        browser.close()
