"""Ingest: the authenticated path by which workers and the SDK report runs.

Bodies and replies are the wire contract (detlab.core.wire): a malformed record is a 422 naming its
field before anything is stored."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import APIRouter, HTTPException

from detlab.backend.api.deps import IngestAuth, IngestIdentityDep, RunId, SessionDep, SettingsDep
from detlab.backend.models import Run, utcnow
from detlab.backend.services import ingest, recordings, workers
from detlab.backend.services.dispatch import send, undispatch
from detlab.core.wire import (
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
    # Row lock on PostgreSQL so two workers cannot claim or finish one run at once.
    run = session.get(Run, run_id, with_for_update=session.get_bind().dialect.name == "postgresql")
    if run is None:
        raise HTTPException(404, f"no run {run_id}")
    return run


@contextmanager
def as_http_errors() -> Iterator[None]:
    """A run in the wrong state is a 409 (the worker stops); a record the run cannot take a 422."""
    try:
        yield
    except ingest.Conflict as exc:
        raise HTTPException(409, str(exc)) from exc
    except ValueError as exc:
        raise HTTPException(422, str(exc)) from exc


@router.post("/runs/{run_id}/claim", response_model=RunSpec)
def claim_run(run_id: RunId, body: Claim, session: SessionDep, settings: SettingsDep) -> RunSpec:
    with as_http_errors():
        spec = ingest.claim(session=session, run=_run(session, run_id), worker=body.worker,
                            stale_after_s=settings.run_stale_after_s)
    session.commit()
    return spec


@router.post("/runs/{run_id}/records", response_model=RecordsAccepted)
def add_records(run_id: RunId, batch: RecordsBatch, session: SessionDep) -> RecordsAccepted:
    with as_http_errors():
        accepted = ingest.add_records(session=session, run=_run(session, run_id), batch=batch)
    session.commit()
    return RecordsAccepted(accepted=accepted)


@router.post("/runs/{run_id}/commlog", response_model=CommLogStored)
def add_comm_log(run_id: RunId, upload: CommLogUpload, session: SessionDep) -> CommLogStored:
    with as_http_errors():
        parsed = ingest.add_comm_log(session=session, run=_run(session, run_id), upload=upload)
    session.commit()
    return CommLogStored(version=parsed.get("version"), library=parsed.get("library"))


@router.post("/runs/{run_id}/finish", response_model=RunStatus)
def finish_run(run_id: RunId, body: Finish, session: SessionDep) -> RunStatus:
    run = _run(session, run_id)
    before = {r.id for r in run.job.runs}
    with as_http_errors():
        ingest.finish(session=session, run=run, attempt=body.attempt, status=body.status, error=body.error)
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
def open_recording(body: RecordingOpen, session: SessionDep, found: IngestIdentityDep) -> RecordingOpened:
    """The run of an SDK recording (created on first open, found again after): records go to
    /runs/{run_id}/records with its attempt, and each rank closes it at /runs/{run_id}/close."""
    with as_http_errors():
        run = recordings.open_recording(session=session, body=body, submitter=found.name if found else None)
    session.commit()
    return RecordingOpened(job_id=run.job_id, run_id=run.id, attempt=run.attempt, status=run.status)


@router.post("/runs/{run_id}/close", response_model=RunStatus)
def close_recording(run_id: RunId, body: RecordingClose, session: SessionDep) -> RunStatus:
    run = _run(session, run_id)
    with as_http_errors():
        recordings.close_rank(session=session, run=run, body=body)
    session.commit()
    return RunStatus(status=run.status)


@router.post("/heartbeat", response_model=HeartbeatAck)
def heartbeat(beat: Heartbeat, session: SessionDep) -> HeartbeatAck:
    ack = workers.heartbeat(session=session, beat=beat)  # stop=True: the run it named was cancelled or moved on
    session.commit()
    return ack
