"""bench/fork_ranks.py kept working: one tiny CPU process per mode, the job through `detlab up` among them (fork
against fresh rank processes is tests/worker/test_zygote.py's)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_fork_ranks_bench_runs_tiny_on_the_cpu_and_through_the_server() -> None:
    out = subprocess.run([sys.executable, "bench/fork_ranks.py", "--device", "cpu", "--workload", "mlp", "--steps", "1",
                          "--repeats", "1", "--rounds", "1", "--modes", "fork,bare,server"], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["every_fork_process_forked"] and result["server_job_status"] == ["succeeded"]
    assert (result["configs"], result["repeats"], result["world_size"]) == (2, 1, 2)
    assert set(result["job_s"]) == {"bare_scripts", "fork", "fork_zygote_warm", "server"}
    assert result["fork_over_bare"] > 0 and result["server_over_bare"] > 0
