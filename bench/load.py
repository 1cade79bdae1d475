"""Load on loopback: page readers and worker ingest streams against one detlab server on PostgreSQL.

Starts `detlab api` on a PostgreSQL database it creates (and drops at the end) through --pg-admin, or is
pointed at a running server with --url (loopback only: this is a load generator, never aimed at a shared
server) and its --ingest-token. It fills a realistic finished train job through the ingest API (2 configs x
2 repeats, W ranks, S steps, T tensors, the second config diverging half way), then runs for --seconds:

- `--readers` threads, each looping over what the job pages fetch: the job list, the job's JSON, its
  comparison, its figures, the findings;
- `--streams` ingest streams, each a worker of its own that claims a run of a long job and posts step
  batches (every rank's records for --batch-steps steps) through the ingest API, as detlab's worker does.

Concurrency is bounded by those two numbers. Before that, optional baselines (--baseline-seconds each):
one reader alone (each page's service time), the readers alone, and the ingest streams alone. Prints one
JSON object: reader latency (p50, p95, max in ms) per endpoint kind and overall, ingest records/s and
per-tensor digests/s stored (checked against the database's row count when the bench owns the server), and
the error count. The server, its database and the bench share the machine: the figures are for that host.

    python bench/load.py --seconds 30
    python bench/load.py --url http://127.0.0.1:8000 --ingest-token "$DETLAB_INGEST_TOKEN"
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import secrets
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from detlab.core.ingest_client import IngestClient
from detlab.core.wire import EnvRecord, Record, StepRecord, TensorInfo, TensorsRecord, WorkerCapacity, WorkerInfo

ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
READS = ("list", "job", "comparison", "figures", "findings")
WORKLOAD = "tiny-lm"  # a built-in: the server accepts the job without a worker advertising it
ERROR_SAMPLES = 5
MAX_STREAMS = 20  # the server's max_repeats: the streams are repeats of one long job
STREAM_STEPS = 50_000  # a stream's run never runs out of steps within a bench


# --- what a worker would send ----------------------------------------------------------------------------------


def tensor_list(count: int) -> list[TensorInfo]:
    """A small transformer's parameter list (embedding, blocks of attention and MLP, head), `count` long."""
    names = ["embed.weight"]
    block = 0
    while len(names) < count - 1:
        names += [f"blocks.{block}.{part}" for part in ("ln1.weight", "attn.qkv.weight", "attn.proj.weight",
                                                        "ln2.weight", "mlp.fc.weight", "mlp.proj.weight")]
        block += 1
    names = names[: count - 1] + ["head.weight"]
    return [TensorInfo(index=i, name=name, shape=[64, 64] if name.endswith("proj.weight") else [64], dtype="float32")
            for i, name in enumerate(names)]


def variant(config_index: int, step: int, steps: int) -> int:
    """Which digests a populated run records at `step`: its second config parts from the first half way."""
    return 1 if config_index == 1 and step >= steps // 2 else 0


def step_record(step: int, rank: int, tensors: int, variant: int) -> StepRecord:
    """One rank's fingerprints after `step`. DDP keeps ranks equal, so only (step, variant) decides the digests:
    two runs of one variant are identical, two variants differ at every tensor."""
    packed = random.Random(step * 7919 + variant).randbytes(16 * tensors)
    loss = 4.0 * 0.995**step + variant * 1e-4 * step
    return StepRecord(step=step, rank=rank, fp_version="fp1",
                      model_digest="fp1:" + hashlib.blake2b(packed, digest_size=16).hexdigest(),
                      digests=packed.hex(), loss_bits=struct.pack(">f", loss).hex(), loss=loss,
                      step_time_s=0.05 + random.Random(step * 31 + rank).random() * 0.01)


def env_records(world_size: int) -> list[Record]:
    return [EnvRecord(rank=r, host=socket.gethostname(), device="cpu", torch="2.13.0", backend="gloo",
                      fingerprint_impl="torch") for r in range(world_size)]


def worker_info(world_size: int) -> WorkerInfo:
    """Enough capacity for the bench's world size: the server refuses jobs no worker of the queue can hold."""
    return WorkerInfo(capacity=WorkerCapacity(device="cpu", gpus=0, cpu_cores=world_size, ranks_per_core=1))


# --- the server ------------------------------------------------------------------------------------------------


