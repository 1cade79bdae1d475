"""detlab at team scale, through the real API: a long comparison, a large history, many jobs.

Creates its own PostgreSQL database (detlab_scale_<random>, dropped at the end unless --keep; it never
drops or alters a database it did not create), migrates it, and fills it with COPY:

- one train comparison: 2 runs x --steps steps x --tensors tensors (diverging at 40 % of the run),
  settled through the real path (services.settle: the stored result and its findings);
- --findings collective findings rows (10 message sizes per cell, folded into finding_cells) and train
  measurements, over 40 configs x 12 stacks x a year;
- --jobs jobs with two runs each.

Then serves the app with uvicorn (a child process) and times requests over HTTP (wall time of the request
on 127.0.0.1, i.e. server time plus a loopback hop): the comparison and its figure (the first request
builds them, later ones are cached: `_cached`), a step window of each, the findings matrix and history
(as served, and built afresh: `_uncached`), the jobs list, static files, and --readers concurrent readers
on a mix with figures. The baseline is the previous code path on the same data: the full comparison as it was
stored before results were thinned (every step), validated and serialised as GET …/comparison did.

    python bench/scale.py --database-url postgresql://postgres@127.0.0.1:5432/postgres --json
"""

from __future__ import annotations

import argparse
import atexit
import gzip
import json
import os
import random
import signal
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import psycopg
from psycopg.types.json import Json

SIZES = 10  # message sizes per collective cell


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 1)


# ---- population ------------------------------------------------------------------------------


def drift_steps(steps: int, every: int) -> set[int]:
    """Steps that carry drift data: every `every`-th (about what the comparison samples: detlab.core.drift.POINTS),
    and every step of the step window the bench asks for, so that both read as many rows as with drift data at
    every step (which would be ~6 GB at 200 tensors)."""
    if every <= 0:
        return set()
    lo = int(steps * 0.4) - 100
    return set(range(0, steps + 1, every)) | set(range(lo, lo + 2000)) | {steps}


