"""The multi-GPU experiments, run through detlab's own server, worker and API on a GPU node.

Starts `detlab up`, then submits (each only if time remains before --deadline seconds):
  collective-w1  a W=1 NCCL collective job: logs recorded and parsed, busbw reported
  train          tiny-lm DDP over all GPUs, 200 steps: default x3 vs full-deterministic x3
  sweep          collective all_reduce bf16/fp32, 4 KiB..1 GiB, NCCL_ALGO x NCCL_PROTO x channels, 3 repeats
and writes each job's results (partial when the deadline cuts a job short) as JSON to --out.

Jobs longer than one call: give --state DIR and --keep-server; the server keeps running in its own
session, and the same command run again (while the machine is still held) reuses the server and the
jobs already submitted instead of starting over.

    PYTHONPATH=. python3 bench/gpu_experiments.py --out $OUT --deadline 560 [--state /tmp/gx --keep-server]
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

from detlab.worker.launch import free_port

SWEEP_KNOBS = {"NCCL_ALGO": [None, "Ring", "Tree"], "NCCL_PROTO": [None, "LL", "LL128", "Simple"],
               "channels": [None, "1"]}


def gpus() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    except FileNotFoundError:
        return 0
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU ")])


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def start_server(state: Path, out: Path, keep: bool) -> tuple[str, subprocess.Popen | None]:
    """The server recorded in `state` if it still answers, else a new `detlab up` on a free port."""
    server = state / "server.json"
    if server.exists() and healthy(url := json.loads(server.read_text())["url"]):
        return url, None
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "DETLAB_RUN_STALE_AFTER_S": "120"}
    up = subprocess.Popen([sys.executable, "-m", "detlab.cli", "up", "--port", str(port), "--data-dir",
                           str(state / "data")], env=env, stdout=(out / "up.log").open("w"),
                          stderr=subprocess.STDOUT, start_new_session=keep)
    end = time.monotonic() + 120
    while not healthy(url):
        if time.monotonic() > end or up.poll() is not None:
            raise RuntimeError(f"detlab did not become healthy; see {out / 'up.log'}")
        time.sleep(1)
    server.write_text(json.dumps({"url": url}))
    return url, up


def run_job(url: str, state: Path, name: str, body: dict[str, Any], out: Path, stop_at: float) -> None:
    """Submit (unless this state already did), wait until done or the deadline, export what exists."""
    jobs_file = state / "jobs.json"
    jobs = json.loads(jobs_file.read_text()) if jobs_file.exists() else {}
    started = time.monotonic()
    if name not in jobs:
        jobs[name] = httpx.post(f"{url}/api/v1/jobs", json=body, timeout=60).json()["id"]
        jobs_file.write_text(json.dumps(jobs))
    job = httpx.get(f"{url}/api/v1/jobs/{jobs[name]}", timeout=60).json()
    while job["status"] not in ("succeeded", "failed") and time.monotonic() < stop_at:
        time.sleep(2)
        job = httpx.get(f"{url}/api/v1/jobs/{jobs[name]}", timeout=60).json()
    path = "collective" if body["kind"] != "train" else "comparison"
    result = httpx.get(f"{url}/api/v1/jobs/{job['id']}/{path}", timeout=300)
    payload = {"job": job, "wall_s": time.monotonic() - started, "complete": job["status"] == "succeeded",
               "result": result.json() if result.status_code == 200 else None}
    (out / f"{name}.json").write_text(json.dumps(payload))
    runs = job["runs"]
    print(f"== {name}: {job['status']} after {payload['wall_s']:.0f} s, "
          f"{sum(r['status'] == 'succeeded' for r in runs)}/{len(runs)} runs succeeded", flush=True)
    for r in runs:
        if r["status"] == "failed":
            print("  failed run", r["id"], (r["error"] or "")[-800:], flush=True)


def experiments(n: int, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    sizes = {"min_bytes": 4096, "max_bytes": args.max_bytes, "step_factor": args.step_factor}
    out = {"collective-w1": {"kind": "collective", "world_size": 1, "configs": [
        {"preset": "default"}, {"preset": "nccl-tree-simple-1ch"}], "collective": {
        "ops": ["all_reduce_sum"], "dtypes": ["float32", "bfloat16"], "trials": 5, "warmup": 2, **sizes}}}
    if n >= 2:
        out["train"] = {"kind": "train", "workload": "tiny-lm", "world_size": n, "steps": 200, "repeats": 3,
                        "configs": [{"preset": "default"}, {"preset": "full-deterministic"}]}
        out["sweep"] = {"kind": "sweep", "world_size": n, "repeats": args.repeats, "configs": [{"preset": "default"}],
                        "sweep": {"over": "collective", "knobs": args.knobs}, "collective": {
                            "ops": ["all_reduce_sum"], "dtypes": ["bfloat16", "float32"], "trials": 3, "warmup": 1,
                            **sizes}}
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline", type=float, default=560.0, help="seconds from start")
    parser.add_argument("--only", nargs="*", default=["collective-w1", "train", "sweep"])
    parser.add_argument("--knobs", type=json.loads, default=SWEEP_KNOBS, help="sweep knobs as JSON")
    parser.add_argument("--repeats", type=int, default=3, help="fresh-process repeats of each sweep cell")
    parser.add_argument("--max-bytes", type=int, default=1 << 30)
    parser.add_argument("--step-factor", type=int, default=4)
    parser.add_argument("--state", type=Path, help="keep server and job ids here, so a rerun continues")
    parser.add_argument("--keep-server", action="store_true", help="leave detlab running after this call")
    args = parser.parse_args()
    stop_at = time.monotonic() + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    state = args.state or Path(tempfile.mkdtemp())
    state.mkdir(parents=True, exist_ok=True)
    n = gpus()
    url, up = start_server(state, args.out, args.keep_server)
    try:
        print(f"{n} GPU(s), detlab at {url}", flush=True)
        for name, body in experiments(n, args).items():
            if name in args.only:
                run_job(url, state, name, body, args.out, stop_at)
    finally:
        if up is not None and not args.keep_server:
            up.terminate()
            up.wait(timeout=30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
