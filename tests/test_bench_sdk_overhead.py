"""bench/sdk_overhead.py kept working: the three modes, two tiny CPU processes each, write the issue's JSON and
state the noise; and bench/sdk_host_profile.py's diagnosis runs."""

from __future__ import annotations

import copy
import json
import random
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))


def test_the_sdk_overhead_bench_runs_tiny_on_the_cpu(tmp_path: Path) -> None:
    from sdk_overhead import bootstrap_pct

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
        # The bootstrap over processes, from the blocks the JSON keeps.
        lo, hi = result["overhead_ci95_pct"][mode]
        assert [lo, hi] == bootstrap_pct(result["block_ms"][mode], result["block_ms"]["none"])
        assert f", 95 % bootstrap over processes {lo:+.2f} to {hi:+.2f} %, " in line
        # The loop's own thread inside rec.step: each process's median step, then the median of those.
        host = result["per_process_rec_step_host_ms"][mode]
        assert len(host) == 2 and all(ms > 0 for ms in host)
        assert result["rec_step_host_ms"][mode] == statistics.median(host)
        assert f"the loop's thread inside rec.step {statistics.median(host):.3f} ms a step; " in line


def test_the_bootstrap_draws_processes_not_blocks() -> None:
    from sdk_overhead import bootstrap_pct

    none = [[100.0, 100.0], [100.0, 100.0]]
    # Two processes a mode, 1 % and 3 % slower: a draw holds both (+2 %), or one of them twice (+1 % or +3 %).
    assert bootstrap_pct([[101.0, 101.0], [103.0, 103.0]], none) == pytest.approx([1.0, 3.0])
    assert bootstrap_pct([[101.0, 101.0], [101.0, 101.0]], none) == pytest.approx([1.0, 1.0])
    # Blocks of one process do not make an interval: they are not independent runs.
    assert bootstrap_pct([[101.0, 103.0]], none) is None
    assert bootstrap_pct([[101.0], [103.0]], [[100.0, 100.0]]) is None


@pytest.mark.parametrize(("flags", "said"), [(["--kernels"], "--kernels times the recorder's CUDA kernels"),
                                             (["--timeline", "10"], "--timeline reads the GPU's timeline")])
def test_the_gpu_work_modes_refuse_the_cpu(flags: list[str], said: str) -> None:
    out = subprocess.run([sys.executable, "bench/sdk_overhead.py", "--device", "cpu", *flags], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and said in out.stderr, out.stderr


def synthetic_trace() -> dict[str, Any]:
    """Three steps of 3 ms (the queue filling: skipped), then two of 1 ms, each (µs from its marker): the marker
    0-2, a GEMM 2-500, an elementwise kernel on another stream 400-550, idle to 600, the recorder's kernel 600-700,
    its copy 700-710, 10 µs idle, a GEMM 720-900, idle to the next marker at 1000. Shuffled, as order is not
    promised; a launch on the host per step, and one outside the steps read."""
    def x(cat: str, name: str, ts: float, dur: float, tid: int = 7) -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": tid}

    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 0}]
    for start in (0, 3000, 6000):
        events += [x("kernel", "spin_kernel(long)", start, 2), x("kernel", "ampere_gemm", start + 2, 500)]
    events.append(x("cuda_runtime", "cudaLaunchKernel", 100, 3))  # in a skipped step
    for b in (9000, 10000):  # the marker as the profiler names it
        events += [x("kernel", "at::cuda::(anonymous namespace)::spin_kernel(long)", b, 2),
                   x("kernel", "ampere_gemm", b + 2, 498),
                   x("kernel", "elementwise", b + 400, 150, tid=9), x("kernel", "_onepass_kernel", b + 600, 100),
                   x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", b + 700, 10),
                   x("kernel", "ampere_gemm", b + 720, 180),
                   x("cuda_runtime", "cudaLaunchKernel", b + 1, 5), x("cuda_runtime", "cudaLaunchKernel", b + 2, 7)]
    events.append(x("kernel", "spin_kernel(long)", 11000, 2))
    random.Random(0).shuffle(events)
    return {"traceEvents": events}


