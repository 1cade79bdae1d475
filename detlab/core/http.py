"""Talking to a detlab server over HTTP, one way for the CLI, the SDK and the worker: the base URL and bearer
token, a refusal's reason on one line, retries of idempotent requests, and the wait for a job to finish."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

# A job in one of these states changes no more.
FINISHED = ("succeeded", "failed", "cancelled")


def auth_headers(token: str | None) -> dict[str, str]:
    """`Authorization: Bearer <token>` when there is a token (an API token, or a worker's ingest token)."""
    return {"Authorization": f"Bearer {token}"} if token else {}


def connect(server: str, token: str | None, *, timeout_s: float = 60.0) -> httpx.Client:
    """A client of the server at `server` (a trailing slash is fine) that sends `token`."""
    return httpx.Client(base_url=server.rstrip("/"), timeout=timeout_s, headers=auth_headers(token))


def detail(resp: httpx.Response) -> str:
    """A refusal's reason on one line (a 422's field errors joined)."""
    try:
        found = resp.json().get("detail", resp.text)
    except (ValueError, AttributeError):  # not JSON, or JSON that is not an object
        return resp.text[:500]
    if isinstance(found, list):
        return "; ".join(f"{'.'.join(str(x) for x in d.get('loc', ())[1:])}: {d.get('msg')}"
                         if isinstance(d, dict) else str(d) for d in found)
    return str(found)


def send(http: httpx.Client, method: str, path: str, *, json: Any = None, retries: int = 0,
         retry_for_s: float | None = None, headers: dict[str, str] | None = None) -> httpx.Response:
    """One request, tried again while the server cannot be reached or answers 5xx (it is idempotent): up to
    `retries` times (backoff from 0.2 s doubling to 5 s: about 21 s for 8), or, with `retry_for_s`, until that
    long has passed since the first try (a worker riding out a database or API outage). The last answer is
    returned as it is; a transport error on the last try is raised."""
    delay, started, attempt = 0.2, time.monotonic(), 0

    def last() -> bool:
        return attempt >= retries if retry_for_s is None else time.monotonic() - started >= retry_for_s

    while True:
        try:
            resp = http.request(method, path, json=json, headers=headers)
        except httpx.TransportError:
            if last():
                raise
        else:
            if resp.status_code < 500 or last():
                return resp
        time.sleep(delay)
        delay, attempt = min(delay * 2, 5.0), attempt + 1


def wait_for_job(http: httpx.Client, job: dict[str, Any], *, timeout_s: float, poll_s: float = 1.0,
                 on_poll: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The job (as GET /api/v1/jobs/{id} gives it) once it has finished, polled every `poll_s`; `on_poll` sees
    it after every poll. TimeoutError when it has not finished after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while job["status"] not in FINISHED:
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job['id']} did not finish within {timeout_s:g} s")
        time.sleep(poll_s)
        job = http.get(f"/api/v1/jobs/{job['id']}").json()
        if on_poll is not None:
            on_poll(job)
    return job
