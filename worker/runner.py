"""Executes one run: claims it, launches W ranks torchrun-style, streams their spools to ingest.

Plain functions, tested without Celery. A rank that exits non-zero or stops making progress fails
the run with its stderr tail; records already streamed stay. A run the server cancels is stopped: the
heartbeat's reply (or a 409 to its records) has its ranks' process groups killed.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from detlab.core.configs import env_error
from detlab.core.ingest_client import BadSpec, IngestClient, Stale
from detlab.core.wire import SCRIPT_ENTRIES, SCRIPT_RUN_KINDS, EnvRecord, RankSpec, Record, RunSpec
from detlab.worker.launch import RankFailed, RanksStopped, launch_ranks
from detlab.worker.scripts import registered

log = logging.getLogger(__name__)

BATCH = 200
POLL_S = 0.2
# A log over this is cut to its head and tail: INIT facts sit at the top, the last TUNING lines at the end.
LOG_CAP_BYTES = 8 << 20
NCCL_DEBUG_DEFAULTS = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING"}
# A run's spool folder is `<tmp>/detlab-run<id>-*` holding this file with its worker's pid: the folder of a
# worker that was killed (its ranks die with it) is removed by the next run on the host.
SPOOL_PREFIX = "detlab-run"
OWNER_FILE = "worker.pid"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def remove_dead_spools(root: Path | None = None) -> list[Path]:
    """Remove spool folders under `root` (the temp dir) whose worker process is gone; returns them."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{SPOOL_PREFIX}*"):
        try:
            pid = int((folder / OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue  # not ours, or being created this instant
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


@dataclass
class Current:
    """The run this worker process is executing, read by the heartbeat thread; `stop_reason` is set by that
    thread when the server answers that the run is no longer ours (cancelled, or another attempt's)."""

    run_id: int | None = None
    attempt: int | None = None
    lease: str | None = field(default=None, repr=False)  # the claim's: the heartbeat that keeps the run carries it
    stop_reason: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self, run_id: int | None, attempt: int | None, lease: str | None = None) -> None:
        with self._lock:
            self.run_id, self.attempt, self.lease, self.stop_reason = run_id, attempt, lease, None

    def now(self) -> tuple[int | None, int | None]:
        """(run_id, attempt) of the run executing, read together."""
        with self._lock:
            return self.run_id, self.attempt

    def now_leased(self) -> tuple[int | None, int | None, str | None]:
        """(run_id, attempt, lease) of the run executing, read together."""
        with self._lock:
            return self.run_id, self.attempt, self.lease

    def stop(self, run_id: int, attempt: int | None, reason: str) -> None:
        """Ask the launcher to kill the ranks, if the reply is about the run still executing (a reply about
        the run before is ignored)."""
        with self._lock:
            if (self.run_id, self.attempt) == (run_id, attempt):
                self.stop_reason = reason


CURRENT = Current()


def child_env(spec: RunSpec, rank: int, log_dir: Path) -> dict[str, str]:
    """The environment of a run's rank process, before the launcher's torchrun variables: the worker's
    own, NCCL debug logging on (one file per rank), and the config's allow-listed knobs."""
    # The API validated these at submission; checked again here so a worker never launches a rank
    # with a variable outside the allow-list, whoever sent the spec.
    refused = [problem for name, value in spec.env.items() if (problem := env_error(name, value))]
    if refused:
        raise ValueError("refusing the run's environment: " + "; ".join(refused))
    return {**os.environ, **NCCL_DEBUG_DEFAULTS, **spec.env,  # the config's knobs, to the children only
            "NCCL_DEBUG_FILE": str(log_dir / f"nccl-rank{rank}.log")}


def script_env(spec: RunSpec, folder: Path) -> dict[str, str]:
    """What a registered script's detlab.Recorder reads to record for this run (detlab.sdk.recorder): where to
    write, every how many steps, the config's seed and torch flags, which it applies when it is made, and the
    step a bisect probes (detlab.sdk.probing)."""
    return {"DETLAB_RUN_DIR": str(folder), "DETLAB_EVERY": str(spec.fingerprint_interval),
            "DETLAB_STEPS": str(spec.steps), "DETLAB_SEED": str(spec.seed), "DETLAB_KIND": spec.kind,
            "DETLAB_WORKLOAD": spec.workload,
            **({"DETLAB_DIAGNOSIS": spec.diagnosis.model_dump_json()} if spec.diagnosis else {}),
            **({"DETLAB_TORCH_FLAGS": spec.torch.model_dump_json()} if spec.torch else {}),
            **({"DETLAB_PROBE_STEP": str(spec.probe_step)} if spec.probe_step else {})}


def phases(spec: RankSpec, folder: Path) -> list[tuple[RankSpec, dict[str, str]]]:
    """The launches of one run, each with what its ranks' environment adds: one, except for the resumed run of a
    `resume` job: stopped after step K and checkpointed, then continued in fresh processes from the checkpoint.
    Both launches record into the same folder (the second's records are a resumed segment of the same run); a
    registered script reads DETLAB_RESUME_STEP and DETLAB_CHECKPOINT_DIR, and DETLAB_RESUME=1 in the second."""
    plan = spec.resume
    if plan is None or plan.stop_at is None:
        return [(spec, {})]
    checkpoints = folder / "checkpoint"
    common = {"DETLAB_RESUME_STEP": str(plan.stop_at), "DETLAB_CHECKPOINT_DIR": str(checkpoints)}
    return [(spec.model_copy(update={"resume": plan.model_copy(update={"phase": phase,
                                                                       "checkpoint_dir": str(checkpoints)})}),
             {**common, **({"DETLAB_RESUME": "1"} if phase == "continue" else {})})
            for phase in ("stop", "continue")]


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


def execute(run_id: int, *, client: IngestClient, worker: str, device: Literal["auto", "cpu", "cuda"] = "auto",
            hang_timeout_s: float = 300.0, first_step_timeout_s: float | None = None) -> str:
    """Run one run to completion; returns its final status ('skipped' when another owns it or it was cancelled
    before it started, 'stopped' when the server said to stop it while its ranks ran)."""
    try:
        spec = client.claim(run_id, worker)
    except Stale:
        return "skipped"
    except BadSpec as exc:  # claimed, but not runnable: fail it now rather than leave it to the reconciler
        if exc.attempt is None:
            raise
        client.finish(run_id, exc.attempt, "failed", f"worker error: {exc}")
        return "failed"
    CURRENT.begin(run_id, spec.attempt, spec.lease)
    try:
        status, error = _launch_and_stream(spec, client, device, hang_timeout_s, first_step_timeout_s)
        client.finish(run_id, spec.attempt, status, error)
        return status
    except RanksStopped as exc:  # the server has the run's status already: nothing to finish
        log.info("run %s attempt %s stopped: %s", run_id, spec.attempt, exc)
        return "stopped"
    except Stale:
        return "skipped"  # cancelled, or replaced by a newer attempt, while we ran (its ranks are killed)
    except Exception as exc:  # a refused spec or a worker bug fails the run rather than stranding it
        client.finish(run_id, spec.attempt, "failed", f"worker error: {type(exc).__name__}: {exc}")
        return "failed"
    finally:
        CURRENT.begin(None, None)


def _launch_and_stream(spec: RunSpec, client: IngestClient, device: Literal["auto", "cpu", "cuda"],
                       hang_timeout_s: float, first_step_timeout_s: float | None,
                       ) -> tuple[Literal["succeeded", "failed"], str | None]:
    def send(records: list[Record]) -> None:
        for i in range(0, len(records), BATCH):
            client.records(spec.run_id, spec.attempt, records[i : i + BATCH])

    for gone in remove_dead_spools():
        log.info("removed the spool folder of a dead worker: %s", gone)
    with tempfile.TemporaryDirectory(prefix=f"{SPOOL_PREFIX}{spec.run_id}-") as tmp:
        folder = Path(tmp)
        (folder / OWNER_FILE).write_text(str(os.getpid()))
        failure: str | None = None
        script = registered().get(spec.workload) if spec.kind in SCRIPT_RUN_KINDS else None
        measured: list[bool] = []

        def send_script(records: list[Record]) -> None:
            measured.extend(not isinstance(r, EnvRecord) for r in records)
            send(records)

        try:
            for ranks, extra in phases(RankSpec.for_run(spec, device=device), folder):
                def env(rank: int, extra: dict[str, str] = extra) -> dict[str, str]:
                    return {**child_env(spec, rank, folder), **(script_env(spec, folder) if script else {}), **extra}

                launch_ranks(ranks, folder, env=env, on_records=send_script if script else send,
                             hang_timeout_s=hang_timeout_s, first_step_timeout_s=first_step_timeout_s, poll_s=POLL_S,
                             tie_to_parent=True, stop=lambda: CURRENT.stop_reason,
                             argv=script.command if script else None, cwd=script.workdir if script else None)
        except RankFailed as exc:
            failure = str(exc)
        if script and spec.diagnosis is not None and not failure and not any(measured):
            entry = SCRIPT_ENTRIES[spec.kind]
            failure = (f"{script.name} never called {entry}: a {spec.kind} job of a registered script measures "
                       f"what the script hands to {entry.split('(')[0]} (docs/sdk.md)")
        upload_logs(client, spec.run_id, spec.attempt, folder, spec.world_size)
        return ("failed", failure) if failure else ("succeeded", None)
