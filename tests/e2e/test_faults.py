"""Faults injected into a whole distributed deployment: API, a real Celery worker and gloo ranks on the CPU,
on a PostgreSQL cluster and a redis-server of this module's own (tests/services.py), so that killing and
restarting them disturbs no one.

Each test counts what the ranks recorded against what PostgreSQL stored and asserts none lost, none
duplicated (a (step, rank) stored twice, or kept from an attempt other than the run's last), none stored
that no rank recorded, and nothing stuck (every run finished, no rank process left). Refusing a submit
while the broker is down is tested from the API side in tests/backend/test_faults.py."""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from detlab.worker.runner import SPOOL_PREFIX
from tests.e2e.conftest import Stack, distributed_stack, rank_pids, read_job, wait_for
from tests.services import PostgresServer, RedisServer
from tests.waiting import wait_steady

# In `make test` like every test; `pytest -m faults` runs these alone. Each waits up to minutes per phase.
pytestmark = [pytest.mark.faults, pytest.mark.timeout(900)]

FINISHED = ("succeeded", "failed", "cancelled")
# tiny-lm trains at tens of steps/s on a CPU: 100 steps outlast each fault, mlp's could end before it.
Steps = set[tuple[int, int]]  # (step, rank)


@dataclass(frozen=True)
class Tally:
    """One run's step records: what its ranks recorded against what PostgreSQL holds."""

    lost: int  # recorded by a rank, not stored
    duplicated: int  # stored twice, or kept from an attempt other than the run's last
    unexpected: int  # stored, but no rank recorded it


CLEAN = Tally(lost=0, duplicated=0, unexpected=0)


@contextmanager
def private_stack(tmp_path: Path, postgres: PostgresServer, redis: RedisServer, **extra: str) -> Iterator[Stack]:
    """A distributed stack on a new database of `postgres` and on `redis`."""
    database = postgres.create_database(f"detlab_fault_{uuid.uuid4().hex[:10]}")
    with distributed_stack(tmp_path, database, redis.url(), **extra) as stack:
        yield stack


# The API's log line for a records batch that met the outage (answered 503).
RECORDS_503 = re.compile(r"database unavailable during POST /api/v1/ingest/runs/\d+/records")


def api_log(stack: Stack) -> str:
    return (stack.log_dir / "api.log").read_text(errors="replace")


def steps_done(stack: Stack, job_id: int) -> int:
    run = read_job(stack, job_id)["runs"][0]
    return int(run["steps_done"]) if run["status"] == "running" else 0


def is_running(stack: Stack, job_id: int) -> bool:
    return bool(read_job(stack, job_id)["runs"][0]["status"] == "running")


def all_steps(steps: int, world_size: int) -> Steps:
    """What a run's ranks record when it completes: steps 0 (the initial weights) to `steps`, on every rank."""
    return {(step, rank) for step in range(steps + 1) for rank in range(world_size)}


def tally(stack: Stack, run_id: int, recorded: Steps) -> Tally:
    engine = create_engine(stack.env["DETLAB_DATABASE_URL"])
    try:
        with engine.connect() as conn:
            attempt = conn.execute(text("SELECT attempt FROM runs WHERE id = :r"), {"r": run_id}).scalar_one()
            rows = conn.execute(text("SELECT step, rank, attempt FROM step_records WHERE run_id = :r"),
                                {"r": run_id}).all()
    finally:
        engine.dispose()
    stored = {(step, rank) for step, rank, _ in rows}
    stale = sum(1 for *_, row_attempt in rows if row_attempt != attempt)
    return Tally(lost=len(recorded - stored), duplicated=len(rows) - len(stored) + stale,
                 unexpected=len(stored - recorded))


def stuck(stack: Stack, job_id: int) -> list[str]:
    """What did not settle: the job's runs not finished, and processes of their ranks still alive."""
    job = read_job(stack, job_id)
    left = [f"run {r['id']} is {r['status']}" for r in job["runs"] if r["status"] not in FINISHED]
    left += [f"run {r['id']}: rank process {pid} alive" for r in job["runs"]
             for pid in stack.ranks(r["id"])]
    return left


def report(fault: str, tallies: list[Tally], left: list[str]) -> None:
    """One line per fault, for the log of a CI run (pytest -s or -rA shows it)."""
    print(json.dumps({"fault": fault, "lost": sum(t.lost for t in tallies),
                      "duplicated": sum(t.duplicated for t in tallies),
                      "unexpected": sum(t.unexpected for t in tallies), "stuck": len(left)}))


