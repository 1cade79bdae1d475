"""`detlab up` as a user runs it: one command, and nothing left behind when it stops."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import ROOT, free_port
from tests.e2e.conftest import stack_env
from tests.ranks import running
from tests.waiting import wait_until


def children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def test_up_says_one_line_and_stopping_it_stops_its_worker_mid_run(tmp_path: Path) -> None:
    """`up` prints one line, that it is ready and where, once it answers; nothing else while its worker starts
    and runs a job (no packaging warnings, no Celery banner or SecurityWarning). Stopped while its worker runs a
    job, `up` leaves no worker behind: a worker waiting out its run (its ingest retries ride out an API outage for
    minutes) would otherwise outlive the API it reports to."""
    port = free_port()
    env = stack_env(tmp_path, port)
    output = tmp_path / "up.out"
    with output.open("wb") as out:
        up = subprocess.Popen([sys.executable, "-m", "detlab.cli", "up", "--port", str(port), "--data-dir",
                               str(tmp_path / "data")], env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: "ready" in output.read_text() or up.poll() is not None, 120, "up's ready line")
        assert httpx.get(f"{url}/api/v1/live", timeout=30).status_code == 200  # ready means it answers
        wait_until(lambda: children(up.pid), 60, "up's worker")
        [worker] = children(up.pid)
        job = httpx.post(f"{url}/api/v1/jobs", json={"workload": "mlp", "steps": 100_000, "configs": [{}]},
                         timeout=30).json()
        wait_until(lambda: httpx.get(f"{url}/api/v1/jobs/{job['id']}", timeout=30).json()["runs"][0]["steps_done"] > 0,
                   120, "the worker's run recording")
        assert output.read_text() == f"detlab ready at {url}\n"
        up.send_signal(signal.SIGTERM)  # the up process only, as a service manager would
        up.wait(timeout=30)
        deadline = time.monotonic() + 20
        while running(worker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not running(worker)
    finally:
        try:
            os.killpg(up.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
