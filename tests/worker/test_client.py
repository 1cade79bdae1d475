"""The worker's ingest client against a live API on loopback (uvicorn in a thread, SQLite): a batch of
records over the API's body cap is split until it fits, and every record is stored once."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session, sessionmaker

from detlab.core.ingest_client import IngestClient, IngestError, TooLarge
from detlab.core.settings import Settings
from detlab.core.wire import StepRecord, TensorInfo, TensorsRecord
from tests.conftest import free_port

TOKEN = "t" * 32
CAP = 64 * 1024  # the API's body cap in this test: a few dozen records of a 100-tensor model
TENSORS = 100


@pytest.fixture
def engine(sqlite_url: str) -> Iterator[Engine]:
    from detlab.backend.db import make_engine
    from detlab.backend.models import Base

    eng = make_engine(sqlite_url)
    Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


@pytest.fixture
def api_url(engine: Engine, tmp_path: Path) -> Iterator[str]:
    """The API with a small body cap, served by uvicorn on a free loopback port."""
    import uvicorn

    from detlab.backend.app import create_app
    from detlab.backend.db import get_session
    from detlab.core.settings import get_settings

    settings = Settings(data_dir=tmp_path, ingest_token=TOKEN, max_body_bytes=CAP)
    app = create_app(reconciler=False, settings=settings)
    factory = sessionmaker(engine, expire_on_commit=False)

    def session() -> Iterator[Session]:
        with factory() as s:
            yield s

    app.dependency_overrides[get_session] = session
    app.dependency_overrides[get_settings] = lambda: settings
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # seconds on a loaded machine; no cost when it starts at once
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def claimed_run(engine: Engine, settings: Settings, client: IngestClient) -> tuple[int, int]:
    from detlab.backend.kinds.registry import JobCreate
    from detlab.backend.services.jobs import create_job

    with sessionmaker(engine)() as session:
        body = {"workload": "mlp", "configs": [{}], "world_size": 2, "steps": 100}
        run_id = create_job(session=session, data=JobCreate.model_validate(body), settings=settings,
                            submitter=None).runs[0].id
        session.commit()
    return run_id, client.claim(run_id, "node:q").attempt


def step(n: int, rank: int) -> StepRecord:
    digests = "".join(f"{(n * 7 + rank * 3 + t) % 2**128:032x}" for t in range(TENSORS))
    return StepRecord(step=n, rank=rank, fp_version="fp1", model_digest="fp1:" + "0" * 32, digests=digests,
                      loss_bits="3f800000", loss=1.0, step_time_s=0.01)


def stored_steps(engine: Engine, run_id: int) -> int:
    from detlab.backend.models import StepRecord as StepRow

    with sessionmaker(engine)() as session:
        return session.scalar(select(func.count()).select_from(StepRow).where(StepRow.run_id == run_id)) or 0


def test_a_batch_over_the_body_cap_is_split_and_every_record_stored(api_url: str, engine: Engine,
                                                                    tmp_path: Path) -> None:
    client = IngestClient(api_url, TOKEN, retries=0)
    run_id, attempt = claimed_run(engine, Settings(data_dir=tmp_path), client)
    tensors = TensorsRecord(tensors=[TensorInfo(index=i, name=f"layer{i}.weight", shape=[8, 8], dtype="float32")
                                     for i in range(TENSORS)])
    records = [tensors, *(step(n, rank) for n in range(1, 61) for rank in range(2))]
    body = len(client._http.build_request("POST", "/", json={"attempt": attempt, "records": [
        r.model_dump(mode="json") for r in records]}).content)
    assert body > 4 * CAP  # the batch as one body is far over the cap

    client.records(run_id, attempt, records)

    assert stored_steps(engine, run_id) == 120


def test_a_single_record_over_the_cap_is_an_error_that_says_so(api_url: str, engine: Engine, tmp_path: Path) -> None:
    client = IngestClient(api_url, TOKEN, retries=0)
    run_id, attempt = claimed_run(engine, Settings(data_dir=tmp_path), client)
    huge = TensorsRecord(tensors=[TensorInfo(index=i, name=f"t{i}" * 60, shape=[1], dtype="float32")
                                  for i in range(1000)])
    with pytest.raises(TooLarge, match="413"):
        client.records(run_id, attempt, [huge])


def test_a_worker_rides_out_an_api_outage_longer_than_a_few_retries(engine: Engine, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's client keeps trying for DETLAB_INGEST_RETRY_S, not for 8 quick retries (about 21 s): an
    API that comes up 25 s after the first try still gets the call."""
    import uvicorn

    from detlab.backend.app import create_app
    from detlab.backend.db import get_session
    from detlab.core.settings import get_settings
    from detlab.worker.tasks import ingest_client

    port = free_port()
    monkeypatch.setenv("DETLAB_API_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("DETLAB_INGEST_TOKEN", TOKEN)
    monkeypatch.setenv("DETLAB_INGEST_RETRY_S", "120")
    get_settings.cache_clear()
    client = ingest_client()
    get_settings.cache_clear()
    settings = Settings(data_dir=tmp_path, ingest_token=TOKEN)
    app = create_app(reconciler=False, settings=settings)
    app.dependency_overrides[get_session] = lambda: sessionmaker(engine, expire_on_commit=False)()
    app.dependency_overrides[get_settings] = lambda: settings
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Timer(25.0, server.run)  # the outage: nothing listens for 25 s
    thread.start()
    try:
        started = time.monotonic()
        ack = client.heartbeat("node:q", "default", None, None)
        assert ack is not None and time.monotonic() - started >= 25
    finally:
        thread.cancel()
        server.should_exit = True
        thread.join(10)


def test_the_client_sends_its_claims_lease_and_another_client_cannot_write_the_run(api_url: str, engine: Engine,
                                                                                  tmp_path: Path) -> None:
    holder = IngestClient(api_url, TOKEN, retries=0)
    run_id, attempt = claimed_run(engine, Settings(data_dir=tmp_path), holder)
    holder.records(run_id, attempt, [step(1, 0)])
    ack = holder.heartbeat("node:q", "default", run_id, attempt, lease=holder.lease(run_id))
    assert (ack.ok, ack.stop) == (True, False)
    other = IngestClient(api_url, TOKEN, retries=0)  # the same worker credential, but it did not claim the run
    with pytest.raises(IngestError, match="403"):
        other.records(run_id, attempt, [step(2, 0)])
    with pytest.raises(IngestError, match="403"):
        other.finish(run_id, attempt, "failed", "not mine")
    assert stored_steps(engine, run_id) == 1


def test_a_worker_sends_its_own_worker_token_when_it_has_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from detlab.core.settings import get_settings
    from detlab.worker.tasks import ingest_client

    monkeypatch.setenv("DETLAB_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("DETLAB_INGEST_TOKEN", TOKEN)
    monkeypatch.setenv("DETLAB_WORKER_TOKEN", "detlab_node-own-token")
    get_settings.cache_clear()
    try:
        assert ingest_client()._http.headers["authorization"] == "Bearer detlab_node-own-token"
    finally:
        get_settings.cache_clear()
