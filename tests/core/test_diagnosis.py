"""Diagnosis summaries without torch: first breaks, the model check, flags that do nothing, verdicts, limits."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from detlab.core import diagnosis
from detlab.core.wire import RECORD, DiagnosisSpec, RunPlan


def row(op: str, batch: int, invariant: bool, dtype: str = "float32", ulp: int = 0) -> dict:
    return {"op": op, "dtype": dtype, "batch_size": batch, "invariant": invariant, "max_ulp": ulp}


def test_first_break_is_the_smallest_batch_that_differs_per_op_and_dtype() -> None:
    rows = [row("mm", 1, True), row("mm", 4, False, ulp=9), row("mm", 2, False, ulp=3), row("mm", 2, True, "bfloat16"),
            row("sum", 1, True), row("sum", 128, True)]
    assert diagnosis.first_breaks(rows) == [{"op": "mm", "dtype": "float32", "first_break": 2},
                                            {"op": "mm", "dtype": "bfloat16", "first_break": None},
                                            {"op": "sum", "dtype": "float32", "first_break": None}]


def test_invariance_json_keeps_only_the_contract_keys() -> None:
    out = diagnosis.invariance_json([{**row("mm", 2, False, ulp=7), "features": 64, "type": "invariance"}])
    assert out == {"results": [row("mm", 2, False, ulp=7)],
                   "summary": [{"op": "mm", "dtype": "float32", "first_break": 2}]}


def test_model_summary_names_the_first_module_at_the_first_breaking_batch() -> None:
    rows = [{"workload": "mlp", "batch_size": b, "invariant": b < 4, "first_module": None if b < 4 else f"m{b}"}
            for b in (8, 1, 4, 2)]
    assert diagnosis.model_summary(rows) == {"workload": "mlp", "batch_sizes": [1, 2, 4, 8], "invariant": False,
                                             "first_module": "m4", "first_break": 4}
    assert diagnosis.model_summary([]) is None


def test_ineffective_lists_ops_with_several_results_only_when_the_config_claims_determinism() -> None:
    ops = [{"op": "aten.index_put_", "distinct": 3}, {"op": "aten.mm", "distinct": 1},
           {"op": "aten.empty", "distinct": None}]
    assert diagnosis.ineffective(ops, claims_determinism=True) == ["aten.index_put_"]
    assert diagnosis.ineffective(ops, claims_determinism=False) == []


def test_audit_json_lists_most_called_ops_first() -> None:
    ops = [{"op": "aten.mm", "count": 2, "nondeterministic": False, "evidence": "re-run", "distinct": 1},
           {"op": "aten.add", "count": 9, "nondeterministic": None, "evidence": "not checked", "distinct": None}]
    assert [o["op"] for o in diagnosis.audit_json(ops)["ops"]] == ["aten.add", "aten.mm"]
    assert set(diagnosis.audit_json(ops)["ops"][0]) == {"op", "count", "nondeterministic", "evidence"}


@pytest.mark.parametrize(("kind", "configs", "expected"), [
    ("batch-invariance", [{"results": [row("mm", 1, True)], "model": None}], "invariant"),
    ("batch-invariance", [{"results": [row("mm", 1, True)], "model": {"invariant": False}}], "not-invariant"),
    ("batch-invariance", [{"results": [], "model": None}], None),
    ("op-audit", [{"ops": [{"nondeterministic": False}, {"nondeterministic": None}]}], "deterministic"),
    ("op-audit", [{"ops": [{"nondeterministic": False}]}, {"ops": [{"nondeterministic": True}]}], "nondeterministic"),
    ("op-audit", [{"ops": [{"nondeterministic": None}]}], None),
])
def test_verdict_in_one_word(kind: str, configs: list, expected: str | None) -> None:
    verdict = diagnosis.invariance_verdict if kind == "batch-invariance" else diagnosis.audit_verdict
    assert verdict(configs) == expected


@pytest.mark.parametrize(("features", "sizes", "problem"), [
    (4096, [1, 2, 4096], None),
    (100, [1], "multiple of 16"),
    (8208, [1], "multiple of 16"),
    (16, [], "1 to 128 batch sizes"),
    (16, [0, 2], "batch sizes must be 1 to 4096"),
    (8192, [4096], "largest batch × features"),
])
def test_invariance_limits_refuse_what_a_worker_cannot_hold(features: int, sizes: list[int],
                                                            problem: str | None) -> None:
    found = diagnosis.invariance_problem(features, sizes)
    assert found is None if problem is None else problem in (found or "")


def test_diagnosis_spec_sorts_batch_sizes_and_refuses_unknown_ops() -> None:
    assert DiagnosisSpec(batch_sizes=[8, 1, 8, 2]).batch_sizes == [1, 2, 8]
    with pytest.raises(ValidationError, match="ops.0"):
        DiagnosisSpec(ops=["conv2d"])
    with pytest.raises(ValidationError, match="largest batch"):
        DiagnosisSpec(features=8192, batch_sizes=[4096])


def test_a_diagnosis_run_needs_its_parameters_and_a_train_run_refuses_them() -> None:
    with pytest.raises(ValidationError, match="needs `diagnosis`"):
        RunPlan(kind="op-audit", workload="mlp", world_size=1, steps=1)
    with pytest.raises(ValidationError, match="takes no `diagnosis`"):
        RunPlan(kind="train", workload="mlp", world_size=1, steps=1, diagnosis=DiagnosisSpec())


def test_records_round_trip_and_evidence_is_bounded() -> None:
    line = '{"type": "audit-op", "op": "aten.mm", "count": 3, "nondeterministic": true, "distinct": 2, ' \
           '"reruns": 5, "evidence": "re-run: 2 distinct results in 5"}'
    assert RECORD.validate_json(line).op == "aten.mm"  # type: ignore[union-attr]
    with pytest.raises(ValidationError, match="evidence"):
        RECORD.validate_python({"type": "audit-op", "op": "aten.mm", "count": 1, "nondeterministic": None,
                                "evidence": "x" * 2000})
    with pytest.raises(ValidationError, match="max_ulp"):
        RECORD.validate_python({"type": "invariance", "op": "mm", "dtype": "float32", "batch_size": 2,
                                "features": 64, "invariant": False, "max_ulp": -1})
