"""A bounded schemathesis run over the app's OpenAPI schema, in process (ASGI), on SQLite and PostgreSQL.

Every operation gets a fixed budget of valid and invalid requests, valid ones on the rows seed() made (so
bodies get past the 404 and reach the database) and the schema's own examples; derandomized, so a run is
repeatable. The one check is schemathesis' `not_a_server_error`; a request the app raises on counts as a
server error too, with its exception, so a failure names what broke."""

from __future__ import annotations

import math
import os
import time
import zlib
from collections import Counter
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.app import create_app
from detlab.backend.db import get_session
from detlab.backend.models import Base
from detlab.backend.services import dispatch as dispatch_service
from detlab.core.settings import Settings, get_settings
from detlab.core.wire import LEASE_HEADER

TOKEN = "t" * 32
AUTH = {"Authorization": f"Bearer {TOKEN}"}
WORLD = 2  # ranks of the seeded job's runs
# Per operation and strategy: ~1,150 requests per database, ~12 s. DETLAB_FUZZ_EXAMPLES=300 for a deep run,
# DETLAB_FUZZ_RANDOM=1 for other examples than the fixed ones, DETLAB_FUZZ_STATUSES=1 (with -s) to print
# how many requests of each operation got each status (how deep the examples got).
EXAMPLES = int(os.environ.get("DETLAB_FUZZ_EXAMPLES", "30"))
DERANDOMIZE = os.environ.get("DETLAB_FUZZ_RANDOM", "") != "1"


@pytest.fixture
def settings(tmp_path) -> Settings:  # type: ignore[no-untyped-def]
    # Workers stay live for the whole run, so /health answers 200 rather than its documented 503.
    # schemathesis calls the app as http://testserver.
    return Settings(data_dir=tmp_path, ingest_token=TOKEN, run_stale_after_s=3600,
                    allowed_hosts=["localhost", "testserver"])


@pytest.fixture
def app(engine: Engine, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The app with a session per request (as in production) and no broker: a submit sends nothing."""
    app = create_app(reconciler=False, settings=settings)
    factory = sessionmaker(engine, expire_on_commit=False)

    def session() -> Iterator[Session]:
        with factory() as s:
            yield s

    app.dependency_overrides[get_session] = session
    app.dependency_overrides[get_settings] = lambda: settings
    monkeypatch.setattr(dispatch_service, "dispatch", lambda run_id, queue: None)
    return app


def seed(app: Any, open_client: TestClient | None = None) -> dict[str, str]:
    """A live worker (so /health answers 200) and a job of two runs: run 1 claimed with two steps recorded,
    run 2 queued, so that ids 1 and 2 find rows and the reports have data. Returns what ingest requests send: the
    worker's token and run 1's lease, so that bodies for run 1 reach the database."""
    with nullcontext(open_client) if open_client else TestClient(app) as client:
        beat = {"worker": "w", "queue": "default"}
        assert client.post("/api/v1/ingest/heartbeat", json=beat, headers=AUTH).status_code == 200
        job = {"workload": "mlp", "configs": [{"preset": "default"}, {"preset": "torch-deterministic"}],
               "world_size": WORLD, "steps": 2}
        assert client.post("/api/v1/jobs", json=job).status_code == 201
        spec = client.post("/api/v1/ingest/runs/1/claim", json={"worker": "w"}, headers=AUTH).json()
        step = {"type": "step", "rank": 0, "fp_version": "fp1", "model_digest": "fp1:" + "0" * 32,
                "digests": "ab" * 16, "loss_bits": "3f800000", "loss": 1.0, "step_time_s": 0.01}
        records = [{**step, "step": s} for s in range(2)]
        headers = {**AUTH, LEASE_HEADER: spec["lease"]}
        resp = client.post("/api/v1/ingest/runs/1/records", json={"attempt": spec["attempt"], "records": records},
                           headers=headers)
        assert resp.status_code == 200
    return headers


SEEDED = {"job_id": 1, "run_id": 1, "run_a": 1, "run_b": 2, "rank": 0}  # rows seed() made: bodies reach the database
RECORD_TYPES = {"model_digest": "step", "op": "trial", "tensors": "tensors"}  # a key only that type has; else env


def onto_run_1(case: schemathesis.Case) -> schemathesis.Case:
    """An ingest body for run 1 as its worker would send it, whatever else it holds: the attempt seed()
    claimed, records with their `type` (the schema lists it as optional: it has a default) and ranks in the
    run's world, so that what passes validation reaches the database."""
    if isinstance(case.body, dict) and "attempt" in case.body:
        case.body["attempt"] = 1
    for record in case.body.get("records", []) if isinstance(case.body, dict) else []:
        if isinstance(record, dict):
            record.setdefault("type", next((t for k, t in RECORD_TYPES.items() if k in record), "env"))
            if isinstance(record.get("rank"), int | float) and math.isfinite(record["rank"]):
                record["rank"] = int(record["rank"]) % WORLD
            if "world_size" in record:
                record["world_size"] = WORLD
    return case


@dataclass
class Tally:
    requests: int = 0
    errors: list[str] = field(default_factory=list)
    statuses: Counter[str] = field(default_factory=Counter)  # "POST /path 422": how deep the examples got


def auth(operation: Any, ingest: dict[str, str]) -> dict[str, str] | None:
    return ingest if operation.path.startswith("/api/v1/ingest") else None


def strategies(operation: Any, ingest: dict[str, str]) -> dict[str, SearchStrategy[schemathesis.Case]]:
    """How one operation is fuzzed: valid and invalid requests, valid ones on the seeded rows, the schema's
    own examples."""
    headers = auth(operation, ingest)
    out = {mode.value: operation.as_strategy(generation_mode=mode, headers=headers)
           for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)}
    if "{" in operation.path:
        path = {k: v for k, v in SEEDED.items() if f"{{{k}}}" in operation.path}
        out["seeded"] = operation.as_strategy(headers=headers, path_parameters=path).map(onto_run_1)
    if examples := operation.get_strategies_from_examples(headers=headers):
        out["examples"] = st.one_of(examples)
    return out


