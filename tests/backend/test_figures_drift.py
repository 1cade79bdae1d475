"""The drift figure (detlab.backend.figures.drift): measured points on a log axis, zeros on a floor ticked 0,
the rounding level across, |Δloss| below; nothing drawn without an estimate."""

from __future__ import annotations

from typing import Any

from detlab.backend.figures.drift import DISTANCE, ROUNDING, drift_figure


def comparison(**drift: Any) -> dict[str, Any]:
    return {"drift": {"available": True, "points": [[0, 0.0], [1, 2e-8], [2, 3e-6]],
                      "loss_delta": [[1, 0.0], [2, 1e-5]], "rounding_level": 2.0**-7, "dtype": "bfloat16",
                      "verdict": "grows to 3e-06 by step 2", "k": 16,
                      "relative_error": 0.35, **drift}}


def trace(figure: dict[str, Any], prefix: str) -> dict[str, Any]:
    return next(t for t in figure["data"] if t["name"].startswith(prefix))


def test_zeros_sit_on_the_floor_ticked_zero_and_hover_their_true_value() -> None:
    figure = drift_figure(comparison())
    distance = trace(figure, DISTANCE)
    axis = figure["layout"]["yaxis"]
    assert axis["type"] == "log" and axis["ticktext"][0] == "0" and distance["y"][0] == axis["tickvals"][0]
    assert distance["customdata"] == [0.0, 2e-8, 3e-6]


def test_the_rounding_level_of_the_dtype_is_drawn_across_the_steps_and_inside_the_axis() -> None:
    figure = drift_figure(comparison())
    line = trace(figure, ROUNDING)
    assert line["x"] == [0, 2] and line["y"] == [2.0**-7, 2.0**-7] and "one bfloat16 ulp" in line["name"]
    lo, hi = figure["layout"]["yaxis"]["range"]
    assert lo < -7 * 0.30103 < hi  # log10(2^-7) within the axis


def test_loss_delta_is_its_own_panel() -> None:
    figure = drift_figure(comparison())
    loss = trace(figure, "|Δloss|")
    assert loss["yaxis"] == "y2" and loss["customdata"] == [0.0, 1e-5]


def test_ranks_that_differ_get_a_trace_each() -> None:
    figure = drift_figure(comparison(ranks={"1": [[1, 1e-6]], "0": [[1, 0.0]]}))
    assert [t["name"] for t in figure["data"] if t["name"].startswith("rank ")] == ["rank 0", "rank 1"]


def test_without_an_estimate_nothing_is_drawn_and_the_title_says_why() -> None:
    figure = drift_figure({"drift": {"available": False, "reason": "run 2 recorded no parameter statistics"}})
    assert figure["data"] == [] and "run 2 recorded no parameter statistics" in figure["layout"]["title"]["text"]
    assert drift_figure({})["data"] == []  # a result stored before drift was estimated
