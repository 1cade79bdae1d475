"""Plotly figure builders for collective and sweep jobs: plain /collective result dict in, plain figure dicts out."""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative

from detlab.backend.figures.text import plain
from detlab.core.collective import DTYPES, OPS

GREEN = "#1a7f37"
RED_LIGHT = "#f4a3a0"
RED_DARK = "#b42318"
FRONTIER = "#2b5fd9"
MIB = 1 << 20
MAX_LABELS = 6  # configs beyond this get hover text instead of printed labels and numbers

# The order the submit form lists them in; unknown ops and dtypes sort after, by name.

Group = tuple[str, str]  # (op, dtype)


def _as_dict(fig: go.Figure) -> dict[str, Any]:
    # to_json turns numpy arrays and typed arrays into plain lists, so the result is JSON-safe.
    result: dict[str, Any] = json.loads(fig.to_json())
    return result


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def human_bytes(n: int) -> str:
    """Message size as people write it: 64 B, 4 KiB, 1.5 MiB, 8 GiB."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MIB), ("KiB", 1 << 10)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.3g} {unit}"
    return f"{n} B"


def config_names(result: dict[str, Any]) -> list[str]:
    """Axis labels, one per config in index order; a repeated name gets its index so categories stay distinct."""
    configs = sorted(result.get("configs") or [], key=lambda c: int(c["index"]))
    names = [plain(c.get("name") or f"config {c['index']}") for c in configs]
    return [f"{n} [{c['index']}]" if names.count(n) > 1 else n for n, c in zip(names, configs, strict=True)]


def _index_positions(result: dict[str, Any]) -> dict[int, int]:
    configs = sorted(result.get("configs") or [], key=lambda c: int(c["index"]))
    return {int(c["index"]): pos for pos, c in enumerate(configs)}


def _order(value: str, known: tuple[str, ...]) -> tuple[int, str]:
    return (known.index(value), "") if value in known else (len(known), value)


def groups(cells: Iterable[dict[str, Any]]) -> list[Group]:
    """The (op, dtype) pairs present, ops and dtypes in the form's order."""
    found = {(str(c["op"]), str(c["dtype"])) for c in cells}
    return sorted(found, key=lambda g: (_order(g[0], OPS), _order(g[1], DTYPES)))


def _group_label(group: Group) -> str:
    return f"{group[0]} · {group[1]}"


def _palette(n: int) -> list[str]:
    # D3 starts with the A/B colours of the train page; past ten configs a longer palette avoids repeats.
    colors = qualitative.D3 if n <= len(qualitative.D3) else qualitative.Dark24
    return [colors[i % len(colors)] for i in range(n)]


def _empty(title: str, message: str) -> dict[str, Any]:
    fig = go.Figure()
    fig.add_annotation(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                       font={"color": "#6b7280", "size": 14})
    fig.update_layout(title={"text": title}, template="plotly_white", height=240,
                      xaxis={"visible": False}, yaxis={"visible": False})
    return _as_dict(fig)


def _group_menu(all_groups: list[Group], traces_per_group: list[int], title: str) -> list[dict[str, Any]]:
    """A dropdown that shows one (op, dtype) at a time; none when there is only one to show."""
    if len(all_groups) < 2:
        return []
    buttons = []
    for g, group in enumerate(all_groups):
        visible = [i == g for i, count in enumerate(traces_per_group) for _ in range(count)]
        buttons.append({"label": _group_label(group), "method": "update",
                        "args": [{"visible": visible}, {"title.text": f"{title}: {_group_label(group)}"}]})
    return [{"buttons": buttons, "direction": "down", "showactive": True, "active": 0,
             "x": 1.0, "xanchor": "right", "y": 1.12, "yanchor": "bottom"}]


def _distinct_colorscale(zmax: int) -> list[list[Any]]:
    # 1 (reproducible) is green; 2 and above run from light to dark red.
    edge = 0.5 / (zmax - 1)
    return [[0.0, GREEN], [edge, GREEN], [edge, RED_LIGHT], [1.0, RED_DARK]]


