"""Workers as the server sees them: heartbeats, which are alive, and which workloads they offer."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import FINISHED, RUNNING, Run, Worker, utcnow
from detlab.backend.services.leases import Forbidden, holds_lease
from detlab.core import preflight
from detlab.core.wire import Heartbeat, HeartbeatAck, WorkerCapacity, WorkerInfo
from detlab.core.workloads import BUILTIN, WorkloadInfo


def as_utc(ts: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; all of ours are UTC.
    return ts if ts is None or ts.tzinfo else ts.replace(tzinfo=UTC)


def heartbeat(*, session: Session, beat: Heartbeat, lease: str | None = None) -> HeartbeatAck:
    """Record that the worker is alive (and its last report of what it offers); the reply tells it to stop
    the run it named when that run is no longer its to execute: cancelled, finished or taken over. Keeping a run
    alive needs its attempt's lease (Forbidden otherwise): no one else can hold a run that its worker lost."""
    worker = session.get(Worker, beat.worker)
    info = {**beat.info.model_dump(), "run_id": beat.run_id}  # the reconciler reads run_id: busy or idle
    if worker is None:
        session.add(Worker(name=beat.worker, queue=beat.queue, info=info))
    else:
        worker.queue, worker.last_seen, worker.info = beat.queue, utcnow(), info
    if beat.run_id is None:
        return HeartbeatAck(ok=True)
    run = session.get(Run, beat.run_id)
    if run is None:
        return HeartbeatAck(ok=True, stop=True, reason=f"run {beat.run_id} does not exist")
    if run.status in FINISHED:
        return HeartbeatAck(ok=True, stop=True, reason=f"run {run.id} is {run.status}")
    if run.attempt != beat.attempt:
        return HeartbeatAck(ok=True, stop=True, reason=f"run {run.id} is on attempt {run.attempt}, not {beat.attempt}")
    if run.status == RUNNING:
        if not holds_lease(run, lease):
            raise Forbidden(f"run {run.id} attempt {run.attempt} is leased to the worker that claimed it: "
                            "a heartbeat for it needs its lease (X-Detlab-Lease)")
        run.heartbeat_at = utcnow()
    return HeartbeatAck(ok=True)


def live_workers(*, session: Session, within_s: float, queue: str | None = None) -> list[Worker]:
    """Workers (of one queue, if given) that have beaten within the last `within_s` seconds."""
    since = utcnow() - timedelta(seconds=within_s)
    query = select(Worker) if queue is None else select(Worker).where(Worker.queue == queue)
    return [w for w in session.scalars(query) if as_utc(w.last_seen) >= since]


def capacity(worker: Worker) -> WorkerCapacity | None:
    """The worker's last report of how many ranks it can launch; None when it did not say."""
    try:
        return WorkerInfo.model_validate({k: v for k, v in (worker.info or {}).items() if k != "run_id"}).capacity
    except ValidationError:
        return None  # an older or foreign worker's report is not trusted to refuse jobs


@dataclass(frozen=True)
class QueueState:
    """What the server knows of a queue's workers: how many are alive, and the largest world size the
    workers it has seen there can run (their last reports; None when none said)."""

    queue: str
    live: int
    seen: int
    max_world_size: int | None
    limit: str | None  # the largest report in words, naming the node

    def note(self) -> str | None:
        """Why a job on this queue may wait, in words; None when a worker is alive."""
        if self.live:
            return None
        start = f"start one with `detlab worker --queue {self.queue}`"
        if not self.seen:
            return f"no worker has ever been seen on queue {self.queue!r}: the job waits until one starts ({start}), " \
                   "and its world size could not be checked against what that worker can run"
        return f"no live worker on queue {self.queue!r} (its {self.seen} known worker(s) are silent): " \
               f"the job waits until one comes back ({start})"


def queue_state(*, session: Session, queue: str, within_s: float) -> QueueState:
    """The live workers of the queue and the capacity they report. With none alive, the last reports of
    the workers seen there stand in (a node restarting is still the node that will run the job)."""
    seen = list(session.scalars(select(Worker).where(Worker.queue == queue)))
    live = live_workers(session=session, within_s=within_s, queue=queue)
    reports = [(w.name, cap) for w in (live or seen) if (cap := capacity(w)) is not None]
    if not reports:
        return QueueState(queue=queue, live=len(live), seen=len(seen), max_world_size=None, limit=None)
    name, best = max(reports, key=lambda item: item[1].max_world_size)
    return QueueState(queue=queue, live=len(live), seen=len(seen), max_world_size=best.max_world_size,
                      limit=f"{best.describe()} on {name}")


def queue_device(*, session: Session, queue: str) -> Literal["cuda", "cpu"] | None:
    """Where the queue's runs execute, as its workers last reported: cuda when any of them runs on GPUs, cpu when
    all that said run on CPUs, None when none said."""
    devices = {cap.device for w in session.scalars(select(Worker).where(Worker.queue == queue))
               if (cap := capacity(w)) is not None}
    return "cuda" if "cuda" in devices else "cpu" if devices else None


def queue_context(*, session: Session, queue: str, ops: frozenset[str]) -> preflight.Context:
    """What preflight may know of a queue: its device (queue_device) and, of its GPU workers, the oldest torch that
    reports its version, with its CUDA runtime (a run may land on any of them; the oldest is the one a
    version-bound rule concerns). Versions not reported stay None: the rules that need them do not fire."""
    caps = [cap for w in session.scalars(select(Worker).where(Worker.queue == queue))
            if (cap := capacity(w)) is not None and cap.device == "cuda" and cap.torch]
    oldest = min(caps, key=lambda c: preflight.version(c.torch) or (1 << 30, 0), default=None)
    return preflight.Context(ops=ops, device=queue_device(session=session, queue=queue),
                             torch=oldest.torch if oldest else None, cuda=oldest.cuda if oldest else None)


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
