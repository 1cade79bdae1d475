"""Responses built from what does not change once stored, kept in memory (per process, least recently used
dropped first) with their gzipped bytes and ETag: a finished job's stored result (a figure of it takes plotly
~0.2 s to build) and the findings matrix until the history changes (reports.matrix.version).

A job's key carries its status and finish time: a job that is settled again (reopened by a re-dispatched
run, then finished with a new result) finishes at a new time (services.jobs.roll_up clears it on reopening),
so it is never answered from the old result. The result itself is not read: a comparison's is hundreds of kB
that PostgreSQL would decompress on every request only to measure it."""

from __future__ import annotations

import gzip
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from detlab.backend.models import FINISHED, Job

MAX_ENTRIES = 128

_lock = threading.Lock()
_entries: OrderedDict[Hashable, Cached] = OrderedDict()


@dataclass(frozen=True)
class Cached:
    """A JSON response body, gzipped once, and its ETag (the bytes' hash)."""

    body: bytes
    gzipped: bytes
    etag: str
    media_type: str = "application/json"

    @classmethod
    def of(cls, body: bytes) -> Cached:
        return cls(body, gzip.compress(body, compresslevel=6, mtime=0), f'"{hashlib.sha256(body).hexdigest()[:32]}"')


def finished_key(*, session: Session, job_id: int) -> Hashable | None:
    """What identifies a finished job's stored result; None while it runs (or has no stored result yet)."""
    row = session.execute(select(Job.status, Job.finished_at, Job.result.is_not(None))
                          .where(Job.id == job_id)).first()
    if row is None or row[0] not in FINISHED or not row[2] or row[1] is None:
        return None
    # The database's URL too: one process may serve (or test) several databases with the same job ids.
    return (str(session.get_bind().engine.url), job_id, row[0], row[1])


def get_or_build(key: Hashable | None, build: Callable[[], bytes]) -> Cached:
    """The response cached under `key`, or built now (and cached when `key` is not None)."""
    if key is None:
        return Cached.of(build())
    with _lock:
        if key in _entries:
            _entries.move_to_end(key)
            return _entries[key]
    item = Cached.of(build())  # outside the lock: two readers may build the same entry once each
    with _lock:
        _entries[key] = item
        while len(_entries) > MAX_ENTRIES:
            _entries.popitem(last=False)
    return item


def clear() -> None:
    with _lock:
        _entries.clear()