def heatmap_figure(result: dict[str, Any]) -> dict[str, Any]:
    """Distinct output digests across runs per config × message size; one (op, dtype) shown, a dropdown for the rest."""
    title = "Distinct outputs across runs (1 = reproducible)"
    cells = result.get("cells") or []
    if not cells:
        return _empty(title, "No collective results recorded yet.")
    names = config_names(result)
    positions = _index_positions(result)
    all_groups = groups(cells)
    zmax = max(2, *(int(c.get("distinct_across_runs") or 1) for c in cells))
    fig = go.Figure()
    for g, group in enumerate(all_groups):
        mine = [c for c in cells if (c["op"], c["dtype"]) == group]
        sizes = sorted({int(c["bytes"]) for c in mine})
        z: list[list[int | None]] = [[None] * len(sizes) for _ in names]
        text: list[list[str]] = [[""] * len(sizes) for _ in names]
        custom: list[list[list[Any]]] = [[["", "", ""] for _ in sizes] for _ in names]
        for c in mine:
            row, col = positions[int(c["config_index"])], sizes.index(int(c["bytes"]))
            distinct = c.get("distinct_across_runs")
            z[row][col] = distinct
            # An asterisk marks cells whose ranks disagreed: reproducible across runs is not enough there.
            mark = "" if c.get("rank_consistent", True) else "*"
            text[row][col] = "" if distinct is None else f"{distinct}{mark}"
            custom[row][col] = [c.get("distinct_in_process"), "yes" if c.get("rank_consistent") else "no",
                                "yes" if c.get("reproducible") else "no"]
        fig.add_trace(go.Heatmap(
            x=[human_bytes(s) for s in sizes], y=names, z=z, text=text, texttemplate="%{text}",
            customdata=custom, name=_group_label(group), visible=g == 0,
            zmin=1, zmax=zmax, colorscale=_distinct_colorscale(zmax), xgap=1, ygap=1,
            colorbar={"title": {"text": "distinct"}, "dtick": 1},
            hovertemplate=("%{y} · %{x}<br>distinct across runs: %{z}<br>max distinct in one process: "
                           "%{customdata[0]}<br>ranks agree: %{customdata[1]}<br>reproducible: %{customdata[2]}"
                           "<extra></extra>"),
        ))
    fig.update_layout(
        title={"text": f"{title}: {_group_label(all_groups[0])}"},
        template="plotly_white",
        height=max(260, 120 + 26 * len(names)),
        margin={"l": 60, "r": 30, "t": 90, "b": 50},
        xaxis={"title": {"text": "message size"}, "type": "category"},
        yaxis={"autorange": "reversed", "type": "category", "automargin": True},
        updatemenus=_group_menu(all_groups, [1] * len(all_groups), title),
    )
    return _as_dict(fig)


def _spread_bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    values = [float(r["busbw_gbps"]) for r in rows]
    spreads = [r.get("busbw_spread") or [v, v] for r, v in zip(rows, values, strict=True)]
    return {"type": "data", "symmetric": False, "thickness": 1,
            "array": [max(float(hi) - v, 0.0) for (_, hi), v in zip(spreads, values, strict=True)],
            "arrayminus": [max(v - float(lo), 0.0) for (lo, _), v in zip(spreads, values, strict=True)]}


