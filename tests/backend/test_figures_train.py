"""Unit tests of detlab.backend.figures.train on hand-made comparison dicts."""

from __future__ import annotations

import json
import math
from typing import Any

from detlab.backend.figures.train import (
    FIRST_DIVERGENCE,
    abs_loss_delta,
    comparison_figure,
    throughput_figure,
)


def make_comparison(**overrides: Any) -> dict[str, Any]:
    """A diverged comparison over 5 steps, first parting at step 2; override any field."""
    comparison: dict[str, Any] = {
        "verdict": "diverged",
        "reason": None,
        "mode": "per-rank",
        "run_a": 12,
        "run_b": 13,
        "first_divergent_step": 2,
        "first_divergent_tensors": ["fc1.weight"],
        "ranks": [0, 1],
        "steps_differing": 3,
        "steps_compared": 5,
        "per_step": [{"step": s, "tensors_differing": n} for s, n in enumerate([0, 0, 1, 4, 4])],
        "loss": {
            "a": [[0, 2.0], [1, 1.5], [2, 1.2], [3, 1.0], [4, 0.9]],
            "b": [[0, 2.0], [1, 1.5], [2, 1.2000001], [3, 1.001], [4, 0.95]],
        },
        "config_diff": [{"key": "torch.deterministic_algorithms", "a": False, "b": True}],
        "throughput": [
            {"config_index": 0, "name": "default", "samples_per_s": 1200.0, "spread": [1100.0, 1250.0],
             "step_time_ms_median": 12.3, "runs": 3, "cost": None, "cost_text": "baseline"},
            {"config_index": 1, "name": "full-deterministic", "samples_per_s": 1000.0,
             "spread": [950.0, 1010.0], "step_time_ms_median": 14.0, "runs": 3, "cost": 0.19,
             "cost_text": "19.0% slower (95% CI 17.0% to 21.0%)"},
        ],
        "reproducibility": [],
        "effective_mismatches": [],
    }
    comparison.update(overrides)
    return comparison


def identical_comparison() -> dict[str, Any]:
    loss = [[0, 2.0], [1, 1.5], [2, 1.2]]
    return make_comparison(
        verdict="identical",
        first_divergent_step=None,
        first_divergent_tensors=[],
        ranks=[],
        steps_differing=0,
        steps_compared=3,
        per_step=[{"step": s, "tensors_differing": 0} for s in range(3)],
        loss={"a": loss, "b": loss},
    )


def trace(fig: dict[str, Any], name: str) -> dict[str, Any]:
    matches = [t for t in fig["data"] if t.get("name") == name]
    assert len(matches) == 1, f"expected one trace named {name!r}, got {len(matches)}"
    return matches[0]


def trace_names(fig: dict[str, Any]) -> list[str]:
    return [t.get("name") for t in fig["data"]]


def test_comparison_figure_is_plain_json() -> None:
    fig = comparison_figure(make_comparison())

    assert json.loads(json.dumps(fig)) == fig


def test_bars_show_tensors_differing_per_step() -> None:
    bars = trace(comparison_figure(make_comparison()), "tensors differing")

    assert bars["type"] == "bar"
    assert bars["x"] == [0, 1, 2, 3, 4]
    assert bars["y"] == [0, 0, 1, 4, 4]


def test_diverged_marks_first_divergent_step_with_named_trace() -> None:
    marker = trace(comparison_figure(make_comparison()), FIRST_DIVERGENCE)

    assert marker["x"] == [2]
    assert marker["y"] == [1]


def test_diverged_draws_line_and_annotation_at_first_divergent_step() -> None:
    layout = comparison_figure(make_comparison())["layout"]

    lines = [s for s in layout["shapes"] if s.get("name") == FIRST_DIVERGENCE]
    notes = [a for a in layout["annotations"] if a.get("name") == FIRST_DIVERGENCE]
    assert [(s["x0"], s["x1"]) for s in lines] == [(2, 2)]
    assert [a["text"] for a in notes] == ["first divergence: step 2"]


def test_identical_has_no_divergence_marker() -> None:
    fig = comparison_figure(identical_comparison())

    assert FIRST_DIVERGENCE not in trace_names(fig)
    assert not fig["layout"].get("shapes")
    assert all(a.get("name") != FIRST_DIVERGENCE for a in fig["layout"].get("annotations", []))


def test_identical_title_says_identical() -> None:
    fig = comparison_figure(identical_comparison())

    assert fig["layout"]["title"]["text"].startswith("Identical")


def test_diverged_title_gives_step_and_count() -> None:
    title = comparison_figure(make_comparison())["layout"]["title"]["text"]

    assert title == "Diverged at step 2: 3 of 5 recorded steps (0–4) differ"


def test_incomparable_title_carries_reason_and_has_no_marker() -> None:
    fig = comparison_figure(make_comparison(verdict="incomparable", reason="tensor lists differ",
                                            first_divergent_step=None))

    assert fig["layout"]["title"]["text"] == "Incomparable: tensor lists differ"
    assert FIRST_DIVERGENCE not in trace_names(fig)


