"""Unit tests of detlab.core.compare on hand-built RunData: verdicts, loss curves, reproducibility, throughput, cost."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from detlab.core.compare import (
    compare_runs,
    cost,
    cost_estimate,
    cost_text,
    reproducibility,
    throughput,
)
from detlab.core.runs import RunData, StepData
from detlab.core.shards import DIGEST_BYTES


def compared(a: RunData, b: RunData) -> dict[str, Any]:
    """The comparison as a report stores it (detlab.core.results.RunComparison.stored)."""
    return compare_runs(a, b).stored()

TENSORS = [("fc1.weight", [8, 4], "float32"), ("fc1.bias", [8], "float32"), ("fc2.weight", [2, 8], "float32")]
DIFFERENT = 200  # a digest byte no tensor of make_run holds


def digests(ids: Iterable[int]) -> bytes:
    """One DIGEST_BYTES chunk per tensor, each filled with its id."""
    return b"".join(bytes([i]) * DIGEST_BYTES for i in ids)


def make_run(
    run_id: int = 1,
    *,
    world_size: int = 2,
    steps: Iterable[int] = range(4),
    workload: str = "mlp",
    tensors: list[tuple[str, list[int], str]] | None = None,
    loss: float | None = 1.0,
    step_time_s: float = 0.1,
) -> RunData:
    """A run whose every rank records every step with tensor i's digest = bytes([i]) * 16."""
    tensors = TENSORS if tensors is None else tensors
    records = {(s, r): StepData(digests(range(len(tensors))), loss, step_time_s)
               for s in steps for r in range(world_size)}
    return RunData(run_id=run_id, workload=workload, world_size=world_size, tensors=tensors, records=records)


def perturb(run: RunData, *, step: int, rank: int, tensor: int, value: int = DIFFERENT) -> None:
    """Change one tensor's digest at one (step, rank) of run."""
    chunks = bytearray(run.records[(step, rank)].digests)
    chunks[tensor * DIGEST_BYTES : (tensor + 1) * DIGEST_BYTES] = bytes([value]) * DIGEST_BYTES
    run.records[(step, rank)].digests = bytes(chunks)


def perturb_all_ranks(run: RunData, *, step: int, tensor: int, value: int = DIFFERENT) -> None:
    for rank in run.ranks():
        perturb(run, step=step, rank=rank, tensor=tensor, value=value)


def set_time(run: RunData, step: int, rank: int, seconds: float) -> None:
    run.records[(step, rank)].step_time_s = seconds


def set_loss(run: RunData, step: int, rank: int, loss: float | None) -> None:
    run.records[(step, rank)].loss = loss


# --- identical and per-rank divergence ------------------------------------------------------------


def test_identical_runs_are_identical() -> None:
    result = compared(make_run(1), make_run(2))

    assert result["verdict"] == "identical"
    assert result["first_divergent_step"] is None
    assert result["first_divergent_tensors"] == []
    assert result["ranks"] == []
    assert result["reason"] is None


def test_identical_runs_count_every_common_step() -> None:
    result = compared(make_run(1), make_run(2))

    assert result["steps_compared"] == 4
    assert result["steps_differing"] == 0
    assert result["per_step"] == [{"step": s, "tensors_differing": 0} for s in range(4)]


def test_equal_world_sizes_compare_per_rank() -> None:
    assert compared(make_run(1), make_run(2))["mode"] == "per-rank"


def test_result_names_both_runs() -> None:
    result = compared(make_run(7), make_run(9))

    assert (result["run_a"], result["run_b"]) == (7, 9)


def test_divergence_reports_first_step() -> None:
    b = make_run(2)
    perturb(b, step=2, rank=1, tensor=1)

    result = compared(make_run(1), b)

    assert result["verdict"] == "diverged"
    assert result["first_divergent_step"] == 2


def test_divergence_reports_differing_tensor_by_name() -> None:
    b = make_run(2)
    perturb(b, step=2, rank=1, tensor=1)

    assert compared(make_run(1), b)["first_divergent_tensors"] == ["fc1.bias"]


def test_divergence_reports_only_the_differing_rank() -> None:
    b = make_run(2, world_size=4)
    perturb(b, step=2, rank=3, tensor=1)

    assert compared(make_run(1, world_size=4), b)["ranks"] == [3]


