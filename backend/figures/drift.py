"""The drift figure: how far two compared runs are apart per step (the estimate of ‖A−B‖/‖A‖, detlab.core.drift)
on a log axis with the dtype's rounding level drawn across, and |Δloss| below it on the same steps."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from detlab.backend.figures.text import plain
from detlab.backend.figures.train import COLOR_DIFF, COLOR_NEUTRAL, _as_dict, _finite, count_dtick, delta_axis

COLOR_DISTANCE = "#6a3d9a"
ROUNDING = "rounding level"
DISTANCE = "‖A−B‖/‖A‖ (estimate)"


def _series(points: list[list[Any]] | None) -> tuple[list[int], list[float]]:
    kept = [(int(s), float(v)) for s, v in points or [] if _finite(v)]
    return [s for s, _ in kept], [v for _, v in kept]


def _log_axis(values: list[float], extra: list[float]) -> tuple[dict[str, Any], float]:
    """A whole-decade log axis (zeros on a floor ticked "0", detlab.backend.figures.train.delta_axis) that also
    spans `extra` (the rounding line)."""
    axis = delta_axis(values + extra)
    return ({"type": "log", "tickvals": axis["tickvals"], "ticktext": axis["ticktext"], "range": axis["range"]},
            axis["floor"])


def drift_figure(comparison: dict[str, Any]) -> dict[str, Any]:
    """Two panels over the sampled steps: the distance estimate (the worst rank; each rank's where they differ)
    with a dashed line at one ulp of the dominant dtype, relative; and |Δloss|. Without drift data the figure
    holds no trace and its title says why."""
    drift = comparison.get("drift") or {"available": False, "reason": "this comparison holds no drift estimate"}
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.12, row_heights=[0.62, 0.38])
    if not drift.get("available"):
        fig.update_layout(title={"text": f"No drift estimate: {drift.get('reason')}"}, template="plotly_white",
                          height=220, margin={"l": 10, "r": 10, "t": 60, "b": 30})
        return _as_dict(fig)
    steps, values = _series(drift.get("points"))
    level, dtype = drift.get("rounding_level"), drift.get("dtype")
    axis, floor = _log_axis(values, [float(level)] if level is not None and _finite(level) else [])
    shown = [v if v > 0 else floor for v in values]
    fig.add_trace(go.Scatter(x=steps, y=shown, name=DISTANCE, mode="lines+markers", line={"color": COLOR_DISTANCE},
                             customdata=values, hovertemplate="step %{x}: %{customdata:.3g}<extra></extra>"),
                  row=1, col=1)
    for rank, points in sorted((drift.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
        rs, rv = _series(points)
        fig.add_trace(go.Scatter(x=rs, y=[v if v > 0 else floor for v in rv], name=f"rank {rank}", mode="lines",
                                 line={"width": 1}, opacity=0.6, customdata=rv,
                                 hovertemplate=f"rank {rank}, step %{{x}}: %{{customdata:.3g}}<extra></extra>"),
                      row=1, col=1)
    if _finite(level) and steps:
        fig.add_trace(go.Scatter(x=[min(steps), max(steps)], y=[level, level], mode="lines",
                                 name=f"{ROUNDING} (one {dtype} ulp, {level:.2g})",
                                 line={"color": COLOR_NEUTRAL, "dash": "dash"}, hoverinfo="skip"), row=1, col=1)
    loss_steps, delta = _series(drift.get("loss_delta"))
    loss_axis, loss_floor = _log_axis(delta, [])
    fig.add_trace(go.Scatter(x=loss_steps, y=[d if d > 0 else loss_floor for d in delta], name="|Δloss|",
                             mode="lines+markers", line={"color": COLOR_DIFF}, customdata=delta,
                             hovertemplate="step %{x}: |Δloss| %{customdata:.3g}<extra></extra>"), row=2, col=1)
    sampled = " (sampled steps)" if drift.get("sampled") else ""
    fig.update_layout(
        title={"text": f"Drift: {plain(drift.get('verdict'))}<br><sup>estimated from {drift.get('k')}-bucket sketches, "
                       f"±{drift.get('relative_error', 0):.0%} per tensor{sampled}</sup>"},
        template="plotly_white", height=460, margin={"l": 10, "r": 10, "t": 80, "b": 40}, uirevision="drift",
        legend={"orientation": "h", "y": -0.15})
    fig.update_yaxes(title={"text": "‖A−B‖/‖A‖"}, **axis, row=1, col=1)
    fig.update_yaxes(title={"text": "|Δloss|"}, **loss_axis, row=2, col=1)
    fig.update_xaxes(dtick=count_dtick(max(steps, default=0) - min(steps, default=0)))  # whole steps
    fig.update_xaxes(title={"text": "step"}, row=2, col=1)
    return _as_dict(fig)
