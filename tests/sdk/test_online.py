"""Online mode and `detlab upload` against a real detlab API process (SQLite), with the plain-PyTorch script
of tests/sdk/scripts/train.py: records streamed as they are written, nothing lost when the server dies
mid-run, uploads idempotent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, func, select

from detlab.backend.models import Job, Run, StepRecord
from tests.conftest import ROOT, free_port
from tests.e2e.conftest import Stack, stack_env
from tests.ranks import finish_ranks, launcher, start_ranks
from tests.waiting import wait_until

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train.py"


def wait_live(stack: Stack, timeout: float = 120.0) -> None:
    """Until the API answers (no worker runs here, so /health would say 503 "no worker")."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert all(p.poll() is None for p in stack.procs.values()), stack.logs()
        try:
            if httpx.get(f"{stack.url}/api/v1/live", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            time.sleep(0.3)
    raise TimeoutError(f"{stack.url} not up after {timeout} s")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Stack]:
    port = free_port()
    env = stack_env(tmp_path, port, DETLAB_DATABASE_URL=f"sqlite:///{tmp_path / 'detlab.sqlite3'}")
    stack = Stack(url=f"http://127.0.0.1:{port}", env=env, log_dir=tmp_path)
    subprocess.run([sys.executable, "-m", "detlab.cli", "migrate"], env=env, cwd=ROOT, check=True)
    stack.start("api", "api", "--host", "127.0.0.1", "--port", str(port))
    try:
        wait_live(stack)
        yield stack
    finally:
        stack.stop()


def script_env(stack: Stack, tmp_path: Path, token: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "DETLAB_TOKEN")}
    if token:
        env["DETLAB_TOKEN"] = stack.env["DETLAB_INGEST_TOKEN"]
    env["DETLAB_SPOOL_DIR"] = str(tmp_path / "spool")
    return env


def train(stack: Stack, tmp_path: Path, out: str, *args: str, ranks: int = 1,
          token: bool = True) -> subprocess.Popen[str]:
    return start_ranks([*launcher(ranks), str(SCRIPT), out, "--server", stack.url, *args],
                       env=script_env(stack, tmp_path, token), merge_output=True)


def finished(proc: subprocess.Popen[str]) -> str:
    done = finish_ranks(proc)
    assert done.returncode == 0, done.stdout[-3000:]
    return done.stdout


def stored(stack: Stack) -> dict[int, tuple[str, str, int, int]]:
    """run id -> (job kind, run status, world size, step records) from the server's own database."""
    engine = create_engine(stack.env["DETLAB_DATABASE_URL"])
    with engine.connect() as db:
        rows = db.execute(select(Run.id, Job.kind, Run.status, Run.world_size,
                                 select(func.count()).where(StepRecord.run_id == Run.id).scalar_subquery())
                          .join(Job, Job.id == Run.job_id)).all()
    engine.dispose()
    return {r[0]: tuple(r[1:]) for r in rows}  # type: ignore[misc]


def test_a_run_streams_to_the_server_and_is_kept_locally(server: Stack, tmp_path: Path) -> None:
    # no token: the server is in auth mode none (the embedded default), where a local recording needs no set-up
    finished(train(server, tmp_path, str(tmp_path / "a"), "--name", "online", "--steps", "5", token=False))
    assert stored(server) == {1: ("recording", "succeeded", 1, 5)}
    found = httpx.get(f"{server.url}/api/v1/jobs", timeout=10).json()["items"]
    assert [(j["kind"], j["status"], j["workload"]) for j in found] == [("recording", "succeeded", "sdk")]
    # the directory is a complete offline recording too
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "compare", str(tmp_path / "a"), str(tmp_path / "a")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_two_ranks_under_torchrun_make_one_recording(server: Stack, tmp_path: Path) -> None:
    finished(train(server, tmp_path, "-", "--steps", "4", ranks=2))
    assert stored(server) == {1: ("recording", "succeeded", 2, 8)}
    assert len(list((tmp_path / "spool").iterdir())) == 1  # one recording id, agreed over the process group


def test_the_server_dying_mid_run_loses_no_record(server: Stack, tmp_path: Path) -> None:
    # The run waits before step 10 until the API is down and before step 20 until it is back: however slowly a
    # loaded machine runs it, it neither ends with the API down nor records nothing then.
    down, back = tmp_path / "api-down", tmp_path / "api-back"
    proc = train(server, tmp_path, str(tmp_path / "a"), "--steps", "30", "--hold", f"10:{down}", "--hold", f"20:{back}")
    deadline = time.monotonic() + 120
    while not any(r[3] >= 3 for r in stored(server).values()):
        assert time.monotonic() < deadline and proc.poll() is None, "no record reached the server"
        time.sleep(0.2)
    server.kill("api")
    local = tmp_path / "a" / "rank0.jsonl"
    at_kill = len(local.read_bytes().splitlines())
    down.touch()
    # The loop goes on (its records wait in the directory): steps 10 to 19 recorded with the API down.
    wait_until(lambda: len(local.read_bytes().splitlines()) >= at_kill + 5 or proc.poll() is not None, 120,
               "steps recorded with the API down", explain=server.logs)
    assert proc.poll() is None, "the run ended while the API was down"
    port = server.url.rsplit(":", 1)[1]
    server.start("api", "api", "--host", "127.0.0.1", "--port", port)
    wait_live(server)
    back.touch()
    finished(proc)
    assert stored(server) == {1: ("recording", "succeeded", 1, 30)}


def test_upload_sends_an_offline_recording_once_however_often_it_is_run(server: Stack, tmp_path: Path) -> None:
    env = script_env(server, tmp_path)
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a"), "--steps", "4"], env=env, check=True,
                   timeout=300)
    said = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-m", "detlab.cli", "upload", str(tmp_path / "a"), "--name", "nightly"],
                              env={**env, "DETLAB_SERVER": server.url}, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        said.append(done.stdout.split(":")[1])
    assert said == [" 6 records to run 1 (succeeded)", " 0 records to run 1 (succeeded)"]  # env, tensors, 4 steps
    assert stored(server) == {1: ("recording", "succeeded", 1, 4)}


def test_upload_to_a_server_that_is_not_there_is_one_line_and_exit_2(tmp_path: Path) -> None:
    subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "a"), "--steps", "2"], check=True, timeout=300,
                   env={k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")})
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "upload", str(tmp_path / "a"), "--server",
                           f"http://127.0.0.1:{free_port()}"], env={**os.environ, "DETLAB_TOKEN": "x" * 20},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ") and "again" in done.stderr
