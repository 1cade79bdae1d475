"""Database fixtures for the server's tests: the schema on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.app import create_app
from detlab.backend.db import get_session, make_engine
from detlab.backend.models import Base
from detlab.core.settings import Settings, get_settings

LOCAL_URL = "http://localhost"
LOCAL_PEER = ("127.0.0.1", 50000)


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def session(engine: Engine) -> Iterator[Session]:
    with sessionmaker(engine, expire_on_commit=False)() as s:
        yield s


@pytest.fixture
def client(session: Session, settings: Settings) -> Iterator[TestClient]:
    """The API on this test's database and settings (each module defines `settings`), reached as a browser on
    this machine would: Host localhost (an allowed host) from 127.0.0.1 (a trusted proxy address)."""
    app = create_app(reconciler=False, settings=settings)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app, base_url=LOCAL_URL, client=LOCAL_PEER) as c:
        yield c
