"""A user of auth mode `local` in Chromium: sent to the login page, logs in, submits, logs out."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import Stack, stack_env, wait_healthy
from tests.e2e.test_browser import ARGS, CHROMIUM

pytestmark = pytest.mark.browser
PASSWORD = "correct horse battery"


@pytest.fixture
def local_auth(tmp_path: Path) -> Iterator[Stack]:
    """`detlab up` in auth mode local with one member, ada, added by the CLI beforehand."""
    port = free_port()
    env = stack_env(tmp_path, port, DETLAB_AUTH_MODE="local")
    data = str(tmp_path / "data")
    subprocess.run([sys.executable, "-m", "detlab.cli", "user", "add", "ada", "--role", "member",
                    "--password-stdin", "--data-dir", data], input=PASSWORD + "\n", text=True, env=env, cwd=ROOT,
                   check=True, capture_output=True, timeout=120)
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=tmp_path)
    stack.start("up", "up", "--port", str(port), "--data-dir", data)
    try:
        wait_healthy(stack.url, list(stack.procs.values()))
        yield stack
    finally:
        stack.stop()


def test_log_in_submit_and_log_out(local_auth: Stack) -> None:
    url = local_auth.url
    assert httpx.get(f"{url}/api/v1/jobs", timeout=10).status_code == 401
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        context = browser.new_context()
        page = context.new_page()
        problems: list[str] = []  # script errors and CSP refusals ("Refused to execute inline script ...")
        page.on("pageerror", lambda exc: problems.append(str(exc)))
        page.on("console", lambda msg: problems.append(msg.text) if "Content Security Policy" in msg.text else None)

        page.goto(url)
        expect(page).to_have_url(f"{url}/login?next=/")
        page.fill("#name", "ada")
        page.fill("#password", "not the password")
        page.click("#submit")
        expect(page.locator("#error")).to_have_text("wrong user name or password")
        page.fill("#password", PASSWORD)
        page.click("#submit")
        expect(page).to_have_url(f"{url}/")
        expect(page.locator("#whoami")).to_have_text("ada")
        [cookie] = context.cookies()
        assert cookie["name"] == "detlab_session" and cookie["httpOnly"] and cookie["sameSite"] == "Lax"

        page.select_option("#workload", "mlp")
        page.fill("#world-size", "1")
        page.fill("#steps", "2")
        page.click("#submit")  # a POST with the cookie and this page's Origin
        page.wait_for_url("**/jobs/*")
        job_path = page.url.removeprefix(url)

        page.click("#logout")
        page.wait_for_url("**/login")
        page.goto(f"{url}{job_path}")
        expect(page).to_have_url(f"{url}/login?next={job_path}")
        assert problems == []
        browser.close()


# `next` values that a naive "starts with one slash" check lets through: the URL parser drops tab and newline
# and reads a backslash as a slash, so each of these is //evil.example/page to the browser.
OFF_SITE = ["/%09/evil.example/page", "/%0a/evil.example/page", "/%0d%0a/evil.example/page", "/%5C/evil.example/page",
            "/%09%5Cevil.example/page", "//evil.example/page", "https://evil.example/page", "/\\evil.example"]


def test_login_returns_only_to_a_path_on_this_server(local_auth: Stack) -> None:
    url = local_auth.url
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_context().new_page()
        left: list[str] = []
        page.on("request", lambda r: left.append(r.url) if urlsplit(r.url).hostname == "evil.example" else None)
        for next_value in [*OFF_SITE, "/findings"]:
            page.goto(f"{url}/login?next={next_value}")
            page.fill("#name", "ada")
            page.fill("#password", PASSWORD)
            page.click("#submit")
            page.wait_for_url(lambda u: "/login" not in u)
            assert page.url.startswith(f"{url}/"), (next_value, page.url)
        assert page.url.split("?")[0] == f"{url}/findings"  # the page may rewrite its query
        assert left == []
        browser.close()
