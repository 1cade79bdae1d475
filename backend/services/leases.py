"""Who may write a run: the holder of its current attempt's lease, or, for an SDK recording, whoever opened it.

A claim hands out a lease, a random secret of that attempt; only its sha256 is kept (runs.lease_hash), so a copy of
the database writes nothing. Records, heartbeats, comm logs and the finish of the attempt carry it
(wire.LEASE_HEADER); a new claim replaces it, so a worker presumed dead and replaced can no longer write."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from detlab.backend.models import Run


class Forbidden(Exception):
    """The sender is not the run's writer: it lacks the attempt's lease, or did not open the recording."""


@dataclass(frozen=True)
class Writer:
    """Who sends a write: `caller` the ingest token's user (None for the server's DETLAB_INGEST_TOKEN), `worker`
    whether it holds a worker credential, `lease` the lease it sent (None when it sent none)."""

    caller: str | None
    worker: bool
    lease: str | None


def lease_digest(lease: str) -> str:
    return hashlib.sha256(lease.encode()).hexdigest()


def new_lease(run: Run) -> str:
    """A lease for the run's current attempt; the one before is void from now on."""
    lease = secrets.token_urlsafe(32)
    run.lease_hash = lease_digest(lease)
    return lease


def holds_lease(run: Run, lease: str | None) -> bool:
    return bool(lease and run.lease_hash and hmac.compare_digest(lease_digest(lease), run.lease_hash))


def check_writer(*, run: Run, writer: Writer) -> None:
    """Refuse (Forbidden) a write to `run` from anyone but its writer: for a run a worker executes, the holder of
    its current attempt's lease, with a worker credential; for an SDK recording, the identity that opened it.
    Stale attempts are refused (409) before this, so a replaced worker learns it is stale, not forbidden."""
    if run.job.recording is not None:  # an SDK recording's: no worker claims it, its opener writes it
        if writer.caller != run.job.submitter:
            raise Forbidden(f"run {run.id} is the recording of {run.job.submitter or 'the server token'}: only the "
                            "identity that opened it writes it")
        return
    if not writer.worker:
        raise Forbidden(f"run {run.id} is executed by a worker: {writer.caller}'s ingest token may not write it")
    if not holds_lease(run, writer.lease):
        raise Forbidden(f"run {run.id} attempt {run.attempt} is leased to the worker that claimed it: "
                        + ("this lease is not its" if writer.lease else "the request lacks its lease (X-Detlab-Lease)"))