def test_divergence_unions_tensors_and_ranks_at_first_step_in_index_order() -> None:
    b = make_run(2, world_size=4)
    perturb(b, step=1, rank=2, tensor=2)
    perturb(b, step=1, rank=0, tensor=0)

    result = compared(make_run(1, world_size=4), b)

    assert result["first_divergent_tensors"] == ["fc1.weight", "fc2.weight"]
    assert result["ranks"] == [0, 2]


def test_first_divergent_tensors_come_from_first_step_only() -> None:
    b = make_run(2)
    perturb(b, step=1, rank=0, tensor=0)
    perturb(b, step=2, rank=0, tensor=2)

    assert compared(make_run(1), b)["first_divergent_tensors"] == ["fc1.weight"]


def test_later_differing_steps_are_counted() -> None:
    b = make_run(2, steps=range(6))
    for step in (1, 2, 4):  # step 3 happens to match again
        perturb(b, step=step, rank=0, tensor=0)

    result = compared(make_run(1, steps=range(6)), b)

    assert result["steps_differing"] == 3
    assert result["steps_compared"] == 6


def test_per_step_counts_distinct_tensors_differing() -> None:
    b = make_run(2)
    perturb(b, step=1, rank=0, tensor=0)
    perturb(b, step=1, rank=1, tensor=0)
    perturb(b, step=1, rank=1, tensor=2)

    per_step = compared(make_run(1), b)["per_step"]

    assert per_step[1] == {"step": 1, "tensors_differing": 2}


def test_per_rank_mode_compares_replicas_rank_by_rank() -> None:
    # Both runs hold the same odd replica on rank 1: per rank they agree, though replicas disagree inside each run.
    a, b = make_run(1), make_run(2)
    perturb(a, step=2, rank=1, tensor=0)
    perturb(b, step=2, rank=1, tensor=0)

    assert compared(a, b)["verdict"] == "identical"


def test_rank_recorded_in_one_run_only_is_noted() -> None:
    a, b = make_run(1), make_run(2)
    for step in b.steps():
        del b.records[(step, 1)]

    result = compared(a, b)

    assert result["reason"] is not None and "rank" in result["reason"]


def test_runs_with_no_common_rank_are_not_identical() -> None:
    a, b = make_run(1, world_size=2), make_run(2, world_size=2)
    for step in a.steps():
        del a.records[(step, 1)]
        del b.records[(step, 0)]
    perturb_all_ranks(b, step=1, tensor=0)

    assert compared(a, b)["verdict"] != "identical"


# --- rank-consensus mode --------------------------------------------------------------------------


def test_different_world_sizes_use_rank_consensus_mode() -> None:
    result = compared(make_run(1, world_size=2), make_run(2, world_size=4))

    assert result["mode"] == "rank-consensus"
    assert result["verdict"] == "identical"


def test_rank_consensus_mode_is_explained_in_reason() -> None:
    reason = compared(make_run(1, world_size=2), make_run(2, world_size=4))["reason"]

    assert "rank-consensus" in reason
    assert "2 vs 4" in reason


def test_rank_consensus_runs_agreeing_internally_but_differing_diverge() -> None:
    b = make_run(2, world_size=4)
    perturb_all_ranks(b, step=2, tensor=1)

    result = compared(make_run(1, world_size=2), b)

    assert result["verdict"] == "diverged"
    assert result["first_divergent_step"] == 2
    assert result["first_divergent_tensors"] == ["fc1.bias"]


def test_rank_consensus_divergence_reports_no_ranks() -> None:
    b = make_run(2, world_size=4)
    perturb_all_ranks(b, step=2, tensor=1)

    assert compared(make_run(1, world_size=2), b)["ranks"] == []


def test_rank_consensus_replicas_disagreeing_inside_a_run_count_as_differing() -> None:
    # Rank 0 of b still matches a; only replica 3 disagrees with its peers.
    b = make_run(2, world_size=4)
    perturb(b, step=1, rank=3, tensor=2)

    result = compared(make_run(1, world_size=2), b)

    assert result["first_divergent_step"] == 1
    assert result["first_divergent_tensors"] == ["fc2.weight"]


def test_rank_consensus_replicas_disagreeing_in_both_runs_count_as_differing() -> None:
    a, b = make_run(1, world_size=2), make_run(2, world_size=4)
    perturb(a, step=1, rank=1, tensor=0)
    perturb(b, step=1, rank=1, tensor=0)

    assert compared(a, b)["verdict"] == "diverged"


# --- incomparable ---------------------------------------------------------------------------------


def test_different_workloads_are_incomparable() -> None:
    result = compared(make_run(1, workload="mlp"), make_run(2, workload="tiny-lm"))

    assert result["verdict"] == "incomparable"
    assert result["reason"] == "different workloads: mlp vs tiny-lm"


