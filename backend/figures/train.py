"""Plotly figure builders for the comparison page: plain comparison dict in, plain figure dict out."""

from __future__ import annotations

import json
import math
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from detlab.backend.figures.text import plain

# Config A / config B colours, shared by every figure so the two runs read the same everywhere.
COLOR_A = "#1f77b4"
COLOR_B = "#ff7f0e"
COLOR_DIFF = "#d62728"
COLOR_NEUTRAL = "#7f7f7f"

FIRST_DIVERGENCE = "first divergence"


def _as_dict(fig: go.Figure) -> dict[str, Any]:
    # to_json turns numpy arrays and typed arrays into plain lists, so the result is JSON-safe.
    result: dict[str, Any] = json.loads(fig.to_json())
    return result


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _loss_points(points: list[list[float]] | None) -> dict[int, float]:
    """Step → loss, dropping points a JSON encoder or a blown-up run made non-finite."""
    return {int(step): float(loss) for step, loss in points or [] if _finite(loss)}


def abs_loss_delta(loss: dict[str, Any] | None) -> tuple[list[int], list[float]]:
    """|loss_a − loss_b| on the steps both runs recorded, zeros included (equal losses are a result)."""
    loss = loss or {}
    a, b = _loss_points(loss.get("a")), _loss_points(loss.get("b"))
    steps = sorted(set(a) & set(b))
    return steps, [abs(a[s] - b[s]) for s in steps]


def _power_of_ten(exponent: int) -> str:
    return f"10<sup>{exponent}</sup>".replace("<sup>-", "<sup>−")


def delta_axis(delta: list[float]) -> dict[str, Any]:
    """A log axis for |Δloss| that also shows zero: zeros sit on a floor one decade below the smallest
    positive value, ticked "0", and the axis spans whole decades so every decade has a labelled tick.

    Returns {"floor", "tickvals", "ticktext", "range"} (range in log10 units, as Plotly takes it).
    """
    positive = [d for d in delta if d > 0]
    lo = math.floor(math.log10(min(positive))) if positive else 0
    hi = max(math.ceil(math.log10(max(positive))), lo + 1) if positive else 1
    floor_exp = lo - 1
    exponents = range(lo, hi + 1)
    return {
        "floor": 10.0**floor_exp,
        "tickvals": [10.0**floor_exp] + [10.0**e for e in exponents],
        "ticktext": ["0"] + [_power_of_ten(e) for e in exponents],
        "range": [floor_exp - 0.3, hi + 0.1],
    }


def count_dtick(max_count: int) -> int | None:
    """Tick step for an axis of whole numbers (counts, steps): Plotly would tick 0.5 on a short range."""
    if max_count <= 6:
        return 1
    if max_count <= 12:
        return 2
    return None  # Plotly's own steps are whole numbers on a range this wide


def _title(comparison: dict[str, Any]) -> str:
    verdict = comparison.get("verdict")
    compared = comparison.get("steps_compared") or 0
    # The step range beside the count: a train job of N steps records N + 1 states (step 0, the weights before
    # training), so "11 steps" alone reads wrong for a 10-step job.
    steps = [int(p["step"]) for p in comparison.get("per_step") or []]
    span = f" ({min(steps)}–{max(steps)})" if steps and compared > 1 else ""
    recorded = f"{compared} recorded {'step' if compared == 1 else 'steps'}{span}"
    if verdict == "identical":
        return f"Identical: all {recorded} are bit-equal"
    if verdict == "diverged":
        step = comparison.get("first_divergent_step")
        differing = comparison.get("steps_differing") or 0
        return f"Diverged at step {step}: {differing} of {recorded} differ"
    reason = comparison.get("reason") or "no reason given"
    return f"Incomparable: {plain(reason)}"


def _thinned(comparison: dict[str, Any]) -> str:
    """A subtitle when the per-step series were thinned (a long run) or are a step window."""
    window, thinned = comparison.get("window"), comparison.get("downsampled")
    parts = []
    if window:
        parts.append(f"steps {window['from_step']}-{window['to_step']}")
    if thinned:
        parts.append(f"{thinned['steps']} steps, {thinned['steps_per_point']} per bar (the most tensors differing "
                     "among them); zoom in for every step")
    return f"<br><sup>{'; '.join(parts)}</sup>" if parts else ""