def test_loss_lines_for_both_runs() -> None:
    fig = comparison_figure(make_comparison())

    assert trace(fig, "loss A")["y"] == [2.0, 1.5, 1.2, 1.0, 0.9]
    assert trace(fig, "loss B")["y"] == [2.0, 1.5, 1.2000001, 1.001, 0.95]


def test_loss_panel_shares_x_axis_with_bars() -> None:
    fig = comparison_figure(make_comparison())
    top, bottom = trace(fig, "tensors differing")["xaxis"], trace(fig, "loss A")["xaxis"]

    assert top != bottom
    assert fig["layout"]["xaxis" + top[1:]]["matches"] == bottom


def test_abs_loss_delta_is_on_a_log_axis() -> None:
    fig = comparison_figure(make_comparison())
    delta = trace(fig, "|Δloss|")

    axis = "yaxis" + delta["yaxis"][1:]
    assert fig["layout"][axis]["type"] == "log"


def test_abs_loss_delta_keeps_zero_steps() -> None:
    steps, delta = abs_loss_delta({"a": [[0, 1.0], [1, 2.0], [2, 3.0]], "b": [[0, 1.0], [1, 2.5], [2, 2.0]]})

    assert steps == [0, 1, 2]
    assert delta == [0.0, 0.5, 1.0]


def delta_layout_axis(fig: dict[str, Any]) -> dict[str, Any]:
    axis: dict[str, Any] = fig["layout"]["yaxis" + trace(fig, "|Δloss|")["yaxis"][1:]]
    return axis


def test_zero_delta_steps_are_drawn_on_the_axis_tick_labelled_zero() -> None:
    loss = {"a": [[0, 1.0], [1, 1.0], [2, 1.0]], "b": [[0, 1.0], [1, 1.0 + 2e-7], [2, 1.0]]}
    fig = comparison_figure(make_comparison(loss=loss))
    delta = trace(fig, "|Δloss|")
    axis = delta_layout_axis(fig)

    zero_tick = axis["tickvals"][axis["ticktext"].index("0")]
    assert delta["x"] == [0, 1, 2]
    assert delta["y"][0] == delta["y"][2] == zero_tick
    assert delta["customdata"][0] == 0.0


def test_delta_axis_has_a_labelled_tick_every_decade_around_the_data() -> None:
    loss = {"a": [[0, 1.0], [1, 1.0]], "b": [[0, 1.0 + 1.2e-7], [1, 1.0 + 2.4e-7]]}
    axis = delta_layout_axis(comparison_figure(make_comparison(loss=loss)))

    assert axis["ticktext"] == ["0", "10<sup>−7</sup>", "10<sup>−6</sup>"]
    low, high = axis["range"]
    assert low < math.log10(axis["tickvals"][0]) and high > math.log10(axis["tickvals"][-1])


def test_tensors_differing_axis_ticks_whole_numbers() -> None:
    fig = comparison_figure(make_comparison(per_step=[{"step": 0, "tensors_differing": 0},
                                                      {"step": 1, "tensors_differing": 2}]))

    assert fig["layout"]["yaxis"]["dtick"] == 1
    assert fig["layout"]["yaxis"]["tick0"] == 0


def test_abs_loss_delta_uses_only_steps_both_runs_recorded() -> None:
    steps, _ = abs_loss_delta({"a": [[0, 1.0], [1, 2.0]], "b": [[1, 2.5], [2, 2.0]]})

    assert steps == [1]


def test_abs_loss_delta_skips_non_finite_losses() -> None:
    steps, _ = abs_loss_delta({"a": [[0, float("nan")], [1, 2.0]], "b": [[0, 1.0], [1, float("inf")]]})

    assert steps == []


def test_step_axis_ticks_whole_steps() -> None:
    fig = comparison_figure(make_comparison())

    assert [fig["layout"][axis]["dtick"] for axis in ("xaxis", "xaxis2")] == [1, 1]


def test_identical_losses_plot_delta_at_zero() -> None:
    fig = comparison_figure(identical_comparison())
    axis = delta_layout_axis(fig)

    assert trace(fig, "|Δloss|")["customdata"] == [0.0, 0.0, 0.0]
    assert axis["ticktext"][0] == "0"


def test_missing_loss_still_builds_figure() -> None:
    fig = comparison_figure(make_comparison(loss=None))

    assert trace(fig, "loss A")["x"] == []


def test_throughput_bars_per_config() -> None:
    bars = throughput_figure(make_comparison())["data"][0]

    assert bars["x"] == ["A: default", "B: full-deterministic"]
    assert bars["y"] == [1200.0, 1000.0]


def test_throughput_error_bars_come_from_spread() -> None:
    error = throughput_figure(make_comparison())["data"][0]["error_y"]

    assert error["array"] == [50.0, 10.0]
    assert error["arrayminus"] == [100.0, 50.0]


def test_throughput_annotates_cost_per_config() -> None:
    notes = throughput_figure(make_comparison())["layout"]["annotations"]

    # the interval in the hover: written over a half-width bar chart it was cut off
    assert [a["text"] for a in notes] == ["baseline", "19.0% slower"]
    assert notes[1]["hovertext"] == "19.0% slower (95% CI 17.0% to 21.0%)"