def test_incomparable_result_has_empty_comparison_fields() -> None:
    result = compared(make_run(1, workload="mlp"), make_run(2, workload="tiny-lm"))

    assert result["mode"] is None
    assert result["steps_compared"] == 0
    assert result["per_step"] == []
    assert result["loss"] == {"a": [], "b": []}


def test_tensor_present_in_one_run_only_is_named() -> None:
    extra = [*TENSORS, ("fc2.bias", [2], "float32")]

    result = compared(make_run(1), make_run(2, tensors=extra))

    assert result["verdict"] == "incomparable"
    assert "fc2.bias" in result["reason"]
    assert "one run only" in result["reason"]


def test_tensor_with_different_shape_is_named() -> None:
    reshaped = [TENSORS[0], ("fc1.bias", [16], "float32"), TENSORS[2]]

    result = compared(make_run(1), make_run(2, tensors=reshaped))

    assert result["verdict"] == "incomparable"
    assert "different shape or dtype: ['fc1.bias']" in result["reason"]


def test_tensor_order_difference_is_incomparable() -> None:
    reordered = [TENSORS[1], TENSORS[0], TENSORS[2]]

    result = compared(make_run(1), make_run(2, tensors=reordered))

    assert result["verdict"] == "incomparable"
    assert result["reason"] == "tensor order differs"


def test_run_without_records_is_incomparable_and_named() -> None:
    result = compared(make_run(1), make_run(2, steps=[]))

    assert result["verdict"] == "incomparable"
    assert result["reason"] == "run(s) 2 recorded no steps"


def test_runs_without_common_step_are_incomparable() -> None:
    result = compared(make_run(1, steps=[0, 1]), make_run(2, steps=[2, 3]))

    assert result["verdict"] == "incomparable"
    assert result["reason"] == "the runs share no recorded step"


def test_a_truncated_run_is_incomplete_never_identical() -> None:
    result = compared(make_run(1, steps=range(11)), make_run(2, steps=range(4)))

    assert result["verdict"] == "incomplete"
    assert result["steps_compared"] == 4
    assert result["missing"] == ["run 2 lacks 7 of 11 steps (4-10)"]
    assert "7 recorded step(s) exist in one run only" in result["reason"]


def test_a_run_short_of_its_expected_steps_is_incomplete_even_when_both_stop_together() -> None:
    a, b = make_run(1, steps=range(4)), make_run(2, steps=range(4))
    a.expected_steps = b.expected_steps = list(range(11))

    result = compared(a, b)

    assert result["verdict"] == "incomplete"
    assert result["missing"] == ["run 1 lacks 7 of 11 steps (4-10)", "run 2 lacks 7 of 11 steps (4-10)"]


def test_a_rank_missing_at_a_step_is_incomplete() -> None:
    b = make_run(2)
    del b.records[(3, 1)]

    result = compared(make_run(1), b)

    assert result["verdict"] == "incomplete"
    assert result["missing"] == ["run 2 lacks ranks at 1 step(s) (3; step 3 has ranks [0] of 2)"]


def test_a_failed_run_is_incomplete_even_with_every_step() -> None:
    b = make_run(2)
    b.status = "failed"

    assert compared(make_run(1), b)["verdict"] == "incomplete"
    assert compared(make_run(1), b)["missing"] == ["run 2 failed"]


def test_a_divergence_before_the_truncation_is_still_a_divergence_with_what_is_missing() -> None:
    b = make_run(2, steps=range(3))
    perturb(b, step=1, rank=0, tensor=0)

    result = compared(make_run(1, steps=range(5)), b)

    assert (result["verdict"], result["first_divergent_step"]) == ("diverged", 1)
    assert result["missing"] == ["run 2 lacks 2 of 5 steps (3-4)"]


def test_complete_identical_runs_have_nothing_missing() -> None:
    a, b = make_run(1), make_run(2)
    a.expected_steps = b.expected_steps = [0, 1, 2, 3]
    a.status = b.status = "succeeded"

    assert (compared(a, b)["verdict"], compared(a, b)["missing"]) == ("identical", [])


def test_step_in_one_run_only_does_not_hide_divergence() -> None:
    b = make_run(2, steps=range(3))
    perturb(b, step=2, rank=0, tensor=0)

    assert compared(make_run(1, steps=range(5)), b)["first_divergent_step"] == 2


# --- loss curves ----------------------------------------------------------------------------------