def loopback_only(url: str) -> str:
    host = urlsplit(url).hostname or ""
    if host not in LOOPBACK:
        raise SystemExit(f"--url must be a server on this machine (127.0.0.1 or localhost), not {host!r}: "
                         "the bench puts a server under load and writes jobs into it")
    return url.rstrip("/")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def private_database(pg_admin: str) -> Iterator[str]:
    """A new PostgreSQL database on --pg-admin's cluster, dropped on the way out; yields its SQLAlchemy URL."""
    import psycopg

    name = f"detlab_load_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(pg_admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield pg_admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://", 1) + f"/{name}"
    finally:
        with psycopg.connect(pg_admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def own_server(database_url: str) -> Iterator[tuple[str, str]]:
    """`detlab migrate` and `detlab api` on the database (embedded broker: no worker consumes the runs, the
    bench's streams claim them); yields (url, ingest token)."""
    port, token = free_port(), secrets.token_urlsafe(24)
    with tempfile.TemporaryDirectory(prefix="detlab-load-") as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}
        env.update({"DETLAB_DATABASE_URL": database_url, "DETLAB_INGEST_TOKEN": token, "DETLAB_DATA_DIR": data,
                    "DETLAB_API_URL": f"http://127.0.0.1:{port}"})
        cli = [sys.executable, "-m", "detlab.cli"]
        subprocess.run([*cli, "migrate"], env=env, cwd=ROOT, check=True, capture_output=True)
        log = (Path(data) / "api.log").open("wb")
        proc = subprocess.Popen([*cli, "api", "--host", "127.0.0.1", "--port", str(port)], env=env, cwd=ROOT,
                                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(url, proc, Path(data) / "api.log")
            yield url, token
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()


def wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"detlab api exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx.get(f"{url}/api/v1/live", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} did not answer in {timeout} s")


# --- populating ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    world_size: int
    steps: int
    tensors: int
    batch_steps: int


def submit(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    resp = http.post("/api/v1/jobs", json=body)
    if resp.status_code not in (200, 201, 202):
        raise SystemExit(f"submitting {body} failed: {resp.status_code} {resp.text[:500]}")
    return dict(resp.json())


def populate(http: httpx.Client, client: IngestClient, shape: Shape) -> int:
    """A finished train job, recorded through the ingest API: 2 configs x 2 repeats, the second config parting
    from the first half way (so the comparison finds a first divergence). Returns its id."""
    job = submit(http, {"workload": WORKLOAD, "steps": shape.steps, "world_size": shape.world_size, "repeats": 2,
                        "configs": [{"preset": "full-deterministic"}, {"preset": "default"}]})
    for run in job["runs"]:
        spec = client.claim(run["id"], "bench-populate")
        client.records(run["id"], spec.attempt, [*env_records(shape.world_size),
                                                 TensorsRecord(tensors=tensor_list(shape.tensors))])
        for first in range(0, shape.steps + 1, shape.batch_steps):
            client.records(run["id"], spec.attempt, [
                step_record(step, rank, shape.tensors, variant(run["config_index"], step, shape.steps))
                for step in range(first, min(first + shape.batch_steps, shape.steps + 1))
                for rank in range(shape.world_size)])
        client.finish(run["id"], spec.attempt, "succeeded")
    return int(job["id"])


# --- measuring -------------------------------------------------------------------------------------------------


@dataclass
class Tally:
    """Latencies (s) per kind and errors, shared by the threads of one phase."""

    latencies: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    samples: list[str] = field(default_factory=list)
    records: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, kind: str, seconds: float, error: str | None = None, records: int = 0) -> None:
        with self.lock:
            self.latencies.setdefault(kind, []).append(seconds)
            self.records += records
            if error:
                self.errors += 1
                if len(self.samples) < ERROR_SAMPLES:
                    self.samples.append(f"{kind}: {error[:300]}")


def percentiles(values: list[float]) -> dict[str, float | int]:
    """n, p50, p95 and max in ms (nearest rank)."""
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, int(q * len(ordered) + 0.5) - 1))]

    return {"n": len(ordered), "p50_ms": round(rank(0.50) * 1e3, 1), "p95_ms": round(rank(0.95) * 1e3, 1),
            "max_ms": round(ordered[-1] * 1e3, 1)}


def read_path(kind: str, job_id: int, turn: int) -> str:
    """What a reader fetches for `kind` on its `turn`-th round (the job page's two figures take turns)."""
    figure = ("comparison/figure", "throughput/figure")[turn % 2]
    return {"list": "/api/v1/jobs?limit=20", "job": f"/api/v1/jobs/{job_id}",
            "comparison": f"/api/v1/jobs/{job_id}/comparison", "figures": f"/api/v1/jobs/{job_id}/{figure}",
            "findings": "/api/v1/findings/matrix"}[kind]