def test_worker_sigkilled_mid_run_is_redone_by_a_new_worker_with_no_record_lost_or_doubled(
        tmp_path: Path, own_postgres: PostgresServer, own_redis: RedisServer) -> None:
    steps, world = 100, 2
    # Lost after 6 s without a heartbeat: the killed worker's run is redone soon after.
    with private_stack(tmp_path, own_postgres, own_redis, DETLAB_RUN_STALE_AFTER_S="6") as stack:
        job = stack.submit({"workload": "tiny-lm", "steps": steps, "world_size": world,
                            "configs": [{"preset": "default"}]})
        run_id = job["runs"][0]["id"]
        wait_for("three recorded steps", lambda: steps_done(stack, job["id"]) >= 3, stack)
        stack.kill("worker")
        # Its ranks die with it (PDEATHSIG): nothing trains on into a spool nobody reads.
        wait_for("the killed worker's ranks gone", lambda: not stack.ranks(run_id), stack,
                 timeout=10)
        stack.start("worker2", "worker", "--queue", "default")

        done = stack.wait_job(job["id"], timeout=300)
        run = done["runs"][0]
        assert (run["status"], run["attempt"]) == ("succeeded", 2), run
        assert "attempt 1 lost" not in (run["error"] or "")  # a success clears the lost attempt's note
        tallies, left = [tally(stack, run_id, all_steps(steps, world))], stuck(stack, job["id"])
    report("worker SIGKILL mid-run", tallies, left)
    assert tallies == [CLEAN] and left == []


def test_redis_restarted_mid_job_loses_no_run_and_no_record(
        tmp_path: Path, own_postgres: PostgresServer, own_redis: RedisServer) -> None:
    steps, world = 100, 2
    # The outage must not make the running run look lost: only Redis goes, its heartbeats go on.
    with private_stack(tmp_path, own_postgres, own_redis, DETLAB_RUN_STALE_AFTER_S="30") as stack:
        running = stack.submit({"workload": "tiny-lm", "steps": steps, "world_size": world,
                                "configs": [{"preset": "default"}]})
        wait_for("three recorded steps", lambda: steps_done(stack, running["id"]) >= 3, stack)
        assert is_running(stack, running["id"]), "the job ended before the fault: make it longer"
        own_redis.stop()  # every queued message, and the running one's unacked copy, is gone with it
        resp = httpx.post(f"{stack.url}/api/v1/jobs", timeout=30, json={
            "workload": "mlp", "steps": 5, "world_size": world, "configs": [{"preset": "default"}]})
        assert resp.status_code == 202, resp.text  # kept, sent by the reconciler once the broker is back
        late = resp.json()
        # The outage lasts until the API has seen it (health names the broker), not a fixed second.
        wait_for("the API seeing the broker down",
                 lambda: httpx.get(f"{stack.url}/api/v1/health", timeout=10).status_code == 503, stack, timeout=60)
        own_redis.start()

        finished = [stack.wait_job(job["id"], timeout=180) for job in (running, late)]
        assert [(j["status"], [r["attempt"] for r in j["runs"]]) for j in finished] == [("succeeded", [1])] * 2
        tallies = [tally(stack, running["runs"][0]["id"], all_steps(steps, world)),
                   tally(stack, late["runs"][0]["id"], all_steps(5, world))]
        left = stuck(stack, running["id"]) + stuck(stack, late["id"])
    report("Redis restart mid-job", tallies, left)
    assert tallies == [CLEAN, CLEAN] and left == []


def test_postgres_restarted_mid_job_has_its_batches_retried_and_stored_once(
        tmp_path: Path, own_postgres: PostgresServer, own_redis: RedisServer) -> None:
    steps, world = 100, 2
    with private_stack(tmp_path, own_postgres, own_redis, DETLAB_RUN_STALE_AFTER_S="30") as stack:
        job = stack.submit({"workload": "tiny-lm", "steps": steps, "world_size": world,
                            "configs": [{"preset": "default"}]})
        run_id = job["runs"][0]["id"]
        wait_for("three recorded steps", lambda: steps_done(stack, job["id"]) >= 3, stack)
        assert is_running(stack, job["id"]), "the job ended before the fault: make it longer"
        own_postgres.stop()  # closes every connection: the API's pool, mid-request or idle
        # The ranks train on; the outage lasts until a batch of the worker's has failed on it (asserted below).
        wait_for("a records batch failing", lambda: RECORDS_503.search(api_log(stack)) is not None, stack, timeout=60)
        own_postgres.start()

        done = stack.wait_job(job["id"], timeout=180)
        run = done["runs"][0]
        # Attempt 1 still: the batches were retried, not the run redone from scratch.
        assert (run["status"], run["attempt"]) == ("succeeded", 1), run
        tallies, left = [tally(stack, run_id, all_steps(steps, world))], stuck(stack, job["id"])
        api_said = api_log(stack)
    report("PostgreSQL restart mid-job", tallies, left)
    # A records batch did fail during the outage (a 503 whose log line names the route), so the worker's retry
    # is what stored it: else this test would prove nothing.
    assert RECORDS_503.search(api_said)
    assert tallies == [CLEAN] and left == []


