"""Sharded models under `detlab compare`: FSDP2 (`fully_shard`) and Replicate() DTensors trained as two gloo
ranks under torchrun on CPU (tests/sdk/scripts/train_sharded.py), compared shard by shard."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from detlab.core.shards import RankTensor
from detlab.sdk import load_run
from tests.ranks import launcher, rank_env, run_ranks

SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_sharded.py"


def record(out: Path, *args: str, flip: str | None = None) -> Path:
    """Run the script as two ranks into `out`; `flip` = STEP:RANK:TENSOR moves one element of RANK's shard."""
    env = rank_env()
    if flip:
        env["DETLAB_TEST_FLIP"] = flip
    done = run_ranks([*launcher(2), str(SCRIPT), str(out), *args], env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def compare(*dirs: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-m", "detlab.cli", "compare", *map(str, dirs), "--json"],
                          capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def fsdp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("fsdp") / "a", "--grads", "--optimizer-state")


def test_each_rank_records_its_own_shards_with_their_placement(fsdp: Path) -> None:
    run = load_run(fsdp)
    # fc1 has 15 rows: rank 0 holds rows 0-7, rank 1 rows 8-14; fc2's one row lies on rank 0 alone
    assert run.rank_tensors[1][:3] == [
        RankTensor("0.weight", [7, 8], "float32", "Shard(dim=0) on mesh [2] at [1], offset [8, 0] of [15, 8]"),
        RankTensor("0.bias", [7], "float32", "Shard(dim=0) on mesh [2] at [1], offset [8] of [15]"),
        RankTensor("2.weight", [0, 15], "float32", "Shard(dim=0) on mesh [2] at [1], offset [1, 0] of [1, 15]")]
    assert run.rank_tensors[0][0].shape == [8, 8]
    assert [t.name for t in run.rank_tensors[1] if t.placement == ""] == [  # Adam's step counts are plain
        "0.weight.step", "0.bias.step", "2.weight.step", "2.bias.step"]


def test_two_fsdp2_runs_are_identical_shard_by_shard(fsdp: Path, tmp_path: Path) -> None:
    code, result = compare(fsdp, record(tmp_path / "b", "--grads", "--optimizer-state"))
    assert (code, result["verdict"], result["mode"], result["missing"]) == (0, "identical", "per-rank", [])
    assert (result["steps_compared"], result["replica_disagreements"]) == (5, [])


def test_one_element_of_rank_1s_shard_changed_names_step_tensor_and_rank(fsdp: Path, tmp_path: Path) -> None:
    code, result = compare(fsdp, record(tmp_path / "b", "--grads", "--optimizer-state", flip="2:1:0.weight"))
    assert code == 1
    assert {k: result[k] for k in ("verdict", "first_divergent_step", "first_divergent_tensors", "ranks")} == {
        "verdict": "diverged", "first_divergent_step": 2, "first_divergent_tensors": ["0.weight"], "ranks": [1]}


def test_another_sharding_of_the_same_model_is_incomparable(fsdp: Path, tmp_path: Path) -> None:
    code, result = compare(fsdp, record(tmp_path / "b", "--grads", "--optimizer-state", "--layout", "fsdp-dim1"))
    assert (code, result["verdict"]) == (2, "incomparable")
    assert result["reason"] == (
        "rank 0: tensors sharded differently: ['0.weight', '0.weight.exp_avg', '0.weight.exp_avg_sq', "
        "'0.weight.grad'] (0.weight: Shard(dim=0) on mesh [2] at [0], offset [0, 0] of [15, 8] vs "
        "Shard(dim=1) on mesh [2] at [0], offset [0, 0] of [15, 8])")


def test_replicate_dtensors_that_part_across_ranks_are_replicas_that_disagree(tmp_path: Path) -> None:
    agreeing = record(tmp_path / "a", "--layout", "replicate")
    parted = record(tmp_path / "b", "--layout", "replicate", flip="3:1:2.bias")
    assert compare(agreeing) == (0, {"verdict": "replicas-agree", "replicated_tensors": 4, "steps": 5,
                                     "replica_disagreements": [], "a": str(agreeing)})
    code, result = compare(parted)
    assert (code, result["verdict"]) == (1, "replicas-disagree")
    [row] = result["replica_disagreements"]
    assert (row["run"], row["step"], row["tensor"], sorted(row["ranks"])) == (1, 3, "2.bias", ["0", "1"])
    assert row["ranks"]["0"] != row["ranks"]["1"]