def comparison_figure(comparison: dict[str, Any]) -> dict[str, Any]:
    """Tensors differing per step (top) and loss A/B with |Δloss| on a log axis (bottom), sharing x=step.

    A diverged comparison gets a vertical line, an annotation and a scatter trace, all named
    "first divergence", at its first divergent step; identical and incomparable ones get none.
    """
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        row_heights=[0.45, 0.55],
        specs=[[{}], [{"secondary_y": True}]],
    )
    # The long arrays (one value per step or bucket) are put into the figure after plotly built it: its
    # validation checks them element by element, most of a long run's figure time. One dict per trace.
    arrays: list[dict[str, Any]] = []
    per_step = comparison.get("per_step") or []
    steps = [int(p["step"]) for p in per_step]
    counts = [p.get("tensors_differing") for p in per_step]  # None: differs, tensor detail not loaded
    differing = [int(c or 0) for c in counts]
    fig.add_trace(
        go.Bar(
            x=[],
            y=[],
            name="tensors differing",
            # One number per bar on a two-colour scale (the numbers come with the arrays below).
            marker={"colorscale": [[0, COLOR_NEUTRAL], [1, COLOR_DIFF]], "cmin": 0, "cmax": 1},
            hovertemplate="step %{x}: %{y} tensors differ<extra></extra>",
        ),
        row=1,
        col=1,
    )
    arrays.append({"x": steps, "y": [None if c is None else int(c) for c in counts],
                   "marker.color": [1 if d else 0 for d in differing]})
    unknown = [s for s, c in zip(steps, counts, strict=True) if c is None]
    if unknown:
        arrays.append({"x": unknown, "y": [max(differing + [1])] * len(unknown)})
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                name="differs (tensor count not loaded)",
                mode="markers",
                marker={"symbol": "line-ew-open", "size": 10, "color": COLOR_DIFF},
                hovertemplate="step %{x}: differs<extra></extra>",
            ),
            row=1,
            col=1,
        )

    first = comparison.get("first_divergent_step")
    if comparison.get("verdict") == "diverged" and first is not None:
        at_first = dict(zip(steps, differing, strict=True)).get(int(first), 0)
        arrays.append({})
        fig.add_trace(
            go.Scatter(
                x=[first],
                y=[at_first],
                name=FIRST_DIVERGENCE,
                mode="markers",
                marker={"symbol": "triangle-down", "size": 12, "color": COLOR_DIFF},
                hovertemplate="first divergence: step %{x}<extra></extra>",
            ),
            row=1,
            col=1,
        )
        # One line through both panels, so the loss curves can be read against the divergence.
        fig.add_shape(
            type="line",
            name=FIRST_DIVERGENCE,
            xref="x",
            yref="paper",
            x0=first,
            x1=first,
            y0=0,
            y1=1,
            line={"color": COLOR_DIFF, "dash": "dash", "width": 1.5},
        )
        fig.add_annotation(
            name=FIRST_DIVERGENCE,
            text=f"first divergence: step {first}",
            x=first,
            xref="x",
            y=1,
            yref="paper",
            yanchor="bottom",
            showarrow=False,
            font={"color": COLOR_DIFF},
        )

    loss = comparison.get("loss") or {}
    for key, label, color in (("a", "loss A", COLOR_A), ("b", "loss B", COLOR_B)):
        points = _loss_points(loss.get(key))
        arrays.append({"x": list(points), "y": list(points.values())})
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                name=label,
                mode="lines",
                line={"color": color, "dash": "solid" if key == "a" else "dot"},
            ),
            row=2,
            col=1,
            secondary_y=False,
        )
    delta_steps, delta = abs_loss_delta(loss)
    axis = delta_axis(delta)
    if delta:
        arrays.append({"x": delta_steps, "y": [d if d > 0 else axis["floor"] for d in delta], "customdata": delta})
        fig.add_trace(
            go.Scatter(
                x=[],
                y=[],
                name="|Δloss|",
                mode="lines+markers",
                marker={"size": 4},
                line={"color": COLOR_DIFF, "width": 1},
                hovertemplate="step %{x}: |Δloss| = %{customdata:.3g}<extra></extra>",
            ),
            row=2,
            col=1,
            secondary_y=True,
        )

    dtick = count_dtick(max(differing + [0]))
    fig.update_yaxes(title_text="tensors differing", rangemode="tozero", tick0=0, dtick=dtick, tickformat="d",
                     row=1, col=1)
    if not any(differing):
        fig.update_yaxes(range=[0, 1], row=1, col=1)
    fig.update_yaxes(title_text="loss", row=2, col=1, secondary_y=False)
    fig.update_yaxes(title_text="|Δloss|", type="log", tickmode="array", tickvals=axis["tickvals"],
                     ticktext=axis["ticktext"], range=axis["range"], showgrid=False,
                     row=2, col=1, secondary_y=True)
    # Steps are whole numbers; on a short run Plotly would tick 0.5 between them.
    fig.update_xaxes(tick0=0, dtick=count_dtick(max(steps, default=0) - min(steps, default=0)), tickformat="d")
    fig.update_xaxes(title_text="step", row=2, col=1)
    fig.update_layout(
        title={"text": _title(comparison) + _thinned(comparison)},
        template="plotly_white",
        height=560,
        margin={"l": 60, "r": 60, "t": 90, "b": 50},
        legend={"orientation": "h", "y": -0.15},
        bargap=0.1,
    )
    out = _as_dict(fig)
    for trace, values in zip(out["data"], arrays, strict=True):
        color = values.pop("marker.color", None)
        trace.update(values)
        if color is not None:
            trace.setdefault("marker", {})["color"] = color
    return out