def fuzz(operation: Any, label: str, strategy: SearchStrategy[schemathesis.Case], tally: Tally,
         ingest: dict[str, str]) -> None:
    """EXAMPLES requests from one strategy to one operation; server errors go to the tally."""
    headers = auth(operation, ingest)

    @given(case=strategy)
    @hypothesis_settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE,
                         phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def call(case: schemathesis.Case) -> None:
        tally.requests += 1
        response = None
        try:
            response = case.call(headers=headers)
            tally.statuses[f"{operation.method.upper()} {operation.path} {response.status_code}"] += 1
            case.validate_response(response, checks=[not_a_server_error])
        except (Exception, FailureGroup) as exc:  # every failure is collected, then reported together
            status = getattr(response, "status_code", "raised")
            tally.errors.append(f"{case.method} {case.formatted_path} {label}: {status} {type(exc).__name__}: "
                                f"{str(exc)[:300]}\n    {case.as_curl_command()[:600]}")

    try:
        call()
    except Unsatisfiable:  # nothing to make invalid: an operation without parameters or body
        assert label == GenerationMode.NEGATIVE.value


def test_no_operation_answers_a_server_error(app: Any, db_url: str) -> None:
    ingest = seed(app)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # Ingest first and cancels last, so the seeded run is still running when its bodies are fuzzed.
    operations = sorted((result.ok() for result in schema.get_all_operations()),
                        key=lambda op: (not op.path.startswith("/api/v1/ingest"), op.path.endswith("/cancel")))
    tally, started = Tally(), time.monotonic()
    for operation in operations:
        for label, strategy in strategies(operation, ingest).items():
            fuzz(operation, label, strategy, tally, ingest)
    print(f"\nfuzz {db_url.split(':', 1)[0]}: {len(operations)} operations, {tally.requests} requests, "
          f"{len(tally.errors)} server errors, {time.monotonic() - started:.1f} s")
    if os.environ.get("DETLAB_FUZZ_STATUSES"):
        print("\n".join(f"{n:6d} {k}" for k, n in sorted(tally.statuses.items())))
    assert len(operations) >= 15 and tally.requests >= len(operations) * EXAMPLES
    assert not tally.errors, "\n".join(tally.errors)



