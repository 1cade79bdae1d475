"""Recordings sent to a detlab server: streamed while the loop runs (online mode), or later (`detlab upload`).

The record files are the spool. Online, a thread per rank sends its file as it grows, remembering how far
the server has it; when the server cannot be reached the file keeps growing and the thread tries again
later, so nothing is lost. `detlab upload DIR` sends a whole directory. Both open the recording under the id
in run.json, and the server stores a record sent twice once, so an upload after a partly streamed run, or
twice, adds only what is missing.
"""

from __future__ import annotations

import hashlib
import os
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from detlab.core.wire import RECORD, Record, RecordingOpen
from detlab.sdk import store
from detlab.sdk.quiet import httpx

if TYPE_CHECKING:
    from detlab.core.ingest_client import IngestClient

# Records per request; the client halves a batch the server finds too large.
BATCH = 200
# How often a streaming thread looks for new records, and how long it waits after a failed request (doubling).
POLL_S = 0.5
RETRY_S = (1.0, 30.0)


def new_recording_id() -> str:
    return uuid.uuid4().hex


def shared_recording_id(rank: int, world_size: int) -> str:
    """One id for every rank of a run: DETLAB_RECORDING_ID if set; one process: a fresh one; with a process
    group: rank 0's, broadcast; else derived from what torchrun gives every rank of one launch alike."""
    import torch.distributed as dist

    if given := os.environ.get("DETLAB_RECORDING_ID"):
        return given
    if world_size == 1:
        return new_recording_id()
    if dist.is_available() and dist.is_initialized():
        box = [new_recording_id() if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
        return str(box[0])
    launch = [os.environ.get(k, "") for k in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")]
    if not any(launch):
        raise RuntimeError("detlab.Recorder(server=...): several ranks but no process group and no torchrun "
                           "environment to agree on one recording; set DETLAB_RECORDING_ID to one value on "
                           "every rank")
    return hashlib.sha256("\0".join(launch).encode()).hexdigest()[:32]


def recording_id_of(out: Path, manifest: store.Manifest) -> str:
    """The recording's id: run.json's, or for a recording made before ids were written, one derived from its
    start time and name, so that uploading it twice still lands on one run."""
    if manifest.id:
        return manifest.id
    return hashlib.sha256(f"{manifest.started.isoformat()}\0{manifest.name}".encode()).hexdigest()[:32]


def resolve_token(token: str | None) -> str | None:
    """`token`, else DETLAB_TOKEN: an API token with scope ingest, or the server's ingest token. None when
    neither is set: a server in auth mode none (`detlab up`, loopback only) takes records without one, any
    other answers 401 and says what to send."""
    return token or os.environ.get("DETLAB_TOKEN") or None


def client(server: str, token: str | None, *, retries: int = 2) -> IngestClient:
    from detlab.core.ingest_client import IngestClient

    return IngestClient(server, resolve_token(token), retries=retries, timeout_s=30.0)


class Tail:
    """The complete records a growing file holds past what was already taken."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def peek(self, limit: int = BATCH) -> tuple[list[Record], int]:
        """Up to `limit` new records and the offset just past them (a line being written is left)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self.offset)
                chunk = f.read(64 << 20)
        except FileNotFoundError:
            return [], self.offset
        records: list[Record] = []
        used = 0
        for line in chunk.splitlines(keepends=True):
            if not line.endswith(b"\n") or len(records) == limit:
                break
            used += len(line)
            if line.strip():
                records.append(RECORD.validate_json(line))
        return records, self.offset + used


def _retryable(exc: BaseException) -> bool:
    from detlab.core.ingest_client import Unavailable

    return isinstance(exc, httpx.TransportError | Unavailable)


class Streamer(threading.Thread):
    """Sends one rank's record file to the server as it grows (online mode)."""

    def __init__(self, server: str, token: str | None, opening: RecordingOpen, path: Path, rank: int) -> None:
        super().__init__(name=f"detlab-stream-{rank}", daemon=True)
        self.server, self.opening, self.rank = server, opening, rank
        self._client = client(server, token)
        self._tail = Tail(path)
        self._done = threading.Event()  # the file is complete: send the rest, then stop
        self._give_up = threading.Event()  # give up now (finish ran out of time)
        self.run_id: int | None = None
        self.attempt = 1
        self.problem: str | None = None  # why streaming stopped for good (a refused token, a refused record)
        self.start()

    def run(self) -> None:
        wait = RETRY_S[0]
        while self.problem is None and not self._give_up.is_set():
            try:
                if self.run_id is None:
                    opened = self._client.open_recording(self.opening)
                    self.run_id, self.attempt = opened.run_id, opened.attempt
                records, end = self._tail.peek()
                if records:
                    self._client.records(self.run_id, self.attempt, records)
                    self._tail.offset = end
                    wait = RETRY_S[0]
                elif self._done.is_set():
                    return
                else:
                    self._done.wait(POLL_S)
            except Exception as exc:  # noqa: BLE001 - the loop must never see the network's troubles
                if not _retryable(exc):
                    self.problem = f"{type(exc).__name__}: {exc}"
                    return
                self._give_up.wait(wait)  # the server is down or busy: the file keeps the records meanwhile
                wait = min(wait * 2, RETRY_S[1])

    def sent_all(self) -> bool:
        return self.run_id is not None and not self._tail.peek(1)[0]

    def finish(self, status: Literal["succeeded", "failed"], error: str | None, timeout_s: float) -> bool:
        """Send what is left (the file is complete) for up to `timeout_s`, then close this rank of the
        recording; False when the server does not have everything (the file keeps it: `detlab upload`)."""
        self._done.set()
        self.join(timeout_s)
        self._give_up.set()
        if self.is_alive() or self.problem is not None or not self.sent_all():
            return False
        assert self.run_id is not None
        try:
            self._client.close_recording(self.run_id, self.rank, status, error)
        except Exception:  # noqa: BLE001 - reported as not sent; `detlab upload` closes it later
            return False
        return True


@dataclass
class Uploaded:
    job_id: int
    run_id: int
    records: int
    status: str


def upload(out: Path, server: str, token: str | None = None, name: str | None = None) -> Uploaded:
    """Send a recording directory: open its run (the same one if it was streamed or uploaded before), send
    every rank's records, close every rank as the recording ended. A recording the server already has whole
    (closed by every rank) is left as it is. Raises store.RecordsError for a directory
    that is not a recording, and the client's errors for a server that refuses or cannot be reached."""
    manifest = store.read_manifest(out)
    files = store.rank_files(out)
    opening = RecordingOpen(recording=recording_id_of(out, manifest), name=name or manifest.name,
                            tags=manifest.tags, world_size=manifest.world_size)
    api = client(server, token, retries=5)
    opened = api.open_recording(opening)
    if opened.status != "running":  # uploaded before, or streamed whole: every rank closed it
        return Uploaded(job_id=opened.job_id, run_id=opened.run_id, records=0, status=opened.status)
    sent = 0
    for _rank, path in sorted(files.items()):
        tail = Tail(path)
        while True:
            records, end = tail.peek()
            if not records:
                break
            api.records(opened.run_id, opened.attempt, records)
            sent += len(records)
            tail.offset = end
    status: Literal["succeeded", "failed"] = "succeeded" if manifest.status == "finished" else "failed"
    error = None if status == "succeeded" else {
        "failed": "the recording was closed by an exception",
        "running": "the recording never closed (it crashed, or was uploaded while it ran)"}[manifest.status]
    final = ""
    for rank in range(manifest.world_size):
        if rank in files:
            final = api.close_recording(opened.run_id, rank, status, error)
        else:
            final = api.close_recording(opened.run_id, rank, "failed", f"rank {rank} wrote no records")
    return Uploaded(job_id=opened.job_id, run_id=opened.run_id, records=sent, status=final)
