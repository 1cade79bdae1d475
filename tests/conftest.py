"""Fixtures every layer may use (real PostgreSQL and Redis, one fresh database each) and the test tiers.

The PostgreSQL database is created on this session's own cluster (started at first use) and dropped after the
test; Redis is a redis-server this session starts on a free port (tests/services.py): the machine's Redis is
never touched.
Imports neither the server nor torch, so the core tests run without them.

Tiers: every test that needs PostgreSQL, Redis, a browser, a whole deployment (tests/e2e), rank processes or
a process of its own (a CLI call, a script: seconds each, importing torch) is marked `slow` here, at collection,
from what it uses; nobody marks it by hand. `make test-fast` runs the rest (`pytest -m "not slow"`);
`make test` runs everything."""

from __future__ import annotations

import inspect
import itertools
import os
import re
import sys
import types
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.services import PostgresServer, RedisServer
from tests.services import free_port as free_port  # where the tests have always imported it from

# A key a report writes that no result model declares (detlab.core.results) fails the tests, not a user's page.
os.environ.setdefault("DETLAB_STRICT_RESULTS", "1")
PG_ADMIN = os.environ.get("DETLAB_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
# The tests' databases live on a PostgreSQL cluster of this session's own (fsync off, tests/services.py), started
# at the first test that needs one: on the machine's cluster each CREATE DATABASE and each commit waits on an fsync
# of a disk that other sessions share (a backend test's database took 0.45-0.6 s there, 0.2 s here). Setting
# DETLAB_TEST_PG puts them on that server instead. The benches (tests/test_bench_*.py) use PG_ADMIN itself.
_session_postgres: list[PostgresServer] = []
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Each test that asks for Redis gets a database index never used before in this session: empty without a
# flush. Far more than the suite's Redis tests; Redis allocates little per unused index.
REDIS_DATABASES = 1024
_redis_indexes = itertools.count()


# ---- tiers -----------------------------------------------------------------------------------------------------
# The reason a test is slow, as a marker of its own (`-m services`, `-m ranks` select them); each also gets `slow`.
# Fixtures that start or reach a service:
SERVICE_FIXTURES = {"pg_url", "redis_url", "redis_server", "own_redis", "own_postgres", "distributed",
                    "shared_distributed"}
# Code that reaches a service or starts ranks without a fixture, looked for in the test, its fixtures and the
# functions of its module that they call (a helper `run()` that calls torchrun makes its callers `ranks`).
SOURCE_SIGNS = {
    "services": re.compile(r"\bPG_ADMIN\b|psycopg\.connect\("),
    "processes": re.compile(r"\bsys\.executable\b|\bsubprocess\.(run|Popen|check_output|check_call|call)\("),
    "ranks": re.compile(r"\bTORCHRUN\b|[\"']torchrun[\"']|\blaunch_ranks\(|\bZygote\(|\bverify\.(launch|main)\("
                        r"|\bmp\.spawn\("),
}
SLOW_MARKERS = {"browser", "faults", "gpu"}
# A deployment's test waits on jobs for minutes by design (the first one of a module starts the shared stack):
# it gets this limit instead of pyproject's 300 s, unless it sets its own.
E2E_TIMEOUT_S = 600  # markers set by hand that put a test in the slow tier too
TIERS = {"both_databases": "a test of the store: on SQLite and on PostgreSQL (others on PostgreSQL only)",
         "slow": "needs PostgreSQL, Redis, a browser, a deployment or processes: not in `make test-fast`",
         "services": "needs PostgreSQL or Redis", "processes": "starts a process of its own (a CLI call, a script)",
         "ranks": "starts rank processes (torchrun, the worker's launcher)",
         "e2e": "a whole deployment (tests/e2e)"}


def _sources(func: Callable[..., object], module: types.ModuleType | None, seen: set[object]) -> Iterator[str]:
    """The source of `func` and of every test helper (a function of a `tests.` module) it names, transitively."""
    func = inspect.unwrap(func)
    if func in seen or not isinstance(func, types.FunctionType):
        return
    seen.add(func)
    try:
        yield inspect.getsource(func)
    except (OSError, TypeError):
        return
    if module is None:
        return
    names = set(func.__code__.co_names) | {n for c in func.__code__.co_consts if isinstance(c, types.CodeType)
                                           for n in c.co_names}
    for name in names:
        called = inspect.unwrap(getattr(module, name, None) or _sources)  # a functools.cache'd helper too
        if isinstance(called, types.FunctionType) and called.__module__.startswith("tests."):
            yield from _sources(called, sys.modules.get(called.__module__), seen)  # imported from another test too


def tier_reasons(item: pytest.Item) -> set[str]:
    """Why `item` is slow: a subset of services, processes, ranks, e2e, browser, faults, gpu (empty: fast)."""
    reasons = {m.name for m in item.iter_markers() if m.name in SLOW_MARKERS}
    if "e2e" in Path(str(item.fspath)).relative_to(ROOT).parts[:2]:
        reasons.add("e2e")
    names = set(getattr(item, "fixturenames", ()))
    callspec = getattr(item, "callspec", None)
    if names & SERVICE_FIXTURES or (callspec is not None and callspec.params.get("db_url") == "postgresql"):
        reasons.add("services")
    if isinstance(item, pytest.Function):
        seen: set[object] = set()
        funcs = [item.obj] + [d.func for n in names for d in item._fixtureinfo.name2fixturedefs.get(n, ())]
        for func in funcs:
            for source in _sources(func, inspect.getmodule(func), seen):
                reasons |= {why for why, sign in SOURCE_SIGNS.items() if sign.search(source)}
    return reasons


def pytest_configure(config: pytest.Config) -> None:
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        reasons = tier_reasons(item)
        for reason in reasons - SLOW_MARKERS:
            item.add_marker(reason)
        if reasons:
            item.add_marker("slow")
        if "e2e" in reasons and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(E2E_TIMEOUT_S))


