"""The one ingest path: workers (and the SDK) claim runs, stream records, finish runs.

Every write is idempotent: a batch sent twice stores once, and a stale attempt (a worker that was
presumed dead and replaced) is refused rather than mixed into the new attempt's records.

A run belongs to its writer. A claim hands out a lease, a secret of that attempt (only its sha256 is kept): only
the holder writes the attempt's records, heartbeats it or finishes it. An SDK recording is written only by the
identity that opened it. A record for a step (or trial, rank, result) that already holds one is an idempotent repeat
when equal and a conflict when not, never a silent first write wins.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import Any

from sqlalchemy import Select, UniqueConstraint, delete, func, select, tuple_
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import (
    FINISHED,
    RUNNING,
    CallsRecord,
    CollectiveTrial,
    CommLog,
    DiagnosisRecord,
    RankEnv,
    Run,
    StepRecord,
    TensorMeta,
    utcnow,
)
from detlab.backend.services import bisect
from detlab.backend.services.leases import Writer, check_writer, new_lease
from detlab.backend.services.settle import settle
from detlab.backend.services.workers import as_utc
from detlab.core import commlog, wire

MAX_LOG_BYTES = 16 << 20  # decompressed; the worker truncates before sending
# Record fields not copied as they are into their table's columns: the ranks write some for their own
# readers (verify-collective), fingerprint_impl goes to the run, and two are converted.
NOT_STORED: dict[type, set[str]] = {
    wire.EnvRecord: {"type", "fingerprint_impl", "torch_flags"},  # torch_flags: a dict, {} when absent
    wire.StepRecord: {"type", "digests", "drift", "state"},  # stored packed, as bytes; state as its JSON
    wire.TrialRecord: {"type", "count", "op_bytes", "world_size", "fp_version"},
}


class Conflict(Exception):
    """The request is well formed but the run is not in a state that accepts it."""


def claim(*, session: Session, run: Run, worker: str, stale_after_s: float) -> wire.RunSpec:
    """Start a new attempt of the run and return what the worker needs to execute it."""
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} is already {run.status}")
    beat = as_utc(run.heartbeat_at)
    if run.status == RUNNING and beat and utcnow() - beat < timedelta(seconds=stale_after_s):
        raise Conflict(f"run {run.id} is running on {run.node} (attempt {run.attempt})")
    # A new attempt starts over: the previous attempt's partial records go, so no step is stored twice.
    for model in (StepRecord, RankEnv, TensorMeta, CollectiveTrial, CommLog, DiagnosisRecord, CallsRecord):
        session.execute(delete(model).where(model.run_id == run.id))
    run.attempt += 1
    run.status, run.node, run.error = RUNNING, worker, None
    run.steps_done = 0
    run.started_at = run.heartbeat_at = utcnow()
    lease = new_lease(run)  # the previous attempt's lease is void from here on
    settle(session=session, job=run.job)
    return run_spec(run).model_copy(update={"lease": lease})


def run_spec(run: Run) -> wire.RunSpec:
    """The claim reply of the run's current attempt, from its stored config and job.

    The config's env is not checked against the allow-list here: the worker checks it before launching,
    so a run whose env a newer allow-list refuses fails with that message instead of never starting."""
    stored = run.job.params.get("collective")  # the job's CollectiveParams and the sizes they give
    collective = {k: v for k, v in stored.items() if k in wire.CollectiveSpec.model_fields} if stored else None
    kind = KINDS[run.job.kind].run_kind(run.job)
    return wire.RunSpec.model_validate({
        **{k: v for k, v in run.config.body.items() if k in ("seed", "threads", "env", "torch")},
        "run_id": run.id, "attempt": run.attempt, "workload": run.job.workload,
        "kind": kind, "collective": collective, "diagnosis": run.job.params.get("diagnosis"),
        "world_size": run.world_size, "steps": run.steps_total,
        "fingerprint_interval": run.job.params.get("fingerprint_interval", 1),
        "inject_bitflip": run.job.params.get("inject_bitflip"),
        "probe_step": bisect.probe_step(run.job),
        "record_collectives": bool(run.job.params.get("record_collectives", False)),
        **KINDS[run.job.kind].run_fields(run),
    })


def _unique_key(model: type) -> tuple[str, ...]:
    """The columns of the table's unique constraint: what names one record within its run."""
    for constraint in model.__table__.constraints:  # type: ignore[attr-defined]
        if isinstance(constraint, UniqueConstraint):
            return tuple(c.name for c in constraint.columns)
    raise TypeError(f"{model.__name__} has no unique constraint")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, memoryview | bytearray):
        a = bytes(a)
    if isinstance(b, memoryview | bytearray):
        b = bytes(b)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True  # a diverged loss sent again is the same NaN
    return bool(a == b)


