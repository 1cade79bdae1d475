"""Job creation: sweeps expand to one config per cell; collective jobs size their runs."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from detlab.backend.api import ingest as api_ingest
from detlab.backend.kinds.base import InvalidJob
from detlab.backend.kinds.registry import JobCreate
from detlab.backend.kinds.sweep import CHANNEL_VARS, expand_sweep
from detlab.backend.models import RUNNING, SUCCEEDED, Run, utcnow
from detlab.backend.services.jobs import create_job
from detlab.backend.services.reconcile import reconcile
from detlab.backend.services.workers import heartbeat
from detlab.core import configs
from detlab.core.settings import Settings
from detlab.core.wire import Heartbeat

pytestmark = pytest.mark.both_databases  # the store itself: SQLite (embedded) and PostgreSQL


def test_sweep_has_one_config_per_cell_of_the_product() -> None:
    cells = expand_sweep(configs.preset("default"), {"NCCL_ALGO": [None, "Ring", "Tree"],
                                                     "NCCL_PROTO": [None, "LL", "LL128", "Simple"]})
    assert len(cells) == 12
    assert len({c.name for c in cells}) == 12
    assert {(c.env.get("NCCL_ALGO"), c.env.get("NCCL_PROTO")) for c in cells} == {
        (a, p) for a in (None, "Ring", "Tree") for p in (None, "LL", "LL128", "Simple")}


def test_sweep_channels_knob_sets_nchannels_and_ctas() -> None:
    one = expand_sweep(configs.preset("default"), {"channels": ["1"]})[0]
    assert {k: one.env[k] for k in CHANNEL_VARS} == dict.fromkeys(CHANNEL_VARS, "1")
    assert one.name == "channels-1"


def test_sweep_default_cell_drops_the_base_configs_value_of_a_swept_knob() -> None:
    base = configs.preset("nccl-tree-simple-1ch")
    cells = expand_sweep(base, {"NCCL_ALGO": [None, "Ring"]})
    assert "NCCL_ALGO" not in cells[0].env and cells[0].name == "default"
    assert cells[1].env["NCCL_ALGO"] == "Ring"
    assert all(c.env["NCCL_PROTO"] == "Simple" for c in cells)  # unswept knobs keep the base's value


def test_sweep_knob_values_are_validated_like_config_env() -> None:
    with pytest.raises(InvalidJob, match="NCCL_ALGO: unknown value"):
        expand_sweep(configs.preset("default"), {"NCCL_ALGO": ["Bogus"]})
    with pytest.raises(InvalidJob, match="LD_PRELOAD is not an allowed variable"):
        expand_sweep(configs.preset("default"), {"LD_PRELOAD": ["x"]})


def test_sweep_over_the_cell_limit_is_refused() -> None:
    with pytest.raises(InvalidJob, match="at most 64"):
        expand_sweep(configs.preset("default"), {"NCCL_BUFFSIZE": [str(4096 * i) for i in range(1, 10)],
                                                 "NCCL_NTHREADS": [str(64 * i) for i in range(1, 9)]})


def test_collective_job_counts_cells_as_steps_and_stores_sizes(session: Session, tmp_path: Path) -> None:
    data = JobCreate.model_validate({"kind": "collective", "world_size": 2,
                                     "configs": [{}, {"preset": "nccl-ring-simple"}],
                                     "collective": {"ops": ["all_reduce_sum", "all_gather"], "dtypes": ["float32"],
                                                    "min_bytes": 4096, "max_bytes": 65536}})
    job = create_job(session=session, data=data, settings=Settings(data_dir=tmp_path), submitter=None)
    assert job.workload == "collective"
    assert job.params["collective"]["sizes"] == [4096, 16384, 65536]
    assert [r.steps_total for r in job.runs] == [6, 6]


def test_sweep_job_runs_every_cell_for_every_repeat_interleaved(session: Session, tmp_path: Path) -> None:
    data = JobCreate.model_validate({"kind": "sweep", "world_size": 2, "repeats": 2, "configs": [{}],
                                     "sweep": {"over": "collective", "knobs": {"NCCL_PROTO": ["LL", "Simple"]}}})
    job = create_job(session=session, data=data, settings=Settings(data_dir=tmp_path), submitter=None)
    assert job.kind == "sweep" and len(job.config_ids) == 2
    assert [(r.repeat, r.config_index) for r in job.runs] == [(0, 0), (0, 1), (1, 0), (1, 1)]


def test_sweep_needs_exactly_one_base_config(session: Session, tmp_path: Path) -> None:
    data = JobCreate.model_validate({"kind": "sweep", "configs": [{}, {}],
                                     "sweep": {"knobs": {"NCCL_PROTO": ["LL"]}}})
    with pytest.raises(InvalidJob, match="exactly one base config"):
        create_job(session=session, data=data, settings=Settings(data_dir=tmp_path), submitter=None)


@pytest.mark.parametrize("body", [
    {"kind": "collective", "configs": [{"world_size": 1024}]},
    {"kind": "train", "workload": "mlp", "world_size": 2, "configs": [{}, {"world_size": 128}]},
    {"kind": "sweep", "configs": [{"world_size": 65}], "sweep": {"knobs": {"NCCL_ALGO": ["Ring"]}}},
])
def test_a_configs_own_world_size_is_held_to_the_limit(session: Session, body: dict) -> None:
    with pytest.raises(InvalidJob, match="at most 64 ranks"):
        create_job(session=session, data=JobCreate.model_validate(body), settings=Settings(), submitter=None)


def test_bitflip_rank_must_exist_in_every_run(session: Session) -> None:
    body = {"workload": "mlp", "world_size": 2, "configs": [{}, {"world_size": 1}],
            "inject_bitflip": {"step": 1, "tensor": "0.weight", "rank": 1}}
    with pytest.raises(InvalidJob, match="inject_bitflip.rank must be < world_size"):
        create_job(session=session, data=JobCreate.model_validate(body), settings=Settings(), submitter=None)


def test_a_workload_a_worker_advertised_can_be_submitted(session: Session) -> None:
    data = JobCreate.model_validate({"workload": "team-gpt", "configs": [{}]})
    with pytest.raises(InvalidJob, match="unknown workload 'team-gpt'"):
        create_job(session=session, data=data, settings=Settings(), submitter=None)
    heartbeat(session=session, beat=Heartbeat(worker="gpu-node:h200", queue="h200", info={"workloads": [
        {"name": "team-gpt", "description": "ours", "global_batch": 8, "default_steps": 7}]}))
    job = create_job(session=session, data=data, settings=Settings(), submitter=None)
    assert (job.workload, job.steps, job.params["global_batch"]) == ("team-gpt", 7, 8)


def test_a_job_whose_last_runs_finished_together_is_settled_by_the_reconciler(session: Session, tmp_path: Path) -> None:
    """Two finishes at once each see the other run unfinished and leave the job running; the reconciler settles
    it (and finds nothing to dispatch)."""
    data = JobCreate.model_validate({"workload": "mlp", "steps": 2, "repeats": 2, "configs": [{}]})
    settings = Settings(data_dir=tmp_path)
    job = create_job(session=session, data=data, settings=settings, submitter=None)
    job.status = "running"
    for run in job.runs:
        run.status = "succeeded"  # as two concurrent finishes leave them: no settle saw both
    session.commit()
    assert reconcile(session=session, settings=settings) == []
    session.commit()
    assert job.status == "succeeded"


def test_the_reconciler_never_overwrites_a_finish_it_races(engine: Engine, tmp_path: Path) -> None:
    """A run's worker was silent past the stale limit and then finishes the run: its finish holds the run (as the
    ingest route locks it) when the reconciler comes to fail it. Before, the reconciler read the run as running and
    its `failed` overwrote the finish's `succeeded`; now it waits for the finish (SQLite) or passes the run over
    (PostgreSQL)."""
    settings = Settings(data_dir=tmp_path, run_stale_after_s=0.01, max_attempts=1)
    make = sessionmaker(engine, expire_on_commit=False)
    with make() as session:
        data = JobCreate.model_validate({"workload": "mlp", "steps": 2, "configs": [{}]})
        job = create_job(session=session, data=data, settings=settings, submitter=None)
        job.status, run = RUNNING, job.runs[0]
        run.status, run.attempt, run.heartbeat_at = RUNNING, 1, utcnow() - timedelta(minutes=5)
        session.commit()
        run_id = run.id
    holding = threading.Event()

    def finish() -> None:
        with make() as session:
            finished = api_ingest._run(session, run_id)
            finished.status, finished.finished_at = SUCCEEDED, utcnow()
            session.flush()
            holding.set()
            time.sleep(1.0)  # the reconciler runs meanwhile
            session.commit()

    worker = threading.Thread(target=finish)
    worker.start()
    assert holding.wait(30)
    with make() as session:
        reconcile(session=session, settings=settings)
        session.commit()
    worker.join(30)
    with make() as session:
        assert session.get(Run, run_id).status == SUCCEEDED