def test_throughput_skips_configs_without_measurement() -> None:
    rows = make_comparison()["throughput"]
    rows[1]["samples_per_s"] = None

    assert throughput_figure(make_comparison(throughput=rows))["data"][0]["x"] == ["A: default"]


def test_steps_that_differ_without_tensor_detail_are_marked_not_drawn_as_zero() -> None:
    from detlab.backend.figures.train import comparison_figure

    comparison = {"verdict": "diverged", "first_divergent_step": 1, "steps_differing": 2, "steps_compared": 3,
                  "per_step": [{"step": 0, "tensors_differing": 0}, {"step": 1, "tensors_differing": 4},
                               {"step": 2, "tensors_differing": None}],
                  "loss": {"a": [], "b": []}}
    traces = {t["name"]: t for t in comparison_figure(comparison)["data"]}
    assert traces["tensors differing"]["y"] == [0, 4, None]
    assert list(traces["differs (tensor count not loaded)"]["x"]) == [2]


def test_throughput_bars_carry_world_sizes_when_the_configs_ran_at_different_ones() -> None:
    rows = make_comparison()["throughput"]
    mixed = throughput_figure(make_comparison(throughput=[{**rows[0], "world_size": 2}, {**rows[1], "world_size": 4}]))
    same = throughput_figure(make_comparison(throughput=[{**rows[0], "world_size": 2}, {**rows[1], "world_size": 2}]))
    assert list(mixed["data"][0]["x"]) == ["A: default @W2", "B: full-deterministic @W4"]
    assert list(same["data"][0]["x"]) == ["A: default", "B: full-deterministic"]


def test_divergence_heatmap_colours_differing_cells_by_ranks_and_names_them_on_hover() -> None:
    from detlab.backend.figures.train import divergence_figure

    found = {"mode": "per-rank", "steps": [2, 7], "tensors": ["fc1.weight", "fc2.bias"], "rank_sets": [[0, 3], [1]],
             "cells": [[2, 0, 0], [7, 0, 1], [7, 1, 0]], "steps_differing": 9, "tensors_differing": 2,
             "truncated": True, "note": "2 of 9 differing steps shown"}
    fig = divergence_figure(make_comparison(divergence_map=found))
    [heatmap] = fig["data"]
    assert (heatmap["x"], heatmap["y"]) == (["2", "7"], ["fc1.weight", "fc2.bias"])
    assert heatmap["z"] == [[2, 1], [None, 2]]  # equal cells stay blank
    assert heatmap["text"] == [["ranks 0, 3", "rank 1"], ["", "ranks 0, 3"]]
    assert "2 of 9 differing steps shown" in fig["layout"]["title"]["text"]
    json.dumps(fig)


def test_divergence_heatmap_of_a_result_without_a_map_is_empty() -> None:
    from detlab.backend.figures.train import divergence_figure

    assert divergence_figure(make_comparison())["data"] == []


def test_a_run_compared_with_itself_has_one_loss_curve_and_a_pair_two() -> None:
    from detlab.backend.figures.train import loss_figure

    loss = {"a": [[0, 2.0], [1, 1.5], [2, float("nan")]], "b": [[0, 2.0], [1, 1.25]]}
    [own] = loss_figure({"run_a": 7, "run_b": 7, "loss": loss})["data"]
    assert (own["x"], own["y"], own["name"]) == ([0, 1], [2.0, 1.5], "run #7")  # a non-finite loss left out
    pair = loss_figure({"run_a": 7, "run_b": 8, "loss": loss})["data"]
    assert [t["name"] for t in pair] == ["A: run #7", "B: run #8"] and pair[1]["y"] == [2.0, 1.25]


def test_the_tensor_step_map_has_a_colour_bar_only_when_colours_differ() -> None:
    from detlab.backend.figures.train import divergence_figure

    def trace(rank_sets: list[list[int]]) -> dict:
        found = {"steps": [3], "tensors": ["w", "b"], "mode": "per-rank", "rank_sets": rank_sets,
                 "cells": [[3, 0, 0], [3, 1, len(rank_sets) - 1]]}
        return divergence_figure({"divergence_map": found})["data"][0]

    one_rank = trace([[0]])  # world size 1: every coloured cell means "differs"; a 0-1 "ranks" bar meant nothing
    assert one_rank["showscale"] is False
    two_ranks = trace([[0], [0, 1]])
    assert two_ranks["showscale"] is True and (two_ranks["zmin"], two_ranks["zmax"]) == (1, 2)
    assert two_ranks["colorbar"]["title"]["text"] == "differing ranks"


def test_the_throughput_title_fits_its_half_width_chart() -> None:
    from detlab.backend.figures.train import throughput_figure

    title = throughput_figure({"throughput": [{"config_index": 0, "samples_per_s": 1.0}]})["layout"]["title"]["text"]
    # the chart is about 450 px wide beside its table; Plotly does not wrap a title, it cuts it
    assert len(title.split("<br>")[0]) <= 30
