"""Engine and sessions. SQLite (embedded) and PostgreSQL (distributed) through one code path."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from detlab.core.settings import get_settings

# Connections kept open: a page's readers at once (20), and as many again opened when busier (anyio runs up
# to 40 sync routes at once), closed on return.
POOL_SIZE, POOL_OVERFLOW = 20, 20


def private_sqlite_file(url: str) -> None:
    """Create the SQLite file of `url` readable by its owner only (it holds password hashes and every record),
    and take group and world access from one made before; -wal and -shm files get the same mode from SQLite."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return
    path = Path(database)
    if path.parent.is_dir():
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, 0o600))
        with contextlib.suppress(OSError):  # another user's file: leave it as it is
            path.chmod(path.stat().st_mode & 0o700)


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        private_sqlite_file(url)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            # WAL lets the page poll while the ingest path writes; FKs are off by default in SQLite.
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    # With the default 5 kept (+10 overflow), 20 concurrent readers opened a PostgreSQL session (a forked
    # backend) for one request in five.
    return create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)


@lru_cache
def get_engine() -> Engine:
    return make_engine(get_settings().resolved_database_url())


@lru_cache
def get_sessionmaker() -> sessionmaker[Session]:
    return sessionmaker(get_engine(), expire_on_commit=False)


def locking(session: Session) -> bool:
    """Make what this transaction reads from here on stay as read until it commits, so that two requests changing
    one run (a claim, a cancel, two ranks closing one recording) wait for each other instead of one overwriting
    the other. PostgreSQL locks rows: True, and the caller reads them FOR UPDATE. SQLite has no row locks and
    reads outside a transaction: its write lock is taken now (BEGIN IMMEDIATE; a concurrent writer waits up to
    busy_timeout), and False."""
    if session.get_bind().dialect.name == "postgresql":
        return True
    connection = session.connection()
    driver = connection.connection.driver_connection
    if driver is not None and not driver.in_transaction:  # already writing: the lock is held
        connection.exec_driver_sql("BEGIN IMMEDIATE")  # through SQLAlchemy: a timeout is its OperationalError
    return False


def get_session() -> Iterator[Session]:
    with get_sessionmaker()() as session:
        yield session
