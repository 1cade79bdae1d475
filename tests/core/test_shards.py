"""Unit tests of detlab.core.shards and of compare_runs on per-rank tensor lists: sharded runs compared shard
by shard, layouts that differ, and replicas that disagree within one run. Hand-built data, no torch."""

from __future__ import annotations

from typing import Any

from detlab.core.compare import compare_runs
from detlab.core.runs import RunData, StepData
from detlab.core.shards import (
    DIGEST_BYTES,
    RankTensor,
    layout_difference,
    list_difference,
    replica_disagreements,
    replicated_count,
)


def compared(a: RunData, b: RunData) -> dict[str, Any]:
    """The comparison as a report stores it (detlab.core.results.RunComparison.stored)."""
    return compare_runs(a, b).stored()

SHARD = "Shard(dim=0) on mesh [2] at [{r}], offset [{o}, 0] of [15, 8]"


def fsdp_tensors(rank: int, placement: str = SHARD) -> list[RankTensor]:
    """Rank `rank`'s list of an FSDP2 model: fc1.weight sharded unevenly (8 + 7 rows), a plain step count."""
    rows, offset = (8, 0) if rank == 0 else (7, 8)
    return [RankTensor("fc1.weight", [rows, 8], "float32", placement.format(r=rank, o=offset)),
            RankTensor("fc1.weight.step", [], "float32")]


def ddp_tensors() -> list[RankTensor]:
    """A DDP model's list: parameters are replicas of rank 0's, the BatchNorm buffer is each rank's own."""
    return [RankTensor("fc1.weight", [8, 4], "float32", replica_of=0), RankTensor("bn.running_mean", [8], "float32"),
            RankTensor("fc1.bias", [8], "float32", replica_of=0)]


def digests(*ids: int) -> bytes:
    return b"".join(bytes([i]) * DIGEST_BYTES for i in ids)


def make_run(run_id: int, tensors: dict[int, list[RankTensor]], steps: range = range(3),
             changed: dict[tuple[int, int], bytes] | None = None) -> RunData:
    """Every rank holds digests 1, 2, ... of its list at every step, except where `changed` says."""
    records = {(s, r): StepData(digests(*range(1, len(tensors[r]) + 1)), 1.0, 0.1) for s in steps for r in tensors}
    for key, value in (changed or {}).items():
        records[key].digests = value
    first = tensors[min(tensors)]
    return RunData(run_id=run_id, workload="sdk", world_size=len(tensors), fp_versions={"fp2"},
                   tensors=[(t.name, t.shape, t.dtype) for t in first], records=records, rank_tensors=tensors)


def fsdp_run(run_id: int, **kwargs: object) -> RunData:
    return make_run(run_id, {0: fsdp_tensors(0), 1: fsdp_tensors(1)}, **kwargs)  # type: ignore[arg-type]


def test_sharded_runs_with_equal_shards_are_identical() -> None:
    result = compared(fsdp_run(1), fsdp_run(2))
    assert (result["verdict"], result["mode"], result["replica_disagreements"]) == ("identical", "per-rank", [])


def test_a_changed_shard_is_named_with_its_rank_own_list() -> None:
    # rank 1's list holds one tensor only: index 0 there is its own shard, read with its own list
    a = make_run(1, {0: fsdp_tensors(0), 1: fsdp_tensors(1)[1:]})
    b = make_run(2, {0: fsdp_tensors(0), 1: fsdp_tensors(1)[1:]}, changed={(1, 1): digests(9)})
    result = compared(a, b)
    assert (result["first_divergent_step"], result["first_divergent_tensors"], result["ranks"]) == (
        1, ["fc1.weight.step"], [1])


def test_a_different_placement_makes_sharded_runs_incomparable() -> None:
    other = "Shard(dim=1) on mesh [2] at [{r}], offset [0, {o}] of [15, 8]"
    b = make_run(2, {0: fsdp_tensors(0, other), 1: fsdp_tensors(1, other)})
    result = compared(fsdp_run(1), b)
    assert result["verdict"] == "incomparable"
    assert result["reason"] == ("rank 0: tensors sharded differently: ['fc1.weight'] (fc1.weight: Shard(dim=0) "
                                "on mesh [2] at [0], offset [0, 0] of [15, 8] vs Shard(dim=1) on mesh [2] at [0], "
                                "offset [0, 0] of [15, 8])")