def test_postgres_down_for_60_s_mid_job_loses_no_record_and_no_attempt(
        tmp_path: Path, own_postgres: PostgresServer, own_redis: RedisServer) -> None:
    """An outage twice the stale limit and past the worker's old retry budget (about 21 s): its records wait in the
    spool and are sent when the database is back, in the same attempt. The run is not judged lost meanwhile:
    heartbeats missed while the store was down do not count (the reconciler's passes failed on it too)."""
    steps, world, outage_s, stale_s = 100, 2, 60.0, 30
    # The reconciler passes often and the worker beats seldom, so that once the database is back the reconciler
    # looks at the run before the worker's next heartbeat or batch does: the silence it sees is the outage's. One
    # attempt only: a run judged lost is failed, not quietly re-dispatched (which the one busy worker would only
    # take after finishing the run, hiding the misjudgement).
    with private_stack(tmp_path, own_postgres, own_redis, DETLAB_RUN_STALE_AFTER_S=str(stale_s),
                       DETLAB_RECONCILE_INTERVAL_S="0.5", DETLAB_HEARTBEAT_INTERVAL_S="5",
                       DETLAB_MAX_ATTEMPTS="1") as stack:
        job = stack.submit({"workload": "tiny-lm", "steps": steps, "world_size": world,
                            "configs": [{"preset": "default"}]})
        run_id = job["runs"][0]["id"]
        wait_for("three recorded steps", lambda: steps_done(stack, job["id"]) >= 3, stack)
        assert is_running(stack, job["id"]), "the job ended before the fault: make it longer"
        own_postgres.stop()
        time.sleep(outage_s)  # the outage itself: the ranks train on into the spool
        down = httpx.get(f"{stack.url}/api/v1/jobs/{job['id']}", timeout=30)
        assert down.status_code == 503 and down.headers["retry-after"]
        own_postgres.start()

        done = stack.wait_job(job["id"], timeout=300)
        run = done["runs"][0]
        assert (run["status"], run["attempt"]) == ("succeeded", 1), run
        tallies, left = [tally(stack, run_id, all_steps(steps, world))], stuck(stack, job["id"])
    report(f"PostgreSQL down {outage_s:.0f} s mid-job", tallies, left)
    assert tallies == [CLEAN] and left == []


def spooled_steps(folder: Path) -> Steps:
    """The (step, rank) of every complete step record in the run's spool files."""
    found: Steps = set()
    for path in folder.glob("rank*.jsonl"):
        data = path.read_bytes()
        for line in data[: data.rfind(b"\n") + 1].splitlines():
            record = json.loads(line)
            if record.get("type") == "step":
                found.add((record["step"], record["rank"]))
    return found


def rank_pid(stack: Stack, run_id: int, rank: int) -> int:
    """The pid of the run's running rank process `rank`."""
    pid = rank_pids(run_id, stack.spool_root).get(rank)
    if pid is None or pid not in stack.ranks(run_id):
        raise LookupError(f"no process of rank {rank} of run {run_id}")
    return pid


def test_hung_rank_fails_the_run_naming_it_with_its_output_and_keeps_every_recorded_step(
        tmp_path: Path, own_postgres: PostgresServer, own_redis: RedisServer) -> None:
    hang_s, world = 5, 2
    # TORCH_CPP_LOG_LEVEL=INFO: each rank writes c10d's connection lines, the output the error must end with.
    with private_stack(tmp_path, own_postgres, own_redis, DETLAB_HANG_TIMEOUT_S=str(hang_s),
                       DETLAB_FIRST_STEP_TIMEOUT_S="120", TORCH_CPP_LOG_LEVEL="INFO") as stack:
        job = stack.submit({"workload": "mlp", "steps": 100_000, "world_size": world,
                            "configs": [{"preset": "default"}]})  # minutes of training: hung long before
        run_id = job["runs"][0]["id"]
        wait_for("three recorded steps", lambda: steps_done(stack, job["id"]) >= 3, stack)
        os.kill(rank_pid(stack, run_id, 1), signal.SIGSTOP)
        (folder,) = stack.spool_root.glob(f"{SPOOL_PREFIX}{run_id}-*")
        # Rank 0 blocks in its next all_reduce: from then on neither spool grows (and once the hang timeout has
        # killed the ranks, surely not). Steady for 4 s, not 1: a rank that a loaded machine starved for a second
        # could still write the step it was in, which `recorded` would then miss.
        recorded = wait_steady(lambda: spooled_steps(folder), timeout=60, steady_s=4.0, what="the spools",
                               explain=stack.logs)

        done = stack.wait_job(job["id"], timeout=60)
        run = done["runs"][0]
        assert (done["status"], run["status"], run["attempt"]) == ("failed", "failed", 1), run
        # Rank 1 is named with the end of its output (rank 0 too: it stalls waiting for rank 1 in its all_reduce).
        head, _, rank1_tail = run["error"].partition("rank 1's output ends:\n")
        named = re.search(r"\branks? \(?([0-9, ]+)\)?", head.split("\n")[0])
        assert f"for {hang_s} s" in head and named and "1" in re.findall(r"\d+", named[1]), run["error"]
        assert "[c10d]" in rank1_tail, run["error"]
        assert recorded and max(step for step, _ in recorded) >= 3
        tallies, left = [tally(stack, run_id, recorded)], stuck(stack, job["id"])
    report("rank 1 SIGSTOPped", tallies, left)
    assert tallies == [CLEAN] and left == []
