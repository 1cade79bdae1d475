"""Markup in data stays text in every figure: Plotly renders <a href>, <b>, <br> in titles, ticks and hovers,
so a tensor, config or job name holding them must reach the figure JSON escaped."""

from __future__ import annotations

import json
from typing import Any

from detlab.backend.figures.collective import collective_figures
from detlab.backend.figures.drift import drift_figure
from detlab.backend.figures.train import comparison_figure, divergence_figure, throughput_figure
from tests.backend.test_figures_collective import make_result
from tests.backend.test_figures_train import make_comparison

LINK = "<a href=x>click</a>"
BOLD = "<b>bold</b>"


def assert_text_only(fig: dict[str, Any]) -> None:
    written = json.dumps(fig)
    assert "<a href" not in written and "<b>" not in written, written
    assert "&lt;a href=x&gt;click&lt;/a&gt;" in written or "&lt;b&gt;bold&lt;/b&gt;" in written


def test_a_tensor_name_with_markup_is_text_on_the_divergence_heatmap() -> None:
    found = {"mode": "per-rank", "steps": [2], "tensors": [LINK, BOLD], "rank_sets": [[0]],
             "cells": [[2, 0, 0], [2, 1, 0]], "note": f"1 step shown of {LINK}"}
    fig = divergence_figure(make_comparison(divergence_map=found))
    assert_text_only(fig)
    assert fig["data"][0]["y"] == ["&lt;a href=x&gt;click&lt;/a&gt;", "&lt;b&gt;bold&lt;/b&gt;"]


def test_a_config_name_with_markup_is_text_on_the_throughput_chart() -> None:
    rows = [{"config_index": 0, "name": LINK, "samples_per_s": 10.0, "spread": [9.0, 11.0]},
            {"config_index": 1, "name": BOLD, "samples_per_s": 8.0, "spread": [7.0, 9.0]}]
    assert_text_only(throughput_figure(make_comparison(throughput=rows)))


def test_a_reason_with_markup_is_text_in_the_comparison_title() -> None:
    assert_text_only(comparison_figure(make_comparison(verdict="incomparable", reason=f"tensor {LINK} differs")))


def test_a_config_name_with_markup_is_text_in_every_collective_chart() -> None:
    result = make_result(configs=[{"index": 0, "name": LINK, "env": {}}, {"index": 1, "name": BOLD, "env": {}}])
    for fig in collective_figures(result).values():
        assert_text_only(fig)


def test_a_drift_verdict_with_markup_is_text_in_its_title() -> None:
    fig = drift_figure({"drift": {"available": True, "points": [[0, 0.0], [1, 1e-7]], "loss_delta": [[1, 1e-6]],
                                  "rounding_level": 2.0**-23, "dtype": "float32", "verdict": f"see {LINK}", "k": 16}})
    assert_text_only(fig)
