"""The reconciler: the database says what should be running; re-dispatch what a broker or a dead
worker lost, fail what has been retried enough, settle a job whose last runs finished together. Never leaves a
run or a job stuck."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta

from sqlalchemy import exists, select
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session

from detlab.backend.db import get_sessionmaker, locking
from detlab.backend.kinds.registry import KINDS
from detlab.backend.models import FAILED, QUEUED, RUNNING, Job, Run, utcnow
from detlab.backend.services.dispatch import send, undispatch
from detlab.backend.services.settle import settle
from detlab.backend.services.workers import as_utc, live_workers
from detlab.core.settings import Settings

# Kinds whose runs no worker runs (an SDK recording's): nothing to re-dispatch.
_FED_ELSEWHERE = [name for name, kind in KINDS.items() if not kind.dispatched]

log = logging.getLogger(__name__)


def reconcile(*, session: Session, settings: Settings, store_back_at: datetime | None = None,
              ) -> list[tuple[int, str]]:
    """Fix runs in the session; returns (run_id, queue) pairs to dispatch after the commit.

    `store_back_at`: when the database last came back from an outage. Heartbeats missed while it was down do not
    count (no worker could send one), so a run's silence is measured from then at the earliest: an outage of the
    store neither re-dispatches nor fails the runs that rode it out."""
    now = utcnow()
    # Two runs of a job finishing at once each see the other unfinished, so neither finish settles the job (nor
    # advances a kind that searches in rounds): settled here. Runs a round adds are queued, sent just below.
    unfinished = exists().where(Run.job_id == Job.id, Run.status.in_([QUEUED, RUNNING]))
    for job in session.scalars(select(Job).where(Job.status.in_([QUEUED, RUNNING]), ~unfinished)):
        settle(session=session, job=job)
    stale = timedelta(seconds=settings.run_stale_after_s)
    to_dispatch: list[tuple[int, str]] = []
    workers = live_workers(session=session, within_s=settings.run_stale_after_s)
    idle_queues = {w.queue for w in workers if w.info.get("run_id") is None}
    busy_runs = {w.info.get("run_id") for w in workers}
    # A recording's run is the SDK's to feed and close: no worker runs it, so none is sent one.
    active = select(Run).join(Job).where(Run.status.in_([QUEUED, RUNNING]), Job.kind.not_in(_FED_ELSEWHERE))
    # Locked as a claim or a finish locks its run, so that a worker finishing a run at this moment is not
    # overwritten with `failed` or a re-queue: PostgreSQL passes over a run being written (the next round sees it),
    # SQLite waits for the write and then reads it finished.
    if locking(session):
        active = active.with_for_update(of=Run, skip_locked=True)
    for run in session.scalars(active.execution_options(populate_existing=True)):
        queue = run.job.queue
        if run.status == RUNNING:
            beat = max(as_utc(run.heartbeat_at) or now, store_back_at or datetime.min.replace(tzinfo=UTC))
            if now - beat < stale or run.id in busy_runs:
                continue
            if run.attempt >= settings.max_attempts:
                run.status, run.finished_at = FAILED, now
                run.error = (f"worker {run.node} lost: no heartbeat for {settings.run_stale_after_s:.0f} s; "
                             f"gave up after {run.attempt} attempt(s). Records already sent are kept.")
                settle(session=session, job=run.job)
                continue
            run.status = QUEUED
            run.error = f"attempt {run.attempt} lost (worker {run.node} silent); re-dispatched"
        elif run.dispatched_at is not None and (queue not in idle_queues or now - as_utc(run.dispatched_at) < stale):
            # Still waiting behind other work, or dispatched recently: the message is not lost.
            continue
        run.dispatched_at = now
        to_dispatch.append((run.id, queue))
    return to_dispatch


class ReconcilerThread(threading.Thread):
    """Runs reconcile() every few seconds inside the API process."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(name="detlab-reconciler", daemon=True)
        self.settings = settings
        self.stop = threading.Event()
        self.store_back_at: datetime | None = None  # when the database last came back from an outage
        self._store_down = False

    def run(self) -> None:
        while not self.stop.wait(self.settings.reconcile_interval_s):
            if self._store_down:  # it was down at the last pass: if this pass reaches it, it is back from now
                self.store_back_at = utcnow()
            try:
                with get_sessionmaker()() as session:
                    pending = reconcile(session=session, settings=self.settings, store_back_at=self.store_back_at)
                    session.commit()
                self._store_down = False
                if unsent := send(pending):
                    log.warning("broker down: %d run(s) left unsent for the next pass", len(unsent))
                    with get_sessionmaker()() as session:
                        undispatch(session=session, run_ids=unsent)
                        session.commit()
            except (OperationalError, InterfaceError, PoolTimeout) as exc:  # the store is down: not the runs' fault
                self._store_down = True
                log.warning("reconcile pass: database unavailable (%s); heartbeats missed meanwhile will not count",
                            type(exc).__name__)
            except Exception:  # noqa: BLE001 - a failed pass is retried on the next tick
                log.exception("reconcile pass failed")
