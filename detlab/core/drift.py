"""How far two compared runs drift apart, step by step: the estimate of ‖A−B‖/‖A‖ over the recorded tensors
(detlab.core.sketch) beside |Δloss|, and a verdict that says whether it stays at rounding level or grows.

Pure functions over RunData (detlab.core.runs). At most POINTS steps are estimated, spread evenly over the
steps both runs recorded with statistics (the loader reads the packed statistics of those steps only), so a
100k-step comparison reads a few hundred rows. Where two ranks' model digests are equal the distance is
exactly 0, whatever the sketches say.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from detlab.core import sketch
from detlab.core.runs import mean_loss

if TYPE_CHECKING:
    from detlab.core.runs import RunData

POINTS = 200
# A distance up to this many ulps (relative) of the dominant dtype is rounding: one ulp per element gives
# about one, a few steps of training amplify it a little, and the estimate itself is ±sqrt(2/K) (35 %).
ROUNDING_ULPS = 4
MAX_RANKS = 8  # per-rank series kept in a result (the furthest apart)


def recorded(run: RunData) -> list[int]:
    """Steps at which some rank of `run` recorded statistics."""
    return sorted({step for (step, _), data in run.records.items() if data.drift_version is not None})


def sample(steps: list[int], points: int = POINTS) -> list[int]:
    """At most `points` of `steps`, evenly spread, the first and the last kept."""
    if len(steps) <= points:
        return steps
    stride = (len(steps) - 1) / (points - 1)
    return sorted({steps[round(i * stride)] for i in range(points)})


def _common(a: RunData, b: RunData) -> list[int]:
    return sorted(set(recorded(a)) & set(recorded(b)))


def steps_to_load(a: RunData, b: RunData) -> list[int]:
    """The steps whose statistics the comparison estimates (and a loader must fill in)."""
    return sample(_common(a, b))


def _unavailable(a: RunData, b: RunData, common: list[int]) -> str | None:
    if common:
        versions = {d.drift_version for run in (a, b) for d in run.records.values() if d.drift_version is not None}
        if len(versions) > 1:
            return f"the runs' sketches are of different versions ({', '.join(sorted(versions))}) and do not compare"
        return None
    lacking = [run.run_id for run in (a, b) if not recorded(run)]
    if lacking:
        who = " and ".join(f"run {r}" for r in lacking)
        return (f"{who} recorded no parameter statistics (recorded before detlab took them, with drift=False, "
                f"with more than {sketch.MAX_TENSORS} tensors, or every step held a NaN or an infinity): "
                "no distance can be estimated")
    return "the runs share no step that both recorded with statistics"


def _distance(x: Any, y: Any) -> float | None:
    """One rank pair at one step: 0 where the digests are equal, else the estimate (None: not loaded)."""
    if x.model_digest is not None and x.model_digest == y.model_digest:
        return 0.0
    if x.stats is None or y.stats is None or x.sketch is None or y.sketch is None or len(x.sketch) != len(y.sketch):
        return None
    return sketch.relative_distance(x.stats, x.sketch, y.sketch)


def _pairs(a: RunData, b: RunData, step: int, ranks: list[int] | None) -> list[tuple[int | None, Any, Any]]:
    """The records compared at a step: rank by rank, or (rank consensus) each run's lowest rank."""
    if ranks is not None:
        return [(r, a.records.get((step, r)), b.records.get((step, r))) for r in ranks]
    x, y = a.at(step, a.ranks()), b.at(step, b.ranks())
    return [(None, x[0] if x else None, y[0] if y else None)]


def _text(value: float) -> str:
    return f"{value:.2g}" if value else "0"


