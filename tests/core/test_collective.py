"""Collective summaries on hand-made trial records: nccl-tests formulas, reproducibility, diffs, exports."""

from __future__ import annotations

from typing import Any

import pytest

from detlab.core.collective import (
    algbw,
    busbw,
    compare_configs,
    format_table,
    nccl_tests_json,
    op_geometry,
    summarize,
)


def trial(*, op: str = "all_reduce_sum", dtype: str = "float32", nbytes: int = 4096, t: int = 0, rank: int = 0,
          digest: str = "fp1:aa", prefix: str = "fp1:pp", time_s: float = 1e-3, world: int = 2,
          **extra: Any) -> dict[str, Any]:
    rec = {"type": "trial", "op": op, "dtype": dtype, "bytes": nbytes, "trial": t, "rank": rank, "digest": digest,
           "prefix_digest": prefix, "time_s": time_s, "world_size": world, "err_max_abs": 0.0,
           "err_max_ulp": 0.5, "frac_diff": 0.0}
    return {**rec, **extra}


def grid(world: int = 2, trials: int = 3, **kw: Any) -> list[dict[str, Any]]:
    return [trial(t=t, rank=r, world=world, **kw) for t in range(trials) for r in range(world)]


def test_algbw_is_bytes_over_seconds_in_gb_per_s() -> None:
    assert algbw(2_000_000_000, 2.0) == pytest.approx(1.0)


@pytest.mark.parametrize(("op", "world", "expected"), [
    ("all_reduce_sum", 4, 1.5),  # 2(n-1)/n
    ("all_reduce_avg", 8, 1.75),
    ("all_gather", 4, 0.75),  # (n-1)/n
    ("reduce_scatter", 8, 0.875),
    ("broadcast", 8, 1.0),
])
def test_busbw_uses_nccl_tests_factors(op: str, world: int, expected: float) -> None:
    assert busbw(op, 1_000_000_000, 1.0, world) == pytest.approx(expected)


def test_busbw_rejects_unknown_op() -> None:
    with pytest.raises(ValueError, match="unknown collective op"):
        busbw("alltoall", 1, 1.0, 2)


def test_geometry_follows_nccl_tests_sizes() -> None:
    # all_gather: size = gathered output, count = per-rank sendcount, rounded down when W does not divide
    assert op_geometry("all_gather", 4096, "float32", 3) == {"count": 341, "in_elems": 341, "out_elems": 1023,
                                                            "op_bytes": 4092}
    assert op_geometry("reduce_scatter", 4096, "float32", 4) == {"count": 256, "in_elems": 1024, "out_elems": 256,
                                                                "op_bytes": 4096}
    assert op_geometry("all_reduce_sum", 4096, "bfloat16", 4)["count"] == 2048


def test_summary_of_reproducible_cell_uses_slowest_rank_per_trial() -> None:
    recs = grid(world=2, trials=3, time_s=1e-3) + [trial(t=t, rank=2, world=3, time_s=2e-3) for t in range(3)]
    for r in recs:
        r["world_size"] = 3
    (row,) = summarize(recs, 3)
    assert row["distinct_digests"] == 1 and row["ranks_consistent"] and row["reproducible"]
    assert row["time_s_median"] == pytest.approx(2e-3)
    assert row["busbw_gbs"] == pytest.approx(4096 / 2e-3 / 1e9 * 4 / 3)


def test_summary_counts_distinct_digests_across_trials() -> None:
    recs = grid()
    recs[-1]["digest"] = "fp1:bb"  # rank 1, last trial
    (row,) = summarize(recs, 2)
    assert row["distinct_digests"] == 2
    assert not row["reproducible"]


def test_summary_detects_ranks_that_disagree() -> None:
    recs = grid()
    for r in recs:
        if r["rank"] == 1:
            r["digest"] = "fp1:bb"
    (row,) = summarize(recs, 2)
    assert row["distinct_digests"] == 1
    assert not row["ranks_consistent"] and not row["reproducible"]


