"""A database outage seen from the API: a 503 with Retry-After on every route (never a 500), and /health naming
the database as down without its address or error text. The PostgreSQL is this test's own, stopped mid-test."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi.testclient import TestClient
from sqlalchemy.orm import sessionmaker

from detlab.backend.app import create_app
from detlab.backend.db import get_session, make_engine
from detlab.backend.models import Base
from detlab.core.settings import Settings, get_settings
from tests.backend.conftest import LOCAL_PEER, LOCAL_URL
from tests.services import PostgresServer


def test_the_api_answers_503_and_health_names_the_database_while_it_is_down(own_postgres: PostgresServer,
                                                                             tmp_path) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(own_postgres.create_database("outage"))
    Base.metadata.create_all(engine)
    settings = Settings(data_dir=tmp_path, ingest_token="t" * 32)
    app = create_app(reconciler=False, settings=settings)

    def session() -> Iterator:  # type: ignore[type-arg]
        with sessionmaker(engine)() as s:
            yield s

    app.dependency_overrides[get_session] = session
    app.dependency_overrides[get_settings] = lambda: settings
    with TestClient(app, base_url=LOCAL_URL, client=LOCAL_PEER) as client:
        assert client.get("/api/v1/jobs").status_code == 200
        own_postgres.stop()
        for path in ("/api/v1/jobs", "/api/v1/live", "/api/v1/jobs/1"):
            down = client.get(path)
            assert down.status_code == 503, (path, down.text)
            assert int(down.headers["retry-after"]) > 0
            assert str(own_postgres.port) not in down.text
        health = client.get("/api/v1/health")
        assert health.status_code == 503
        assert health.json()["database"] == "unreachable"
        assert str(own_postgres.port) not in health.text and "127.0.0.1" not in health.text
        own_postgres.start()
        assert client.get("/api/v1/jobs").status_code == 200  # back without a restart of the API
    engine.dispose()
