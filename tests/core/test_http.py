"""detlab.core.http: a refusal's reason on one line, retries of idempotent requests, the wait for a job.

The server is an in-process httpx transport: these are the client's own rules, not the API's."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from detlab.core import http


def client(handler: Any) -> httpx.Client:
    return httpx.Client(base_url="http://detlab.test", transport=httpx.MockTransport(handler))


@pytest.mark.parametrize(("resp", "text"), [
    (httpx.Response(404, json={"detail": "job 7 not found"}), "job 7 not found"),
    (httpx.Response(422, json={"detail": [{"loc": ["body", "sweep", "over"], "msg": "Input should be 'train'"},
                                          "plain"]}), "sweep.over: Input should be 'train'; plain"),
    (httpx.Response(502, text="<html>bad gateway</html>"), "<html>bad gateway</html>"),
    (httpx.Response(400, json=["not", "an", "object"]), '["not","an","object"]'),
])
def test_detail_is_the_reason_on_one_line(resp: httpx.Response, text: str) -> None:
    assert http.detail(resp) == text


def test_auth_headers_only_with_a_token() -> None:
    assert http.auth_headers("detlab_abc") == {"Authorization": "Bearer detlab_abc"}
    assert http.auth_headers(None) == {} and http.auth_headers("") == {}
    with http.connect("http://detlab.test/", "t") as c:
        assert c.base_url == "http://detlab.test" and c.headers["Authorization"] == "Bearer t"


def test_send_retries_5xx_and_returns_the_first_other_answer() -> None:
    answers = iter([503, 500, 409])
    with client(lambda request: httpx.Response(next(answers))) as c:
        assert http.send(c, "POST", "/x", json={}, retries=3).status_code == 409


def test_send_returns_the_last_5xx_when_every_try_got_one() -> None:
    calls = []
    with client(lambda request: calls.append(request) or httpx.Response(503)) as c:
        assert http.send(c, "POST", "/x", retries=1).status_code == 503
    assert len(calls) == 2


def test_send_raises_when_the_last_try_reached_nobody() -> None:
    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    with client(down) as c, pytest.raises(httpx.ConnectError):
        http.send(c, "GET", "/x", retries=1)


def test_wait_for_job_polls_until_it_finished_and_shows_each_poll() -> None:
    states = iter(["running", "succeeded"])
    seen: list[str] = []
    with client(lambda request: httpx.Response(200, json={"id": 3, "status": next(states)})) as c:
        job = http.wait_for_job(c, {"id": 3, "status": "queued"}, timeout_s=30, poll_s=0,
                                on_poll=lambda j: seen.append(j["status"]))
    assert job["status"] == "succeeded" and seen == ["running", "succeeded"]


def test_wait_for_job_gives_up_after_its_timeout() -> None:
    with client(lambda request: httpx.Response(200, json={"id": 3, "status": "running"})) as c, \
            pytest.raises(TimeoutError, match="job 3 did not finish"):
        http.wait_for_job(c, {"id": 3, "status": "queued"}, timeout_s=0.05, poll_s=0.01)
