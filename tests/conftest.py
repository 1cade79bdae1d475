"""Fixtures every layer may use: real PostgreSQL and Redis, one fresh database each.

The PostgreSQL database is created on the machine's cluster and dropped after the test; Redis is a
redis-server this session starts on a free port (tests/services.py): the machine's Redis is never touched.
Imports neither the server nor torch, so the core tests run without them."""

from __future__ import annotations

import itertools
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services import RedisServer
from tests.services import free_port as free_port  # where the tests have always imported it from

# A key a report writes that no result model declares (detlab.core.results) fails the tests, not a user's page.
os.environ.setdefault("DETLAB_STRICT_RESULTS", "1")
PG_ADMIN = os.environ.get("DETLAB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Each test that asks for Redis gets a database index never used before in this session: empty without a
# flush. Far more than the suite's Redis tests; Redis allocates little per unused index.
REDIS_DATABASES = 1024
_redis_indexes = itertools.count()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    import psycopg

    name = f"detlab_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'detlab.sqlite3'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """This session's own redis-server, stopped when the session ends."""
    server = RedisServer(folder=tmp_path_factory.mktemp("redis"), databases=REDIS_DATABASES)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A database index of the session's redis-server that no other test used: empty, never flushed."""
    db = next(_redis_indexes)
    assert db < redis_server.databases, f"more than {redis_server.databases} tests used Redis: raise REDIS_DATABASES"
    return redis_server.url(db)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may stop and start again (a broker outage)."""
    server = RedisServer(folder=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
