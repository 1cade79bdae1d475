"""The `collective` rank program on real gloo ranks, its seeded inputs, and `detlab verify-collective`."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch

from detlab.core.collective import DTYPE_BYTES, OPS, compare_configs, summarize
from detlab.core.wire import CollectiveSpec, EnvRecord, RankSpec, Record, TrialRecord
from detlab.tensors.fingerprint import implementation_name
from detlab.worker import verify
from detlab.worker.ranks.collective import input_tensor, input_values_np, reference, round_to

SIZES = [4096, 16384, 65536]
TRIALS = 3
COLLECTIVE = CollectiveSpec(ops=list(OPS), dtypes=list(DTYPE_BYTES), sizes=SIZES, trials=TRIALS, warmup=1)
_runs: dict[int, list[Record]] = {}


def spec(world: int) -> RankSpec:
    return RankSpec(kind="collective", workload="collective", world_size=world, steps=COLLECTIVE.cells(), seed=1234,
                    threads=1, collective=COLLECTIVE, device="cpu")


def records(world: int) -> list[Record]:
    """Every record of one gloo run at this world size (run once per session, shared by the tests)."""
    if world not in _runs:
        _runs[world] = verify.launch(spec(world), timeout_s=120)
    return _runs[world]


def envs(world: int) -> list[EnvRecord]:
    return [r for r in records(world) if isinstance(r, EnvRecord)]


def trials(world: int, op: str | None = None) -> list[dict[str, Any]]:
    """The trial records as the plain dicts detlab.core.collective takes."""
    return [r.model_dump() for r in records(world) if isinstance(r, TrialRecord) and op in (None, r.op)]


@pytest.mark.parametrize("dtype", list(DTYPE_BYTES))
def test_inputs_same_bits_from_numpy_and_torch_and_across_calls(dtype: str) -> None:
    cpu = torch.device("cpu")
    a = input_tensor(7, 2, 5000, dtype, cpu, via_numpy=False)
    b = input_tensor(7, 2, 20000, dtype, cpu)[:5000]  # a longer message has the same leading elements
    ref = input_values_np(7, 2, np.arange(5000), dtype)
    assert torch.equal(a, b)
    assert np.array_equal(a.double().numpy(), ref)
    assert np.array_equal(input_values_np(7, 2, np.arange(5000), dtype), ref)


def test_inputs_depend_on_seed_rank_and_index_only() -> None:
    idx = np.arange(4096)
    x = input_values_np(1, 0, idx, "float32")
    assert not np.array_equal(x, input_values_np(1, 1, idx, "float32"))
    assert not np.array_equal(x, input_values_np(2, 0, idx, "float32"))
    # element i does not depend on which other elements are asked for (no world size, no message size)
    assert np.array_equal(input_values_np(1, 0, idx[1000:1010], "float32"), x[1000:1010])


def test_inputs_are_cancellation_prone() -> None:
    xs = [input_values_np(3, q, np.arange(10000), "float32").astype(np.float32) for q in range(4)]
    assert (xs[0] < 0).any() and (xs[0] > 0).any()
    assert np.abs(xs[0]).max() > 100 and np.abs(xs[0]).min() < 0.01
    sequential = ((xs[0] + xs[1]) + xs[2]) + xs[3]
    pairwise = (xs[0] + xs[1]) + (xs[2] + xs[3])
    assert np.mean(sequential != pairwise) > 0.05  # summation order changes the rounded result
    exact = reference("all_reduce_sum", 3, 4, 0, "float32", 10000)
    assert np.mean(sequential != round_to(exact, "float32")) > 0.05


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_run_records_every_cell_trial_and_rank(world: int) -> None:
    got = {(r["op"], r["dtype"], r["bytes"], r["trial"], r["rank"]) for r in trials(world)}
    want = {(o, d, s, t, r) for o in OPS for d in DTYPE_BYTES for s in SIZES for t in range(TRIALS)
            for r in range(world)}
    assert got == want
    assert sorted(r.rank for r in envs(world)) == list(range(world))
    assert all(r.fingerprint_impl == implementation_name("cpu") for r in envs(world))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_gloo_is_reproducible_and_rank_consistent_at_fixed_world_size(world: int) -> None:
    summary = summarize(trials(world), world)
    assert len(summary) == len(OPS) * len(DTYPE_BYTES) * len(SIZES)
    assert [(r["op"], r["dtype"], r["bytes"]) for r in summary if not r["reproducible"]] == []
    assert all(r["distinct_digests"] == 1 and r["ranks_consistent"] for r in summary)


def test_all_reduce_differs_between_world_sizes_2_and_4() -> None:
    # Expected: each rank adds its own inputs, so W=4 sums two more terms than W=2.
    rows = compare_configs(trials(2, "all_reduce_sum"), trials(4, "all_reduce_sum"))
    assert any(r["equal"] is False for r in rows)


def test_reduction_order_shows_only_with_more_than_two_ranks() -> None:
    # a + b is correctly rounded in any order; with 3 or 4 terms gloo's order loses bits (cancellation).
    assert all(r["frac_diff"] == 0 for r in trials(2, "all_reduce_sum"))
    for world in (3, 4):
        assert any(r["frac_diff"] > 0 for r in trials(world, "all_reduce_sum") if r["dtype"] == "float32")


def test_broadcast_is_identical_across_world_sizes() -> None:
    # broadcast delivers rank 0's input, which does not depend on the world size
    rows = compare_configs(trials(2, "broadcast"), trials(4, "broadcast"))
    assert rows and all(r["equal"] for r in rows)


@pytest.mark.parametrize("world", [2, 4])
def test_errors_against_float64_are_finite_and_small(world: int) -> None:
    for r in trials(world):
        errs = (r["err_max_abs"], r["err_max_ulp"], r["frac_diff"])
        assert all(e is not None and math.isfinite(e) for e in errs), r
        assert 0 <= r["frac_diff"] <= 1
        if r["op"] in ("all_gather", "broadcast"):  # data movement only: bit-exact
            assert errs == (0.0, 0.0, 0.0), r
        else:  # W-1 roundings of partial sums below W * 2^11, half an ulp each, in the output dtype
            bits = {"float32": 24, "bfloat16": 8, "float16": 11}[r["dtype"]]
            assert r["err_max_abs"] <= world * 2.0 ** (11 + math.ceil(math.log2(world)) - bits), r


def test_verify_main_returns_0_and_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = verify.main(["--world-size", "2", "--ops", "all_reduce_sum,reduce_scatter", "--dtypes", "bfloat16",
                        "--min-bytes", "4K", "--max-bytes", "16K", "--trials", "2", "--warmup", "0", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["reproducible"] is True
    assert len(out["summary"]) == 4 and len(out["nccl_tests"]["results"]) == 4
    assert out["nccl_tests"]["results"][0]["type"] == "bfloat16"


def test_verify_main_returns_1_when_not_reproducible(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    def flaky(spec: RankSpec, *, timeout_s: float) -> list[Record]:
        return [TrialRecord(op="all_reduce_sum", dtype="float32", bytes=4096, count=1024, op_bytes=4096,
                            world_size=spec.world_size, trial=t, rank=r, digest=f"fp1:{t:032x}",
                            prefix_digest="fp1:" + "0" * 32, fp_version="fp1", time_s=1e-3)
                for t in range(2) for r in range(2)]

    monkeypatch.setattr(verify, "launch", flaky)
    assert verify.main(["--world-size", "2", "--max-bytes", "4K"]) == 1
    assert "NOT REPRODUCIBLE" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["--ops", "allreduce"], ["--dtypes", "float64"], ["--min-bytes", "2M"],
                                  ["--world-size", "0"], ["--trials", "x"], ["--trials", "5000"], ["--seed", "-1"]])
def test_verify_main_rejects_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert verify.main(argv) == 2
    assert "error" in capsys.readouterr().err
