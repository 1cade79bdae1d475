"""Unit tests of detlab.backend.figures.collective on hand-made /collective result dicts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from detlab.backend.figures.collective import (
    collective_figures,
    config_names,
    equality_shares,
    frontier_points,
    human_bytes,
    pareto_front,
)

KIB, MIB = 1 << 10, 1 << 20


def make_cell(config_index: int, size: int, **overrides: Any) -> dict[str, Any]:
    """A reproducible all_reduce_sum float32 cell; override any field."""
    cell: dict[str, Any] = {
        "config_index": config_index, "op": "all_reduce_sum", "dtype": "float32", "bytes": size,
        "trials": 15, "runs": 3, "distinct_in_process": 1, "distinct_across_runs": 1,
        "rank_consistent": True, "reproducible": True, "time_us": 12.3, "algbw_gbps": 1.0,
        "busbw_gbps": 2.0, "busbw_spread": [1.5, 2.5], "err_max_abs": 1e-6, "err_max_ulp": 2.0, "frac_diff": 0.01,
    }
    cell.update(overrides)
    return cell


def make_result(cells: list[dict[str, Any]] | None = None, **overrides: Any) -> dict[str, Any]:
    """Two configs (default, tree-simple) at 4 KiB and 1 MiB; default is not reproducible at 1 MiB."""
    result: dict[str, Any] = {
        "world_size": 2,
        "configs": [{"index": 0, "name": "default", "env": {}},
                    {"index": 1, "name": "tree-simple", "env": {"NCCL_ALGO": "Tree"}}],
        "cells": cells if cells is not None else [
            make_cell(0, 4 * KIB, busbw_gbps=1.0),
            make_cell(0, MIB, busbw_gbps=10.0, distinct_across_runs=3, reproducible=False),
            make_cell(1, 4 * KIB, busbw_gbps=0.8),
            make_cell(1, MIB, busbw_gbps=6.0),
        ],
        "equality": [
            {"op": "all_reduce_sum", "dtype": "float32", "bytes": 4 * KIB, "equal": [[True, False], [False, True]]},
            {"op": "all_reduce_sum", "dtype": "float32", "bytes": MIB, "equal": [[True, True], [True, True]]},
        ],
        "effective": [], "logs": [], "note": None, "export": {},
    }
    result.update(overrides)
    return result


def traces(fig: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [t for t in fig["data"] if t.get("name") == name]


def only(fig: dict[str, Any], name: str) -> dict[str, Any]:
    matches = traces(fig, name)
    assert len(matches) == 1, f"expected one trace named {name!r}, got {len(matches)}"
    return matches[0]


@pytest.mark.parametrize(("n", "text"), [(64, "64 B"), (4096, "4 KiB"), (1536, "1.5 KiB"), (MIB, "1 MiB"),
                                         (8 << 30, "8 GiB")])
def test_human_bytes_uses_binary_units(n: int, text: str) -> None:
    assert human_bytes(n) == text


def test_figures_are_the_four_page_charts_as_plain_json() -> None:
    figures = collective_figures(make_result())

    assert set(figures) == {"heatmap", "bandwidth", "frontier", "equality"}
    assert json.loads(json.dumps(figures)) == figures


def test_heatmap_puts_distinct_digests_at_config_and_size() -> None:
    heat = collective_figures(make_result())["heatmap"]["data"][0]

    assert heat["type"] == "heatmap"
    assert heat["y"] == ["default", "tree-simple"]
    assert heat["x"] == ["4 KiB", "1 MiB"]
    assert heat["z"] == [[1, 3], [1, 1]]


def test_heatmap_colours_one_green_and_more_red() -> None:
    heat = collective_figures(make_result())["heatmap"]["data"][0]
    scale = heat["colorscale"]

    assert heat["zmin"] == 1 and heat["zmax"] == 3
    assert scale[0][1] == "#1a7f37"
    assert scale[-1][1] == "#b42318"


def test_heatmap_marks_cells_whose_ranks_disagree() -> None:
    cells = [make_cell(0, 4 * KIB, rank_consistent=False), make_cell(1, 4 * KIB)]

    heat = collective_figures(make_result(cells))["heatmap"]["data"][0]

    assert heat["text"] == [["1*"], ["1"]]


def test_heatmap_has_one_trace_per_op_dtype_and_a_dropdown_between_them() -> None:
    cells = [make_cell(0, 4 * KIB), make_cell(0, 4 * KIB, op="all_gather", dtype="bfloat16"),
             make_cell(0, 4 * KIB, dtype="float16")]

    fig = collective_figures(make_result(cells))["heatmap"]

    assert [t["name"] for t in fig["data"]] == ["all_reduce_sum · float32", "all_reduce_sum · float16",
                                                "all_gather · bfloat16"]
    assert [t.get("visible", True) for t in fig["data"]] == [True, False, False]
    buttons = fig["layout"]["updatemenus"][0]["buttons"]
    assert [b["args"][0]["visible"] for b in buttons] == [[True, False, False], [False, True, False],
                                                           [False, False, True]]


def test_a_single_op_dtype_gets_no_dropdown() -> None:
    fig = collective_figures(make_result())["heatmap"]

    assert not fig["layout"].get("updatemenus")


def test_repeated_config_names_stay_distinct_categories() -> None:
    twins = [{"index": 0, "name": "default", "env": {}}, {"index": 1, "name": "default", "env": {}}]

    result = make_result(configs=twins)

    assert config_names(result) == ["default [0]", "default [1]"]


def test_bandwidth_draws_busbw_per_config_on_a_log_size_axis() -> None:
    fig = collective_figures(make_result())["bandwidth"]
    line = only(fig, "tree-simple")

    assert fig["layout"]["xaxis"]["type"] == "log"
    assert line["x"] == [4 * KIB, MIB]
    assert line["y"] == [0.8, 6.0]


def test_bandwidth_error_bars_span_the_spread() -> None:
    cells = [make_cell(0, 4 * KIB, busbw_gbps=2.0, busbw_spread=[1.5, 2.25]),
             make_cell(0, MIB, busbw_gbps=6.0, busbw_spread=[5.0, 6.0])]

    line = only(collective_figures(make_result(cells))["bandwidth"], "default")

    assert line["error_y"]["arrayminus"] == [0.5, 1.0]
    assert line["error_y"]["array"] == [0.25, 0.0]


def test_bandwidth_opens_the_markers_of_unreproducible_sizes() -> None:
    line = only(collective_figures(make_result())["bandwidth"], "default")

    assert line["marker"]["symbol"] == ["circle", "circle-open"]


def test_pareto_front_keeps_the_points_nothing_beats_on_both_axes() -> None:
    points = [(10.0, 0.5), (6.0, 1.0), (5.0, 0.9), (10.0, 0.4), (2.0, 1.0)]

    assert pareto_front(points) == [1, 0]


def test_frontier_takes_median_busbw_over_large_sizes_and_share_reproducible() -> None:
    cells = [make_cell(0, 4 * KIB, busbw_gbps=100.0), make_cell(0, MIB, busbw_gbps=4.0),
             make_cell(0, 4 * MIB, busbw_gbps=8.0, reproducible=False), make_cell(0, 16 * MIB, busbw_gbps=9.0)]

    [point] = frontier_points(make_result(cells))

    assert point["busbw_gbps"] == 8.0
    assert point["reproducible_share"] == 0.75


def test_frontier_falls_back_to_the_largest_size_below_one_mib() -> None:
    cells = [make_cell(0, 4 * KIB, busbw_gbps=1.0), make_cell(0, 64 * KIB, busbw_gbps=3.0)]

    [point] = frontier_points(make_result(cells))

    assert point["busbw_gbps"] == 3.0
    assert point["basis"] == "at 64 KiB, the largest size"


def test_frontier_line_runs_through_the_non_dominated_configs() -> None:
    result = make_result()
    result["configs"].append({"index": 2, "name": "slow-and-flaky", "env": {}})
    result["cells"] += [make_cell(2, 4 * KIB, busbw_gbps=0.5, reproducible=False),
                        make_cell(2, MIB, busbw_gbps=2.0, reproducible=False)]

    fig = collective_figures(result)["frontier"]

    front = only(fig, "Pareto frontier")
    assert list(zip(front["x"], front["y"], strict=True)) == [(6.0, 1.0), (10.0, 0.5)]
    assert only(fig, "configs")["text"] == ["default", "tree-simple", "slow-and-flaky"]


def test_frontier_labels_only_the_frontier_when_configs_are_many() -> None:
    configs = [{"index": i, "name": f"cell-{i}", "env": {}} for i in range(8)]
    cells = [make_cell(i, MIB, busbw_gbps=float(i + 1), reproducible=i < 4) for i in range(8)]

    fig = collective_figures(make_result(cells, configs=configs))["frontier"]

    labels = only(fig, "configs")["texttemplate"]
    assert [label for label in labels if label] == ["cell-3", "cell-7"]


def test_frontier_leaves_out_configs_without_bandwidth() -> None:
    cells = [make_cell(0, MIB), make_cell(1, MIB, busbw_gbps=None)]

    assert [p["name"] for p in frontier_points(make_result(cells))] == ["default"]


def test_equality_shares_count_equal_cells_and_skip_incomparable_ones() -> None:
    equality = [
        {"op": "all_reduce_sum", "dtype": "float32", "bytes": 4 * KIB, "equal": [[True, False], [False, True]]},
        {"op": "all_reduce_sum", "dtype": "float32", "bytes": MIB, "equal": [[True, True], [True, True]]},
        {"op": "all_gather", "dtype": "float32", "bytes": MIB, "equal": [[True, None], [None, True]]},
    ]

    assert equality_shares(make_result(equality=equality)) == [[1.0, 0.5], [0.5, 1.0]]


def test_equality_share_is_none_when_never_comparable() -> None:
    equality = [{"op": "all_gather", "dtype": "float32", "bytes": MIB, "equal": [[True, None], [None, True]]}]

    fig = collective_figures(make_result(equality=equality))["equality"]

    assert fig["data"][0]["z"] == [[1.0, None], [None, 1.0]]
    assert fig["data"][0]["text"] == [["100%", "n/a"], ["n/a", "100%"]]


def test_an_empty_result_gives_figures_that_say_so() -> None:
    figures = collective_figures(make_result(cells=[], equality=[]))

    for name, fig in figures.items():
        assert fig["data"] == [], name
        assert "yet" in fig["layout"]["annotations"][0]["text"], name
