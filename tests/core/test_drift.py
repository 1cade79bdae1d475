"""How far two runs drift (detlab.core.drift): measured points only, exact zeros where digests agree, a verdict
that says rounding level or growth, and no chart at all where a run recorded no statistics."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from detlab.core import drift, sketch
from detlab.core.compare import DIGEST_BYTES, compare_runs
from detlab.core.runs import RunData, StepData


def compared(a: RunData, b: RunData) -> dict[str, Any]:
    """The comparison as a report stores it (detlab.core.results.RunComparison.stored)."""
    return compare_runs(a, b).stored()

TENSORS = [("w", [64, 64], "float32"), ("b", [64], "float32")]


def params(step: int, rel: float) -> list[np.ndarray]:
    """Run B's parameters at `step`: run A's moved by `rel` of their size (0: the same)."""
    rng = np.random.default_rng(step)
    a = [rng.standard_normal(64 * 64).astype(np.float32), rng.standard_normal(64).astype(np.float32)]
    noise = np.random.default_rng(1000 + step)
    return [x + (rel * noise.standard_normal(x.size) * np.abs(x)).astype(np.float32) for x in a]


def step_data(values: list[np.ndarray], digest: str, with_stats: bool = True) -> StepData:
    stats = sketch.pack(np.stack([sketch.stats_reference(v) for v in values]))
    sk = sketch.pack(np.stack([sketch.sketch_reference(v, t) for t, v in enumerate(values)]))
    return StepData(digests=None, loss=1.0, step_time_s=0.1, model_digest=digest,
                    drift_version="cs1" if with_stats else None,
                    stats=stats if with_stats else None, sketch=sk if with_stats else None)


def run(run_id: int, rel: dict[int, float], with_stats: bool = True, ranks: int = 1) -> RunData:
    data = RunData(run_id=run_id, workload="mlp", world_size=ranks, tensors=TENSORS)
    for step, r in rel.items():
        for rank in range(ranks):
            data.records[(step, rank)] = step_data(params(step, r), f"fp2:{step:04x}{r!r:>28}", with_stats)
    return data


def test_identical_runs_are_at_distance_exactly_zero() -> None:
    result = compared(run(1, {0: 0, 1: 0, 2: 0}), run(2, {0: 0, 1: 0, 2: 0}))["drift"]
    assert result["available"] and [p[1] for p in result["points"]] == [0.0, 0.0, 0.0]
    assert result["verdict"].startswith("distance 0 at 3 compared steps")


def test_a_difference_at_rounding_level_stays_there() -> None:
    result = compared(run(1, {s: 0 for s in range(4)}), run(2, {0: 0, 1: 2**-24, 2: 2**-24, 3: 2**-24}))
    found = result["drift"]
    assert found["points"][0][1] == 0.0 and 0 < found["max"] < 4 * 2**-23
    assert found["verdict"].startswith("stays at rounding level") and found["rounding_level"] == 2**-23


def test_a_growing_difference_is_named_with_its_size_and_step() -> None:
    result = compared(run(1, {s: 0 for s in range(5)}), run(2, {0: 0, 1: 1e-7, 2: 1e-5, 3: 1e-3, 4: 1e-2}))
    found = result["drift"]
    assert found["max_step"] == 4 and found["max"] == pytest.approx(1e-2, rel=0.6)
    assert found["verdict"].startswith(f"grows to {found['max']:.2g} by step 4")
    assert [s for s, _ in found["loss_delta"]] == [0, 1, 2, 3, 4]


def test_a_run_without_statistics_gives_no_chart_and_says_which() -> None:
    result = compared(run(1, {0: 0, 1: 1e-3}), run(2, {0: 0, 1: 0}, with_stats=False))["drift"]
    assert not result["available"] and "run 2 recorded no parameter statistics" in result["reason"]
    assert "points" not in result


def test_long_runs_are_estimated_at_a_bounded_even_sample_of_steps() -> None:
    steps = list(range(0, 2000, 3))
    assert drift.sample(steps)[0] == 0 and drift.sample(steps)[-1] == steps[-1]
    assert len(drift.sample(steps)) == drift.POINTS
    assert drift.sample(steps[:10]) == steps[:10]


def test_ranks_that_drift_differently_are_shown_apart() -> None:
    a, b = run(1, {0: 0, 1: 0}, ranks=2), run(2, {0: 0, 1: 0}, ranks=2)
    b.records[(1, 1)] = step_data(params(1, 1e-3), "fp2:other")
    found = compared(a, b)["drift"]
    assert found["points"][1][1] > 0 and set(found["ranks"]) == {"0", "1"}
    assert found["ranks"]["0"][1][1] == 0.0 and found["ranks"]["1"][1][1] == found["points"][1][1]


def test_many_ranks_keep_the_series_of_the_furthest_apart_only() -> None:
    ranks = drift.MAX_RANKS + 4
    a, b = run(1, {0: 0, 1: 0}, ranks=ranks), run(2, {0: 0, 1: 0}, ranks=ranks)
    for rank in range(ranks):
        b.records[(1, rank)] = step_data(params(1, 1e-6 * (rank + 1)), f"fp2:other{rank}")
    kept = compared(a, b)["drift"]["ranks"]
    assert list(kept) == [str(r) for r in range(4, ranks)]


def test_every_tensor_differing_at_the_first_recorded_step_names_the_initial_states() -> None:
    """An unseeded model (PyTorch's DDP tutorial as written): every tensor differs from the first step on; that is a
    cause, not a drift that "grows by step 0"."""
    a, b = run(1, {s: 0 for s in range(3)}), run(2, {s: 0.5 for s in range(3)})
    for data, fill in ((a, 1), (b, 2)):
        for record in data.records.values():
            record.digests = bytes([fill]) * (DIGEST_BYTES * len(TENSORS))
    result = compared(a, b)
    assert (result["verdict"], result["first_divergent_step"], result["first_divergent_tensors"]) == \
        ("diverged", 0, ["w", "b"])
    assert result["drift"]["verdict"] == ("initial states differ — seed before building the model, or load the same "
                                          "weights (every tensor differs at step 0, the first recorded)")


def test_a_difference_that_starts_later_is_not_called_initial() -> None:
    a, b = run(1, {s: 0 for s in range(3)}), run(2, {0: 0, 1: 0.5, 2: 0.5})
    for data in (a, b):
        for (step, _), record in data.records.items():
            record.digests = bytes([1 if data is a or step == 0 else 2]) * (DIGEST_BYTES * len(TENSORS))
    assert compared(a, b)["drift"]["verdict"].startswith("grows to")


def test_a_divergence_after_the_last_sketched_step_is_not_called_bit_identical() -> None:
    """Recorder() sketches every tenth step: runs of 6 steps parting at step 2 share one sketched step (0), where
    the distance is 0. The verdict says the drift after the divergence was not estimated, not "bit-identical"."""
    a, b = run(1, {s: 0 for s in range(6)}), run(2, {s: 0 if s < 2 else 1e-3 for s in range(6)})
    for data in (a, b):
        for (step, _), record in data.records.items():
            record.digests = bytes([1 if data is a or step < 2 else 2]) * (DIGEST_BYTES * len(TENSORS))
            if step:
                record.drift_version = record.stats = record.sketch = None
    result = compared(a, b)
    assert (result["verdict"], result["first_divergent_step"]) == ("diverged", 2)
    assert result["drift"]["verdict"] == (
        "not estimated after the divergence at step 2: the last step both runs sketched is 0 (distance 0 there); "
        "Recorder(drift=True) sketches every step")