def test_the_timeline_is_read_step_by_step_from_a_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from sdk_overhead import print_timeline, read_timeline

    t = read_timeline(synthetic_trace())
    assert (t["steps"], t["gpu_step_ms"], t["busy_ms"], t["idle_ms"]) == (2, 1.0, 0.84, 0.16)
    assert t["gaps_over_20us_per_step"] == 2  # 550 to 600 and 900 to the next marker; not 710 to 720
    assert t["largest_gaps"][:2] == [{"us": 100.0, "after": "ampere_gemm", "before": "spin_kernel"}] * 2
    assert t["largest_gaps"][2:] == [{"us": 50.0, "after": "elementwise", "before": "_onepass_kernel"}] * 2
    assert t["spent_ms"] == {"ampere_gemm": 0.678, "elementwise": 0.15, "recorder kernels": 0.1,
                             "copies and memsets": 0.01}
    assert t["host_calls"] == {"cudaLaunchKernel": {"per_step": 2.0, "ms_per_step": 0.012}}
    with pytest.raises(ValueError, match="4 step markers"):
        read_timeline({"traceEvents": [e for e in synthetic_trace()["traceEvents"]
                                       if e.get("ts") not in (10000, 11000)]})
    slower = copy.deepcopy(t)
    slower["spent_ms"]["ampere_gemm"] += 0.05
    print_timeline({"none": [t], "default": [slower]})
    out = capsys.readouterr().out.splitlines()
    assert out[2].split() == ["none", "1.000", "0.840", "0.160", "2.0", "0.100", "0.010", "0.828"]
    assert out[3].split()[-1] == "0.878"
    assert out[5].startswith("default: the model's kernels furthest from none's (ms a step): +0.0500 ampere_gemm;")


def test_the_host_profile_runs_tiny_on_the_cpu() -> None:
    """bench/sdk_host_profile.py kept working: a recorded mode names every timed part of rec.step and the writer's
    time; slack times the bare loop at each busy-wait and reports each against none."""
    ran = {mode: subprocess.run([sys.executable, "bench/sdk_host_profile.py", mode, "--device", "cpu", "--size", "tiny",
                                 "--blocks", "2", "--block-steps", "2"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300) for mode in ("no_drift", "slack")}
    for mode, out in ran.items():
        assert out.returncode == 0, (mode, out.stderr[-3000:])
    for part in ("rec.step (the loop's thread)", "ListKey", "_queue", "read_scalar (the loss)",
                 "writer CPU per record", "of it outside waits for the GPU"):
        assert part in ran["no_drift"].stdout
    rows = {float(m.group(1)): [float(v) for v in m.group(2, 3, 4, 5)] for m in re.finditer(
        r"x = (\S+) ms: wall +(\S+) ms \((\S+) to (\S+)\), (\S+) ms against x = 0", ran["slack"].stdout)}
    assert sorted(rows) == [0.0, 0.5, 1.0, 2.0, 4.0]
    # Each step busy-waits x ms of the wall clock, so no block is faster than that; the last column is each median
    # against x = 0's. Whether the wall grows with x is the figure itself, which a loaded machine blurs (a median
    # of two blocks once read 65 ms at x = 0 and 14 ms at x = 4): that belongs to the run, not to a test.
    for x, (median, fastest, slowest, against) in rows.items():
        assert x <= fastest <= median <= slowest
        assert abs(against - (median - rows[0.0][0])) <= 0.0015


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_timeline_reads_the_profilers_own_trace_on_cuda(tmp_path: Path) -> None:
    """On a GPU (skipped elsewhere): the markers, the recorder's Triton kernels (inside its CUDA graphs) and the
    host's calls are found in a real torch.profiler trace, and every process's trace is kept."""
    out = subprocess.run([sys.executable, "bench/sdk_overhead.py", "--size", "tiny", "--procs", "1", "--blocks", "1",
                          "--block-steps", "2", "--warmup", "2", "--timeline", "8", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    timeline = json.loads((tmp_path / "sdk_overhead.json").read_text())["timeline"]
    assert sorted(timeline) == ["default", "no_drift", "none"]
    for mode, (t,) in timeline.items():
        assert t["steps"] == 4 and 0 < t["busy_ms"] <= t["gpu_step_ms"], (mode, t)
        assert (t["spent_ms"].get("recorder kernels", 0) > 0) == (mode != "none"), (mode, t["spent_ms"])
        assert t["host_calls"], mode
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "traces").glob("*.json.gz")) == sorted(timeline)
    assert "GPU timeline per step (ms)" in out.stdout