def test_loss_curve_is_mean_of_rank_losses() -> None:
    a = make_run(1, steps=[1])
    set_loss(a, 1, 0, 1.0)
    set_loss(a, 1, 1, 3.0)

    assert compared(a, make_run(2, steps=[1]))["loss"]["a"] == [[1, 2.0]]


def test_loss_curve_skips_ranks_without_loss() -> None:
    a = make_run(1, steps=[1])
    set_loss(a, 1, 0, None)
    set_loss(a, 1, 1, 3.0)

    assert compared(a, make_run(2, steps=[1]))["loss"]["a"] == [[1, 3.0]]


def test_loss_curve_skips_steps_without_any_loss() -> None:
    # Step 0 is the initial parameters: no loss recorded on any rank.
    a = make_run(1, steps=range(3))
    for rank in a.ranks():
        set_loss(a, 0, rank, None)

    assert [s for s, _ in compared(a, make_run(2, steps=range(3)))["loss"]["a"]] == [1, 2]


def test_loss_curve_covers_common_steps_only() -> None:
    result = compared(make_run(1, steps=range(5), loss=0.5), make_run(2, steps=range(3), loss=0.5))

    assert result["loss"]["a"] == [[0, 0.5], [1, 0.5], [2, 0.5]]


# --- reproducibility ------------------------------------------------------------------------------


def test_reproducibility_of_no_repeats_has_no_rate() -> None:
    assert reproducibility([]) == {"repeats": 0, "recorded": 0, "comparable": 0, "identical_to_first": 0,
                                   "incomplete": 0, "incomparable": 0, "rate": None, "first_divergent_step": None}


def test_reproducibility_of_one_repeat_has_no_rate() -> None:
    assert reproducibility([make_run(1)])["rate"] is None


def test_reproducibility_all_identical_is_one() -> None:
    result = reproducibility([make_run(1), make_run(2), make_run(3)])

    assert result["rate"] == 1.0
    assert result["identical_to_first"] == 2


def test_reproducibility_half_identical_is_one_half() -> None:
    diverged = make_run(3)
    perturb(diverged, step=3, rank=0, tensor=0)

    result = reproducibility([make_run(1), make_run(2), diverged])

    assert result["rate"] == 0.5
    assert result["identical_to_first"] == 1
    assert result["repeats"] == 3
    assert result["first_divergent_step"] == 3


def test_reproducibility_none_identical_is_zero() -> None:
    diverged = make_run(2)
    perturb(diverged, step=1, rank=1, tensor=2)

    assert reproducibility([make_run(1), diverged])["rate"] == 0.0


def test_reproducibility_counts_incomparable_repeat_apart_never_as_identical() -> None:
    other_tensors = make_run(2, tensors=[("other.weight", [4], "float32")])
    result = reproducibility([make_run(1), other_tensors, make_run(3)])
    counts = (result["comparable"], result["identical_to_first"], result["incomparable"], result["rate"])
    assert counts == (1, 1, 1, 1.0)


def test_reproducibility_reads_k_of_n_over_comparable_repeats() -> None:
    # 3 repeats: one identical to the first, one truncated: 1 of 1 comparable, 1 incomplete (not "2 identical").
    truncated = make_run(3, steps=range(2))
    result = reproducibility([make_run(1), make_run(2), truncated])
    assert (result["repeats"], result["comparable"], result["identical_to_first"], result["incomplete"],
            result["rate"]) == (3, 1, 1, 1, 1.0)


def test_reproducibility_compares_each_repeat_to_the_first() -> None:
    # Repeats 2 and 3 agree with each other but not with repeat 1.
    second, third = make_run(2), make_run(3)
    perturb(second, step=1, rank=0, tensor=0)
    perturb(third, step=1, rank=0, tensor=0)

    assert reproducibility([make_run(1), second, third])["rate"] == 0.0


# --- throughput and cost --------------------------------------------------------------------------


def timed_run(times: list[float], run_id: int = 1) -> RunData:
    """A one-rank run whose steps 1..N took times[i-1] seconds, plus an untimed step 0."""
    run = make_run(run_id, world_size=1, steps=range(len(times) + 1), step_time_s=0.0)
    for step, seconds in enumerate(times, start=1):
        set_time(run, step, 0, seconds)
    return run


def test_throughput_median_of_samples_per_second() -> None:
    run = timed_run([9.0, 9.0, 0.1, 0.2, 0.25, 0.5, 1.0])  # steps 1-2 are warm-up

    result = throughput([run], global_batch=100, warmup=2)

    assert result["samples_per_s"] == pytest.approx(400.0)
    assert result["step_time_ms_median"] == pytest.approx(250.0)


