"""Ingest: the authenticated path by which workers and the SDK report runs.

Bodies and replies are the wire contract (detlab.core.wire): a malformed record is a 422 naming its
field before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException
from sqlalchemy.orm import Session

from detlab.backend.api.deps import (
    IngestAuth,
    IngestCaller,
    IngestCallerDep,
    RunId,
    SessionDep,
    SettingsDep,
    WorkerCaller,
)
from detlab.backend.db import locking
from detlab.backend.models import Run, utcnow
from detlab.backend.services import ingest, recordings, workers
from detlab.backend.services.dispatch import send, undispatch
from detlab.backend.services.leases import Forbidden, Writer
from detlab.core.wire import (
    LEASE_HEADER,
    Claim,
    CommLogStored,
    CommLogUpload,
    Finish,
    Heartbeat,
    HeartbeatAck,
    RecordingClose,
    RecordingOpen,
    RecordingOpened,
    RecordsAccepted,
    RecordsBatch,
    RunSpec,
    RunStatus,
)

router = APIRouter(prefix="/api/v1/ingest", tags=["ingest"], dependencies=[IngestAuth])


def _run(session: SessionDep, run_id: int) -> Run:
    # Locked so that two writers cannot claim, finish or close one run at once.
    run = session.get(Run, run_id, with_for_update=locking(session) or None, populate_existing=True)
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    return run


# The lease of the attempt a write belongs to, as the claim handed it out (services.leases).
Lease = Annotated[str | None, Header(alias=LEASE_HEADER, max_length=128,
                                     description="the lease the run's claim returned (RunSpec.lease)")]


def writer(caller: IngestCaller, lease: str | None) -> Writer:
    return Writer(caller=caller.name, worker=caller.worker, lease=lease)


@contextmanager
def as_http_errors(session: Session) -> Iterator[None]:
    """A run in the wrong state is a 409 (the worker stops); a sender that is not the run's writer a 403; a record
    the run cannot take a 422. A refused request leaves nothing behind: a batch is stored whole or not at all."""
    try:
        yield
    except (ingest.Conflict, Forbidden, ValueError) as exc:
        session.rollback()
        status = 409 if isinstance(exc, ingest.Conflict) else 403 if isinstance(exc, Forbidden) else 422
        raise HTTPException(status, str(exc)) from exc


@router.post("/runs/{run_id}/claim", response_model=RunSpec)
def claim_run(run_id: RunId, body: Claim, session: SessionDep, settings: SettingsDep, _: WorkerCaller) -> RunSpec:
    """Start a new attempt (a worker credential only); the reply's `lease` is what its later writes carry."""
    with as_http_errors(session):
        spec = ingest.claim(session=session, run=_run(session, run_id), worker=body.worker,
                            stale_after_s=settings.run_stale_after_s)
    session.commit()
    return spec


@router.post("/runs/{run_id}/records", response_model=RecordsAccepted)
def add_records(run_id: RunId, batch: RecordsBatch, session: SessionDep, caller: IngestCallerDep,
                lease: Lease = None) -> RecordsAccepted:
    with as_http_errors(session):
        accepted = ingest.add_records(session=session, run=_run(session, run_id), batch=batch,
                                      writer=writer(caller, lease))
    session.commit()
    return RecordsAccepted(accepted=accepted)


@router.post("/runs/{run_id}/commlog", response_model=CommLogStored)
def add_comm_log(run_id: RunId, upload: CommLogUpload, session: SessionDep, caller: IngestCallerDep,
                 lease: Lease = None) -> CommLogStored:
    with as_http_errors(session):
        parsed = ingest.add_comm_log(session=session, run=_run(session, run_id), upload=upload,
                                     writer=writer(caller, lease))
    session.commit()
    return CommLogStored(version=parsed.get("version"), library=parsed.get("library"))


@router.post("/runs/{run_id}/finish", response_model=RunStatus)
def finish_run(run_id: RunId, body: Finish, session: SessionDep, caller: IngestCallerDep,
               lease: Lease = None) -> RunStatus:
    run = _run(session, run_id)
    before = {r.id for r in run.job.runs}
    with as_http_errors(session):
        ingest.finish(session=session, run=run, attempt=body.attempt, status=body.status, error=body.error,
                      writer=writer(caller, lease))
    session.commit()
    # A finish that ended a round of a kind that searches (Kind.advance) added the next round's runs: sent now, not
    # on the reconciler's next pass (which sends them if this does not get through; a second message for a run
    # is refused at its claim).
    added = [r for r in run.job.runs if r.id not in before]
    if added:
        for new in added:
            new.dispatched_at = utcnow()
        session.commit()
        if unsent := send([(new.id, run.job.queue) for new in added]):
            undispatch(session=session, run_ids=unsent)
            session.commit()
    return RunStatus(status=run.status)


@router.post("/recordings", response_model=RecordingOpened)
def open_recording(body: RecordingOpen, session: SessionDep, caller: IngestCallerDep) -> RecordingOpened:
    """The run of an SDK recording (created on first open, found again after, by the same identity only): records go
    to /runs/{run_id}/records with its attempt, and each rank closes it at /runs/{run_id}/close."""
    with as_http_errors(session):
        run = recordings.open_recording(session=session, body=body, submitter=caller.name)
    session.commit()
    return RecordingOpened(job_id=run.job_id, run_id=run.id, attempt=run.attempt, status=run.status)


@router.post("/runs/{run_id}/close", response_model=RunStatus)
def close_recording(run_id: RunId, body: RecordingClose, session: SessionDep, caller: IngestCallerDep) -> RunStatus:
    run = _run(session, run_id)
    with as_http_errors(session):
        recordings.close_rank(session=session, run=run, body=body, writer=writer(caller, None))
    session.commit()
    return RunStatus(status=run.status)


@router.post("/heartbeat", response_model=HeartbeatAck)
def heartbeat(beat: Heartbeat, session: SessionDep, _: WorkerCaller, lease: Lease = None) -> HeartbeatAck:
    """A worker is alive (a worker credential only); naming a run, it carries that attempt's lease."""
    with as_http_errors(session):
        ack = workers.heartbeat(session=session, beat=beat, lease=lease)  # stop: the run was cancelled or moved on
    session.commit()
    return ack
