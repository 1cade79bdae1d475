"""Memory and liveness of `detlab api` (auth mode local) under a bounded flood of wrong logins, on loopback.

Starts its own server on 127.0.0.1 with a fresh SQLite data dir and one user, samples the server's RSS and
the latency of /api/v1/live while --concurrency threads post wrong passwords for --seconds, and prints one
JSON object: RSS before, peak and after (MiB), /live p50 and max (ms) idle and under the flood, and the
answers counted by status. Never aimed at another host: it only talks to the server it started.

    python bench/login_flood.py                      # today's limits (rate limit, 2 hashes at once)
    python bench/login_flood.py --unbounded          # as before the limits: every login hashes at once
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def live_ms(client: httpx.Client, samples: list[float]) -> None:
    start = time.perf_counter()
    client.get("/api/v1/live")
    samples.append((time.perf_counter() - start) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--unbounded", action="store_true", help="no rate limit, every login hashes at once")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as data:
        port = free_port()
        env = {**os.environ, "DETLAB_DATA_DIR": data, "DETLAB_AUTH_MODE": "local"}
        if args.unbounded:
            env |= {"DETLAB_LOGIN_FAILURES_PER_ACCOUNT": "1000000", "DETLAB_LOGIN_FAILURES_PER_ADDRESS": "1000000",
                    "DETLAB_LOGIN_CONCURRENT_HASHES": "64"}
        cli = [sys.executable, "-m", "detlab.cli"]
        subprocess.run([*cli, "migrate"], env=env, cwd=ROOT, check=True, capture_output=True)
        subprocess.run([*cli, "user", "add", "ada", "--role", "member", "--password-stdin", "--data-dir", data],
                       input="correct horse battery\n", text=True, env=env, cwd=ROOT, check=True, capture_output=True)
        proc = subprocess.Popen([*cli, "api", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=open(Path(data) / "api.log", "w"))
        url = f"http://127.0.0.1:{port}"
        try:
            with httpx.Client(base_url=url, timeout=60) as probe:
                deadline = time.monotonic() + 60
                while True:
                    try:
                        if probe.get("/api/v1/live").status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    if time.monotonic() > deadline:
                        raise SystemExit("the server did not start")
                    time.sleep(0.2)
                idle: list[float] = []
                for _ in range(20):
                    live_ms(probe, idle)
                before = rss_mib(proc.pid)

                stop = threading.Event()
                answers: Counter[int] = Counter()

                def flood(i: int) -> None:
                    with httpx.Client(base_url=url, timeout=60) as c:
                        while not stop.is_set():
                            r = c.post("/api/v1/auth/login", json={"name": f"user{i % 4}", "password": "wrong!!!"})
                            answers[r.status_code] += 1

                rss = [before]

                def sample() -> None:  # its own thread: a slow /live must not thin out the samples
                    while not stop.is_set():
                        rss.append(rss_mib(proc.pid))
                        time.sleep(0.05)

                threads = [threading.Thread(target=flood, args=(i,)) for i in range(args.concurrency)]
                threads.append(threading.Thread(target=sample))
                for t in threads:
                    t.start()
                loaded: list[float] = []
                end = time.monotonic() + args.seconds
                while time.monotonic() < end:
                    live_ms(probe, loaded)
                    time.sleep(0.1)
                stop.set()
                for t in threads:
                    t.join()
                peak, after = max(rss), rss_mib(proc.pid)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            errors = [line for line in (Path(data) / "api.log").read_text().splitlines() if "Error" in line]
    print(json.dumps({
        "mode": "unbounded" if args.unbounded else "limited", "concurrency": args.concurrency,
        "seconds": args.seconds, "rss_mib": {"before": round(before), "peak": round(peak), "after": round(after)},
        "live_ms": {"idle_p50": round(statistics.median(idle), 1), "flood_p50": round(statistics.median(loaded), 1),
                    "flood_max": round(max(loaded), 1)},
        "answers": dict(sorted(answers.items())), "server_errors": sorted(set(errors))[:5],
    }))


if __name__ == "__main__":
    main()