def test_throughput_spread_is_interquartile_range() -> None:
    run = timed_run([9.0, 9.0, 0.1, 0.2, 0.25, 0.5, 1.0])  # rates after warm-up: 1000, 500, 400, 200, 100

    assert throughput([run], global_batch=100, warmup=2)["spread"] == pytest.approx([200.0, 500.0])


def test_throughput_spread_interpolates_between_samples() -> None:
    run = timed_run([0.1, 0.2, 0.4, 0.5])  # rates 1000, 500, 250, 200

    assert throughput([run], global_batch=100, warmup=0)["spread"] == pytest.approx([237.5, 625.0])


def test_throughput_skips_warmup_steps() -> None:
    run = timed_run([5.0, 5.0, 0.5, 0.5, 0.5])

    assert throughput([run], global_batch=10, warmup=2)["samples_per_s"] == pytest.approx(20.0)


def test_throughput_uses_slowest_rank_of_each_step() -> None:
    run = make_run(1, world_size=2, steps=[1, 2, 3], step_time_s=0.1)
    for step in (1, 2, 3):
        set_time(run, step, 1, 0.4)

    assert throughput([run], global_batch=8, warmup=0)["samples_per_s"] == pytest.approx(20.0)


def test_throughput_ignores_untimed_steps() -> None:
    run = timed_run([0.5, 0.5])  # step 0 has step_time_s 0.0

    result = throughput([run], global_batch=10, warmup=-1)

    assert result["samples_per_s"] == pytest.approx(20.0)
    assert result["spread"] == pytest.approx([20.0, 20.0])


def test_throughput_pools_steps_over_runs() -> None:
    runs = [timed_run([0.1, 0.1, 0.1], run_id=1), timed_run([1.0, 1.0], run_id=2)]

    result = throughput(runs, global_batch=10, warmup=0)

    assert result["samples_per_s"] == pytest.approx(100.0)  # median of 100, 100, 100, 10, 10
    assert result["runs"] == 2


def test_throughput_without_timed_steps_is_none() -> None:
    run = timed_run([0.5, 0.5])

    assert throughput([run], global_batch=10, warmup=2) == {
        "samples_per_s": None, "spread": None, "step_time_ms_median": None, "runs": 1}


def test_cost_is_relative_slowdown() -> None:
    assert cost(800.0, 1000.0) == pytest.approx(0.2)


def test_cost_of_faster_config_is_negative() -> None:
    assert cost(1250.0, 1000.0) == pytest.approx(-0.25)


def test_cost_of_baseline_itself_is_zero() -> None:
    assert cost(1000.0, 1000.0) == 0.0


@pytest.mark.parametrize(("thr", "baseline"), [(None, 1000.0), (800.0, None), (800.0, 0.0)])
def test_cost_without_both_throughputs_is_none(thr: float | None, baseline: float | None) -> None:
    assert cost(thr, baseline) is None


def test_reproducibility_ignores_repeats_that_recorded_nothing() -> None:
    dead = make_run(9)
    dead.records.clear()
    result = reproducibility([make_run(1), dead, make_run(2)])
    assert (result["repeats"], result["recorded"], result["identical_to_first"], result["rate"]) == (3, 2, 1, 1.0)


def test_reproducibility_is_unknown_when_every_repeat_died() -> None:
    dead = [make_run(i) for i in range(3)]
    for run in dead:
        run.records.clear()
    assert reproducibility(dead)["rate"] is None


def test_runs_fingerprinted_with_different_versions_are_incomparable() -> None:
    a, b = make_run(1), make_run(2)
    b.fp_versions = {"fp2"}
    result = compared(a, b)
    assert result["verdict"] == "incomparable" and "fingerprint versions differ" in result["reason"]


def test_model_digests_alone_find_the_divergence_and_detail_is_shown_where_loaded() -> None:
    from detlab.core.compare import differing_steps

    a, b = make_run(1), make_run(2)
    perturb(b, step=2, rank=1, tensor=2)
    perturb(b, step=3, rank=0, tensor=1)
    for run in (a, b):
        for key, data in run.records.items():
            data.model_digest = data.digests.hex()
            if key[0] != 2:
                data.digests = None  # only step 2's packed digests are loaded
    assert differing_steps(a, b) == [2, 3]
    result = compared(a, b)
    assert result["first_divergent_step"] == 2 and result["ranks"] == [1]
    assert result["first_divergent_tensors"] == [TENSORS[2][0]]
    assert [p["tensors_differing"] for p in result["per_step"]] == [0, 0, 1, None]
    assert "tensor counts shown for 1 of 2 differing steps" in result["reason"]