# Keyed by no rank, these are written alike by several ranks that may each see their own part (an SDK rank's
# tensor list holds its shard's shapes; a diagnosis result its own timings): the first stays, as it always did.
SHARED_BY_RANKS = (TensorMeta, DiagnosisRecord)


def _insert(session: Session, model: type, rows: list[dict[str, Any]]) -> None:
    """Insert the rows; one whose key is stored already must equal the stored row (a repeat, ignored), else the
    whole request is a Conflict: a second, different record for one step never silently loses to the first."""
    if not rows:
        return
    dialect = session.get_bind().dialect.name
    stmt = (postgresql.insert(model) if dialect == "postgresql" else sqlite.insert(model)).values(rows)
    if model in SHARED_BY_RANKS:
        session.execute(stmt.on_conflict_do_nothing())
        return
    key = _unique_key(model)
    columns = [getattr(model, name) for name in key]
    inserted = {tuple(r) for r in session.execute(stmt.on_conflict_do_nothing().returning(*columns))}
    first: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:  # the same key twice in one batch: the later copy must repeat the earlier
        k = tuple(row[name] for name in key)
        if k in first and k in inserted:
            _compare(model, key, k, row, first[k].get)
        first.setdefault(k, row)
    before = [k for k in first if k not in inserted]  # stored by an earlier request
    if not before:
        return
    query: Select[Any] = select(model).where(tuple_(*columns).in_(before)).execution_options(populate_existing=True)
    stored: dict[tuple[Any, ...], Any] = {tuple(getattr(obj, name) for name in key): obj
                                         for obj in session.scalars(query)}
    for row in rows:
        k = tuple(row[name] for name in key)
        if k not in inserted:
            _compare(model, key, k, row, partial(getattr, stored[k]))


def _compare(model: type, key: tuple[str, ...], k: tuple[Any, ...], row: dict[str, Any],
             stored: Callable[[str], Any]) -> None:
    differ = sorted(name for name, value in row.items() if not _same(value, stored(name)))
    if differ:
        what = ", ".join(f"{name} {value}" for name, value in zip(key, k, strict=True) if name != "run_id")
        table = model.__table__.name  # type: ignore[attr-defined]
        raise Conflict(f"run {row['run_id']} already holds a {table} record for {what} "
                       f"that differs in {', '.join(differ)}: a record is stored once, never replaced")


def _check_attempt(run: Run, attempt: int) -> None:
    if run.status in FINISHED:
        raise Conflict(f"run {run.id} is already {run.status}")
    if attempt != run.attempt:
        raise Conflict(f"attempt {attempt} is stale: run {run.id} is on attempt {run.attempt}")


def diagnosis_key(rec: wire.InvarianceRecord | wire.ModelInvarianceRecord | wire.AuditOpRecord) -> str:
    """What names a diagnosis result within its run (a record sent twice is stored once)."""
    match rec:
        case wire.InvarianceRecord():
            return f"{rec.op}/{rec.dtype}/{rec.batch_size}"
        case wire.ModelInvarianceRecord():
            return str(rec.batch_size)
        case wire.AuditOpRecord():
            return rec.op


def _row(run: Run, rec: wire.EnvRecord | wire.StepRecord | wire.TrialRecord) -> dict[str, Any]:
    return {"run_id": run.id, **rec.model_dump(exclude=NOT_STORED[type(rec)])}