def pg_admin_url() -> str:
    """The admin URL of the server the tests' databases are made on (the session's own cluster, started now if
    it is not yet; or DETLAB_TEST_PG's)."""
    if "DETLAB_TEST_PG" in os.environ:
        return PG_ADMIN
    if not _session_postgres:
        server = PostgresServer()
        server.init()
        try:
            server.start()
        except BaseException:
            server.destroy()
            raise
        _session_postgres.append(server)
    return _session_postgres[0].admin_url


def pytest_unconfigure(config: pytest.Config) -> None:
    while _session_postgres:
        _session_postgres.pop().destroy()


@contextmanager
def pg_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database, dropped afterwards."""
    import psycopg

    admin = pg_admin_url()
    name = f"detlab_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    with pg_database() as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'detlab.sqlite3'}"


@pytest.fixture
def db_url(request: pytest.FixtureRequest) -> str:
    """The database a test's server stores in: PostgreSQL, as in production; a test of the store itself (its
    module marked `both_databases`) runs on SQLite, the embedded deployment's, too (pytest_generate_tests)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_url" in metafunc.fixturenames:
        both = metafunc.definition.get_closest_marker("both_databases") is not None
        metafunc.parametrize("db_url", ["sqlite", "postgresql"] if both else ["postgresql"], indirect=True)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """This session's own redis-server, stopped when the session ends."""
    server = RedisServer(folder=tmp_path_factory.mktemp("redis"), databases=REDIS_DATABASES)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def unused_redis_url(redis_server: RedisServer) -> str:
    """A database index of the session's redis-server that no one used before: empty, never flushed."""
    db = next(_redis_indexes)
    assert db < redis_server.databases, f"more than {redis_server.databases} tests used Redis: raise REDIS_DATABASES"
    return redis_server.url(db)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """A database index of the session's redis-server that no other test used: empty, never flushed."""
    return unused_redis_url(redis_server)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, which the test may stop and start again (a broker outage)."""
    server = RedisServer(folder=tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster for this module's tests (one database each), removed at the end."""
    server = PostgresServer()
    server.init()
    server.start()
    try:
        yield server
    finally:
        server.destroy()
