"""Engine and sessions. SQLite (embedded) and PostgreSQL (distributed) through one code path."""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from detlab.core.settings import get_settings

# Connections kept open: a page's readers at once (20), and as many again opened when busier (anyio runs up
# to 40 sync routes at once), closed on return.
POOL_SIZE, POOL_OVERFLOW = 20, 20


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
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


def get_session() -> Iterator[Session]:
    with get_sessionmaker()() as session:
        yield session