# Stateful: scenarios that follow the schema's links (inferred by schemathesis: a job's id from its submission into
# its reads, cancels and reruns, its runs' ids into their claims, records and logs), so requests carry ids the server
# just made rather than ids chosen blind. Bounded so it stays cheap: STATEFUL_EXAMPLES scenarios of at most
# STATEFUL_STEPS calls each.
STATEFUL_EXAMPLES = int(os.environ.get("DETLAB_FUZZ_STATEFUL_EXAMPLES", "20"))
STATEFUL_STEPS = 8
JOBS = [{"workload": "mlp", "configs": [{"preset": "default"}, {"preset": "torch-deterministic"}], "world_size": WORLD,
         "steps": 2},
        {"workload": "mlp", "configs": [{"preset": "default"}], "world_size": 1, "steps": 2, "repeats": 2,
         "tags": ["fuzz"]},
        {"kind": "collective", "configs": [{"preset": "default"}], "world_size": WORLD}]


def test_linked_scenarios_over_real_ids_answer_no_server_error(app: Any, engine: Engine, db_url: str) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    machine = schema.as_state_machine()  # infers the links (a job's id from POST /jobs into its paths, ...)
    linked = schema.statistic.transitions.total
    tally, started = Tally(), time.monotonic()
    ingest: dict[str, str] = {}
    leases: dict[int, tuple[int, str]] = {}  # run id -> (attempt, lease) of its claim in this scenario

    class Scenarios(machine):  # type: ignore[misc,valid-type]
        def setup(self) -> None:
            # Every scenario starts from the same rows (ids from 1 again): hypothesis replays scenarios and needs
            # the same calls to answer alike, which they would not after an earlier scenario's claims and cancels.
            with engine.begin() as conn:
                tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
                conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
            ingest.clear()
            ingest.update(seed(app, seeder))
            leases.clear()
            leases[1] = (1, ingest[LEASE_HEADER])

        def before_call(self, case: schemathesis.Case) -> None:
            # A generated job body is almost never a valid job, and an invalid one makes no ids to follow: one in
            # JOBS (by the body's hash, so derandomized runs repeat) is sent instead. A body for a run this
            # scenario claimed carries that claim's attempt, so records reach the database.
            if case.operation.method.upper() == "POST" and case.operation.path == "/api/v1/jobs":
                case.body = JOBS[zlib.crc32(repr(case.body).encode()) % len(JOBS)]
            run_id = (case.path_parameters or {}).get("run_id")
            if isinstance(case.body, dict) and "attempt" in case.body and run_id in leases:
                onto_run_1(case)
                case.body["attempt"] = leases[run_id][0]

        def after_call(self, response: Any, case: schemathesis.Case) -> None:
            if case.operation.path.endswith("/claim") and response.status_code == 200:
                reply = response.json()
                leases[reply["run_id"]] = (reply["attempt"], reply["lease"])

        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            headers = dict(auth(case.operation, ingest) or {})
            run_id = (case.path_parameters or {}).get("run_id")
            if headers and run_id in leases:
                headers[LEASE_HEADER] = leases[run_id][1]
            return {"headers": headers}

        def validate_response(self, response: Any, case: schemathesis.Case, *args: Any, **kwargs: Any) -> None:
            tally.requests += 1
            tally.statuses[f"{case.operation.method.upper()} {case.operation.path} {response.status_code}"] += 1
            try:
                case.validate_response(response, checks=[not_a_server_error])
            except (Exception, FailureGroup) as exc:
                tally.errors.append(f"{case.method} {case.formatted_path}: {response.status_code} "
                                    f"{type(exc).__name__}: {str(exc)[:300]}\n    {case.as_curl_command()[:600]}")

    with TestClient(app) as seeder:
        Scenarios.run(settings=hypothesis_settings(
            max_examples=STATEFUL_EXAMPLES, stateful_step_count=STATEFUL_STEPS, deadline=None, database=None,
            derandomize=DERANDOMIZE, phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
    operations = {key.rsplit(" ", 1)[0] for key in tally.statuses}
    print(f"\nstateful fuzz {db_url.split(':', 1)[0]}: {linked} links, {tally.requests} requests over "
          f"{len(operations)} operations, {len(tally.errors)} server errors, {time.monotonic() - started:.1f} s")
    if os.environ.get("DETLAB_FUZZ_STATUSES"):
        print("\n".join(f"{n:6d} {k}" for k, n in sorted(tally.statuses.items())))
    assert linked >= 100 and tally.requests >= STATEFUL_EXAMPLES
    assert not tally.errors, "\n".join(tally.errors)
