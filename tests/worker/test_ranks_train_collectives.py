"""The built-in train ranks with `record_collectives`: two real gloo ranks under the worker's launcher record
every DDP bucket's allreduce with their data-parallel position, and two runs' calls compare equal."""

from __future__ import annotations

from pathlib import Path

from detlab.core import collective_calls
from detlab.core.wire import BitFlip, CallsRecord, EnvRecord, RankSpec, RunSpec
from detlab.sdk.store import step_calls
from detlab.worker.launch import launch_ranks
from detlab.worker.runner import child_env


def train(tmp_path: Path, name: str, flip: BitFlip | None = None) -> list:
    spec = RunSpec(run_id=1, attempt=1, workload="mlp", kind="train", world_size=2, steps=3, threads=1,
                   record_collectives=True, inject_bitflip=flip)
    folder = tmp_path / name
    folder.mkdir()
    got: list = []
    launch_ranks(RankSpec.for_run(spec, device="cpu"), folder, env=lambda rank: child_env(spec, rank, folder),
                 on_records=got.extend, timeout_s=300)
    return got


def calls_of(records: list) -> collective_calls.RunCalls:
    return {(r.step, r.rank): step_calls(r) for r in records if isinstance(r, CallsRecord)}


def test_each_step_records_its_bucket_allreduces_and_each_rank_its_position(tmp_path: Path) -> None:
    got = train(tmp_path, "a")
    assert sorted((e.rank, e.position) for e in got if isinstance(e, EnvRecord)) == [(0, {"dp": 0}), (1, {"dp": 1})]
    calls = calls_of(got)
    assert sorted(calls) == [(s, r) for s in (1, 2, 3) for r in (0, 1)]
    assert {c[0] for sc in calls.values() for c in sc.calls} == {"ddp_allreduce"}
    assert all(c[3] == 2 for sc in calls.values() for c in sc.calls)


def test_two_runs_make_the_same_calls_with_the_same_inputs_and_outputs(tmp_path: Path) -> None:
    """(A flip of a parameter's lowest bit, the workers' fault injection, is absorbed by this MLP's forward: the
    next steps' gradients are bit-equal, so no call differs; the SDK tests plant a bit in a gradient instead.)"""
    a, b = calls_of(train(tmp_path, "a")), calls_of(train(tmp_path, "b", BitFlip(step=1, tensor="0.weight", rank=1)))
    result = collective_calls.first_difference(a, b)
    assert result["status"] == "identical" and result["calls_compared"] == 10
    assert all(sc.inputs != sc.outputs for sc in a.values())  # a bucket's sum is not its rank's share