def reader(url: str, job_id: int, until: float, tally: Tally, seed: int) -> None:
    """Fetch the job's pages in turn, each kind once per round, in an order of its own, until `until`."""
    kinds = list(READS)
    random.Random(seed).shuffle(kinds)
    turn = 0
    with httpx.Client(base_url=url, timeout=60) as http:
        while time.monotonic() < until:
            for kind in kinds:
                path = read_path(kind, job_id, turn)
                started = time.perf_counter()
                error = None
                try:
                    resp = http.get(path)
                    if resp.status_code != 200:
                        error = f"{path}: {resp.status_code} {resp.text}"
                except httpx.HTTPError as exc:
                    error = f"{path}: {type(exc).__name__}: {exc}"
                tally.add(kind, time.perf_counter() - started, error)
            turn += 1


def warm_up(http: httpx.Client, job_id: int) -> None:
    """Fetch every page once before timing: the first request of a kind imports and caches what it uses."""
    for kind in READS:
        for turn in (0, 1):
            http.get(read_path(kind, job_id, turn))


@dataclass
class Stream:
    """One worker's ingest: a claimed run of the long job, and the next step it will send."""

    run_id: int
    attempt: int
    client: IngestClient
    next_step: int = 0


def open_streams(http: httpx.Client, url: str, token: str, shape: Shape, count: int) -> list[Stream]:
    """A long job with `count` runs (repeats of one config), each claimed by a worker of its own. No retries:
    a failed batch is an error the bench counts, not one it hides."""
    job = submit(http, {"workload": WORKLOAD, "steps": STREAM_STEPS, "world_size": shape.world_size,
                        "repeats": count, "configs": [{"preset": "default"}]})
    streams = []
    for i, run in enumerate(job["runs"]):
        client = IngestClient(url, token, retries=0, timeout_s=60)
        spec = client.claim(run["id"], f"bench-stream-{i}")
        client.records(run["id"], spec.attempt, [*env_records(shape.world_size),
                                                 TensorsRecord(tensors=tensor_list(shape.tensors))])
        streams.append(Stream(run_id=run["id"], attempt=spec.attempt, client=client))
    return streams


def ingest(stream: Stream, shape: Shape, until: float, tally: Tally) -> None:
    """Post every rank's records of the next --batch-steps steps, as fast as the server takes them."""
    while time.monotonic() < until:
        steps = range(stream.next_step, stream.next_step + shape.batch_steps)
        batch = [step_record(step, rank, shape.tensors, 0) for step in steps for rank in range(shape.world_size)]
        started = time.perf_counter()
        try:
            stream.client.records(stream.run_id, stream.attempt, batch)
        except Exception as exc:  # noqa: BLE001 - counted; the stream goes on with its next batch
            tally.add("ingest", time.perf_counter() - started, f"{type(exc).__name__}: {exc}")
            continue
        tally.add("ingest", time.perf_counter() - started, records=len(batch))
        stream.next_step = steps.stop


def run_phase(seconds: float, *, url: str, job_id: int, readers: int, streams: list[Stream],
              shape: Shape) -> dict[str, Any]:
    """Readers and streams (either may be none) for `seconds`; what they measured."""
    tally, until = Tally(), time.monotonic() + seconds
    threads = [threading.Thread(target=reader, args=(url, job_id, until, tally, i)) for i in range(readers)]
    threads += [threading.Thread(target=ingest, args=(s, shape, until, tally)) for s in streams]
    started = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    out: dict[str, Any] = {"seconds": round(elapsed, 1), "errors": tally.errors}
    if readers:
        reads = {k: v for k, v in tally.latencies.items() if k != "ingest"}
        out["readers"] = {"per_kind": {k: percentiles(reads.get(k, [])) for k in READS},
                          "overall": percentiles([x for v in reads.values() for x in v])}
    if streams:
        out["ingest"] = {"batches": percentiles(tally.latencies.get("ingest", [])), "records": tally.records,
                         "records_per_s": round(tally.records / elapsed, 1),
                         "digests_per_s": round(tally.records * shape.tensors / elapsed, 1)}
    if tally.samples:
        out["error_samples"] = tally.samples
    return out


def stored_records(database_url: str, run_ids: list[int]) -> int:
    """Step records PostgreSQL holds for the runs: what the streams' accepted batches should add up to."""
    from sqlalchemy import bindparam, create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            query = text("SELECT count(*) FROM step_records WHERE run_id IN :ids").bindparams(
                bindparam("ids", expanding=True))
            return int(conn.execute(query, {"ids": run_ids}).scalar_one())
    finally:
        engine.dispose()


