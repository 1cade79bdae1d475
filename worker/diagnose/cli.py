"""`detlab batch-invariance` and `detlab audit`: the diagnosis measurements on this machine, no server needed.

Each spawns one rank of `python -m detlab.worker.ranks.diagnose` (the program a job's run executes) under a
config's flags, and prints a table, or one JSON object with `--json`:
- batch-invariance: `{"results": [{"op","dtype","batch_size","invariant","max_ulp"}...], "summary":
  [{"op","dtype","first_break"}...], "device", "tf32", "model"}`; exit 0 when everything is invariant, 1 if not;
- audit: `{"ops": [{"op","count","nondeterministic","evidence"}...], "ineffective": [...], "workload", "device",
  "threads", "torch_flags"}`; exit 0 when no op was found nondeterministic, 1 when one was.
Bad arguments: one line on stderr, exit 2. The options are parsed by the command line (detlab.cli.diagnose).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Literal

from pydantic import ValidationError

from detlab.core import configs, diagnosis
from detlab.core.wire import (
    AuditOpRecord,
    DiagnosisSpec,
    EnvRecord,
    InvarianceRecord,
    ModelInvarianceRecord,
    RankSpec,
    Record,
    explain,
)
from detlab.worker.launch import RankFailed
from detlab.worker.verify import launch


class UsageError(ValueError):
    """A bad command line; the message says what to change."""


def _config(text: str) -> configs.ConfigBody:
    try:
        ref = json.loads(text) if text.lstrip().startswith("{") else {"preset": text}
        return configs.resolve(ref)
    except ValidationError as exc:
        raise UsageError(f"--config: {explain(exc, 'config')}") from exc
    except ValueError as exc:
        raise UsageError(f"--config: {exc}") from exc


def _check_device(device: str) -> None:
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA GPU is visible; use --device cpu")


def build_spec(kind: Literal["batch-invariance", "op-audit"], args: argparse.Namespace) -> RankSpec:
    """The rank's spec for these arguments; UsageError when a value is out of bounds or unknown."""
    from detlab.worker.workloads import registry

    body = _config(args.config)
    workload = args.workload
    if workload is not None and workload not in registry():
        raise UsageError(f"--workload: unknown {workload!r}; known: {', '.join(sorted(registry()))}")
    _check_device(args.device)
    try:
        if kind == "batch-invariance":
            d = DiagnosisSpec(ops=args.ops, dtypes=args.dtypes, batch_sizes=args.batch_sizes, features=args.features,
                              workload=workload)
        else:
            d = DiagnosisSpec(reruns=args.reruns, calls_per_op=args.calls_per_op)
        return RankSpec(kind=kind, workload=workload or kind, world_size=1, steps=max(1, d.cells()),
                        seed=body.seed, threads=args.threads or body.threads, torch=body.torch, diagnosis=d,
                        device=args.device)
    except ValidationError as exc:
        raise UsageError(_explain(exc)) from exc


def _explain(exc: ValidationError) -> str:
    """`--batch-sizes: ...` for the option a value came from (`arguments:` for a rule over several)."""
    return "; ".join(f"{'--' + str(e['loc'][0]).replace('_', '-') if e['loc'] else 'arguments'}: "
                     f"{e['msg'].removeprefix('Value error, ')}" for e in exc.errors())


def _env(records: list[Record]) -> EnvRecord | None:
    return next((r for r in records if isinstance(r, EnvRecord)), None)


def invariance_result(records: list[Record]) -> dict[str, Any]:
    env = _env(records)
    out = diagnosis.invariance_json([r.model_dump() for r in records if isinstance(r, InvarianceRecord)])
    return {**out, "device": env.device if env else None,
            "tf32": env.torch_flags.allow_tf32 if env and env.torch_flags else None,
            "model": diagnosis.model_summary([r.model_dump() for r in records if isinstance(r, ModelInvarianceRecord)])}


def audit_result(records: list[Record], spec: RankSpec) -> dict[str, Any]:
    env = _env(records)
    rows = [r.model_dump() for r in records if isinstance(r, AuditOpRecord)]
    claims = bool(spec.torch and spec.torch.deterministic_algorithms)
    return diagnosis.audit_report(
        rows, claims_determinism=claims, workload=spec.workload, device=env.device if env else None,
        threads=env.torch_flags.num_threads if env and env.torch_flags else spec.threads,  # as in effect
        torch_flags=env.torch_flags.model_dump() if env and env.torch_flags else None)


def _print_invariance(result: dict[str, Any]) -> None:
    print(f"# detlab batch-invariance on {result['device']} (TF32 {'on' if result['tf32'] else 'off'})")
    print(f"{'op':<12} {'dtype':<9} {'first break':>11}  max ULP by batch size")
    for s in result["summary"]:
        ulps = " ".join(f"{r['batch_size']}:{r['max_ulp']}" for r in result["results"]
                        if (r["op"], r["dtype"]) == (s["op"], s["dtype"]))
        print(f"{s['op']:<12} {s['dtype']:<9} {str(s['first_break'] or '-'):>11}  {ulps}")
    if model := result["model"]:
        where = "invariant" if model["invariant"] else \
            f"breaks at batch {model['first_break']} in module {model['first_module']}"
        print(f"model {model['workload']}: {where}")


def _print_audit(result: dict[str, Any]) -> None:
    print(f"# detlab audit: {result['workload']} on {result['device']}, {result['threads'] or 'default'} threads")
    width = max([24, *(len(o["op"]) for o in result["ops"])])
    print(f"{'op':<{width}} {'count':>7}  {'nondet':<6}  evidence")
    for o in result["ops"]:
        flag = {True: "yes", False: "no", None: "?"}[o["nondeterministic"]]
        print(f"{o['op']:<{width}} {o['count']:>7}  {flag:<6}  {o['evidence']}")
    if result["ineffective"]:
        print(f"flags that do nothing: the config claims determinism, yet {', '.join(result['ineffective'])} "
              "gave different bits on re-run")


def run(kind: Literal["batch-invariance", "op-audit"], args: argparse.Namespace) -> int:
    """Entry point of `detlab batch-invariance` / `detlab audit` (detlab.cli.diagnose parses the options):
    0 all clean, 1 not, 2 bad usage."""
    prog = "batch-invariance" if kind == "batch-invariance" else "audit"
    try:
        spec = build_spec(kind, args)
    except UsageError as exc:
        print(f"detlab {prog}: error: {exc}", file=sys.stderr)
        return 2
    try:
        records = launch(spec, timeout_s=args.timeout)
    except RankFailed as exc:
        print(f"detlab {prog}: {exc}", file=sys.stderr)
        return 1
    if kind == "batch-invariance":
        result = invariance_result(records)
        ok = diagnosis.all_invariant(result["results"]) and (result["model"] is None or result["model"]["invariant"])
        print(json.dumps(result)) if args.json else _print_invariance(result)
    else:
        result = audit_result(records, spec)
        ok = not any(o["nondeterministic"] for o in result["ops"])
        print(json.dumps(result)) if args.json else _print_audit(result)
    return 0 if ok else 1
