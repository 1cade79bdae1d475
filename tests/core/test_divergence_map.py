"""The tensor × step map of where two runs differ: cells, ranks, caps."""

from __future__ import annotations

from detlab.core.divergence_map import tensor_step_map
from detlab.core.runs import RunData, StepData
from detlab.core.shards import DIGEST_BYTES


def run(run_id: int, world_size: int, steps: int, tensors: int, parted: dict[tuple[int, int], set[int]]) -> RunData:
    """A run whose tensor t at (step, rank) has digest 1 where `parted` lists it, else 0."""
    data = RunData(run_id=run_id, workload="mlp", world_size=world_size,
                   tensors=[(f"t{i}", [2], "float32") for i in range(tensors)])
    for step in range(steps):
        for rank in range(world_size):
            bad = parted.get((step, rank), set())
            digests = b"".join(bytes([1 if t in bad else 0]) * DIGEST_BYTES for t in range(tensors))
            data.records[(step, rank)] = StepData(digests, 1.0, 0.01, model_digest=digests.hex())
    return data


def test_cells_name_the_ranks_that_differ_and_share_rank_sets() -> None:
    a = run(1, 4, 4, 3, {})
    b = run(2, 4, 4, 3, {(2, 1): {0, 2}, (2, 3): {0}, (3, 1): {0, 2}, (3, 3): {0, 2}})
    found = tensor_step_map(a, b, [0, 1, 2, 3])
    assert found is not None
    assert (found["mode"], found["steps"], found["tensors"]) == ("per-rank", [2, 3], ["t0", "t2"])
    cells = {(step, found["tensors"][t]): found["rank_sets"][r] for step, t, r in found["cells"]}
    assert cells == {(2, "t0"): [1, 3], (2, "t2"): [1], (3, "t0"): [1, 3], (3, "t2"): [1, 3]}
    assert len(found["rank_sets"]) == 2  # [1, 3] once, [1] once
    assert (found["truncated"], found["note"], found["tensors_differing"]) == (False, None, 2)


def test_identical_runs_have_no_map() -> None:
    assert tensor_step_map(run(1, 2, 3, 2, {}), run(2, 2, 3, 2, {}), [0, 1, 2]) is None


def test_only_steps_with_loaded_digests_count_and_the_rest_are_noted() -> None:
    b = run(2, 2, 4, 2, {(s, 0): {1} for s in (1, 2, 3)})
    for step in (2, 3):  # as the report leaves steps outside its detail sample: model digests only
        for rank in range(2):
            b.records[(step, rank)].digests = None
    found = tensor_step_map(run(1, 2, 4, 2, {}), b, [1], steps_differing=3)
    assert found is not None and found["steps"] == [1] and found["truncated"] is True
    assert "compared at 1 of 3 differing steps" in found["note"]


def test_caps_keep_the_first_step_and_the_earliest_tensors() -> None:
    parted = {(s, 0): set(range(1, min(s, 9) + 1)) for s in range(1, 30)}  # tensor t differs from step t on
    found = tensor_step_map(run(1, 1, 30, 10, {}), run(2, 1, 30, 10, parted), list(range(30)),
                            max_tensors=3, max_steps=5)
    assert found is not None and found["truncated"] is True
    assert found["steps"][0] == 1 and len(found["steps"]) == 5
    assert found["tensors"] == ["t1", "t2", "t3"] and found["tensors_differing"] == 9
    assert "5 of 29 differing steps" in found["note"] and "3 of 9 differing tensors" in found["note"]
    assert all(0 <= t < 3 for _, t, _ in found["cells"])


def test_different_world_sizes_map_tensors_without_ranks() -> None:
    b = run(2, 4, 3, 2, {(1, r): {1} for r in range(4)})
    found = tensor_step_map(run(1, 2, 3, 2, {}), b, [0, 1, 2])
    assert found is not None and found["mode"] == "rank-consensus"
    assert (found["tensors"], found["rank_sets"], found["cells"]) == (["t1"], [[]], [[1, 0, 0]])
