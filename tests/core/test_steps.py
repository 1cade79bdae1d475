"""Thinning a comparison's per-step series: bounded, and never hiding a difference."""

from __future__ import annotations

from detlab.core.steps import bucket_bounds, downsample, is_oversize


def comparison(steps: int, diverge: int | None = None, spike: int | None = None) -> dict:
    per_step = [{"step": s, "tensors_differing": 3 if diverge is not None and s >= diverge else 0}
                for s in range(steps)]
    loss_a = [[s, 1.0] for s in range(steps)]
    loss_b = [[s, 1.0 + (0.5 if s == spike else 0.0)] for s in range(steps)]
    return {"verdict": "diverged", "per_step": per_step, "loss": {"a": loss_a, "b": loss_b}}


def test_buckets_cover_every_step_once_and_are_at_most_points() -> None:
    bounds = bucket_bounds(list(range(100_001)), 2000)
    assert len(bounds) <= 2000
    assert bounds[0][0] == 0 and bounds[-1][1] == 100_001
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))


def test_a_short_comparison_is_returned_as_it_is() -> None:
    short = comparison(50)
    assert downsample(short, 100) is short
    assert not is_oversize(short, 100)


def test_a_long_comparison_is_thinned_and_says_how() -> None:
    thinned = downsample(comparison(10_000, diverge=7_001), 100)
    assert len(thinned["per_step"]) == 100 and len(thinned["loss"]["a"]) == 100
    assert thinned["downsampled"] == {"steps": 10_000, "points": 100, "steps_per_point": 100}
    assert thinned["verdict"] == "diverged"


def test_a_single_differing_step_shows_in_its_bucket() -> None:
    data = comparison(10_000)
    data["per_step"][4321]["tensors_differing"] = 7
    buckets = downsample(data, 100)["per_step"]
    [hit] = [b for b in buckets if b["tensors_differing"]]
    assert hit["step"] <= 4321 <= hit["to_step"]
    assert (hit["tensors_differing"], hit["steps_differing"]) == (7, 1)


def test_a_step_that_differs_with_unknown_tensors_is_not_shown_as_equal() -> None:
    data = comparison(10_000)
    data["per_step"][50]["tensors_differing"] = None  # differs, packed digests not loaded
    first = downsample(data, 100)["per_step"][0]
    assert first["tensors_differing"] is None and first["steps_differing"] == 1


def test_loss_is_sampled_where_the_runs_part_most() -> None:
    thinned = downsample(comparison(10_000, spike=5_555), 100)
    a, b = dict(map(tuple, thinned["loss"]["a"])), dict(map(tuple, thinned["loss"]["b"]))
    assert 5_555 in a and b[5_555] - a[5_555] == 0.5
