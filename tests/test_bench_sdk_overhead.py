"""bench/sdk_overhead.py kept working: the three modes, one tiny CPU process each, write the issue's JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_the_sdk_overhead_bench_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "bench/sdk_overhead.py", "--device", "cpu", "--size", "tiny", "--procs", "1",
                          "--blocks", "2", "--block-steps", "2", "--warmup", "1", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "sdk_overhead.json").read_text())
    assert set(result["step_ms"]) == {"none", "default", "no_drift"}
    assert set(result["overhead_pct"]) == {"default", "no_drift"}
    assert (result["processes_per_mode"], result["blocks"], result["device"]) == (1, 2, "cpu")
    assert all(len(blocks) == 1 and len(blocks[0]) == 2 for blocks in result["block_ms"].values())
