"""Database fixtures for the server's tests: the schema on SQLite and on PostgreSQL."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.app import create_app
from detlab.backend.db import get_session, make_engine
from detlab.backend.models import Base
from detlab.core.settings import Settings, get_settings
from detlab.core.wire import LEASE_HEADER

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
        carry_leases(c)
        yield c


_RUN_WRITE = re.compile(r"/api/v1/ingest/runs/(\d+)/(records|commlog|finish)$")


def carry_leases(client: httpx.Client) -> None:
    """Make the client act as a worker does (detlab.core.ingest_client): the lease a claim got is sent with that
    run's later writes and heartbeats, unless a request sets its own X-Detlab-Lease (the lease tests do)."""
    leases: dict[int, str] = {}

    def on_request(request: httpx.Request) -> None:
        if LEASE_HEADER in request.headers:
            return
        if found := _RUN_WRITE.search(request.url.path):
            run_id: int | None = int(found[1])
        elif request.url.path == "/api/v1/ingest/heartbeat":
            try:
                run_id = json.loads(request.content or b"{}").get("run_id")
            except (ValueError, AttributeError):
                run_id = None
        else:
            return
        if isinstance(run_id, int) and run_id in leases:
            request.headers[LEASE_HEADER] = leases[run_id]

    def on_response(response: httpx.Response) -> None:
        found = re.search(r"/api/v1/ingest/runs/(\d+)/claim$", response.request.url.path)
        if found and response.status_code == 200:
            response.read()
            leases[int(found[1])] = response.json()["lease"]

    client.event_hooks = {"request": [on_request], "response": [on_response]}
