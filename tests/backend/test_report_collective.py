"""Collective results assembly: equivalence classes and cross-config equality (pure parts)."""

from __future__ import annotations

from typing import Any

from detlab.backend.reports.collective import cell_rows, equality


def trial(digest: str, *, rank: int = 0, trial: int = 0, op: str = "all_reduce_sum",
          size: int = 4096) -> dict[str, Any]:
    return {"op": op, "dtype": "float32", "bytes": size, "trial": trial, "rank": rank, "digest": digest,
            "prefix_digest": digest, "time_s": 1e-3, "err_max_abs": 0.0, "err_max_ulp": 0.0, "frac_diff": 0.0,
            "impl": "all_reduce", "world_size": 2}


def run(digest: str, trials: int = 2) -> list[dict[str, Any]]:
    return [trial(digest, rank=r, trial=t) for t in range(trials) for r in range(2)]


def test_a_fresh_process_that_differs_is_seen_across_runs_not_in_process() -> None:
    row = cell_rows(0, [run("fp1:a"), run("fp1:b")], 2, ["n1", "n1"])[0]
    assert row["distinct_in_process"] == 1
    assert row["distinct_across_runs"] == 2
    assert row["reproducible"] is False
    assert row["distinct_across_nodes"] is None  # one node: the class does not apply


def test_nodes_that_disagree_are_counted() -> None:
    row = cell_rows(0, [run("fp1:a"), run("fp1:a"), run("fp1:b")], 2, ["n1", "n1", "n2"])[0]
    assert row["nodes"] == 2 and row["distinct_across_nodes"] == 2


def test_equality_matrix_compares_outputs_rank_by_rank() -> None:
    same = {("all_reduce_sum", "float32", 4096): {0: "x", 1: "x"}}
    other = {("all_reduce_sum", "float32", 4096): {0: "x", 1: "y"}}
    [cell] = equality([same, same, other], [2, 2, 2])
    assert cell["equal"] == [[True, True, False], [True, True, False], [False, False, True]]


def test_reduce_scatter_is_not_compared_across_world_sizes() -> None:
    out = {("reduce_scatter", "float32", 4096): {0: "x"}}
    [cell] = equality([out, out], [2, 4])
    assert cell["equal"][0][1] is None