def test_detail_steps_keep_the_first_and_sample_the_rest() -> None:
    from detlab.backend.reports.train import DETAIL_STEPS, detail_steps

    chosen = detail_steps(list(range(5, 100_005)))
    assert chosen[0] == 5 and len(chosen) <= DETAIL_STEPS + 1 and chosen == sorted(chosen)
    assert detail_steps([3, 9]) == [3, 9]


# --- cost with a bootstrap interval --------------------------------------------------------------


def noisy(center: float, n: int, seed: int) -> list[float]:
    import random

    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-0.3, 0.3)) for _ in range(n)]


def test_cost_of_two_runs_of_one_config_is_within_noise() -> None:
    result = cost_estimate([timed_run(noisy(0.1, 40, 1), 1)], [timed_run(noisy(0.1, 40, 2), 2)], 10)
    lo, hi = result["interval"]
    assert lo < 0 < hi and result["within_noise"] is True


def test_a_clearly_slower_config_has_an_interval_around_its_cost_that_excludes_zero() -> None:
    result = cost_estimate([timed_run(noisy(0.1, 40, 1), 1)], [timed_run(noisy(0.2, 40, 2), 2)], 10)
    lo, hi = result["interval"]
    assert 0 < lo < result["cost"] < hi < 1 and result["within_noise"] is False
    assert result["cost"] == pytest.approx(0.5, abs=0.1)


def test_cost_interval_excludes_warmup_steps() -> None:
    # The slow first steps (compilation, allocator warm-up) must not make B look slower.
    a = timed_run([0.1] * 20, 1)
    b = timed_run([5.0, 5.0] + [0.1] * 18, 2)
    result = cost_estimate([a], [b], 10, warmup=2)
    assert result["cost"] == pytest.approx(0.0) and result["interval"] == pytest.approx([0.0, 0.0])


def test_too_few_timed_steps_give_a_point_cost_and_no_interval() -> None:
    # Steps 1-2 are warm-up: one timed step each side would bootstrap to a zero-width interval.
    result = cost_estimate([timed_run([0.1, 0.1, 0.1], 1)], [timed_run([0.2, 0.2, 0.2], 2)], 10)
    assert result["cost"] == pytest.approx(0.5) and result["interval"] is None and result["within_noise"] is None
    assert cost_text(result) == "50.0% slower (too few timed steps for an interval)"


def test_cost_interval_is_none_without_timed_steps() -> None:
    assert cost_estimate([], [timed_run([0.1] * 5, 2)], 10)["interval"] is None


def test_cost_interval_is_reproducible() -> None:
    args = ([timed_run(noisy(0.1, 30, 1), 1)], [timed_run(noisy(0.12, 30, 2), 2)], 10)
    assert cost_estimate(*args) == cost_estimate(*args)


@pytest.mark.parametrize(("estimate", "text"), [
    (None, "baseline"),
    ({"cost": None, "interval": None, "within_noise": None}, "not measured"),
    ({"cost": 0.012, "interval": [-0.021, 0.034], "within_noise": True}, "within noise (-2.1% to +3.4%)"),
    ({"cost": 0.19, "interval": [0.152, 0.228], "within_noise": False}, "19.0% slower (95% CI 15.2% to 22.8%)"),
    ({"cost": -0.05, "interval": [-0.07, -0.031], "within_noise": False}, "5.0% faster (95% CI 3.1% to 7.0%)"),
])
def test_cost_reads_with_its_interval_or_as_noise(estimate: dict | None, text: str) -> None:
    assert cost_text(estimate) == text


def test_preflight_findings_of_either_run_are_reported_once_per_finding_with_their_ranks() -> None:
    finding = {"rule": "nccl-no-op-variable", "matched": "NCCL_DETERMINISTIC=1", "reason": "r", "fix": "f",
               "source": "s"}
    a, b = make_run(1), make_run(2)
    b.preflight = {0: [finding], 1: [finding]}
    result = compared(a, b)
    assert result["verdict"] == "identical"  # a setting nothing reads: the finding says so, the verdict stands
    assert result["preflight"] == [{"run": "b", "ranks": [0, 1], **finding}]
    assert compared(a, make_run(2))["preflight"] == []