def test_reduce_scatter_ranks_differ_by_design_but_must_be_stable() -> None:
    recs = grid(op="reduce_scatter")
    for r in recs:
        r["digest"] = f"fp1:r{r['rank']}"
    (row,) = summarize(recs, 2)
    assert row["reproducible"] and "by design" in row["rank_check"]
    recs[-1]["digest"] = "fp1:other"
    assert not summarize(recs, 2)[0]["reproducible"]


def test_missing_rank_is_not_reproducible() -> None:
    (row,) = summarize(grid(world=2), 3)
    assert not row["complete"] and not row["reproducible"]


def test_prefix_class_groups_sizes_with_the_same_leading_bits() -> None:
    recs = (grid(nbytes=4096, prefix="fp1:p") + grid(nbytes=16384, prefix="fp1:p", digest="fp1:x")
            + grid(nbytes=65536, prefix="fp1:q", digest="fp1:y"))
    rows = summarize(recs, 2)
    assert [r["bytes"] for r in rows] == [4096, 16384, 65536]
    assert [r["prefix_class"] for r in rows] == [0, 0, 1]
    assert rows[0]["prefix_classes"] == 2


def test_compare_configs_equal_and_different_cells() -> None:
    a = grid(nbytes=4096) + grid(nbytes=16384)
    b = grid(nbytes=4096) + [trial(nbytes=16384, t=t, rank=r, digest="fp1:bb" if r == 1 else "fp1:aa",
                                   frac_diff=0.25) for t in range(3) for r in range(2)]
    same, differ = compare_configs(a, b)
    assert same["equal"] and same["elements_differing"] == 0
    assert differ["equal"] is False and differ["ranks_differing"] == [1]
    # a is correctly rounded everywhere (frac 0), so b's off-reference elements are exactly the differences
    assert differ["elements_differing"] == 1024 and differ["elements_differing_max"] == 1024


def test_compare_configs_cell_in_one_config_only() -> None:
    (row,) = compare_configs(grid(nbytes=4096), [])
    assert row["equal"] is None and row["note"] == "only in config a"


def test_compare_configs_across_world_sizes_uses_consensus() -> None:
    a, b = grid(world=2, op="broadcast"), grid(world=4, op="broadcast")
    (row,) = compare_configs(a, b)
    assert row["equal"] and "world sizes differ" in row["note"]
    (rs,) = compare_configs(grid(world=2, op="reduce_scatter"), grid(world=4, op="reduce_scatter"))
    assert rs["equal"] is None


def test_nccl_tests_export_fields() -> None:
    summary = summarize(grid(nbytes=4096) + grid(op="all_gather", nbytes=4096, impl="all_gather"), 2)
    out = nccl_tests_json(summary, {"world_size": 2, "trials": 3, "warmup": 1, "step_factor": 4})
    assert out["version"] == 2 and out["config"]["iterations"] == 3
    ar, ag = out["results"]
    assert (ar["size"], ar["count"], ar["type"], ar["redop"], ar["root"]) == (4096, 1024, "float", "sum", "    -1")
    assert ar["experiment_name"] == "AllReduce" and ar["out_of_place"] is None
    assert ar["in_place"]["time"] == pytest.approx(1000.0)  # microseconds
    assert ar["in_place"]["alg_bw"] == pytest.approx(4.096e-3)
    assert ar["in_place"]["bus_bw"] == pytest.approx(4.096e-3)  # 2(n-1)/n = 1 for n = 2
    assert ag["experiment_name"] == "AllGather" and ag["out_of_place"]["bus_bw"] == pytest.approx(2.048e-3)
    assert ar["detlab"]["digest"] == "fp1:aa" and ar["detlab"]["distinct_digests"] == 1
    assert out["average_bus_bandwidth"]["bandwidth"] == pytest.approx(3.072e-3)
    assert out["detlab"]["reproducible"] is True


def test_table_has_digest_columns_and_verdict() -> None:
    good = format_table(summarize(grid(), 2))
    assert "#dig" in good and "fp1:aa" in good
    assert good.rstrip().splitlines()[-1].startswith("# verdict: REPRODUCIBLE")
    recs = grid()
    recs[0]["digest"] = "fp1:zz"
    assert "# verdict: NOT REPRODUCIBLE: 1 of 1 cells: all_reduce_sum/float32/4096B" in format_table(
        summarize(recs, 2))