def _verdict(points: list[list[float]], level: tuple[str, float] | None, sampled: bool) -> str:
    where = f"at {len(points)} sampled steps" if sampled else f"at {len(points)} compared steps"
    peak_step, peak = max(points, key=lambda p: (p[1], -p[0]))
    if peak == 0.0:
        return f"distance 0 {where}: the parameters are bit-identical there"
    if level is None:
        return f"grows to {_text(peak)} by step {int(peak_step)} (no floating-point tensors for a rounding level)"
    dtype, ulp = level
    if peak <= ROUNDING_ULPS * ulp:
        return (f"stays at rounding level {where}: at most {_text(peak)}, within {ROUNDING_ULPS} {dtype} ulps "
                f"({_text(ulp)} relative each)")
    return f"grows to {_text(peak)} by step {int(peak_step)} ({peak / ulp:.3g} × one {dtype} ulp, {_text(ulp)})"


def _verdict_after(diverged_at: int, last: list[float]) -> str:
    """The verdict where the runs part after every step both sketched (a short run under Recorder()'s cadence)."""
    return (f"not estimated after the divergence at step {diverged_at}: the last step both runs sketched is "
            f"{int(last[0])} (distance {_text(last[1])} there); Recorder(drift=True) sketches every step")


def compare(a: RunData, b: RunData, per_rank: bool, diverged_at: int | None) -> dict[str, Any]:
    """The drift between two comparable runs, from the statistics loaded in their records: `points` per step
    (the worst rank's estimate of ‖A−B‖/‖A‖), `ranks` per rank where they differ (the MAX_RANKS furthest
    apart), `loss_delta`, the dtype's rounding level and the verdict text. `available` False says why (never
    a made-up zero). `diverged_at`, the first step whose digests differ, keeps the verdict from calling runs
    bit-identical at steps that all precede it."""
    common = _common(a, b)
    reason = _unavailable(a, b, common)
    base = {"version": sketch.VERSION, "k": sketch.K, "relative_error": sketch.RELATIVE_ERROR}
    if reason:
        return {**base, "available": False, "reason": reason}
    level = sketch.rounding_level(a.tensors)
    ranks = sorted(set(a.ranks()) & set(b.ranks())) if per_rank else None
    points: list[list[float]] = []
    by_rank: dict[str, list[list[float]]] = {}
    loss_delta: list[list[float]] = []
    steps = sample(common)
    for step in steps:
        found: list[tuple[int | None, float]] = []
        for rank, x, y in _pairs(a, b, step, ranks):
            if x is not None and y is not None and (value := _distance(x, y)) is not None:
                found.append((rank, value))
        if not found:
            continue
        points.append([step, max(v for _, v in found)])
        for rank, value in found:
            if rank is not None:
                by_rank.setdefault(str(rank), []).append([step, value])
        la, lb = mean_loss(a, step), mean_loss(b, step)
        if la is not None and lb is not None and math.isfinite(la - lb):
            loss_delta.append([step, abs(la - lb)])
    if not points:
        return {**base, "available": False, "reason": "no step holds statistics of both runs on a common rank"}
    same_ranks = len({tuple(v for _, v in series) for series in by_rank.values()}) <= 1
    if len(by_rank) > MAX_RANKS:  # the ranks that drift furthest: a 1024-rank run stays a small result
        worst = sorted(by_rank, key=lambda r: -max(v for _, v in by_rank[r]))[:MAX_RANKS]
        by_rank = {r: by_rank[r] for r in sorted(worst, key=int)}
    sampled = len(steps) < len(common)
    peak_step, peak = max(points, key=lambda p: (p[1], -p[0]))
    verdict = _verdict(points, level, sampled)
    if diverged_at is not None and points[-1][0] < diverged_at:
        verdict = _verdict_after(diverged_at, points[-1])
    return {**base, "available": True, "reason": None, "points": points,
            "ranks": {} if same_ranks else by_rank, "loss_delta": loss_delta,
            "dtype": level[0] if level else None, "rounding_level": level[1] if level else None,
            "max": peak, "max_step": int(peak_step), "sampled": sampled,
            "verdict": verdict}