def config_label(index: int, name: str, world_size: int | None = None) -> str:
    """'A: default' for config 0, 'B: ...' for config 1, the index itself beyond two configs; with
    ' @W4' when the configs ran at different world sizes (as the page labels them)."""
    letter = "AB"[index] if index in (0, 1) else str(index)
    return f"{letter}: {plain(name)}" + (f" @W{world_size}" if world_size is not None else "")


def throughput_figure(comparison: dict[str, Any]) -> dict[str, Any]:
    """Samples/s per config as bars, with the interquartile spread as error bars and the cost over each bar."""
    rows = [r for r in comparison.get("throughput") or [] if _finite(r.get("samples_per_s"))]
    worlds = {r.get("world_size") for r in comparison.get("throughput") or []}
    labels = [config_label(int(r["config_index"]), str(r.get("name") or ""),
                           r.get("world_size") if len(worlds) > 1 else None) for r in rows]
    values = [float(r["samples_per_s"]) for r in rows]
    spreads = [r.get("spread") or [v, v] for r, v in zip(rows, values, strict=True)]
    fig = go.Figure(
        go.Bar(
            x=labels,
            y=values,
            name="samples/s",
            marker_color=[COLOR_A if r["config_index"] == 0 else COLOR_B for r in rows],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [max(hi - v, 0.0) for (_, hi), v in zip(spreads, values, strict=True)],
                "arrayminus": [max(v - lo, 0.0) for (lo, _), v in zip(spreads, values, strict=True)],
            },
            hovertemplate="%{x}: %{y:.1f} samples/s<extra></extra>",
        )
    )
    for row, label, (_, hi), value in zip(rows, labels, spreads, values, strict=True):
        fig.add_annotation(
            name=f"cost {row['config_index']}",
            x=label,
            y=max(hi, value),
            # the figure only ("84.1% slower"): the reason in brackets is the table's, and cut the bar chart
            text=(row.get("cost_text") or "").split(" (")[0],
            hovertext=row.get("cost_text") or "",
            showarrow=False,
            yanchor="bottom",
            yshift=4,
        )
    fig.update_layout(
        # Short enough for the half-width chart beside the table; what the bars mean goes in the subtitle.
        title={"text": "Throughput<br><sup>median samples/s, IQR of steps</sup>"},
        template="plotly_white",
        yaxis={"title": {"text": "samples/s"}, "rangemode": "tozero"},
        height=340,
        margin={"l": 60, "r": 30, "t": 60, "b": 40},
        showlegend=False,
    )
    return _as_dict(fig)


