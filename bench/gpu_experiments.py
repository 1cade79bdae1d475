"""The multi-GPU experiments, run through detlab's own server, worker and API on a GPU node.

Starts `detlab up`, then submits (each only if time remains before --deadline seconds):
  collective-w1  a W=1 NCCL collective job: logs recorded and parsed, busbw reported
  train          tiny-lm DDP over all GPUs, 200 steps: default x3 vs full-deterministic x3
  sweep          collective all_reduce bf16/fp32, 4 KiB..1 GiB, NCCL_ALGO x NCCL_PROTO x channels, 3 repeats
and writes each job's results (partial when the deadline cuts a job short) as JSON to --out.

    PYTHONPATH=. python3 bench/gpu_experiments.py --out $OUT --deadline 560
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from worker.runner import free_port

PORT = free_port()
URL = f"http://127.0.0.1:{PORT}"
SWEEP_KNOBS = {"NCCL_ALGO": [None, "Ring", "Tree"], "NCCL_PROTO": [None, "LL", "LL128", "Simple"],
               "channels": [None, "1"]}


def gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except FileNotFoundError:
        return 0
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def wait_healthy(up: subprocess.Popen, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end and up.poll() is None:
        try:
            if httpx.get(f"{URL}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise TimeoutError("detlab did not become healthy")


def run_job(name: str, body: dict[str, Any], out: Path, stop_at: float) -> None:
    started = time.monotonic()
    job = httpx.post(f"{URL}/api/v1/jobs", json=body, timeout=60).json()
    while job.get("status") not in ("succeeded", "failed") and time.monotonic() < stop_at:
        time.sleep(2)
        job = httpx.get(f"{URL}/api/v1/jobs/{job['id']}", timeout=60).json()
    path = "collective" if body["kind"] != "train" else "comparison"
    result = httpx.get(f"{URL}/api/v1/jobs/{job['id']}/{path}", timeout=300)
    payload = {"job": job, "wall_s": time.monotonic() - started, "complete": job.get("status") == "succeeded",
               "result": result.json() if result.status_code == 200 else None}
    (out / f"{name}.json").write_text(json.dumps(payload))
    runs = job.get("runs", [])
    print(f"== {name}: {job.get('status')} after {payload['wall_s']:.0f} s, "
          f"{sum(r['status'] == 'succeeded' for r in runs)}/{len(runs)} runs succeeded", flush=True)
    for r in runs:
        if r["status"] == "failed":
            print("  failed run", r["id"], (r["error"] or "")[-800:], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=560.0, help="seconds from start")
    parser.add_argument("--only", nargs="*", default=["collective-w1", "train", "sweep"])
    parser.add_argument("--knobs", type=json.loads, default=SWEEP_KNOBS, help="sweep knobs as JSON")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process repeats of each sweep cell")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--step-factor", type=int, default=4)
    args = parser.parse_args()
    stop_at = time.monotonic() + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    n = gpus()
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "DETLAB_RUN_STALE_AFTER_S": "120"}
    data = tempfile.mkdtemp()
    log = (args.out / "up.log").open("w")
    up = subprocess.Popen([sys.executable, "-m", "backend.cli", "up", "--port", str(PORT), "--data-dir", data],
                          env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(up)
        print(f"{n} GPU(s)", flush=True)
        sizes = {"min_bytes": 4096, "max_bytes": args.max_bytes, "step_factor": args.step_factor}
        if "collective-w1" in args.only:
            run_job("collective-w1", {"kind": "collective", "world_size": 1, "configs": [
                {"preset": "default"}, {"preset": "nccl-tree-simple-1ch"}], "collective": {
                "ops": ["all_reduce_sum"], "dtypes": ["float32", "bfloat16"], "trials": 5, "warmup": 2, **sizes}},
                args.out, stop_at)
        if n >= 2 and "train" in args.only:
            run_job("train", {"kind": "train", "workload": "tiny-lm", "world_size": n, "steps": 200, "repeats": 3,
                              "configs": [{"preset": "default"}, {"preset": "full-deterministic"}]}, args.out, stop_at)
        if n >= 2 and "sweep" in args.only:
            run_job("sweep", {"kind": "sweep", "world_size": n, "repeats": args.repeats,
                              "configs": [{"preset": "default"}],
                              "sweep": {"over": "collective", "knobs": args.knobs}, "collective": {
                                  "ops": ["all_reduce_sum"], "dtypes": ["bfloat16", "float32"], "trials": 3,
                                  "warmup": 1, **sizes}}, args.out, stop_at)
    finally:
        up.terminate()
        up.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