def add_records(*, session: Session, run: Run, batch: wire.RecordsBatch, writer: Writer) -> int:
    """Store a batch of spool records; returns how many were accepted (repeats are ignored, conflicts refused).

    The batch was validated field by field on the way in; what is checked here needs the run."""
    _check_attempt(run, batch.attempt)
    check_writer(run=run, writer=writer)
    steps: list[dict[str, Any]] = []
    envs: list[dict[str, Any]] = []
    tensors: list[dict[str, Any]] = []
    trials: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for i, rec in enumerate(batch.records):
        if not isinstance(rec, wire.TensorsRecord) and rec.rank >= run.world_size:
            raise ValueError(f"records.{i}: rank {rec.rank} is outside the run's world_size {run.world_size}")
        match rec:
            case wire.StepRecord():
                drift = rec.drift
                steps.append({**_row(run, rec), "attempt": batch.attempt, "digests": bytes.fromhex(rec.digests),
                              "drift_version": drift and drift.version,
                              "stats": drift and bytes.fromhex(drift.stats),
                              "sketch": drift and bytes.fromhex(drift.sketch),
                              "state": rec.state.model_dump(exclude_none=True) if rec.state else None})
            case wire.EnvRecord():
                envs.append({**_row(run, rec), "torch_flags": rec.torch_flags.model_dump() if rec.torch_flags else {}})
                run.fingerprint_impl = rec.fingerprint_impl or run.fingerprint_impl
                run.device = (rec.device or "")[:32] or run.device
            case wire.TrialRecord():
                trials.append(_row(run, rec))
            case wire.CallsRecord():
                # Compact: [op, dtype, count, group_size] per call, digests packed as bytes.
                calls.append({"run_id": run.id, "step": rec.step, "rank": rec.rank, "fp_version": rec.fp_version,
                              "calls": [[c.op, c.dtype, c.count, c.group_size] for c in rec.calls],
                              "inputs": bytes.fromhex(rec.inputs), "outputs": bytes.fromhex(rec.outputs),
                              "unread": rec.unread})
            case wire.TensorsRecord():
                tensors += [{"run_id": run.id, **t.model_dump()} for t in rec.tensors]
            case wire.InvarianceRecord() | wire.ModelInvarianceRecord() | wire.AuditOpRecord():
                results.append({"run_id": run.id, "type": rec.type, "key": diagnosis_key(rec),
                                "body": rec.model_dump(exclude={"type", "rank"})})
    _insert(session, StepRecord, steps)
    _insert(session, RankEnv, envs)
    _insert(session, TensorMeta, tensors)
    _insert(session, CollectiveTrial, trials)
    _insert(session, DiagnosisRecord, results)
    _insert(session, CallsRecord, calls)
    if steps:
        run.steps_done = max(run.steps_done, max(s["step"] for s in steps))
    if trials:  # a collective run's progress: (op, dtype, size) cells that rank 0 finished
        cells = select(CollectiveTrial.op, CollectiveTrial.dtype, CollectiveTrial.bytes).where(
            CollectiveTrial.run_id == run.id, CollectiveTrial.rank == 0).distinct().subquery()
        run.steps_done = session.scalar(select(func.count()).select_from(cells)) or 0
    if results:  # a diagnosis run's progress: results recorded, of the cells it was sized for
        done = session.scalar(select(func.count()).where(DiagnosisRecord.run_id == run.id)) or 0
        run.steps_done = min(run.steps_total, done)
    run.heartbeat_at = utcnow()
    return len(batch.records)


def add_comm_log(*, session: Session, run: Run, upload: wire.CommLogUpload, writer: Writer) -> dict[str, Any]:
    """Store one process's NCCL/RCCL log (compressed) with its parsed facts."""
    _check_attempt(run, upload.attempt)
    check_writer(run=run, writer=writer)
    try:
        raw = base64.b64decode(upload.zlib_b64, validate=True)
        inflater = zlib.decompressobj()
        text = inflater.decompress(raw, MAX_LOG_BYTES)
        if inflater.unconsumed_tail:
            raise ValueError(f"log is over {MAX_LOG_BYTES} bytes decompressed")
        if not inflater.eof:  # stored as sent and decompressed whole on every read: it must be complete
            raise ValueError("log is not a complete zlib stream (empty or cut short)")
    except (ValueError, zlib.error) as exc:
        raise ValueError(f"bad log upload: {exc}") from exc
    parsed = commlog.parse(text.decode("utf-8", errors="replace"))
    _insert(session, CommLog, [{"run_id": run.id, "rank": upload.rank, "raw": raw, "raw_bytes": upload.raw_bytes,
                                "truncated": upload.truncated, "parsed": parsed}])
    return parsed


def finish(*, session: Session, run: Run, attempt: int, status: str, error: str | None, writer: Writer) -> None:
    if run.status in FINISHED and run.attempt == attempt:
        check_writer(run=run, writer=writer)
        return  # a retried finish
    _check_attempt(run, attempt)
    check_writer(run=run, writer=writer)
    run.status, run.error, run.finished_at = status, error, utcnow()
    settle(session=session, job=run.job)
