"""bench/fork_ranks.py kept working: one tiny CPU process per mode; the forked runs' digests are the fresh ones."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_the_fork_ranks_bench_runs_tiny_on_the_cpu_and_both_modes_give_the_same_digests() -> None:
    out = subprocess.run([sys.executable, "bench/fork_ranks.py", "--device", "cpu", "--workload", "mlp", "--steps", "1",
                          "--repeats", "1", "--rounds", "1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["deterministic_config_same_digests_in_both_modes"] and result["every_fork_process_forked"]
    assert (result["configs"], result["repeats"], result["world_size"]) == (2, 1, 2)
    assert set(result["job_s"]) == {"bare_scripts", "fresh", "fork", "fork_zygote_warm"}
    assert result["fork_over_bare"] > 0 and result["fresh_over_bare"] > 0
