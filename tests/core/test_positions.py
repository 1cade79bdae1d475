"""Ranks lined up by logical position (detlab.core.positions) and the train comparison that uses it."""

from __future__ import annotations

from typing import Any

from detlab.core import positions
from detlab.core.compare import compare_runs
from detlab.core.runs import RunData, StepData


def compared(a: RunData, b: RunData) -> dict[str, Any]:
    """The comparison as a report stores it (detlab.core.results.RunComparison.stored)."""
    return compare_runs(a, b).stored()


def test_equal_positions_under_other_rank_numbers_line_up() -> None:
    got = positions.line_up((1, 2), {0: {"dp": 0, "tp": 0}, 1: {"dp": 0, "tp": 1}},
                            {0: {"dp": 0, "tp": 1}, 1: {"dp": 0, "tp": 0}}, (2, 2))
    assert got.b_to_a == {0: 1, 1: 0} and got.reason is None and "lined up by logical position" in (got.note or "")


def test_without_positions_on_every_rank_ranks_meet_by_number() -> None:
    assert positions.line_up((1, 2), {0: {"dp": 0}}, {0: {"dp": 0}, 1: {"dp": 1}}, (2, 2)) == positions.Alignment()
    assert positions.line_up((1, 2), {}, {0: {"dp": 0}}, (1, 1)) == positions.Alignment()


def test_two_ranks_at_one_position_are_refused() -> None:
    got = positions.line_up((1, 2), {0: {"dp": 0}, 1: {"dp": 0}}, {0: {"dp": 0}, 1: {"dp": 1}}, (2, 2))
    assert got.reason == "positions do not line up: ranks 0 and 1 of run 1 record the same position dp=0"


def test_other_dimensions_are_refused() -> None:
    got = positions.line_up((1, 2), {0: {"dp": 0}}, {0: {"tp": 0}}, (1, 1))
    assert "run 1 records dimensions ['dp'], run 2 ['tp']" in (got.reason or "")


def test_data_parallel_runs_at_two_world_sizes_keep_the_rank_consensus() -> None:
    got = positions.line_up((1, 2), {0: {"dp": 0, "tp": 0}, 1: {"dp": 1, "tp": 0}},
                            {r: {"dp": r, "tp": 0} for r in range(4)}, (2, 4))
    assert got == positions.Alignment()


def test_tensor_parallel_runs_whose_positions_differ_are_refused() -> None:
    got = positions.line_up((1, 2), {0: {"dp": 0, "tp": 0}, 1: {"dp": 0, "tp": 1}},
                            {r: {"dp": r // 2, "tp": r % 2} for r in range(4)}, (2, 4))
    assert got.reason == "positions do not line up: run 2 alone has dp=1,tp=0, dp=1,tp=1"


def _run(run_id: int, digests: dict[int, str], where: dict[int, int] | None) -> RunData:
    """Two steps, one rank-local tensor: rank r holds digests[r]; `where`: rank -> dp (None: not recorded)."""
    records = {(step, rank): StepData(bytes.fromhex(d * 16), None, 0.0, f"fp2:{d * 16}")
               for step in (0, 1) for rank, d in digests.items()}
    return RunData(run_id=run_id, workload="sdk", world_size=2, tensors=[("bn.running_mean", [4], "float32")],
                   records=records, fp_versions={"fp2"}, status="succeeded",
                   positions={r: {"dp": dp} for r, dp in where.items()} if where else {})


def test_runs_whose_ranks_are_swapped_compare_identical_by_position() -> None:
    a = _run(1, {0: "aa", 1: "bb"}, {0: 0, 1: 1})
    b = _run(2, {0: "bb", 1: "aa"}, {0: 1, 1: 0})
    result = compared(a, b)
    assert result["verdict"] == "identical" and "run 2's ranks [0, 1] are numbered otherwise" in result["reason"]
    by_number = compared(_run(1, {0: "aa", 1: "bb"}, None), _run(2, {0: "bb", 1: "aa"}, None))
    assert by_number["verdict"] == "diverged" and by_number["ranks"] == [0, 1]


def test_runs_whose_positions_do_not_line_up_are_incomparable() -> None:
    result = compared(_run(1, {0: "aa", 1: "bb"}, {0: 0, 1: 1}), _run(2, {0: "aa", 1: "bb"}, {0: 0, 1: 0}))
    assert result["verdict"] == "incomparable" and "positions do not line up" in result["reason"]
