"""The one ingest path: workers (and the SDK) claim runs, stream records, finish runs.

Every write is idempotent: a batch sent twice stores once, and a stale attempt (a worker that was
presumed dead and replaced) is refused rather than mixed into the new attempt's records.
"""

from __future__ import annotations

import base64
import zlib
from datetime import timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from detlab.backend.models import (
    FINISHED,
    RUNNING,
    CollectiveTrial,
    CommLog,
    RankEnv,
    Run,
    StepRecord,
    TensorMeta,
    utcnow,
)
from detlab.backend.schemas import CommLogUpload, RecordsBatch
from detlab.backend.services.settle import settle
from detlab.backend.services.workers import as_utc
from detlab.core import commlog

TRIAL_KEYS = ("op", "dtype", "bytes", "trial", "rank", "digest", "time_s")
TRIAL_OPTIONAL = ("prefix_digest", "err_max_abs", "err_max_ulp", "frac_diff", "impl")
MAX_LOG_BYTES = 16 << 20  # decompressed; the worker truncates before sending


class Conflict(Exception):
    """The request is well formed but the run is not in a state that accepts it."""


def claim(*, session: Session, run: Run, worker: str, stale_after_s: float) -> dict[str, Any]:
    """Start a new attempt of the run and return what the worker needs to execute it."""
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} is already {run.status}")
    beat = as_utc(run.heartbeat_at)
    if run.status == RUNNING and beat and utcnow() - beat < timedelta(seconds=stale_after_s):
        raise Conflict(f"run {run.id} is running on {run.node} (attempt {run.attempt})")
    # A new attempt starts over: the previous attempt's partial records go, so no step is stored twice.
    for model in (StepRecord, RankEnv, TensorMeta, CollectiveTrial, CommLog):
        session.execute(delete(model).where(model.run_id == run.id))
    run.attempt += 1
    run.status, run.node, run.error = RUNNING, worker, None
    run.steps_done = 0
    run.started_at = run.heartbeat_at = utcnow()
    settle(session=session, job=run.job)
    body = run.config.body
    return {
        "run_id": run.id, "attempt": run.attempt, "workload": run.job.workload,
        "kind": "collective" if run.job.workload == "collective" else "train",
        **(run.job.params.get("collective") or {}),  # ops, dtypes, sizes, trials, warmup
        "world_size": run.world_size, "steps": run.steps_total, "seed": body["seed"], "threads": body["threads"],
        "env": body["env"], "torch": body["torch"],
        "fingerprint_interval": run.job.params.get("fingerprint_interval", 1),
        "inject_bitflip": run.job.params.get("inject_bitflip"),
    }


def _insert(session: Session, model: type, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    stmt = (postgresql.insert(model) if dialect == "postgresql" else sqlite.insert(model)).values(rows)
    session.execute(stmt.on_conflict_do_nothing())


def _check_attempt(run: Run, attempt: int) -> None:
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} is already {run.status}")
    if attempt != run.attempt:
        raise Conflict(f"attempt {attempt} is stale: run {run.id} is on attempt {run.attempt}")


def add_records(*, session: Session, run: Run, batch: RecordsBatch) -> int:
    """Store a batch of spool records; returns how many were accepted (duplicates are ignored)."""
    _check_attempt(run, batch.attempt)
    steps: list[dict[str, Any]] = []
    envs: list[dict[str, Any]] = []
    tensors: list[dict[str, Any]] = []
    trials: list[dict[str, Any]] = []
    for rec in batch.records:
        kind = rec.get("type")
        try:
            if kind == "step":
                steps.append({"run_id": run.id, "attempt": batch.attempt, "step": int(rec["step"]),
                              "rank": int(rec["rank"]), "fp_version": str(rec["fp_version"]),
                              "model_digest": str(rec["model_digest"]), "digests": bytes.fromhex(rec["digests"]),
                              "loss_bits": str(rec["loss_bits"]), "step_time_s": float(rec["step_time_s"]),
                              "loss": None if rec.get("loss") is None else float(rec["loss"])})
            elif kind == "env":
                envs.append({"run_id": run.id, **{k: rec.get(k) for k in (
                    "rank", "host", "device", "driver", "cuda", "hip", "torch", "nccl", "backend")},
                    "effective_env": rec.get("effective_env") or {}, "torch_flags": rec.get("torch_flags") or {}})
                run.fingerprint_impl = rec.get("fingerprint_impl") or run.fingerprint_impl
                run.device = str(rec.get("device") or "")[:32] or run.device
            elif kind == "trial":
                trials.append({"run_id": run.id, **{k: rec[k] for k in TRIAL_KEYS},
                               **{k: rec.get(k) for k in TRIAL_OPTIONAL}})
            elif kind == "tensors":
                tensors += [{"run_id": run.id, "index": int(t["index"]), "name": str(t["name"]),
                             "shape": list(t["shape"]), "dtype": str(t["dtype"])} for t in rec["tensors"]]
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad {kind} record: {exc}") from exc
    _insert(session, StepRecord, steps)
    _insert(session, RankEnv, envs)
    _insert(session, TensorMeta, tensors)
    _insert(session, CollectiveTrial, trials)
    if steps:
        run.steps_done = max(run.steps_done, max(s["step"] for s in steps))
    if trials:  # a collective run's progress: (op, dtype, size) cells that rank 0 finished
        cells = select(CollectiveTrial.op, CollectiveTrial.dtype, CollectiveTrial.bytes).where(
            CollectiveTrial.run_id == run.id, CollectiveTrial.rank == 0).distinct().subquery()
        run.steps_done = session.scalar(select(func.count()).select_from(cells)) or 0
    run.heartbeat_at = utcnow()
    return len(batch.records)


def add_comm_log(*, session: Session, run: Run, upload: CommLogUpload) -> dict[str, Any]:
    """Store one process's NCCL/RCCL log (compressed) with its parsed facts."""
    _check_attempt(run, upload.attempt)
    try:
        raw = base64.b64decode(upload.zlib_b64, validate=True)
        inflater = zlib.decompressobj()
        text = inflater.decompress(raw, MAX_LOG_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"log is over {MAX_LOG_BYTES} bytes decompressed")
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"bad log upload: {exc}") from exc
    parsed = commlog.parse(text.decode("utf-8", errors="replace"))
    _insert(session, CommLog, [{"run_id": run.id, "rank": upload.rank, "raw": raw, "raw_bytes": upload.raw_bytes,
                                "truncated": upload.truncated, "parsed": parsed}])
    return parsed


def finish(*, session: Session, run: Run, attempt: int, status: str, error: str | None) -> None:
    if run.status in FINISHED and run.attempt == attempt:
        return  # a retried finish
    _check_attempt(run, attempt)
    run.status, run.error, run.finished_at = status, error, utcnow()
    settle(session=session, job=run.job)