def _ranks_text(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def divergence_figure(comparison: dict[str, Any]) -> dict[str, Any]:
    """Tensor × step heatmap of the comparison's divergence_map: a cell is coloured where the runs' digests
    of that tensor differ at that step (by how many ranks differ), blank where they are equal; hovering
    names the ranks. Steps are categories: only differing steps with per-tensor digests are listed."""
    found = comparison.get("divergence_map") or {}
    steps, tensors = found.get("steps") or [], found.get("tensors") or []
    per_rank = found.get("mode") == "per-rank"
    column = {step: i for i, step in enumerate(steps)}
    z: list[list[int | None]] = [[None] * len(steps) for _ in tensors]
    text = [[""] * len(steps) for _ in tensors]
    rank_sets = found.get("rank_sets") or []
    for step, row, ranks_at in found.get("cells") or []:
        ranks = rank_sets[ranks_at] if ranks_at < len(rank_sets) else []
        z[row][column[step]] = len(ranks) if per_rank else 1
        text[row][column[step]] = _ranks_text(ranks) if per_rank else "differs (ranks not matched: rank consensus)"
    most_ranks = max([len(r) for r in rank_sets] + [1])
    fig = go.Figure()
    if steps:
        fig.add_trace(go.Heatmap(
            x=[str(s) for s in steps], y=[plain(t) for t in tensors], z=z, text=text, name="differing ranks",
            # Colour by how many ranks differ, on a whole-number scale from none to the most seen.
            # A colour bar only where colours differ: with one rank (or rank consensus) every coloured cell
            # means the same, "differs", which the title says; a 0-1 "ranks" bar would mean nothing.
            colorscale=[[0, "#fcbba1"], [1, COLOR_DIFF]], zmin=1 if most_ranks > 1 else 0, xgap=1, ygap=1,
            zmax=most_ranks if per_rank else 1, showscale=per_rank and most_ranks > 1,
            colorbar={"title": {"text": "differing ranks"}, "thickness": 12, "dtick": count_dtick(most_ranks)},
            hovertemplate="step %{x} · %{y}<br>%{text}<extra></extra>"))
    title = "Where the runs differ: tensor × step"
    if steps and not (per_rank and most_ranks > 1):
        title += "<br><sup>a coloured cell: that tensor differs at that step</sup>"
    if found.get("note"):
        title += f"<br><sup>{plain(found['note'])}</sup>"
    fig.update_layout(
        title={"text": title}, template="plotly_white", uirevision="divergence",
        height=max(260, 120 + 18 * len(tensors)), margin={"l": 10, "r": 10, "t": 70, "b": 50},
        xaxis={"title": {"text": "step (differing steps only)"}, "type": "category"},
        yaxis={"title": {"text": ""}, "type": "category", "autorange": "reversed", "automargin": True})
    return _as_dict(fig)


def warm_up() -> None:
    """Build a tiny figure of each kind once, so that plotly has loaded what it loads on first use."""
    tiny = {"verdict": "diverged", "first_divergent_step": 1, "per_step": [{"step": 0, "tensors_differing": 0},
                                                                       {"step": 1, "tensors_differing": 1}],
            "loss": {"a": [[0, 1.0], [1, 1.0]], "b": [[0, 1.0], [1, 2.0]]}}
    comparison_figure(tiny)
    throughput_figure({"throughput": [{"config_index": 0, "samples_per_s": 1.0, "spread": [1.0, 1.0]}]})
    from detlab.backend.figures.drift import drift_figure  # it builds on this module's helpers

    drift_figure({"drift": {"available": True, "points": [[0, 0.0], [1, 1e-7]], "loss_delta": [[1, 1e-6]],
                            "rounding_level": 2.0**-23, "dtype": "float32", "verdict": "", "k": 16}})



def loss_figure(pair: dict[str, Any]) -> dict[str, Any]:
    """The loss per step of a compared pair's runs: A and B, or one curve when a run is compared with itself
    (a recording's own page). Steps with a non-finite or no loss are left out."""
    loss = pair.get("loss") or {}
    same = pair.get("run_a") is not None and pair.get("run_a") == pair.get("run_b")
    fig = go.Figure()
    sides = [("a", f"run #{pair.get('run_a')}", COLOR_A)] if same else [
        ("a", f"A: run #{pair.get('run_a')}", COLOR_A), ("b", f"B: run #{pair.get('run_b')}", COLOR_B)]
    for side, name, colour in sides:
        points = _loss_points(loss.get(side))
        fig.add_trace(go.Scatter(x=list(points), y=list(points.values()), name=name, mode="lines+markers",
                                 line={"color": colour}, marker={"size": 4},
                                 hovertemplate="step %{x}: loss %{y:.6g}<extra>" + name + "</extra>"))
    fig.update_layout(
        title={"text": "Loss per step"},
        template="plotly_white",
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": "loss"}},
        height=300,
        margin={"l": 60, "r": 30, "t": 50, "b": 40},
        showlegend=not same,
    )
    return _as_dict(fig)
