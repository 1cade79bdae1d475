"""Workers as the server sees them: heartbeats, which are alive, and which workloads they offer."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import RUNNING, Run, Worker, utcnow
from detlab.core.wire import Heartbeat
from detlab.core.workloads import BUILTIN, WorkloadInfo


def as_utc(ts: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; all of ours are UTC.
    return ts if ts is None or ts.tzinfo else ts.replace(tzinfo=UTC)


def heartbeat(*, session: Session, beat: Heartbeat) -> None:
    worker = session.get(Worker, beat.worker)
    info = {**beat.info.model_dump(), "run_id": beat.run_id}  # the reconciler reads run_id: busy or idle
    if worker is None:
        session.add(Worker(name=beat.worker, queue=beat.queue, info=info))
    else:
        worker.queue, worker.last_seen, worker.info = beat.queue, utcnow(), info
    if beat.run_id is not None:
        run = session.get(Run, beat.run_id)
        if run is not None and run.status == RUNNING and run.attempt == beat.attempt:
            run.heartbeat_at = utcnow()


def live_workers(*, session: Session, within_s: float) -> list[Worker]:
    since = utcnow() - timedelta(seconds=within_s)
    return [w for w in session.scalars(select(Worker)) if as_utc(w.last_seen) >= since]


def known_workloads(*, session: Session) -> dict[str, WorkloadInfo]:
    """The built-ins, and every workload a worker has advertised (a stale worker's stay known: its
    queue keeps the runs until a worker with that workload comes back)."""
    known = dict(BUILTIN)
    for info in session.scalars(select(Worker.info)):
        for item in (info or {}).get("workloads") or []:
            try:
                workload = WorkloadInfo.model_validate(item)
            except ValidationError:
                continue  # an older or foreign worker's description is not trusted to validate jobs
            known.setdefault(workload.name, workload)
    return known
