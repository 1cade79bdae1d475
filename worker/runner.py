"""Executes one run: claims it, launches W ranks torchrun-style, streams their spools to ingest.

Plain functions, tested without Celery. A rank that exits non-zero or stops making progress fails
the run with its stderr tail; records already streamed stay.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from detlab.core.configs import env_error
from detlab.worker.client import IngestClient, Stale

BATCH = 200
POLL_S = 0.2
RANK_PROGRAMS = {"train": "detlab.worker.ranks.train", "collective": "detlab.worker.ranks.collective"}
# A log over this is cut to its head and tail: INIT facts sit at the top, the last TUNING lines at the end.
LOG_CAP_BYTES = 8 << 20
NCCL_DEBUG_DEFAULTS = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"}


@dataclass
class Current:
    """The run this worker process is executing, read by the heartbeat thread."""

    run_id: int | None = None
    attempt: int | None = None


CURRENT = Current()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """For Popen's preexec_fn: the child gets `sig` when its parent dies, however the parent died.

    A SIGKILLed worker must not leave ranks training into a spool nobody reads."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(1, sig)  # PR_SET_PDEATHSIG


def rank_env(spec: dict[str, Any], rank: int, port: int, log_dir: Path) -> dict[str, str]:
    # The API validated these at submission; checked again here so a worker never launches a rank
    # with a variable outside the allow-list, whoever sent the spec.
    refused = [problem for name, value in spec["env"].items() if (problem := env_error(name, value))]
    if refused:
        raise ValueError("refusing the run's environment: " + "; ".join(refused))
    env = {**os.environ, **NCCL_DEBUG_DEFAULTS}
    env.update(spec["env"])  # the config's allow-listed knobs, to the children only
    env.update({"NCCL_DEBUG_FILE": str(log_dir / f"nccl-rank{rank}.log"),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                "LOCAL_RANK": str(rank), "WORLD_SIZE": str(spec["world_size"]),
                "LOCAL_WORLD_SIZE": str(spec["world_size"]), "PYTHONUNBUFFERED": "1"})
    if spec.get("threads"):
        env["OMP_NUM_THREADS"] = str(spec["threads"])
    return env


@dataclass
class SpoolReader:
    """Reads complete new lines from the ranks' spool files (a torn last line waits for the rest)."""

    folder: Path
    offsets: dict[Path, int] = field(default_factory=dict)

    def read(self) -> list[dict[str, Any]]:
        out = []
        for path in sorted(self.folder.glob("rank*.jsonl")):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.offsets[path] = self.offsets.get(path, 0) + end
            out += [json.loads(line) for line in data[:end].splitlines() if line.strip()]
        return out


def upload_logs(client: IngestClient, run_id: int, attempt: int, folder: Path, world: int) -> None:
    """Send each rank's NCCL/RCCL debug log (none on gloo), cut to head and tail when over the cap."""
    for rank in range(world):
        path = folder / f"nccl-rank{rank}.log"
        if not path.exists():
            continue
        data = path.read_bytes()
        truncated = len(data) > LOG_CAP_BYTES
        if truncated:
            head, tail = data[: LOG_CAP_BYTES // 4], data[-(LOG_CAP_BYTES - LOG_CAP_BYTES // 4) :]
            data = head + b"\n[detlab: log truncated here]\n" + tail
        client.comm_log(run_id, attempt, rank, data, path.stat().st_size, truncated)


def _tail(path: Path, limit: int = 4000) -> str:
    data = path.read_bytes() if path.exists() else b""
    return data[-limit:].decode(errors="replace")


def execute(run_id: int, *, client: IngestClient, worker: str, device: str = "auto",
            hang_timeout_s: float = 300.0) -> str:
    """Run one run to completion; returns its final status ('skipped' when another owns it)."""
    try:
        spec = client.claim(run_id, worker)
    except Stale:
        return "skipped"
    attempt = spec["attempt"]
    CURRENT.run_id, CURRENT.attempt = run_id, attempt
    try:
        status, error = _launch_and_stream(spec, client, device, hang_timeout_s)
        client.finish(run_id, attempt, status, error)
        return status
    except Stale:
        return "skipped"  # replaced by a newer attempt while we ran
    except Exception as exc:  # a refused spec or a worker bug fails the run rather than stranding it
        client.finish(run_id, attempt, "failed", f"worker error: {type(exc).__name__}: {exc}")
        return "failed"
    finally:
        CURRENT.run_id = CURRENT.attempt = None


def _launch_and_stream(spec: dict[str, Any], client: IngestClient, device: str,
                       hang_timeout_s: float) -> tuple[str, str | None]:
    run_id, attempt, world = spec["run_id"], spec["attempt"], int(spec["world_size"])
    with tempfile.TemporaryDirectory(prefix=f"detlab-run{run_id}-") as tmp:
        folder = Path(tmp)
        spec_path = folder / "spec.json"
        spec_path.write_text(json.dumps({**spec, "spool_dir": str(folder), "device": device}))
        port = free_port()
        procs = []
        for rank in range(world):
            with (folder / f"rank{rank}.stderr").open("wb") as err:  # the child keeps its own copy
                procs.append(subprocess.Popen([sys.executable, "-m", RANK_PROGRAMS[spec["kind"]], str(spec_path)],
                                              env=rank_env(spec, rank, port, folder), stdout=err,
                                              stderr=subprocess.STDOUT, preexec_fn=die_with_parent))
        reader = SpoolReader(folder)
        last_progress = time.monotonic()
        failure: str | None = None
        try:
            while True:
                records = reader.read()
                for i in range(0, len(records), BATCH):
                    client.records(run_id, attempt, records[i : i + BATCH])
                if records:
                    last_progress = time.monotonic()
                codes = [p.poll() for p in procs]
                bad = [r for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    rank = bad[0]
                    failure = (f"rank {rank} exited with code {codes[rank]}; its output ends:\n"
                               f"{_tail(folder / f'rank{rank}.stderr')}")
                    break
                if all(c == 0 for c in codes):
                    break
                if time.monotonic() - last_progress > hang_timeout_s:
                    failure = f"no progress from any rank for {hang_timeout_s:.0f} s; killed"
                    break
                time.sleep(POLL_S)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
            for p in procs:
                p.wait()
        rest = reader.read()  # what ranks wrote before exiting or being killed is kept
        for i in range(0, len(rest), BATCH):
            client.records(run_id, attempt, rest[i : i + BATCH])
        upload_logs(client, run_id, attempt, folder, world)
        return ("failed", failure) if failure else ("succeeded", None)