def bench(url: str, token: str, args: argparse.Namespace, database_url: str | None) -> dict[str, Any]:
    shape = Shape(world_size=args.world_size, steps=args.steps, tensors=args.tensors, batch_steps=args.batch_steps)
    client = IngestClient(url, token, timeout_s=60)
    client.heartbeat("bench-worker", "default", None, None, worker_info(shape.world_size))
    with httpx.Client(base_url=url, timeout=60) as http:
        started = time.monotonic()
        job_id = populate(http, client, shape)
        populated_s = time.monotonic() - started
        streams = open_streams(http, url, token, shape, args.streams)
        warm_up(http, job_id)
    load_before = os.getloadavg()
    phase = {"url": url, "job_id": job_id, "readers": args.readers, "shape": shape}
    baseline = {}
    if args.baseline_seconds > 0:
        # One reader alone: each page's service time, with no queue in front of it.
        baseline["one_reader"] = run_phase(args.baseline_seconds, streams=[], **{**phase, "readers": 1})
        baseline["readers_only"] = run_phase(args.baseline_seconds, streams=[], **phase)
        baseline["ingest_only"] = run_phase(args.baseline_seconds, streams=streams, **{**phase, "readers": 0})
    load = run_phase(args.seconds, streams=streams, **phase)
    for s in streams:
        s.client.finish(s.run_id, s.attempt, "succeeded")
    sent = sum(s.next_step for s in streams) * shape.world_size
    result: dict[str, Any] = {
        "server": url, "database": "PostgreSQL, a database of its own" if database_url else "the server's",
        # The server, its database and the bench share this machine's cores: the figures are for this host.
        "host": {"cpus": os.cpu_count(), "loadavg_1m_before": round(load_before[0], 2),
                 "loadavg_1m_after": round(os.getloadavg()[0], 2)},
        "settings": {"seconds": args.seconds, "readers": args.readers, "streams": args.streams,
                     "batch_records": shape.batch_steps * shape.world_size},
        "job": {"id": job_id, "runs": 4, "world_size": shape.world_size, "steps": shape.steps,
                "tensors": shape.tensors, "step_records": 4 * (shape.steps + 1) * shape.world_size,
                "populated_s": round(populated_s, 1)},
        "baseline": baseline, "load": load,
        "ingest_sent_records": sent,
        "errors": load["errors"] + sum(p["errors"] for p in baseline.values()),
    }
    if database_url:
        stored = stored_records(database_url, [s.run_id for s in streams])
        result["ingest_stored_records"] = stored
        if stored != sent:
            result["errors"] += 1
            result["ingest_mismatch"] = f"{sent} step records accepted, {stored} stored"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="length of the mixed phase")
    parser.add_argument("--baseline-seconds", type=float, default=10.0,
                        help="length of each baseline (one reader, readers alone, ingest alone); 0: none")
    parser.add_argument("--readers", type=int, default=20)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=500, help="steps of the populated job's runs")
    parser.add_argument("--tensors", type=int, default=48, help="parameters fingerprinted per step")
    parser.add_argument("--batch-steps", type=int, default=25, help="steps per ingest batch (x world size records)")
    parser.add_argument("--pg-admin", default="postgresql://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL URL allowed to CREATE and DROP DATABASE")
    parser.add_argument("--url", help="a running detlab server on this machine instead of starting one")
    parser.add_argument("--ingest-token", default=os.environ.get("DETLAB_INGEST_TOKEN"),
                        help="with --url: the server's ingest token")
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args()
    for name in ("seconds", "world_size", "steps", "tensors", "batch_steps"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')} must be positive")
    if not (1 <= args.readers <= 256 and 1 <= args.streams <= MAX_STREAMS):
        raise SystemExit(f"--readers must be 1 to 256 and --streams 1 to {MAX_STREAMS}: concurrency is bounded")
    if args.url:
        if not args.ingest_token:
            raise SystemExit("--url needs --ingest-token (or DETLAB_INGEST_TOKEN): the bench ingests as a worker")
        result = bench(loopback_only(args.url), args.ingest_token, args, None)
    else:
        with private_database(args.pg_admin) as database_url, own_server(database_url) as (url, token):
            result = bench(url, token, args, database_url)
    text = json.dumps(result, indent=None if args.json is None else 1)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(json.dumps(result))
    sys.exit(1 if result["errors"] else 0)


if __name__ == "__main__":
    main()