def populate_comparison(conn: psycopg.Connection, steps: int, tensors: int, drift_every: int = 0) -> int:
    """Two runs of one job, one rank each: equal until 40 % of the steps, then a third of the tensors differ."""
    with conn.cursor() as cur:
        cfg = []
        for name, env in (("default", {}), ("full-deterministic", {"NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"})):
            body = {"name": name, "env": env, "torch": {"deterministic_algorithms": bool(env)}, "seed": 0,
                    "world_size": None, "threads": None}
            cur.execute("INSERT INTO configs (name, hash, body, created_at) VALUES (%s, %s, %s, now()) RETURNING id",
                        (name, uuid.uuid4().hex[:16], Json(body)))
            cfg.append(cur.fetchone()[0])  # type: ignore[index]
        cur.execute("INSERT INTO jobs (kind, workload, world_size, steps, repeats, params, config_ids, status, queue, "
                    "created_at) VALUES ('train', 'mlp', 1, %s, 1, %s, %s, 'running', 'default', now()) RETURNING id",
                    (steps, Json({"fingerprint_interval": 1, "global_batch": 64}), Json(cfg)))
        job_id = cur.fetchone()[0]  # type: ignore[index]
        run_ids = []
        for i in range(2):
            cur.execute("INSERT INTO runs (job_id, config_id, config_index, repeat, world_size, steps_total, "
                        "steps_done, status, attempt, device) VALUES (%s, %s, %s, 0, 1, %s, %s, 'succeeded', 1, 'cpu') "
                        "RETURNING id",
                        (job_id, cfg[i], i, steps, steps))
            run_ids.append(cur.fetchone()[0])  # type: ignore[index]
            with cur.copy('COPY tensor_meta (run_id, "index", name, shape, dtype) FROM STDIN') as copy:
                for t in range(tensors):
                    copy.write_row((run_ids[-1], t, f"layers.{t // 2}.{'weight' if t % 2 == 0 else 'bias'}",
                                    json.dumps([64, 64] if t % 2 == 0 else [64]), "float32"))
            cur.execute("INSERT INTO rank_envs (run_id, rank, host, device, driver, cuda, torch, nccl, backend, "
                        "effective_env, torch_flags) VALUES (%s, 0, 'bench', 'NVIDIA H200', '580.1', '13.0', '2.11.0', "
                        "'2.28.9', 'nccl', '{}', '{}')", (run_ids[-1],))
    rng = np.random.default_rng(0)
    diverge = int(steps * 0.4)
    differ = np.arange(tensors) % 3 == 0
    with_drift = drift_steps(steps, drift_every)
    cols = ("(run_id, step, rank, attempt, fp_version, model_digest, digests, loss_bits, loss, step_time_s, "
            "drift_version, stats, sketch)")
    with conn.cursor() as cur, cur.copy(f"COPY step_records {cols} FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(["int4", "int4", "int4", "int4", "varchar", "varchar", "bytea", "varchar", "float8", "float8",
                        "varchar", "bytea", "bytea"])
        for step in range(steps + 1):
            stats = np.abs(rng.standard_normal((tensors, 3))) if step in with_drift else None
            sketched = rng.standard_normal((tensors, 16)) if step in with_drift else None
            packed = rng.integers(0, 256, size=(tensors, 16), dtype=np.uint8)
            loss = 5.0 * np.exp(-step / steps) + 0.01 * rng.random()
            times = 0.010 + 0.001 * rng.random(2)
            for i, run_id in enumerate(run_ids):
                own, own_loss = packed, loss
                if i == 1 and step >= diverge:
                    own = packed.copy()
                    own[differ, 0] ^= 1
                    own_loss = loss + 1e-6 * rng.random()
                digest = f"fp1:{hash(own.tobytes()) & (2**64 - 1):032x}"
                drift = (None, None, None)
                if stats is not None and sketched is not None:
                    moved = sketched + (1e-6 * step / steps if i == 1 and step >= diverge else 0.0)
                    drift = ("cs1", stats.astype("<f8").tobytes(), moved.astype("<f8").tobytes())
                copy.write_row((run_id, step, 0, 1, "fp1", digest, own.tobytes(), f"{own_loss:.12f}"[:16], own_loss,
                                times[i] * (1.3 if i else 1.0), *drift))
    conn.commit()
    return int(job_id)


def populate_jobs(conn: psycopg.Connection, count: int) -> list[int]:
    """`count` finished jobs, two runs each, with small stored results, over the last year."""
    with conn.cursor() as cur:
        cur.execute("SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'")
        has_verdict = "verdict" in {r[0] for r in cur.fetchall()}
        cur.execute("SELECT id FROM configs ORDER BY id LIMIT 2")
        cfg = [r[0] for r in cur.fetchall()]
        cur.execute("SELECT coalesce(max(id), 0) FROM jobs")
        first = cur.fetchone()[0] + 1  # type: ignore[index]
        now = datetime.now(UTC)
        verdicts = ["identical", "diverged", "incomplete", "incomparable"]
        cols = "id, kind, workload, world_size, steps, repeats, params, config_ids, status, queue, created_at, " \
               "finished_at, result" + (", verdict" if has_verdict else "")
        with cur.copy(f"COPY jobs ({cols}) FROM STDIN") as copy:
            for n in range(count):
                when = now - timedelta(minutes=5 * (count - n))
                verdict = verdicts[n % 4]
                row = [first + n, "train", ["mlp", "tiny-lm", "scatter"][n % 3], 1 + n % 4, 100, 2,
                       json.dumps({"global_batch": 64}), json.dumps(cfg), "succeeded", "default", when,
                       when + timedelta(minutes=3), json.dumps({"verdict": verdict, "per_step": []})]
                copy.write_row(row + ([verdict] if has_verdict else []))
        with cur.copy("COPY runs (job_id, config_id, config_index, repeat, world_size, steps_total, steps_done, "
                      "status, attempt, device) FROM STDIN") as copy:
            for n in range(count):
                for i in range(2):
                    copy.write_row((first + n, cfg[i], i, 0, 1, 100, 100, "succeeded", 1, "NVIDIA H200"))
        cur.execute("SELECT setval(pg_get_serial_sequence('jobs', 'id'), (SELECT max(id) FROM jobs))")
    conn.commit()
    return list(range(first, first + count))