def bandwidth_figure(result: dict[str, Any]) -> dict[str, Any]:
    """busbw (GB/s) against message size on a log axis, one line per config; open markers = not reproducible."""
    title = "Bus bandwidth"
    cells = [c for c in result.get("cells") or [] if _finite(c.get("busbw_gbps"))]
    if not cells:
        return _empty(title, "No bandwidth measured yet.")
    names = config_names(result)
    positions = _index_positions(result)
    colors = _palette(len(names))
    all_groups = groups(cells)
    fig = go.Figure()
    per_group = []
    for g, group in enumerate(all_groups):
        mine = [c for c in cells if (c["op"], c["dtype"]) == group]
        indices = sorted({int(c["config_index"]) for c in mine}, key=lambda i: positions[i])
        per_group.append(len(indices))
        for index in indices:
            rows = sorted((c for c in mine if int(c["config_index"]) == index), key=lambda c: int(c["bytes"]))
            pos = positions[index]
            fig.add_trace(go.Scatter(
                x=[int(r["bytes"]) for r in rows], y=[float(r["busbw_gbps"]) for r in rows],
                name=names[pos], legendgroup=names[pos], visible=g == 0, mode="lines+markers",
                line={"color": colors[pos], "width": 1.5},
                marker={"color": colors[pos], "size": 9, "line": {"width": 1.5, "color": colors[pos]},
                        "symbol": ["circle" if r.get("reproducible") else "circle-open" for r in rows]},
                error_y=_spread_bars(rows),
                text=[human_bytes(int(r["bytes"])) for r in rows],
                customdata=["reproducible" if r.get("reproducible") else "NOT reproducible" for r in rows],
                hovertemplate="%{fullData.name} · %{text}: %{y:.2f} GB/s · %{customdata}<extra></extra>",
            ))
    sizes = sorted({int(c["bytes"]) for c in cells})
    legend = "median over trials, spread as error bars · ● reproducible  ○ not reproducible"
    fig.add_annotation(text=legend, x=0, y=1.02, xref="paper", yref="paper",
                       xanchor="left", yanchor="bottom", showarrow=False, font={"color": "#6b7280", "size": 12})
    fig.update_layout(
        title={"text": f"{title}: {_group_label(all_groups[0])}"},
        template="plotly_white",
        height=420,
        margin={"l": 60, "r": 30, "t": 100, "b": 50},
        xaxis={"title": {"text": "message size"}, "type": "log", "tickvals": sizes,
               "ticktext": [human_bytes(s) for s in sizes]},
        yaxis={"title": {"text": "busbw (GB/s)"}, "rangemode": "tozero"},
        legend={"orientation": "v"},
        updatemenus=_group_menu(all_groups, per_group, title),
    )
    return _as_dict(fig)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (higher is better on both), by ascending x."""
    front = [
        i for i, (x, y) in enumerate(points)
        if not any(ox >= x and oy >= y and (ox, oy) != (x, y) for ox, oy in points)
    ]
    return sorted(front, key=lambda i: (points[i][0], -points[i][1]))


def frontier_points(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per config: bandwidth (median busbw over its cells ≥ 1 MiB, else over its largest size) and the share of its
    (op, dtype, size) cells that are reproducible. Configs without a bandwidth measurement are left out."""
    names = config_names(result)
    positions = _index_positions(result)
    out = []
    for index, pos in sorted(positions.items(), key=lambda item: item[1]):
        mine = [c for c in result.get("cells") or [] if int(c["config_index"]) == index]
        measured = [c for c in mine if _finite(c.get("busbw_gbps"))]
        if not measured:
            continue
        large = [c for c in measured if int(c["bytes"]) >= MIB]
        basis = "median over sizes ≥ 1 MiB"
        if not large:
            largest = max(int(c["bytes"]) for c in measured)
            large = [c for c in measured if int(c["bytes"]) == largest]
            basis = f"at {human_bytes(largest)}, the largest size"
        out.append({"config_index": index, "name": names[pos], "basis": basis,
                    "busbw_gbps": statistics.median(float(c["busbw_gbps"]) for c in large),
                    "reproducible_share": sum(1 for c in mine if c.get("reproducible")) / len(mine)})
    return out


