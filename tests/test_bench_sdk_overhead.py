"""bench/sdk_overhead.py kept working: the three modes, two tiny CPU processes each, write the issue's JSON and
state the noise."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT


def test_the_sdk_overhead_bench_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "bench/sdk_overhead.py", "--device", "cpu", "--size", "tiny", "--procs", "2",
                          "--blocks", "2", "--block-steps", "2", "--warmup", "1", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    result = json.loads((tmp_path / "sdk_overhead.json").read_text())
    assert set(result["step_ms"]) == {"none", "default", "no_drift"}
    assert set(result["overhead_pct"]) == {"default", "no_drift"}
    assert (result["processes_per_mode"], result["blocks"], result["device"]) == (2, 2, "cpu")
    assert all(len(blocks) == 2 and len(blocks[0]) == 2 for blocks in result["block_ms"].values())
    # The noise is the spread of the processes without a recorder; an overhead within it is said to be.
    none = result["per_process_median_ms"]["none"]
    assert result["noise_pct"] == (max(none) - min(none)) / statistics.median(none) * 100
    for mode, pct in result["overhead_pct"].items():
        assert result["overhead_range_pct"][mode] == [min(result["per_process_overhead_pct"][mode]),
                                                      max(result["per_process_overhead_pct"][mode])]
        line = next(x for x in out.stdout.splitlines() if x.startswith(f"{mode}: "))
        assert line.startswith(f"{mode}: {pct:+.2f} %, per round") and line.endswith(": within noise") == (
            abs(pct) <= result["noise_pct"]), line
        # The loop's own thread inside rec.step: each process's median step, then the median of those.
        host = result["per_process_rec_step_host_ms"][mode]
        assert len(host) == 2 and all(ms > 0 for ms in host)
        assert result["rec_step_host_ms"][mode] == statistics.median(host)
        assert f"the loop's thread inside rec.step {statistics.median(host):.3f} ms a step; " in line


def test_the_gpu_work_modes_refuse_the_cpu() -> None:
    out = subprocess.run([sys.executable, "bench/sdk_overhead.py", "--device", "cpu", "--kernels"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--kernels times the recorder's CUDA kernels" in out.stderr, out.stderr
