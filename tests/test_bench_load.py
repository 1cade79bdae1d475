"""bench/load.py kept working: a few seconds of it with tiny settings, on a database it creates and drops."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import PG_ADMIN, ROOT

LOAD = [sys.executable, str(ROOT / "bench" / "load.py")]


def test_a_few_seconds_of_load_read_every_page_and_store_every_batch_sent() -> None:
    out = subprocess.run([*LOAD, "--seconds", "2", "--baseline-seconds", "1", "--readers", "2", "--streams", "2",
                          "--world-size", "2", "--steps", "6", "--tensors", "4", "--batch-steps", "2",
                          "--pg-admin", PG_ADMIN], cwd=ROOT, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["errors"] == 0, result
    readers = result["load"]["readers"]
    assert all(readers["per_kind"][kind]["n"] > 0 for kind in ("list", "job", "comparison", "figures", "findings"))
    assert readers["overall"]["p95_ms"] >= readers["overall"]["p50_ms"] > 0
    assert result["load"]["ingest"]["digests_per_s"] > 0
    assert result["ingest_stored_records"] == result["ingest_sent_records"] > 0
    assert set(result["baseline"]) == {"one_reader", "readers_only", "ingest_only"}


def test_a_server_off_this_machine_is_refused() -> None:
    out = subprocess.run([*LOAD, "--url", "http://10.1.2.3:8000", "--ingest-token", "t" * 32], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "must be a server on this machine" in out.stderr
