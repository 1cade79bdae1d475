"""HTTP client of the ingest API, used by workers and by the SDK in users' scripts (one ingest path).

It lives in the core, below the worker and the SDK, because it needs only httpx and the wire models of
detlab.core.wire; the connection and its retries are detlab.core.http's, shared with the CLI."""

from __future__ import annotations

import base64
import zlib
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from detlab.core import http
from detlab.core.wire import (
    LEASE_HEADER,
    MAX_ERROR_CHARS,
    Claim,
    CommLogUpload,
    Finish,
    Heartbeat,
    HeartbeatAck,
    Record,
    RecordingClose,
    RecordingOpen,
    RecordingOpened,
    RecordsBatch,
    RunSpec,
    WorkerInfo,
    explain,
)


class IngestError(RuntimeError):
    pass


class Stale(IngestError):
    """The API refused the request because the run moved on (finished, or another attempt)."""


class Unavailable(IngestError):
    """The API answered 5xx on every try: it is restarting or overloaded; the same request may work later."""


class TooLarge(IngestError):
    """The API refused the body as over its size cap (413, DETLAB_MAX_BODY_BYTES)."""


class BadSpec(IngestError):
    """The claim reply is not a runnable spec; `attempt` is the attempt it started, when it says."""

    def __init__(self, message: str, attempt: int | None) -> None:
        super().__init__(message)
        self.attempt = attempt


class IngestClient:
    """`retries` tries again after a transport error or a 5xx (about 21 s for 8); `retry_for_s`, when given,
    instead keeps trying until that long has passed since the first try, so that a worker rides out a database or
    API outage with its records in the spool.

    The lease of each run this client claimed is kept and sent with that run's writes (header X-Detlab-Lease):
    the server takes an attempt's records, logs and finish from the holder of its lease only."""

    def __init__(self, api_url: str, token: str | None, *, retries: int = 8, timeout_s: float = 30.0,
                 retry_for_s: float | None = None) -> None:
        self._http = http.connect(api_url, token, timeout_s=timeout_s)
        self._retries, self._retry_for_s = retries, retry_for_s
        self._leases: dict[int, str] = {}  # run id -> the lease of the attempt this client claimed

    def _post(self, path: str, body: BaseModel, lease: str | None = None) -> dict[str, Any]:
        # Every ingest call is idempotent, so retrying after a lost response is safe.
        resp = http.send(self._http, "POST", path, json=body.model_dump(mode="json"), retries=self._retries,
                         retry_for_s=self._retry_for_s, headers={LEASE_HEADER: lease} if lease else None)
        if resp.status_code == 409:
            raise Stale(resp.json().get("detail", resp.text))
        if resp.status_code == 413:
            raise TooLarge(f"{path}: {resp.status_code} {resp.text[:500]}")
        if resp.status_code >= 500:
            raise Unavailable(f"{path}: {resp.status_code} {resp.text[:500]}")
        if resp.status_code >= 400:
            raise IngestError(f"{path}: {resp.status_code} {resp.text[:500]}")
        result: dict[str, Any] = resp.json()
        return result

    def claim(self, run_id: int, worker: str) -> RunSpec:
        """Start a new attempt of the run; raises Stale when another worker owns it."""
        reply = self._post(f"/api/v1/ingest/runs/{run_id}/claim", Claim(worker=worker))
        if isinstance(reply, dict) and isinstance(lease := reply.get("lease"), str):
            self._leases[run_id] = lease  # kept before the spec is checked: a BadSpec run is failed with it
        try:
            return RunSpec.model_validate(reply)
        except ValidationError as exc:
            attempt = reply.get("attempt") if isinstance(reply, dict) else None
            raise BadSpec(f"the claim reply is not a runnable spec: {explain(exc)}",
                          attempt if isinstance(attempt, int) else None) from exc

    def records(self, run_id: int, attempt: int, records: list[Record]) -> None:
        """Send spool records. A batch over the API's body cap (many tensors: MoE models) is sent again in
        halves until each part fits; the API stores a record sent twice once, so nothing is lost or doubled.
        Only a single record over the cap is an error (TooLarge)."""
        try:
            self._post(f"/api/v1/ingest/runs/{run_id}/records", RecordsBatch(attempt=attempt, records=records),
                       self.lease(run_id))
        except TooLarge:
            if len(records) < 2:
                raise
            half = len(records) // 2
            self.records(run_id, attempt, records[:half])
            self.records(run_id, attempt, records[half:])

    def comm_log(self, run_id: int, attempt: int, rank: int, text: bytes, raw_bytes: int, truncated: bool) -> None:
        upload = CommLogUpload(attempt=attempt, rank=rank, zlib_b64=base64.b64encode(zlib.compress(text, 6)).decode(),
                               raw_bytes=raw_bytes, truncated=truncated)
        self._post(f"/api/v1/ingest/runs/{run_id}/commlog", upload, self.lease(run_id))

    def finish(self, run_id: int, attempt: int, status: Literal["succeeded", "failed"],
               error: str | None = None) -> None:
        # An error over the cap keeps its head (what failed) and its tail (the rank's last output).
        if error is not None and len(error) > MAX_ERROR_CHARS:
            error = error[: MAX_ERROR_CHARS // 2] + "\n[...]\n" + error[-(MAX_ERROR_CHARS // 2 - 7) :]
        self._post(f"/api/v1/ingest/runs/{run_id}/finish", Finish(attempt=attempt, status=status, error=error),
                   self.lease(run_id))

    def open_recording(self, opening: RecordingOpen) -> RecordingOpened:
        """The server run of an SDK recording (the same one for every rank and every retry)."""
        return RecordingOpened.model_validate(self._post("/api/v1/ingest/recordings", opening))

    def close_recording(self, run_id: int, rank: int, status: Literal["succeeded", "failed"],
                        error: str | None = None) -> str:
        """Say this rank of a recording is done; returns the run's status (finished once every rank closed)."""
        body = RecordingClose(rank=rank, status=status, error=error[-MAX_ERROR_CHARS:] if error else None)
        return str(self._post(f"/api/v1/ingest/runs/{run_id}/close", body)["status"])

    def lease(self, run_id: int) -> str | None:
        """The lease this client's claim of the run got (None when it did not claim it)."""
        return self._leases.get(run_id)

    def heartbeat(self, worker: str, queue: str, run_id: int | None, attempt: int | None,
                  info: WorkerInfo | None = None, lease: str | None = None) -> HeartbeatAck:
        """Say the worker is alive; the reply's `stop` says the run it named is no longer its to execute. Naming a
        run, `lease` is its attempt's (the heartbeat thread has a client of its own, so it is passed in)."""
        beat = Heartbeat(worker=worker, queue=queue, run_id=run_id, attempt=attempt, info=info or WorkerInfo())
        return HeartbeatAck.model_validate(self._post("/api/v1/ingest/heartbeat", beat, lease))