def populate_findings(conn: psycopg.Connection, rows: int, job_ids: list[int]) -> dict[str, int]:
    """`rows` collective findings rows (SIZES per cell) with their folded cells, and a train measurement per
    collective cell in ten, over 40 configs x 12 stacks x 5 ops x 2 dtypes and a year."""
    rng = random.Random(0)
    configs = [f"cfg-{i:02d}" for i in range(40)]
    stacks = [(f"{w} x {gpu}", drv, rt, tv, lib) for w, gpu, drv, rt, tv, lib in [
        (w, gpu, drv, rt, tv, lib) for gpu, drv, rt, lib in (
            ("NVIDIA H200", "580.1", "CUDA 13.0", "NCCL 2.28.9"), ("NVIDIA H100", "570.4", "CUDA 12.8", "NCCL 2.27.5"),
            ("AMD MI300X", None, "ROCm 6.2", "RCCL 2.22.3")) for w in (2, 8) for tv in ("2.9.0", "2.11.0")]]
    ops = ["all_reduce_sum", "all_gather", "reduce_scatter_sum", "broadcast", "all_to_all"]
    dtypes = ["float32", "bfloat16"]
    now = datetime.now(UTC)
    cells_written = train_written = 0
    cell_cols = ("source, job_id, measured_at, kind, workload, op, dtype, config_index, config, config_env, stack, "
                 "hardware, world_size, driver, runtime, torch, library, identical, comparable, runs, cost, cost_lo, "
                 "cost_hi, first_divergent_step, largest_bytes, busbw_gbps")
    with conn.cursor() as cur, cur.copy(
            "COPY findings (source, recorded_at, hardware, library, world_size, config, config_env, op, dtype, "
            "bytes, runs, reproducible, busbw_gbps) FROM STDIN") as fcopy:
        cells: list[tuple[Any, ...]] = []
        when = now
        for n in range(rows // SIZES):
            # One sweep job per 40 cells: every config, on one op, dtype and stack.
            job_id = job_ids[(n // len(configs)) % len(job_ids)]
            source, config_index = f"job {job_id}", n % len(configs)
            config, stack = configs[config_index], stacks[(n // len(configs)) % len(stacks)]
            op_name, dtype = ops[(n // 480) % len(ops)], dtypes[(n // 2400) % len(dtypes)]
            hardware, driver, runtime, torch, library = stack
            parts = (hardware, driver and f"driver {driver}", runtime, f"torch {torch}", library)
            label = " · ".join(p for p in parts if p)
            if config_index == 0:
                when = now - timedelta(seconds=rng.randrange(365 * 86400))
            ok = 0
            for k in range(SIZES):
                repro = rng.random() < (0.9 if config_index % 2 else 0.5)
                ok += repro
                fcopy.write_row((source, when, hardware, library, int(hardware.split()[0]), config, "{}", op_name,
                                 dtype, 4096 << (2 * k), 3, repro, 100.0 * rng.random()))
            cells.append((source, job_id, when, "collective", "collective", op_name, dtype, config_index, config, "{}",
                          label, hardware, int(hardware.split()[0]), driver, runtime, torch, library, ok, SIZES, 3,
                          None, None, None, None, 4096 << (2 * (SIZES - 1)), 100.0 * rng.random()))
            if n % 10 == 0:
                cost = rng.gauss(0.15, 0.1)
                train_job = job_ids[-1 - (n // len(configs)) % len(job_ids)]
                cells.append((f"job {train_job}", train_job, when, "train", ["mlp", "tiny-lm", "scatter"][n % 3], "",
                              "", config_index, config, "{}", label, hardware, int(hardware.split()[0]), driver,
                              runtime, torch, library, rng.randrange(3), 2, 3, cost, cost - 0.05, cost + 0.05,
                              rng.randrange(1, 100) if rng.random() < 0.5 else None, None, None))
                train_written += 1
    with conn.cursor() as cur, cur.copy(f"COPY finding_cells ({cell_cols}) FROM STDIN") as copy:
        for cell in cells:
            copy.write_row(cell)
            cells_written += 1
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("ANALYZE")
    conn.commit()
    return {"findings_rows": rows // SIZES * SIZES, "finding_cells": cells_written, "train_measurements": train_written}


# ---- measuring -------------------------------------------------------------------------------


def timed(client: httpx.Client, url: str, n: int, **kw: Any) -> tuple[list[float], httpx.Response]:
    times, response = [], None
    for _ in range(n):
        start = time.perf_counter()
        response = client.get(url, **kw)
        times.append(time.perf_counter() - start)
        response.raise_for_status()
    assert response is not None
    return times, response


def baseline_comparison(job_id: int) -> dict[str, Any]:
    """The previous code path: the comparison with every step (as it was stored before results were thinned),
    read back, validated and serialised as GET …/comparison did."""
    from detlab.backend.db import get_sessionmaker
    from detlab.backend.reports import train as train_report
    from detlab.backend.services.jobs import load_job
    from detlab.core.results import TrainResult

    with get_sessionmaker()() as session:
        job = load_job(session=session, job_id=job_id)
        assert job is not None
        start = time.perf_counter()
        full = json.loads(json.dumps(train_report.build(session=session, job=job)), parse_constant=lambda _: None)
        build_s = time.perf_counter() - start
    text = json.dumps(full)
    start = time.perf_counter()
    body = TrainResult.model_validate(json.loads(text)).model_dump_json(exclude_unset=True)
    serve_s = time.perf_counter() - start
    return {"baseline_build_ms": ms(build_s), "baseline_comparison_ms": ms(serve_s),
            "baseline_comparison_bytes": len(body), "baseline_stored_bytes": len(text)}


def app() -> Any:
    """The app as served here (no reconciler: nothing here is dispatched)."""
    from detlab.backend.app import create_app

    return create_app(reconciler=False)


def serve(workers: int = 1) -> tuple[str, Any]:
    """The app under uvicorn in a process of its own (DETLAB_DATABASE_URL inherited), so that the readers'
    client threads do not share the server's interpreter; `workers` uvicorn worker processes."""
    import socket
    import subprocess

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "uvicorn", "scale:app", "--factory", "--app-dir",
                                os.path.dirname(os.path.abspath(__file__)), "--host", "127.0.0.1", "--port", str(port),
                                "--log-level", "warning", "--workers", str(workers)])
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/api/v1/live", timeout=5).status_code == 200:
                return base, process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise RuntimeError(f"the server did not start (exit code {process.returncode})")


def first_and_rest(client: httpx.Client, url: str, n: int, **kw: Any) -> tuple[float, float, httpx.Response]:
    """The first request (built: nothing cached) and the median of `n - 1` more (served from the cache)."""
    times, response = timed(client, url, max(n, 2), **kw)
    return ms(times[0]), ms(statistics.median(times[1:])), response


def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    os.environ["DETLAB_DATABASE_URL"] = url
    from alembic import command

    from detlab.backend.db import get_sessionmaker
    from detlab.backend.services.jobs import load_job
    from detlab.backend.services.settle import settle
    from detlab.migrations import alembic_config

    out: dict[str, Any] = {"steps": args.steps, "tensors": args.tensors, "runs": 2}
    command.upgrade(alembic_config(url), "head")
    pg = url.replace("postgresql+psycopg://", "postgresql://")
    started = time.perf_counter()
    with psycopg.connect(pg) as conn:
        job_id = populate_comparison(conn, args.steps, args.tensors, args.drift_every)
        out["drift_every"] = args.drift_every
        out["populate_comparison_s"] = round(time.perf_counter() - started, 1)
        job_ids = populate_jobs(conn, args.jobs)
        out["jobs"] = args.jobs + 1
        out.update(populate_findings(conn, args.findings, job_ids))
    out["populate_s"] = round(time.perf_counter() - started, 1)

    with get_sessionmaker()() as session:  # the job finishes: its result is built once and stored
        job = load_job(session=session, job_id=job_id)
        assert job is not None
        start = time.perf_counter()
        settle(session=session, job=job)
        session.commit()
        out["settle_ms"] = ms(time.perf_counter() - start)
        out["stored_result_bytes"] = len(json.dumps(job.result))
    if args.baseline:
        out.update(baseline_comparison(job_id))

    from detlab.backend.db import get_engine

    get_engine().dispose()
    base, server = serve(args.server_workers)
    atexit.register(server.terminate)  # also when a measurement fails
    out["server_workers"] = args.server_workers
    n = args.rounds
    with httpx.Client(base_url=base, timeout=120) as client:
        cmp = f"/api/v1/jobs/{job_id}/comparison"
        out["comparison_ms"], out["comparison_ms_cached"], resp = first_and_rest(client, cmp, n)
        out["comparison_bytes"] = len(resp.content)
        out["comparison_gzip_bytes"] = len(gzip.compress(resp.content, 5))
        out["comparison_points"] = len(resp.json()["per_step"])
        out["drift_points"] = len((resp.json().get("drift") or {}).get("points") or [])
        window = {"from_step": int(args.steps * 0.4) - 100, "to_step": int(args.steps * 0.4) + 1899}
        out["window_ms"], _, resp = first_and_rest(client, cmp, 2, params=window)
        out["window_bytes"], out["window_steps"] = len(resp.content), len(resp.json()["per_step"])
        out["figure_ms"], out["figure_ms_cached"], resp = first_and_rest(client, cmp + "/figure", n)
        out["figure_bytes"] = len(resp.content)
        out["drift_figure_ms"], out["drift_figure_ms_cached"], resp = first_and_rest(client, cmp + "/drift/figure", n)
        out["drift_figure_bytes"] = len(resp.content)
        out["window_figure_ms"], _, resp = first_and_rest(client, cmp + "/figure", 2, params=window)

        recent = (datetime.now(UTC) - timedelta(days=90)).date().isoformat()
        scopes = [{}, {"kind": "train"}, {"kind": "collective", "op": "all_reduce_sum", "dtype": "float32"},
                  {"kind": "train", "workload": "mlp", "since": recent},
                  {"kind": "collective", "op": "broadcast", "dtype": "bfloat16"}]
        matrix = client.get("/api/v1/findings/matrix", params={"kind": "train"}).json()
        picks = [{"config": c["config"], "stack": c["stack"], "kind": "train"} for c in matrix["cells"][:5]]
        findings_times: list[float] = []
        for i in range(args.findings_requests):
            if i % 3 == 2:
                times, _ = timed(client, "/api/v1/findings/history", 1, params=picks[i % len(picks)])
            else:
                times, _ = timed(client, "/api/v1/findings/matrix", 1, params=scopes[i % len(scopes)])
            findings_times += times
        out["findings_ms_p95"] = ms(p95(findings_times))
        out["findings_ms_median"] = ms(statistics.median(findings_times))
        # The same mix with every matrix built afresh: a distinct (future) `until` is a scope never cached.
        cold: list[float] = []
        for i in range(args.findings_requests):
            if i % 3 == 2:
                times, _ = timed(client, "/api/v1/findings/history", 1, params=picks[i % len(picks)])
            else:
                until = (datetime.now(UTC) + timedelta(days=1 + i)).date().isoformat()
                times, _ = timed(client, "/api/v1/findings/matrix", 1, params={**scopes[i % len(scopes)],
                                                                               "until": until})
            cold += times
        out["findings_ms_p95_uncached"] = ms(p95(cold))
        out["findings_ms_median_uncached"] = ms(statistics.median(cold))
        resp = client.get("/api/v1/findings/matrix", params={"kind": "train"})
        out["findings_revalidated_status"] = client.get(
            "/api/v1/findings/matrix", params={"kind": "train"},
            headers={"If-None-Match": resp.headers.get("etag", "")}).status_code

        jobs_times: list[float] = []
        for i in range(args.jobs_requests):
            times, _ = timed(client, "/api/v1/jobs", 1, params={"limit": 20, "offset": (i * 997) % max(args.jobs, 1)})
            jobs_times += times
        out["jobs_list_ms_p95"] = ms(p95(jobs_times))

        resp = client.get("/static/plotly.min.js", headers={"Accept-Encoding": "gzip"})
        out["plotly_bytes_sent"] = int(resp.headers.get("content-length", len(resp.content)))
        out["plotly_headers"] = {k: resp.headers.get(k) for k in ("content-encoding", "cache-control", "etag")}
        page = client.get("/jobs/1").text
        versioned = next(part.split('"')[0] for part in page.split('src="')[1:] if "plotly" in part)
        resp = client.get(versioned, headers={"Accept-Encoding": "gzip"})
        out["plotly_versioned_cache_control"] = resp.headers.get("cache-control")
        out["plotly_revalidated_status"] = client.get(
            "/static/plotly.min.js", headers={"If-None-Match": resp.headers["etag"]}).status_code

    mix = [f"/api/v1/jobs/{job_id}/comparison", f"/api/v1/jobs/{job_id}/comparison/figure",
           f"/api/v1/jobs/{job_id}/throughput/figure", "/api/v1/findings/matrix?kind=train",
           "/api/v1/jobs?limit=20", f"/api/v1/jobs/{job_id}"]

    def reader(k: int) -> list[float]:
        with httpx.Client(base_url=base, timeout=120, headers={"Accept-Encoding": "gzip"}) as c:
            times = []
            for i in range(args.reader_requests):
                start = time.perf_counter()
                c.get(mix[(k + i) % len(mix)]).raise_for_status()
                times.append(time.perf_counter() - start)
            return times

    with ThreadPoolExecutor(args.readers) as pool:
        start = time.perf_counter()
        all_times = [t for ts in pool.map(reader, range(args.readers)) for t in ts]
        wall = time.perf_counter() - start
    out["readers"] = args.readers
    out["readers_ms_p95"] = ms(p95(all_times))
    out["readers_ms_median"] = ms(statistics.median(all_times))
    out["readers_requests_per_s"] = round(len(all_times) / wall, 1)
    server.terminate()
    server.wait(30)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", required=True, help="a PostgreSQL server's URL (its maintenance database); "
                        "a database of its own is created there and dropped at the end")
    parser.add_argument("--json", action="store_true", help="print one JSON object (default: one line per figure)")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--tensors", type=int, default=200)
    parser.add_argument("--drift-every", type=int, default=500, help="steps between steps with drift statistics and "
                        "sketches (0: none, as records from before them); every step of the window has them")
    parser.add_argument("--findings", type=int, default=1_000_000, help="collective findings rows")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--readers", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="requests per single-request figure")
    parser.add_argument("--findings-requests", type=int, default=60)
    parser.add_argument("--jobs-requests", type=int, default=60)
    parser.add_argument("--reader-requests", type=int, default=12, help="requests per concurrent reader")
    parser.add_argument("--server-workers", type=int, default=1, help="uvicorn worker processes (detlab api runs 1)")
    parser.add_argument("--no-baseline", dest="baseline", action="store_false")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    args = parser.parse_args(argv)

    # A SIGTERM (a timeout) still drops the database created below: the `finally` runs on SystemExit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    admin = args.database_url.replace("postgresql+psycopg://", "postgresql://")
    name = f"detlab_scale_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = admin.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://") + f"/{name}"
    try:
        out = run(url, args)
    finally:
        from detlab.backend.db import get_engine

        if get_engine.cache_info().currsize:
            get_engine().dispose()
        if args.keep:
            print(f"kept database {name}", file=sys.stderr)
        else:
            with psycopg.connect(admin, autocommit=True) as conn:  # only the database created above
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    out["database"] = "PostgreSQL (own database, dropped)" if not args.keep else name
    if args.json:
        print(json.dumps(out))
    else:
        for key, value in out.items():
            print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
