"""Recordings: runs of a team's own training, made by `detlab.Recorder` and streamed (online mode) or
uploaded later (`detlab upload`).

A recording is a job of kind "recording" with one run, opened already running at attempt 1. No worker runs
it and nothing dispatches or re-dispatches it (the reconciler leaves it alone): the SDK sends its records
through the same ingest path a worker uses, so they are stored, deduplicated and compared the same way. Its
config is "recorded": what the run was configured with is in its ranks' environment records. It finishes
when every rank of its world has closed, failed if one failed; a recording whose process died unclosed stays
running until it is cancelled, and its records so far are kept.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from detlab.backend.models import FAILED, FINISHED, RECORDING, RUNNING, SUCCEEDED, Job, Run, utcnow
from detlab.backend.services.ingest import Conflict
from detlab.backend.services.jobs import get_or_create_config, set_tags
from detlab.backend.services.leases import Forbidden, Writer, check_writer
from detlab.backend.services.settle import settle
from detlab.core import configs, wire

CONFIG_NAME = "recorded"


def _found(session: Session, body: wire.RecordingOpen, submitter: str | None) -> Run | None:
    job = session.scalars(select(Job).where(Job.recording == body.recording)).first()
    if job is None:
        return None
    if job.submitter != submitter:  # a recording is its opener's: no one else adds to it or closes it
        raise Forbidden(f"recording {body.recording} was opened by {job.submitter or 'the server token'}: only that "
                        "identity writes it")
    if job.world_size != body.world_size:
        raise Conflict(f"recording {body.recording} was opened with world_size {job.world_size}, not "
                       f"{body.world_size}: one recording is one run of one world")
    return job.runs[0]


def open_recording(*, session: Session, body: wire.RecordingOpen, submitter: str | None) -> Run:
    """The recording's run, created on first open; every later open (another rank, a retry, an upload of the
    same directory) finds it again."""
    run = _found(session, body, submitter)
    if run is not None:
        return run
    config = get_or_create_config(session=session, body=configs.ConfigBody(name=CONFIG_NAME))
    now = utcnow()
    try:
        with session.begin_nested():  # two ranks opening at once: the second one's insert fails (unique)
            job = Job(kind=RECORDING, workload=body.workload, world_size=body.world_size, steps=0, repeats=1,
                      params={"name": body.name}, config_ids=[config.id], status=RUNNING, submitter=submitter,
                      recording=body.recording)
            session.add(job)
            session.flush()
            session.add(Run(job_id=job.id, config_id=config.id, config_index=0, repeat=0,
                            world_size=body.world_size, steps_total=0, status=RUNNING, attempt=1, node="sdk",
                            started_at=now, heartbeat_at=now))
            session.flush()
    except IntegrityError:
        found = _found(session, body, submitter)
        if found is None:
            raise
        return found
    set_tags(session=session, job=job, tags=body.tags)
    session.refresh(job)
    return job.runs[0]


def close_rank(*, session: Session, run: Run, body: wire.RecordingClose, writer: Writer) -> None:
    """Note that one rank is done; when all are, finish the run and settle the job (its result computed)."""
    job = run.job
    if job.kind != RECORDING:
        raise Conflict(f"run {run.id} is not a recording: workers finish it")
    check_writer(run=run, writer=writer)
    if body.rank >= run.world_size:
        raise ValueError(f"rank {body.rank} is outside the recording's world_size {run.world_size}")
    if run.status in FINISHED:
        return  # a retried close, or a rank closing after the recording was cancelled
    closed = {**job.params.get("closed", {}), str(body.rank): [body.status, body.error]}
    job.params = {**job.params, "closed": closed}  # a new dict: the JSON column sees the change
    if len(closed) < run.world_size:
        return
    errors = [f"rank {r}: {e or 'failed'}" for r, (s, e) in sorted(closed.items(), key=lambda kv: int(kv[0]))
              if s == "failed"]
    run.status = FAILED if errors else SUCCEEDED
    run.error = "; ".join(errors)[: wire.MAX_ERROR_CHARS] or None
    run.finished_at = utcnow()
    settle(session=session, job=job)
