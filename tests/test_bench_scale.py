"""bench/scale.py at tiny sizes, so that it cannot rot: one JSON object with every figure, its own
database created and dropped."""

from __future__ import annotations

import json
import subprocess
import sys

import psycopg

from tests.conftest import PG_ADMIN, ROOT

KEYS = {"comparison_ms", "comparison_bytes", "figure_ms", "findings_ms_p95", "jobs_list_ms_p95", "readers_ms_p95",
        "window_ms", "window_steps", "steps", "tensors", "findings_rows", "finding_cells", "jobs",
        "baseline_comparison_ms", "baseline_comparison_bytes", "plotly_versioned_cache_control"}


def scale_databases() -> set[str]:
    with psycopg.connect(PG_ADMIN) as conn:
        return {r[0] for r in conn.execute("SELECT datname FROM pg_database WHERE datname LIKE 'detlab_scale_%'")}


def test_the_scale_bench_runs_small_and_cleans_up() -> None:
    before = scale_databases()
    out = subprocess.run([sys.executable, "bench/scale.py", "--database-url", PG_ADMIN, "--json", "--steps", "5000",
                          "--tensors", "4", "--findings", "200", "--jobs", "30", "--readers", "2",
                          "--reader-requests", "2", "--rounds", "2", "--findings-requests", "3",
                          "--jobs-requests", "3"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    [line] = out.stdout.strip().splitlines()
    result = json.loads(line)
    assert KEYS <= set(result)
    assert (result["steps"], result["findings_rows"], result["jobs"]) == (5000, 200, 31)
    # 5001 steps come thinned to 2000 points; the baseline (every step) is larger.
    assert result["comparison_bytes"] < result["baseline_comparison_bytes"]
    assert result["window_steps"] == 2000
    assert result["plotly_versioned_cache_control"] == "public, max-age=31536000, immutable"
    assert scale_databases() == before
