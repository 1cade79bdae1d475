"""Preflight: the one table of known-broken and no-op settings, each rule with its reason, its fix and its source,
and the check of a setup against it — a job's config (`check`: the server refuses a job any of whose configs a rule
matches, fail closed) or a process's settings as torch reports them (`check_setup`: the SDK's Recorder records and
warns; detlab.tensors.stack gathers the facts).

Pure: no database, no torch. What a rule needs to know of the job (the collectives its runs issue, the device its
queue's workers run on, their torch and CUDA versions) is passed in; a rule whose condition depends on something
not known does not fire."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
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
    """What a rule may know of the job: the collectives its runs issue, its device, and the torch and CUDA runtime
    versions its ranks run (None: not known)."""

    ops: frozenset[str] = TRAIN_OPS
    device: Device | None = None
    torch: str | None = None  # torch.__version__, e.g. "2.9.1+cu128"
    cuda: str | None = None  # torch.version.cuda, e.g. "12.8"


@dataclass(frozen=True)
class Setup:
    """What the rules read: a config's environment and torch flags, or a process's as torch reports them.
    `warn_only` is known of a process only (a config cannot ask for it)."""

    name: str
    env: Mapping[str, str] = field(default_factory=dict)
    deterministic_algorithms: bool = False
    warn_only: bool | None = None

    @classmethod
    def of_config(cls, body: ConfigBody) -> Setup:
        return cls(body.name, dict(body.env), body.torch.deterministic_algorithms)


@dataclass(frozen=True)
class Rule:
    key: str
    setting: str  # the setting, as users write it
    reason: str
    fix: str
    source: str
    matches: Callable[[Setup, Context], str | None]  # what matched, in words; None: the rule does not fire


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

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "config": self.config, "matched": self.matched, "reason": self.reason,
                "fix": self.fix, "source": self.source}


def version(text: str | None) -> tuple[int, int] | None:
    """(major, minor) of a version string ("2.11.0+cu130" → (2, 11), "10.2" → (10, 2)); None when not one."""
    found = re.match(r"\s*(\d+)\.(\d+)", text or "")
    return (int(found[1]), int(found[2])) if found else None


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


def _tree_for_gathers(body: Setup, ctx: Context) -> str | None:
    value = body.env.get("NCCL_ALGO")
    if value is None:
        return None
    for op, func in _FUNCS.items():
        algos = _algos_for(value, func)
        if op in ctx.ops and algos is not None and algos <= _NO_GATHER:
            return f"NCCL_ALGO={value} leaves {func} only {sorted(algos)}"
    return None


def _no_op_var(body: Setup, ctx: Context) -> str | None:
    named = [name for name in NO_OP_VARS if name in body.env]
    return f"{named[0]}={body.env[named[0]]}" if named else None


# torch's own test (ATen Context::checkCuBLASConfigDeterministic, torch 1.7 to 2.9): the exact strings it accepts.
CUBLAS_DETERMINISTIC = (":4096:8", ":16:8")
# The first torch without that test: pytorch/pytorch#161749 removed it from main on 2025-10-03, after the 2.9 branch.
CUBLAS_CHECK_REMOVED = (2, 10)
CUBLAS_PR = "https://github.com/pytorch/pytorch/pull/161749"


def _cublas_unset(body: Setup, ctx: Context) -> str | None:
    if ctx.device != "cuda" or not body.deterministic_algorithms:
        return None
    value = body.env.get("CUBLAS_WORKSPACE_CONFIG")
    torch, cuda = version(ctx.torch), version(ctx.cuda)
    if value in CUBLAS_DETERMINISTIC or torch is None or cuda is None:
        return None  # set as torch wants it, or the versions that decide are not known: no claim
    if torch >= CUBLAS_CHECK_REMOVED or cuda < (10, 2):
        return None
    shown = f"CUBLAS_WORKSPACE_CONFIG={value}" if value is not None else "CUBLAS_WORKSPACE_CONFIG unset"
    return f"deterministic_algorithms on CUDA {ctx.cuda} with torch {ctx.torch} and {shown}"


def _warn_only(body: Setup, ctx: Context) -> str | None:
    if body.deterministic_algorithms and body.warn_only:
        return "use_deterministic_algorithms(True, warn_only=True)"
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
    Rule("cublas-workspace-unset",
         "use_deterministic_algorithms on CUDA >= 10.2 with torch <= 2.9, CUBLAS_WORKSPACE_CONFIG not :4096:8 or :16:8",
         "torch 1.7 to 2.9 raise a RuntimeError at the first cuBLAS call under deterministic algorithms (a warning "
         "under warn_only) unless CUBLAS_WORKSPACE_CONFIG is exactly :4096:8 or :16:8 (ATen's "
         "Context::checkCuBLASConfigDeterministic, CUDA runtime >= 10.2). torch >= 2.10 dropped the check: it gives "
         "each cuBLAS handle and stream its own workspace, which cuBLAS documents as reproducible (measured: H200, "
         "torch 2.11+cu130, reproducible without it and no alert)",
         "set CUBLAS_WORKSPACE_CONFIG=:4096:8 (or :16:8), or run torch >= 2.10",
         f"{CUBLAS_PR}; https://docs.nvidia.com/cuda/cublas/#results-reproducibility", _cublas_unset),
    Rule("deterministic-warn-only", "use_deterministic_algorithms(True, warn_only=True)",
         "warn_only keeps every nondeterministic kernel and only warns when one runs: the runs are no more "
         "deterministic for the ops that lack a deterministic implementation",
         "torch.use_deterministic_algorithms(True) (an op without a deterministic kernel then raises, naming it)",
         "https://docs.pytorch.org/docs/stable/generated/torch.use_deterministic_algorithms.html", _warn_only),
)
# A config cannot say warn_only (detlab's TorchFlags has no such key), so `deterministic-warn-only` fires only on a
# process's settings: the SDK's Recorder records it; no job can carry it.


def check(body: ConfigBody, ctx: Context) -> list[Finding]:
    """Every rule the config matches, in the table's order."""
    return check_setup(Setup.of_config(body), ctx)


def check_setup(setup: Setup, ctx: Context) -> list[Finding]:
    """Every rule the setup (a config's, or a process's) matches, in the table's order."""
    return [Finding(rule.key, setup.name, matched, rule.reason, rule.fix, rule.source)
            for rule in RULES if (matched := rule.matches(setup, ctx))]


def table() -> list[dict[str, str]]:
    """The rules as rows (docs, the API): key, setting, reason, fix, source."""
    return [{"key": r.key, "setting": r.setting, "reason": r.reason, "fix": r.fix, "source": r.source} for r in RULES]