def frontier_figure(result: dict[str, Any]) -> dict[str, Any]:
    """Reproducibility against bandwidth, one point per config, with the Pareto frontier drawn through them."""
    title = "Reproducibility vs bandwidth"
    points = frontier_points(result)
    if not points:
        return _empty(title, "No bandwidth measured yet.")
    colors = _palette(len(config_names(result)))
    positions = _index_positions(result)
    xy = [(p["busbw_gbps"], p["reproducible_share"]) for p in points]
    front = pareto_front(xy)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[xy[i][0] for i in front], y=[xy[i][1] for i in front], name="Pareto frontier", mode="lines",
        line={"color": FRONTIER, "dash": "dash", "width": 1.5}, hoverinfo="skip",
    ))
    on_front = set(front)
    # Past a handful of configs the labels pile up; then only the frontier is labelled and hover names the rest.
    labelled = set(range(len(points))) if len(points) <= MAX_LABELS else on_front
    fig.add_trace(go.Scatter(
        x=[x for x, _ in xy], y=[y for _, y in xy], name="configs", mode="markers+text",
        text=[p["name"] for p in points], textposition="top center", textfont={"size": 11},
        texttemplate=[p["name"] if i in labelled else "" for i, p in enumerate(points)],
        marker={"size": [14 if i in on_front else 9 for i in range(len(points))],
                "color": [colors[positions[p["config_index"]]] for p in points],
                "line": {"width": [2 if i in on_front else 0 for i in range(len(points))], "color": FRONTIER}},
        customdata=["on the frontier" if i in on_front else "dominated" for i in range(len(points))],
        hovertemplate="%{text}<br>%{x:.2f} GB/s · %{y:.0%} reproducible · %{customdata}<extra></extra>",
    ))
    fig.update_layout(
        title={"text": f"{title} (up and right is better)"},
        template="plotly_white",
        height=420,
        margin={"l": 60, "r": 30, "t": 60, "b": 50},
        # Headroom on the right so the fastest config's label is not cut at the edge.
        xaxis={"title": {"text": f"busbw (GB/s), {' / '.join(dict.fromkeys(p['basis'] for p in points))}"},
               "range": [0, max(x for x, _ in xy) * 1.2 or 1]},
        yaxis={"title": {"text": "share of cells reproducible"}, "tickformat": ".0%", "range": [-0.05, 1.12]},
        showlegend=False,
    )
    return _as_dict(fig)


def equality_shares(result: dict[str, Any]) -> list[list[float | None]]:
    """Config × config: the share of comparable (op, dtype, size) entries whose outputs were bitwise equal."""
    n = len(result.get("configs") or [])
    equal = [[0] * n for _ in range(n)]
    compared = [[0] * n for _ in range(n)]
    for entry in result.get("equality") or []:
        matrix = entry.get("equal") or []
        for i in range(min(n, len(matrix))):
            for j in range(min(n, len(matrix[i]))):
                if matrix[i][j] is None:
                    continue
                compared[i][j] += 1
                equal[i][j] += bool(matrix[i][j])
    return [[equal[i][j] / compared[i][j] if compared[i][j] else None for j in range(n)] for i in range(n)]


def equality_figure(result: dict[str, Any]) -> dict[str, Any]:
    """Config × config heatmap of the share of cells with bitwise-equal outputs (red 0% → green 100%)."""
    title = "Bitwise-equal outputs between configs"
    if not result.get("equality") or not result.get("configs"):
        return _empty(title, "No cross-config comparison yet.")
    names = config_names(result)
    shares = equality_shares(result)
    fig = go.Figure(go.Heatmap(
        x=names, y=names, z=shares, zmin=0, zmax=1, xgap=1, ygap=1,
        colorscale=[[0.0, RED_DARK], [0.5, "#fff4d6"], [1.0, GREEN]],
        text=[["n/a" if s is None else f"{s:.0%}" for s in row] for row in shares],
        texttemplate="%{text}" if len(names) <= MAX_LABELS * 2 else None,
        colorbar={"title": {"text": "equal"}, "tickformat": ".0%"},
        hovertemplate="%{y} vs %{x}: %{text} of cells bitwise equal<extra></extra>",
    ))
    fig.update_layout(
        title={"text": f"{title} (share of op · dtype · size cells)"},
        template="plotly_white",
        height=max(320, 140 + 28 * len(names)),
        margin={"l": 60, "r": 30, "t": 60, "b": 60},
        xaxis={"type": "category", "tickangle": -30, "automargin": True},
        yaxis={"type": "category", "autorange": "reversed", "automargin": True},
    )
    return _as_dict(fig)


def collective_figures(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The four figures of a collective or sweep job page, keyed by the div they are drawn in."""
    return {
        "heatmap": heatmap_figure(result),
        "bandwidth": bandwidth_figure(result),
        "frontier": frontier_figure(result),
        "equality": equality_figure(result),
    }
