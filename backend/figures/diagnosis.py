"""Plotly figure builders for batch-invariance jobs: the /diagnosis result dict in, plain figure dicts out."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go

from detlab.backend.figures.collective import GREEN, RED_DARK, RED_LIGHT, _as_dict, _empty, _order
from detlab.backend.figures.text import plain
from detlab.core.diagnosis import INVARIANCE_DTYPES, INVARIANCE_OPS


def _row_label(config: dict[str, Any], op: str, dtype: str, several: bool) -> str:
    return f"{plain(config['label'])}: {op} · {dtype}" if several else f"{op} · {dtype}"


def _verdict(invariant: bool) -> str:
    return "invariant (bitwise equal to batch 1)" if invariant else "differs from batch 1"


def invariance_heatmap(result: dict[str, Any]) -> dict[str, Any]:
    """Op · dtype (per config when there are several) × batch size: green where row 0 equals the batch-1 result
    bitwise, red deepening with log10 of the largest ULP difference where it does not; the first batch size
    that breaks is marked ✕. Hover: invariant or not, max ULP, first break."""
    configs = [c for c in result.get("configs") or [] if c.get("results")]
    if result.get("kind") != "batch-invariance" or not configs:
        return _empty("Batch invariance", "no batch-invariance results yet")
    several = len(configs) > 1
    sizes = sorted({r["batch_size"] for c in configs for r in c["results"]})
    rows: list[tuple[dict[str, Any], str, str]] = []
    for c in configs:
        pairs = sorted({(r["op"], r["dtype"]) for r in c["results"]},
                       key=lambda p: (_order(p[0], INVARIANCE_OPS), _order(p[1], INVARIANCE_DTYPES)))
        rows += [(c, op, dtype) for op, dtype in pairs]
    z: list[list[float | None]] = []
    text: list[list[str]] = []
    hover: list[list[str]] = []
    for c, op, dtype in rows:
        cells = {r["batch_size"]: r for r in c["results"] if (r["op"], r["dtype"]) == (op, dtype)}
        first = next((s["first_break"] for s in c["summary"] if (s["op"], s["dtype"]) == (op, dtype)), None)
        z.append([None if b not in cells else math.log10(1 + cells[b]["max_ulp"]) for b in sizes])
        text.append(["" if b not in cells else "✕" if b == first else "" for b in sizes])
        hover.append([f"{op} · {dtype}, batch {b}: not measured" if b not in cells else
                      f"{op} · {dtype}, batch {b}<br>{_verdict(cells[b]['invariant'])}<br>max ULP "
                      f"{cells[b]['max_ulp']:,}<br>first break: {first if first is not None else 'none'}"
                      for b in sizes])
    top = max((v for row in z for v in row if v is not None), default=0.0) or 1.0
    fig = go.Figure(go.Heatmap(
        z=z, x=[str(b) for b in sizes], y=[_row_label(c, op, dtype, several) for c, op, dtype in rows],
        text=text, texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
        zmin=0, zmax=top, xgap=2, ygap=2,
        colorscale=[[0.0, GREEN], [1e-9, RED_LIGHT], [1.0, RED_DARK]],
        colorbar={"title": {"text": "log10(1+ULP)"}}))
    fig.update_layout(title="Batch invariance: row 0 against the batch-1 result (✕ first break)",
                      xaxis={"title": "batch size", "type": "category"},
                      yaxis={"autorange": "reversed", "type": "category"},
                      height=max(260, 40 + 26 * len(rows)), margin={"l": 160, "r": 20, "t": 50, "b": 50})
    return _as_dict(fig)
