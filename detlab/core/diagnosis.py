"""Diagnosis jobs as numbers: what `batch-invariance` and `op-audit` measure, their limits, their summaries.

Pure Python (no torch): the API validates requests against these lists and limits, the worker's rank
program measures, and the backend, the CLI and the findings summarise with the same functions.

Batch invariance: for an op, a dtype and a batch size b, the op runs on the first b samples of one
seeded input and on the first sample alone; row 0 of the batched result must equal the batch-1 result
bitwise. `max_ulp` is the largest distance between the two rows' elements in units in the last place
(the floats' bit patterns as ordered integers). The first batch size that breaks is per (op, dtype).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

InvarianceOp = Literal["mm", "linear", "bmm", "matmul", "addmm", "log_softmax", "softmax", "mean", "sum",
                       "layer_norm", "rms_norm", "sdpa"]
InvarianceDtype = Literal["float32", "bfloat16", "float16"]
INVARIANCE_OPS: tuple[str, ...] = get_args(InvarianceOp)
INVARIANCE_DTYPES: tuple[str, ...] = get_args(InvarianceDtype)
DEFAULT_BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)

# What a worker must hold: the weight (features²) and the input (largest batch × features), per dtype at
# float32: 8192² × 4 B = 256 MiB and 2^24 × 4 B = 64 MiB; sdpa views a sample's features as 16 tokens.
MIN_FEATURES, MAX_FEATURES, FEATURES_MULTIPLE = 16, 8192, 16
MAX_BATCH = 4096
MAX_BATCH_SIZES = 128  # every size from 1 to 128, e.g., to find where a GPU kernel's tiling changes
MAX_ELEMENTS = 1 << 24  # largest batch × features
SDPA_TOKENS = 16
# How many times an op of an audit is run again on identical inputs, and how many of its calls are.
DEFAULT_RERUNS, MAX_RERUNS = 8, 50
DEFAULT_CALLS_PER_OP, MAX_CALLS_PER_OP = 2, 16
MAX_AUDIT_OPS = 4096  # distinct aten ops one step may run (a record each)
EVIDENCE_CHARS = 1024


def invariance_problem(features: int, batch_sizes: Sequence[int]) -> str | None:
    """Why (features, batch sizes) cannot run, in words a user can act on; None when they can."""
    if not MIN_FEATURES <= features <= MAX_FEATURES or features % FEATURES_MULTIPLE:
        return (f"features must be a multiple of {FEATURES_MULTIPLE} from {MIN_FEATURES} to {MAX_FEATURES} "
                f"(got {features})")
    if not batch_sizes or len(batch_sizes) > MAX_BATCH_SIZES:
        return f"give 1 to {MAX_BATCH_SIZES} batch sizes"
    if bad := [b for b in batch_sizes if not 1 <= b <= MAX_BATCH]:
        return f"batch sizes must be 1 to {MAX_BATCH} (got {bad[:5]})"
    if max(batch_sizes) * features > MAX_ELEMENTS:
        return (f"largest batch × features is {max(batch_sizes) * features:,}; at most {MAX_ELEMENTS:,} "
                "(fewer features or smaller batches)")
    return None


def sdpa_geometry(features: int) -> tuple[int, int, int]:
    """(heads, tokens, head_dim) that sdpa views one sample's `features` as."""
    head_dim = min(64, features // SDPA_TOKENS)
    return features // (SDPA_TOKENS * head_dim), SDPA_TOKENS, head_dim


def first_breaks(results: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per (op, dtype), in the order first seen: the smallest batch size whose row 0 differs from the batch-1
    result, None when every measured size is invariant."""
    breaks: dict[tuple[str, str], int | None] = {}
    for row in results:
        key = (row["op"], row["dtype"])
        current = breaks.setdefault(key, None)
        if not row["invariant"] and (current is None or row["batch_size"] < current):
            breaks[key] = row["batch_size"]
    return [{"op": op, "dtype": dtype, "first_break": b} for (op, dtype), b in breaks.items()]


def invariance_json(results: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`{"results": [...], "summary": [...]}`: the rows as measured and the first break per (op, dtype)."""
    rows = [{k: row[k] for k in ("op", "dtype", "batch_size", "invariant", "max_ulp")} for row in results]
    return {"results": rows, "summary": first_breaks(rows)}


def all_invariant(results: Iterable[Mapping[str, Any]]) -> bool:
    return all(row["invariant"] for row in results)


def ineffective(ops: Iterable[Mapping[str, Any]], claims_determinism: bool) -> list[str]:
    """The ops that gave different bits on re-run although the config claims determinism (its deterministic
    algorithms flag is on): the flags did nothing for them."""
    if not claims_determinism:
        return []
    return [row["op"] for row in ops if row.get("distinct") is not None and row["distinct"] > 1]


def audit_json(ops: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """`{"ops": [{"op","count","nondeterministic","evidence"}...]}`, most called first."""
    rows = [{k: row[k] for k in ("op", "count", "nondeterministic", "evidence")} for row in ops]
    return {"ops": sorted(rows, key=lambda r: (-r["count"], r["op"]))}


def audit_report(ops: Sequence[Mapping[str, Any]], *, claims_determinism: bool, workload: str | None,
                 device: str | None, threads: int | None, torch_flags: Mapping[str, Any] | None) -> dict[str, Any]:
    """The op audit's JSON, as `detlab audit --json` prints it and `detlab.audit` returns it: `{"ops", "ineffective",
    "workload", "device", "threads", "torch_flags"}`."""
    return {**audit_json(ops), "ineffective": ineffective(ops, claims_determinism), "workload": workload,
            "device": device, "threads": threads, "torch_flags": dict(torch_flags) if torch_flags else None}


def model_summary(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """A workload's forward, sample 0 alone against inside batches: the batch sizes checked, whether every one
    is invariant, and the first that breaks with the first module that differs there (None without rows)."""
    if not rows:
        return None
    ordered = sorted(rows, key=lambda r: r["batch_size"])
    broken = next((r for r in ordered if not r["invariant"]), None)
    return {"workload": ordered[0]["workload"], "batch_sizes": [r["batch_size"] for r in ordered],
            "invariant": broken is None, "first_module": broken["first_module"] if broken else None,
            "first_break": broken["batch_size"] if broken else None}


def invariance_verdict(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """A batch-invariance result in one word for the jobs list: `invariant` / `not-invariant` (the model check
    counts); None when nothing was measured."""
    rows = [r["invariant"] for c in configs for r in c.get("results") or []]
    rows += [c["model"]["invariant"] for c in configs if c.get("model")]
    return None if not rows else "invariant" if all(rows) else "not-invariant"


def audit_verdict(configs: Sequence[Mapping[str, Any]]) -> str | None:
    """An op-audit result in one word for the jobs list: `deterministic` / `nondeterministic` (ops not checked
    do not count as deterministic: with only those, None)."""
    flags = [o["nondeterministic"] for c in configs for o in c.get("ops") or [] if o["nondeterministic"] is not None]
    return None if not flags else "nondeterministic" if any(flags) else "deterministic"


Verdict = Literal["invariant", "not-invariant", "deterministic", "nondeterministic"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
