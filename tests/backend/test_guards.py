"""Checks on every request in every auth mode: the Host header (DNS rebinding), the Origin of state-changing
requests (CSRF), JSON only as JSON, and the security headers on every response."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.app import FRONTEND
from detlab.backend.models import Job
from detlab.backend.pages import PAGES, render
from detlab.core.settings import Settings
from tests.backend.conftest import LOCAL_URL

TOKEN = "t" * 32
JOB = {"workload": "mlp", "configs": [{}], "world_size": 1, "steps": 2}
BEAT = {"worker": "node:default", "queue": "default"}


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    return Settings(data_dir=tmp_path, ingest_token=TOKEN)


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "localhost.evil.example", "a@localhost",
                                  "127.0.0.2"])
def test_a_host_not_allowed_is_a_400_on_pages_api_and_health(client: TestClient, host: str) -> None:
    for path in ("/", "/api/v1/jobs", "/api/v1/health", "/static/common.js"):
        resp = client.get(path, headers={"Host": host})
        assert resp.status_code == 400, path
        assert "DETLAB_ALLOWED_HOSTS" in resp.json()["detail"]


@pytest.mark.parametrize("host", ["localhost", "localhost:8000", "127.0.0.1:8000", "[::1]:8000", "LOCALHOST"])
def test_loopback_names_are_allowed_by_default(client: TestClient, host: str) -> None:
    assert client.get("/api/v1/jobs", headers={"Host": host}).status_code == 200


def test_configured_hosts_are_allowed(client: TestClient, settings: Settings) -> None:
    settings.allowed_hosts = [*settings.allowed_hosts, "detlab.example.com"]
    assert client.get("/api/v1/jobs", headers={"Host": "detlab.example.com"}).status_code == 200


@pytest.mark.parametrize("origin", ["http://evil.example", "http://localhost:9999", "null"])
def test_a_cross_origin_post_is_refused_and_stores_nothing(client: TestClient, session: Session,
                                                           origin: str) -> None:
    resp = client.post("/api/v1/jobs", json=JOB, headers={"Origin": origin})
    assert resp.status_code == 403 and "cross-origin" in resp.json()["detail"]
    assert session.scalar(select(Job)) is None


def test_a_same_origin_post_and_one_without_origin_are_served(client: TestClient) -> None:
    assert client.post("/api/v1/jobs", json=JOB, headers={"Origin": LOCAL_URL}).status_code == 201
    assert client.post("/api/v1/jobs", json=JOB).status_code == 201  # the CLI, CI: no Origin
    # A worker: no Origin, no cookie.
    assert client.post("/api/v1/ingest/heartbeat", json=BEAT, headers={"Authorization": f"Bearer {TOKEN}"}
                       ).status_code == 200


def test_a_json_body_sent_as_text_plain_is_refused(client: TestClient, session: Session) -> None:
    # A page elsewhere may send text/plain without a CORS preflight; FastAPI >= 0.132 reads JSON only as JSON.
    resp = client.post("/api/v1/jobs", content=b'{"workload": "mlp", "configs": [{}]}',
                       headers={"Content-Type": "text/plain"})
    assert resp.status_code == 422
    assert session.scalar(select(Job)) is None


@pytest.mark.parametrize("path", ["/", "/api/v1/jobs", "/api/v1/jobs/999", "/static/common.js", "/login"])
def test_every_response_carries_the_security_headers(client: TestClient, path: str) -> None:
    for resp in (client.get(path), client.get(path, headers={"Host": "evil.example"})):
        csp = resp.headers["content-security-policy"]
        script_src = re.search(r"script-src ([^;]*)", csp)
        assert script_src and script_src.group(1) == "'self'"
        assert "frame-ancestors 'none'" in csp and "object-src 'none'" in csp
        assert resp.headers["x-content-type-options"] == "nosniff"
        assert resp.headers["x-frame-options"] == "DENY"
        assert resp.headers["referrer-policy"] == "same-origin"


class InlineScripts(HTMLParser):
    """Whatever the CSP (script-src 'self') would block: inline <script>, on* handlers, javascript: URLs."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "script":
            self._in_script = True
            if not named.get("src"):
                self.found.append(f"<script> without src at line {self.getpos()[0]}")
        self.found += [f"{tag} {k}= at line {self.getpos()[0]}" for k, v in attrs
                       if k.startswith("on") or (v or "").strip().lower().startswith("javascript:")]

    def handle_endtag(self, tag: str) -> None:
        self._in_script = self._in_script and tag != "script"

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append(f"inline script at line {self.getpos()[0]}")


@pytest.mark.parametrize("page", sorted(p.name for p in Path(FRONTEND).glob("*.html")))
def test_pages_hold_no_script_the_csp_would_block(page: str) -> None:
    [entry] = [entry for entry in PAGES if entry.body == page]  # every page body is served, in the layout
    parser = InlineScripts()
    parser.feed(render(entry, (Path(FRONTEND) / page).read_text()))
    assert parser.found == []
