"""Ranks leave their process group without hanging (detlab.worker.ranks.teardown), however late their gloo workers
are to free the collectives they ran: tests/worker/busy_gloo.py keeps one busy in Python past the final barrier,
which a rank that joins the workers with the GIL held never gets past."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from detlab.core.configs import TorchFlags
from detlab.core.wire import RankSpec, Record, RunSpec, StepRecord
from detlab.worker.launch import launch_ranks
from detlab.worker.runner import script_env
from tests.worker.test_scripts import SCRIPT

BUSY = [sys.executable, str(Path(__file__).resolve().parent / "busy_gloo.py")]


def ranks_at(records: list[Record], step: int) -> list[int]:
    return sorted(r.rank for r in records if isinstance(r, StepRecord) and r.step == step)


def test_a_bisect_rank_exits_while_a_gloo_worker_still_holds_python_state(tmp_path: Path) -> None:
    # The scatter bisect of tests/e2e/test_bisect.py, probing step 1 under its config's torch flags: DDP's reducer is
    # then the group's last owner (without flags, torch keeps references of its own to the group until exit).
    spec = RankSpec(kind="train", workload="scatter", world_size=2, steps=1, probe_step=1, device="cpu", threads=2,
                    torch=TorchFlags())
    records: list[Record] = []
    launch_ranks(spec, tmp_path, on_records=records.extend, poll_s=0.05, timeout_s=120,
                 argv=[*BUSY, "-m", "detlab.worker.ranks.train", str(tmp_path / "spec.json")])
    assert ranks_at(records, 1) == [0, 1]


def test_a_registered_script_probed_by_a_bisect_exits_while_a_gloo_worker_still_holds_python_state(
        tmp_path: Path) -> None:
    # tests/sdk/scripts/train.py keeps its group past its model and drops it last, as worker/ranks/teardown.py does.
    spec = RunSpec(run_id=1, attempt=1, workload="sdk-train", kind="train", world_size=2, steps=2, probe_step=2)
    base = {k: v for k, v in os.environ.items() if not k.startswith("DETLAB_")}
    records: list[Record] = []
    launch_ranks(RankSpec.for_run(spec, device="cpu"), tmp_path, on_records=records.extend, poll_s=0.05, timeout_s=120,
                 env=lambda _rank: {**base, **script_env(spec, tmp_path)},
                 argv=[*BUSY, str(SCRIPT), str(tmp_path / "ignored"), "--steps", "5"], cwd=tmp_path)
    assert ranks_at(records, 2) == [0, 1]
