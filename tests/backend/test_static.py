"""Pages and static files: sent gzipped, cached for a year under versioned URLs, revalidated by ETag."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from detlab.core.settings import Settings

GZIP = {"Accept-Encoding": "gzip"}


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path)


@pytest.fixture
def db_url(sqlite_url: str) -> str:
    return sqlite_url  # nothing here reads the database


def versioned(page: str, name: str) -> str:
    [url] = re.findall(rf'"(/static/{re.escape(name)}\?v=[0-9a-f]+)"', page)
    return url


def test_plotly_is_sent_gzipped_and_revalidated_by_etag(client: TestClient) -> None:
    resp = client.get("/static/plotly.min.js", headers=GZIP)
    assert resp.status_code == 200 and resp.headers["content-encoding"] == "gzip"
    assert int(resp.headers["content-length"]) < len(resp.content) / 2  # 4.8 MB sent as about 1.4 MB
    assert resp.headers["content-type"].startswith("application/javascript")
    assert resp.headers["cache-control"] == "no-cache" and resp.headers["vary"] == "Accept-Encoding"
    again = client.get("/static/plotly.min.js", headers={"If-None-Match": resp.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


def test_pages_name_their_assets_by_version_and_those_are_immutable(client: TestClient) -> None:
    page = client.get("/jobs/1", headers=GZIP)
    assert page.headers["content-encoding"] == "gzip" and page.headers["cache-control"] == "no-cache"
    for name in ("plotly.min.js", "common.js", "app.css"):
        resp = client.get(versioned(page.text, name), headers=GZIP)
        assert resp.status_code == 200
        assert resp.headers["cache-control"] == "public, max-age=31536000, immutable"


def test_a_stale_version_is_not_cached_for_a_year(client: TestClient) -> None:
    resp = client.get("/static/common.js?v=000000000000")
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-cache"


def test_a_client_without_gzip_gets_the_plain_file(client: TestClient) -> None:
    from detlab.backend.app import FRONTEND

    resp = client.get("/static/app.css", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in resp.headers
    assert resp.content == (FRONTEND / "static" / "app.css").read_bytes()


@pytest.mark.parametrize("path", ["/static/nope.js", "/static/../app.py", "/static/%2e%2e/app.py",
                                  "/static/..%2f__init__.py"])
def test_only_files_under_static_are_served(client: TestClient, path: str) -> None:
    assert client.get(path).status_code == 404


def test_api_json_is_gzipped_when_large(client: TestClient) -> None:
    resp = client.get("/openapi.json", headers=GZIP)
    assert resp.headers.get("content-encoding") == "gzip"


def test_the_favicon_is_served_and_every_page_links_its_icon(client: TestClient) -> None:
    resp = client.get("/favicon.ico")
    assert resp.status_code == 200 and resp.headers["content-type"] == "image/vnd.microsoft.icon"
    assert resp.content[:4] == b"\x00\x00\x01\x00"  # an ICO header, one image (a PNG) inside
    page = client.get("/jobs")
    assert client.get(versioned(page.text, "favicon.svg")).headers["content-type"].startswith("image/svg+xml")


def test_every_page_of_the_table_is_served_in_the_one_layout(client: TestClient) -> None:
    from detlab.backend.pages import PAGES

    links = None
    for entry in PAGES:
        page = client.get(entry.path.replace("{job_id:int}", "7"))
        assert page.status_code == 200, entry.path
        assert f"<title>detlab · {entry.title}</title>" in page.text
        assert page.text.count('<header class="topbar">') == 1 and page.text.count("<main") == 1
        scripts = re.findall(r'<script src="/static/([^"?]+)\?v=[0-9a-f]+"></script>', page.text)
        assert scripts[-len(entry.scripts):] == list(entry.scripts)  # every script versioned, in the table's order
        if entry.navigation:
            nav = re.findall(r'<a class="navlink" href="([^"]+)"( aria-current="page")?>([^<]+)</a>', page.text)
            assert [text for _, current, text in nav if current] == [entry.section or entry.nav]
            assert links in (None, [(href, text) for href, _, text in nav])  # the same navigation everywhere
            links = [(href, text) for href, _, text in nav]
    assert links == [("/jobs", "jobs"), ("/", "new job"), ("/compare", "compare runs"), ("/findings", "findings")]


def test_a_job_page_needs_a_job_number(client: TestClient) -> None:
    assert client.get("/jobs/seven").status_code == 404