def test_a_sharded_and_a_plain_tensor_are_named_as_such() -> None:
    plain = [RankTensor("fc1.weight", [8, 8], "float32")]
    assert list_difference([fsdp_tensors(0)[0]], plain) == (
        f"tensors sharded differently: ['fc1.weight'] (fc1.weight: {SHARD.format(r=0, o=0)} vs not sharded)")


def test_sharded_runs_of_other_world_sizes_are_incomparable() -> None:
    four = {r: fsdp_tensors(min(r, 1)) for r in range(4)}
    assert layout_difference({0: fsdp_tensors(0), 1: fsdp_tensors(1)}, four, (2, 4)) == (
        "sharded tensors compare shard by shard, at one world size: 2 vs 4 ranks")


def test_replicated_runs_keep_the_whole_list_messages() -> None:
    b = make_run(2, {0: ddp_tensors()[:2], 1: ddp_tensors()[:2]})
    result = compared(make_run(1, {0: ddp_tensors(), 1: ddp_tensors()}), b)
    assert result["reason"] == "tensors present in one run only: ['fc1.bias']"


def test_replicas_that_agree_report_nothing() -> None:
    run = make_run(1, {0: ddp_tensors(), 1: ddp_tensors()}, changed={(1, 1): digests(1, 7, 3)})  # a buffer
    assert replica_disagreements(1, run.rank_tensors, {k: d.digests for k, d in run.records.items()}, "fp2") == []
    assert replicated_count(run.rank_tensors) == 2


def test_a_replica_out_of_step_is_reported_at_its_first_step_with_every_rank_digest() -> None:
    out_of_step = {(1, 1): digests(5, 2, 3), (2, 1): digests(5, 2, 6)}  # rank 1's fc1.weight from step 1 on
    run = make_run(1, {0: ddp_tensors(), 1: ddp_tensors()}, changed=out_of_step)
    result = compare_runs(run, make_run(2, {0: ddp_tensors(), 1: ddp_tensors()}))
    assert [row.model_dump() for row in result.replica_disagreements] == [
        {"run": 1, "step": 1, "tensor": "fc1.weight", "ranks": {0: "fp2:" + "01" * 16, 1: "fp2:" + "05" * 16}}]


def test_replicas_are_matched_by_name_in_each_rank_own_list() -> None:
    # rank 1 records fc1.bias first: its index differs, the tensor is the same
    moved = [ddp_tensors()[2], *ddp_tensors()[:2]]
    run = make_run(1, {0: ddp_tensors(), 1: moved})
    run.records[(0, 1)].digests = digests(3, 1, 2)  # the same digests, in rank 1's order
    rows = replica_disagreements(1, run.rank_tensors, {k: d.digests for k, d in run.records.items()}, "fp2")
    assert [(r["step"], r["tensor"]) for r in rows] == [(1, "fc1.weight"), (1, "fc1.bias")]  # step 0 agrees


def test_ranks_replicating_different_groups_are_not_compared() -> None:
    # a 2 x 2 mesh, Replicate() along dim 0: ranks {0, 2} hold one shard, {1, 3} the other
    tensors = {r: [RankTensor("w", [4], "float32", replica_of=r % 2)] for r in range(4)}
    run = make_run(1, tensors, changed={(0, 1): digests(8), (0, 3): digests(8)})
    assert replica_disagreements(1, tensors, {k: d.digests for k, d in run.records.items()}, "fp2") == []
    run.records[(0, 2)].digests = digests(9)
    [row] = replica_disagreements(1, tensors, {k: d.digests for k, d in run.records.items()}, "fp2")
    assert (row["step"], row["tensor"], sorted(row["ranks"])) == (0, "w", [0, 2])


def test_steps_without_loaded_digests_are_skipped() -> None:
    run = make_run(1, {0: ddp_tensors(), 1: ddp_tensors()}, changed={(0, 1): digests(5, 2, 3)})
    run.records[(0, 0)].digests = None
    assert replica_disagreements(1, run.rank_tensors, {k: d.digests for k, d in run.records.items()}, "fp2") == []


def test_runs_without_per_rank_lists_report_no_replicas() -> None:
    run = make_run(1, {0: ddp_tensors(), 1: ddp_tensors()}, changed={(0, 1): digests(5, 2, 3)})
    run.rank_tensors = {}
    assert compared(run, run)["replica_disagreements"] == []
