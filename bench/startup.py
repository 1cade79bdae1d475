"""How long a warm restart of `detlab up` takes: to its ready line (the pages answer) and to a healthy stack.

Each `--detlab` executable (this checkout's and, as the baseline, another's, e.g. main's) is started on its own
data dir, once to create it, then `--rounds` times interleaved (A B A B) so that the load of a shared machine
falls on both alike. Prints one line per start and a JSON summary: medians and spreads per executable."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def answers(url: str, path: str) -> bool:
    try:
        return httpx.get(url + path, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def one_start(detlab: str, data_dir: Path, timeout: float) -> dict[str, float]:
    """Seconds from the command to /live answering (the pages) and to /health 200 (a worker beats)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DETLAB_DATA_DIR": str(data_dir)}
    env.pop("DETLAB_DATABASE_URL", None)
    env.pop("DETLAB_BROKER_URL", None)
    start = time.monotonic()
    proc = subprocess.Popen([detlab, "up", "--port", str(port), "--data-dir", str(data_dir)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    found: dict[str, float] = {}
    try:
        while len(found) < 2 and time.monotonic() - start < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"{detlab} up exited with {proc.returncode}")
            for name, path in (("ready_s", "/api/v1/live"), ("healthy_s", "/api/v1/health")):
                if name not in found and answers(url, path):
                    found[name] = time.monotonic() - start
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--detlab", action="append", required=True, help="a detlab executable; give two to compare")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        dirs = {exe: Path(tmp) / f"data{i}" for i, exe in enumerate(args.detlab)}
        for exe, data_dir in dirs.items():
            one_start(exe, data_dir, args.timeout)  # a cold start: creates the data dir, migrates
        times: dict[str, list[dict[str, float]]] = {exe: [] for exe in args.detlab}
        for r in range(args.rounds):
            for exe, data_dir in dirs.items():
                found = one_start(exe, data_dir, args.timeout)
                times[exe].append(found)
                print(f"round {r} {exe}: {found}", flush=True)
    summary = {}
    for exe, runs in times.items():
        summary[exe] = {}
        for name in ("ready_s", "healthy_s"):
            values = sorted(run[name] for run in runs if name in run)
            if values:
                summary[exe][name] = {"median": round(statistics.median(values), 2), "min": round(values[0], 2),
                                      "max": round(values[-1], 2), "n": len(values)}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
