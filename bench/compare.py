"""How long a train comparison takes to build, against loading every packed digest (the baseline).

Writes two synthetic runs (S steps x W ranks x T tensors, diverging half way) into a fresh SQLite
file (or --database-url), then times `reports.train.build` (model digests first, packed digests for the
first divergent step and a sample) against the same comparison with every step's packed digests
loaded. Prints medians and min-max over --repeats.

    python bench/compare.py --steps 20000 --ranks 8 --tensors 150
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.db import make_engine
from detlab.backend.models import Base, Config, Job, Run, StepRecord, TensorMeta
from detlab.backend.reports import train as train_report
from detlab.backend.services.jobs import load_job
from detlab.core import compare


def populate(session: Session, steps: int, ranks: int, tensors: int) -> int:
    config = Config(name="c", hash="h", body={"env": {}, "torch": {}, "threads": None, "seed": 0})
    session.add(config)
    session.flush()
    job = Job(kind="train", workload="mlp", world_size=ranks, steps=steps, repeats=1, params={"global_batch": 64},
              config_ids=[config.id, config.id])
    session.add(job)
    session.flush()
    runs = [Run(job_id=job.id, config_id=config.id, config_index=i, repeat=0, world_size=ranks, steps_total=steps,
                status="succeeded") for i in range(2)]
    session.add_all(runs)
    session.flush()
    same = bytes(range(16)) * tensors
    for run in runs:
        session.execute(insert(TensorMeta), [{"run_id": run.id, "index": i, "name": f"t{i}", "shape": [4],
                                              "dtype": "float32"} for i in range(tensors)])
        rows = []
        for step in range(steps + 1):
            packed = same if run.config_index == 0 or step < steps // 2 else bytes([step % 256]) * 16 + same[16:]
            rows += [{"run_id": run.id, "step": step, "rank": rank, "attempt": 1, "fp_version": "fp1",
                      "model_digest": f"fp1:{hash(packed) & (2**64 - 1):032x}", "digests": packed, "loss_bits": "0",
                      "loss": 1.0, "step_time_s": 0.01} for rank in range(ranks)]
            if len(rows) >= 5000:
                session.execute(insert(StepRecord), rows)
                rows = []
        if rows:
            session.execute(insert(StepRecord), rows)
    session.commit()
    return job.id


def full_load(session: Session, job: Job) -> dict:
    runs = sorted(job.runs, key=lambda r: r.config_index)
    a, b = (train_report.load_run(session=session, run=r, workload=job.workload) for r in runs)
    train_report.load_detail(session=session, runs=[a, b], steps=a.steps())
    return compare.compare_runs(a, b).stored()


def timed(fn, repeats: int) -> list[float]:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--tensors", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    url = args.database_url or f"sqlite:///{Path(tempfile.mkdtemp()) / 'bench.sqlite3'}"
    engine = make_engine(url)
    Base.metadata.drop_all(engine)
    Base.metadata.create_all(engine)
    with sessionmaker(engine, expire_on_commit=False)() as session:
        job_id = populate(session, args.steps, args.ranks, args.tensors)
        print(f"{args.steps} steps x {args.ranks} ranks x {args.tensors} tensors, diverging at step "
              f"{args.steps // 2}, on {engine.dialect.name}")
        for name, fn in (("build (model digests + sampled detail)", train_report.build),
                         ("baseline: every packed digest loaded", full_load)):
            def once(fn=fn) -> None:  # type: ignore[no-untyped-def]
                session.expire_all()
                fn(session=session, job=load_job(session=session, job_id=job_id)) if fn is train_report.build \
                    else fn(session, load_job(session=session, job_id=job_id))
            t = timed(once, args.repeats)
            print(f"  {name:42s} median {statistics.median(t):7.3f} s  (min {min(t):.3f}, max {max(t):.3f})")


if __name__ == "__main__":
    main()
