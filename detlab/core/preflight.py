"""Preflight: the one table of known-broken and no-op settings, each rule with its reason, its fix and its source,
and the check of a config against it. Fail closed: the server refuses a job any of whose configs a rule matches.

Pure: no database, no torch. What a rule needs to know of the job (the collectives its runs issue, the device its
queue's workers run on) is passed in; a rule whose condition depends on something not known does not fire."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from detlab.core.configs import ConfigBody

# The collectives a DDP training run issues: the parameters broadcast and the shapes checked at start-up
# (all_gather), the gradient buckets every step (all_reduce).
TRAIN_OPS = frozenset({"broadcast", "all_gather", "all_reduce_sum"})
# NCCL's AllGather and ReduceScatter have no Tree, CollNetChain or NVLSTree algorithm: an NCCL_ALGO that leaves them
# only those finds none ("no algorithm/protocol available"). Ring always has both.
_NO_GATHER = {"tree", "collnetchain", "nvlstree"}
_FUNCS = {"all_gather": "allgather", "reduce_scatter": "reducescatter"}
# Names that look like determinism switches but that no NCCL release reads (NCCL's environment reference lists none;
# the NCCL_ prefix passes the allow-list, so they would run silently as no-ops).
NO_OP_VARS = ("NCCL_DETERMINISTIC", "NCCL_DETERMINISM")
NCCL_ENV_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"

Device = Literal["cuda", "cpu"]


@dataclass(frozen=True)
class Context:
    """What a rule may know of the job: the collectives its runs issue and its queue's device (None: not known)."""

    ops: frozenset[str] = TRAIN_OPS
    device: Device | None = None


@dataclass(frozen=True)
class Rule:
    key: str
    setting: str  # the setting, as users write it
    reason: str
    fix: str
    source: str
    matches: Callable[[ConfigBody, Context], str | None]  # what matched, in words; None: the rule does not fire


@dataclass(frozen=True)
class Finding:
    rule: str
    config: str
    matched: str
    reason: str
    fix: str
    source: str

    def message(self) -> str:
        return f"config {self.config}: {self.matched}: {self.reason}. Fix: {self.fix} (preflight rule {self.rule}; " \
               f"source: {self.source})"


def _algos_for(value: str, func: str) -> set[str] | None:
    """The algorithms NCCL_ALGO=value leaves NCCL function `func`; None when the value does not restrict it."""
    chosen: set[str] | None = None
    for segment in value.split(";"):
        name, sep, spec = segment.rpartition(":")
        if sep and name.lower() != func:
            continue
        if sep or chosen is None:  # a function's own segment wins over the global one
            items = {i.lower() for i in spec.removeprefix("^").split(",") if i}
            chosen = ({"ring", "tree", "collnetdirect", "collnetchain", "nvls", "nvlstree", "pat"} - items
                      if spec.startswith("^") else items)
    return chosen


def _tree_for_gathers(body: ConfigBody, ctx: Context) -> str | None:
    value = body.env.get("NCCL_ALGO")
    if value is None:
        return None
    for op, func in _FUNCS.items():
        algos = _algos_for(value, func)
        if op in ctx.ops and algos is not None and algos <= _NO_GATHER:
            return f"NCCL_ALGO={value} leaves {func} only {sorted(algos)}"
    return None


def _no_op_var(body: ConfigBody, ctx: Context) -> str | None:
    named = [name for name in NO_OP_VARS if name in body.env]
    return f"{named[0]}={body.env[named[0]]}" if named else None


def _cublas_unset(body: ConfigBody, ctx: Context) -> str | None:
    if ctx.device == "cuda" and body.torch.deterministic_algorithms and "CUBLAS_WORKSPACE_CONFIG" not in body.env:
        return "deterministic_algorithms on CUDA with CUBLAS_WORKSPACE_CONFIG unset"
    return None


RULES: tuple[Rule, ...] = (
    Rule("nccl-algo-tree-gathers", "NCCL_ALGO=Tree (global)",
         "NCCL >= 2.24 has no Tree algorithm for AllGather/ReduceScatter: a global NCCL_ALGO=Tree fails with "
         "'no algorithm/protocol available' (DDP's start-up all_gather fails; measured on 2x H200, NCCL 2.28)",
         "restrict Tree to all_reduce: NCCL_ALGO=allreduce:tree (the per-function syntax of NCCL >= 2.24)",
         f"{NCCL_ENV_DOCS}#nccl-algo", _tree_for_gathers),
    Rule("nccl-no-op-variable", "NCCL_DETERMINISTIC and the like",
         "no NCCL release reads this variable: it changes nothing, and the runs are no more deterministic",
         "pin the algorithm, protocol and channels instead (NCCL_ALGO=allreduce:tree, NCCL_PROTO=Simple, "
         "NCCL_MIN/MAX_NCHANNELS=1), or run `detlab fix` to find what this workload needs",
         NCCL_ENV_DOCS, _no_op_var),
    Rule("cublas-workspace-unset", "use_deterministic_algorithms on CUDA without CUBLAS_WORKSPACE_CONFIG",
         "cuBLAS picks its workspace per stream: under deterministic algorithms torch raises on the first cuBLAS "
         "call (CUDA >= 10.2) rather than run it nondeterministically",
         "set CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8)",
         "https://docs.pytorch.org/docs/stable/notes/randomness.html#cublas", _cublas_unset),
)
# use_deterministic_algorithms(True, warn_only=True) keeps nondeterministic kernels with only a warning; a config
# cannot say warn_only (detlab's TorchFlags has no such key), so no rule here needs to refuse it.


def check(body: ConfigBody, ctx: Context) -> list[Finding]:
    """Every rule the config matches, in the table's order."""
    return [Finding(rule.key, body.name, matched, rule.reason, rule.fix, rule.source)
            for rule in RULES if (matched := rule.matches(body, ctx))]


def table() -> list[dict[str, str]]:
    """The rules as rows (docs, the API): key, setting, reason, fix, source."""
    return [{"key": r.key, "setting": r.setting, "reason": r.reason, "fix": r.fix, "source": r.source} for r in RULES]
