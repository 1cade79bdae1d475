"""Idempotency keys of job submissions: a retried submit finds the job its first attempt stored."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta

from sqlalchemy.orm import Session

from detlab.backend.kinds.registry import JobCreate
from detlab.backend.models import IDEMPOTENCY_KEY_LENGTH, IdempotencyKey, Job, utcnow
from detlab.backend.services.workers import as_utc

MAX_KEY_LENGTH = IDEMPOTENCY_KEY_LENGTH
# A key is honoured this long after its first use; later it names a new job.
KEY_LIFETIME = timedelta(days=1)


class KeyReused(ValueError):
    """The key was used, within its lifetime, for a different submission."""


def body_hash(*, data: JobCreate, submitter: str | None) -> str:
    """The submission's digest: its parsed body (key order and spelling of defaults do not count) and who sent it."""
    canonical = json.dumps({"submitter": submitter, "body": data.model_dump(mode="json")}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def find_job(*, session: Session, key: str, digest: str) -> Job | None:
    """The job stored under this key within its lifetime; None if there is none (an expired key is dropped).
    Raises KeyReused when the key came with a different body."""
    row = session.get(IdempotencyKey, key)
    if row is None:
        return None
    created = as_utc(row.created_at)
    if created is None or utcnow() - created > KEY_LIFETIME:
        session.delete(row)
        session.flush()
        return None
    if row.body_hash != digest:
        raise KeyReused(f"Idempotency-Key {key!r} was used for a different submission (job {row.job_id}) "
                        f"in the last {KEY_LIFETIME.days} day(s); send a new key for a new job")
    return session.get(Job, row.job_id)


def remember(*, session: Session, key: str, digest: str, job: Job) -> None:
    """Store the key for the job just created (a concurrent twin's insert fails on the primary key)."""
    session.add(IdempotencyKey(key=key, body_hash=digest, job_id=job.id))
    session.flush()
