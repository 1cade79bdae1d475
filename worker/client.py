"""HTTP client of the ingest API, used by workers (and by the SDK in users' scripts)."""

from __future__ import annotations

import base64
import time
import zlib
from typing import Any

import httpx


class IngestError(RuntimeError):
    pass


class Stale(IngestError):
    """The API refused the request because the run moved on (finished, or another attempt)."""


class IngestClient:
    def __init__(self, api_url: str, token: str, *, retries: int = 8, timeout_s: float = 30.0) -> None:
        self._http = httpx.Client(base_url=api_url.rstrip("/"), timeout=timeout_s,
                                  headers={"Authorization": f"Bearer {token}"})
        self._retries = retries

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        # Every ingest call is idempotent, so retrying after a lost response is safe.
        delay = 0.2
        for attempt in range(self._retries + 1):
            try:
                resp = self._http.post(path, json=body)
            except httpx.TransportError:
                if attempt == self._retries:
                    raise
            else:
                if resp.status_code == 409:
                    raise Stale(resp.json().get("detail", resp.text))
                if resp.status_code < 500:
                    if resp.status_code >= 400:
                        raise IngestError(f"{path}: {resp.status_code} {resp.text[:500]}")
                    return resp.json()
                if attempt == self._retries:
                    raise IngestError(f"{path}: {resp.status_code} {resp.text[:500]}")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")

    def claim(self, run_id: int, worker: str) -> dict[str, Any]:
        return self._post(f"/api/v1/ingest/runs/{run_id}/claim", {"worker": worker})

    def records(self, run_id: int, attempt: int, records: list[dict[str, Any]]) -> None:
        self._post(f"/api/v1/ingest/runs/{run_id}/records", {"attempt": attempt, "records": records})

    def comm_log(self, run_id: int, attempt: int, rank: int, text: bytes, raw_bytes: int, truncated: bool) -> None:
        body = {"attempt": attempt, "rank": rank, "zlib_b64": base64.b64encode(zlib.compress(text, 6)).decode(),
                "raw_bytes": raw_bytes, "truncated": truncated}
        self._post(f"/api/v1/ingest/runs/{run_id}/commlog", body)

    def finish(self, run_id: int, attempt: int, status: str, error: str | None = None) -> None:
        self._post(f"/api/v1/ingest/runs/{run_id}/finish", {"attempt": attempt, "status": status, "error": error})

    def heartbeat(self, worker: str, queue: str, run_id: int | None, attempt: int | None,
                  info: dict[str, Any] | None = None) -> None:
        self._post("/api/v1/ingest/heartbeat", {"worker": worker, "queue": queue, "run_id": run_id,
                                                "attempt": attempt, "info": info or {}})
