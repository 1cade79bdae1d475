"""The cs1 count sketch (detlab.core.sketch): an unbiased estimate of ‖a−b‖² whose spread is about sqrt(2/K),
fine enough to see two runs apart at rounding level."""

from __future__ import annotations

import math

import numpy as np
import pytest

from detlab.core import sketch

SEEDS = 400


def estimates(a: np.ndarray, b: np.ndarray, seeds: int = SEEDS) -> np.ndarray:
    """‖S(a)−S(b)‖ / ‖a−b‖ under `seeds` different hash seeds (each seed is another random map)."""
    exact = np.linalg.norm(a.astype(np.float64) - b.astype(np.float64))
    return np.array([np.linalg.norm(sketch.sketch_reference(a, 3, seed) - sketch.sketch_reference(b, 3, seed))
                     for seed in range(seeds)]) / exact


@pytest.fixture(scope="module")
def weights() -> np.ndarray:
    return np.random.default_rng(0).standard_normal(3 * sketch.COLUMNS + 123).astype(np.float32)


def test_the_squared_estimate_is_unbiased_with_the_documented_spread(weights: np.ndarray) -> None:
    moved = weights + np.random.default_rng(1).standard_normal(weights.size).astype(np.float32) * 1e-3
    ratio_sq = estimates(weights, moved) ** 2
    # mean 1 within 3 standard errors; spread of the squared ratio sqrt(2/K) within 20 %
    assert abs(ratio_sq.mean() - 1) < 3 * math.sqrt(2 / sketch.K) / math.sqrt(SEEDS)
    assert ratio_sq.std() == pytest.approx(math.sqrt(2 / sketch.K), rel=0.2)


def test_a_sparse_difference_is_estimated_as_well_as_a_dense_one(weights: np.ndarray) -> None:
    moved = weights.copy()
    moved[[5, 4096, 9000, 12000]] += 0.5  # across rows and columns: no pair may cancel systematically
    ratio_sq = estimates(weights, moved) ** 2
    assert abs(ratio_sq.mean() - 1) < 4 * math.sqrt(2 / sketch.K) / math.sqrt(SEEDS)


@pytest.mark.parametrize("dtype, ulp", [(np.float32, 2.0**-23), (np.float16, 2.0**-10)])
def test_a_one_ulp_difference_everywhere_is_not_drowned_by_the_sketchs_rounding(dtype: type, ulp: float) -> None:
    a = np.random.default_rng(2).uniform(1, 2, 50_000).astype(dtype)
    b = np.nextafter(a, dtype(np.inf)).astype(dtype)
    exact = np.linalg.norm(a.astype(np.float64) - b.astype(np.float64)) / np.linalg.norm(a.astype(np.float64))
    assert exact == pytest.approx(ulp, rel=0.5)
    ratio = estimates(a, b, seeds=100)
    assert abs((ratio**2).mean() - 1) < 0.15


def test_equal_tensors_have_sketches_exactly_equal(weights: np.ndarray) -> None:
    assert np.array_equal(sketch.sketch_reference(weights, 0), sketch.sketch_reference(weights.copy(), 0))


def test_the_map_depends_on_the_tensors_index(weights: np.ndarray) -> None:
    assert not np.array_equal(sketch.sketch_reference(weights, 0), sketch.sketch_reference(weights, 1))


def test_the_relative_distance_uses_the_exact_norm_from_the_stats(weights: np.ndarray) -> None:
    moved = weights * np.float32(1.001)
    stats = sketch.pack(np.stack([sketch.stats_reference(weights)] * 2))
    sk_a = sketch.pack(np.stack([sketch.sketch_reference(weights, t) for t in range(2)]))
    sk_b = sketch.pack(np.stack([sketch.sketch_reference(moved, t) for t in range(2)]))
    estimate = sketch.relative_distance(stats, sk_a, sk_b)
    assert estimate is not None and estimate == pytest.approx(1e-3, rel=3 * sketch.RELATIVE_ERROR)
    zeros = sketch.pack(np.zeros((2, sketch.STATS)))
    assert sketch.relative_distance(zeros, sk_a, sk_b) is None  # nothing to be relative to


def test_the_rounding_level_is_that_of_the_dtype_holding_most_elements() -> None:
    tensors = [("w", [1000, 10], "bfloat16"), ("b", [10], "float32"), ("step", [], "int64")]
    assert sketch.rounding_level(tensors) == ("bfloat16", 2.0**-7)
    assert sketch.rounding_level([("n", [3], "int64")]) is None
