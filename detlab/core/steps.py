"""A comparison's per-step series thinned for a page: at most MAX_POINTS buckets of consecutive steps,
chosen so that no difference is hidden (a bucket shows the most tensors differing in it and how many
of its steps differ; loss is sampled where |Δloss| peaks). The full detail of a step window is
computed on demand from the recorded rows.

Pure functions over the comparison dict (as detlab.core.compare.compare_runs returns it)."""

from __future__ import annotations

import math
from typing import Any

MAX_POINTS = 2000  # buckets per series: ~100 KB of JSON, a figure plotly draws at once


def bucket_bounds(steps: list[int], points: int | None = None) -> list[tuple[int, int]]:
    """Index ranges [lo, hi) splitting `steps` into at most `points` (MAX_POINTS) buckets of near-equal length."""
    points = points or MAX_POINTS
    n = len(steps)
    if n <= points:
        return [(i, i + 1) for i in range(n)]
    size = math.ceil(n / points)
    return [(lo, min(lo + size, n)) for lo in range(0, n, size)]


def _per_step(rows: list[dict[str, Any]], points: int) -> list[dict[str, Any]]:
    out = []
    for lo, hi in bucket_bounds([r["step"] for r in rows], points):
        part = rows[lo:hi]
        counts = [r.get("tensors_differing") for r in part]
        known = [c for c in counts if c is not None]
        # None (differs, tensor count not loaded) only when nothing in the bucket has a known count > 0.
        worst = max(known, default=0)
        differing = sum(1 for c in counts if c is None or c > 0)
        out.append({"step": part[0]["step"], "to_step": part[-1]["step"],
                    "tensors_differing": None if worst == 0 and differing else worst,
                    "steps_differing": differing, "steps": len(part)})
    return out


def _loss(loss: dict[str, list[Any]], points: int) -> dict[str, list[list[Any]]]:
    """Both curves at the same sampled steps: per bucket the step where |Δloss| is largest (its first
    step when the runs agree), so a difference between the runs is never averaged away."""
    a = {int(s): v for s, v in loss.get("a") or []}
    b = {int(s): v for s, v in loss.get("b") or []}
    steps = sorted(set(a) | set(b))
    picked = []
    for lo, hi in bucket_bounds(steps, points):
        best, best_delta = steps[lo], -1.0
        for s in steps[lo:hi]:
            x, y = a.get(s), b.get(s)
            delta = abs(x - y) if isinstance(x, int | float) and isinstance(y, int | float) else 0.0
            if delta > best_delta or (math.isnan(delta) and best_delta >= 0):
                best, best_delta = s, math.inf if math.isnan(delta) else delta
        picked.append(best)
    return {"a": [[s, a[s]] for s in picked if s in a], "b": [[s, b[s]] for s in picked if s in b]}


def downsample(result: dict[str, Any], points: int | None = None) -> dict[str, Any]:
    """The comparison with `per_step` and `loss` thinned to at most `points` buckets, and `downsampled`
    saying how (the steps in all, the steps per bucket: GET …/comparison?from_step=&to_step= gives a
    window in full); the comparison itself when they are that short already."""
    points = points or MAX_POINTS
    per_step = result.get("per_step") or []
    loss = result.get("loss") or {}
    longest = max(len(per_step), *(len(v or []) for v in loss.values()), 0) if loss else len(per_step)
    if longest <= points:
        return result
    steps = len(per_step)
    return {**result, "per_step": _per_step(per_step, points), "loss": _loss(loss, points),
            "downsampled": {"steps": steps, "points": points,
                            "steps_per_point": math.ceil(max(steps, longest) / points)}}


def is_oversize(result: dict[str, Any], points: int | None = None) -> bool:
    """A stored comparison from before results were thinned (or a live one): too long to serve whole."""
    points = points or MAX_POINTS
    loss = result.get("loss") or {}
    return len(result.get("per_step") or []) > points or any(len(v or []) > points for v in loss.values())
