"""`detlab verify-collective`: the collective reproducibility check on this machine, no server needed.

Spawns `--world-size` ranks of `python -m detlab.worker.ranks.collective` (gloo on CPU, nccl with one GPU per rank),
or, when started under torchrun (RANK and WORLD_SIZE set), runs as one of its ranks and gathers the
records to every rank. Prints an nccl-tests-style table with digest columns, or one JSON object with
`--json` (summary + an nccl-tests `-J`-shaped export). Exit 0 when every (op, dtype, size) gave one
distinct digest with consistent ranks, 1 otherwise (or when a rank failed), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from detlab.core.collective import DTYPE_BYTES, OPS, format_table, nccl_tests_json, summarize, verdict
from detlab.core.wire import CollectiveSpec, EnvRecord, RankSpec, Record, TrialRecord, explain
from detlab.worker.launch import RankFailed, RanksTimedOut, launch_ranks

MAX_SIZES = 24
ENV_PREFIXES = ("NCCL_", "RCCL_", "CUBLAS_", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "TORCH_NCCL_")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


class UsageError(ValueError):
    """A bad command line; the message says what to change."""


def parse_size(text: str) -> int:
    """'4096', '4K', '64M', '1G' -> bytes (binary units, as nccl-tests' -b/-e)."""
    t = text.strip().upper().removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    try:
        value = int(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size; use bytes or a K/M/G suffix, e.g. 4K") from None
    return value


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="detlab verify-collective", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=("gloo", "nccl"), default="gloo", help="gloo on CPU, nccl on GPUs")
    p.add_argument("--world-size", type=int, default=None, help="ranks to spawn (default 2; under torchrun: its)")
    p.add_argument("--ops", type=_names, default=["all_reduce_sum"], help=f"comma-separated: {','.join(OPS)}")
    p.add_argument("--dtypes", type=_names, default=["float32"], help=f"comma-separated: {','.join(DTYPE_BYTES)}")
    p.add_argument("--min-bytes", type=parse_size, default=4096, help="smallest size, e.g. 4K (default 4K)")
    p.add_argument("--max-bytes", type=parse_size, default=1 << 20, help="largest size, e.g. 1G (default 1M)")
    p.add_argument("--step-factor", type=int, default=4, help="size multiplier between steps (default 4)")
    p.add_argument("--trials", type=int, default=5, help="timed, fingerprinted trials per size (default 5)")
    p.add_argument("--warmup", type=int, default=2, help="untimed iterations before the trials (default 2)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch/OMP threads per rank")
    p.add_argument("--ref-max-elems", type=int, default=1 << 22,
                   help="skip the float64 reference for outputs larger than this (default 4Mi elements)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds before spawned ranks are killed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    return p


def _check(args: argparse.Namespace, under_torchrun: bool) -> None:
    bad_ops = [o for o in args.ops if o not in OPS]
    bad_dtypes = [d for d in args.dtypes if d not in DTYPE_BYTES]
    if not args.ops or bad_ops:
        raise UsageError(f"--ops: unknown {bad_ops or 'none given'}; choose from {', '.join(OPS)}")
    if not args.dtypes or bad_dtypes:
        raise UsageError(f"--dtypes: unknown {bad_dtypes or 'none given'}; choose from {', '.join(DTYPE_BYTES)}")
    if under_torchrun:
        world = int(os.environ["WORLD_SIZE"])
        if args.world_size not in (None, world):
            raise UsageError(f"--world-size {args.world_size} but torchrun started WORLD_SIZE={world}; drop the flag")
        args.world_size = world
    args.world_size = 2 if args.world_size is None else args.world_size
    if args.world_size < 1:
        raise UsageError("--world-size must be >= 1")
    if args.step_factor < 2 or args.trials < 1 or args.warmup < 0:
        raise UsageError("--step-factor must be >= 2, --trials >= 1 and --warmup >= 0")
    smallest = 4 * args.world_size  # every rank needs >= 1 float32 element of all_gather / reduce_scatter
    if args.min_bytes < smallest or args.min_bytes > args.max_bytes:
        raise UsageError(f"need {smallest} <= --min-bytes <= --max-bytes (4 bytes per rank); "
                         f"got {args.min_bytes} and {args.max_bytes}")
    n = len(sizes(args))
    if n > MAX_SIZES:
        raise UsageError(f"{n} sizes from --min-bytes/--max-bytes/--step-factor; at most {MAX_SIZES}")
    if args.backend == "nccl":
        import torch

        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        need = 1 if under_torchrun else args.world_size
        if have < need:
            raise UsageError(f"--backend nccl needs {need} visible CUDA GPU(s), found {have}; "
                             "use --backend gloo on CPU or a smaller --world-size")


def sizes(args: argparse.Namespace) -> list[int]:
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size *= args.step_factor
    return out


def build_spec(args: argparse.Namespace) -> RankSpec:
    """The detlab.worker.ranks.collective spec for these (checked) arguments; UsageError when out of bounds."""
    try:
        collective = CollectiveSpec(ops=args.ops, dtypes=args.dtypes, sizes=sizes(args), trials=args.trials,
                                    warmup=args.warmup)
        return RankSpec(kind="collective", workload="collective", world_size=args.world_size,
                        steps=collective.cells(), seed=args.seed, threads=args.threads, collective=collective,
                        device="cuda" if args.backend == "nccl" else "cpu", ref_max_elems=args.ref_max_elems)
    except ValidationError as exc:
        raise UsageError(explain(exc)) from exc


def launch(spec: RankSpec, *, timeout_s: float = 600.0) -> list[Record]:
    """Spawn the spec's `world_size` collective ranks torchrun-style; returns every record they spooled.

    The ranks get this process's environment, so a user's NCCL_* settings reach them unchanged."""
    records: list[Record] = []
    with tempfile.TemporaryDirectory(prefix="detlab-verify-") as tmp:
        try:
            launch_ranks(spec, Path(tmp), on_records=records.extend, timeout_s=timeout_s, poll_s=0.1,
                         tie_to_parent=True)
        except RanksTimedOut as exc:
            raise RanksTimedOut(f"{exc} (raise --timeout)") from exc
    return records


def _in_process(spec: RankSpec) -> list[Record]:
    """Run as one torchrun rank; every rank gets every rank's records."""
    import torch.distributed as dist

    from detlab.worker.ranks import collective, teardown

    mine = collective.run(spec, finalize=False)
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    teardown.leave()
    return [r for records in everyone for r in records]


def _meta(args: argparse.Namespace, argv: list[str], records: list[Record], start: str) -> dict[str, Any]:
    envs = sorted((r for r in records if isinstance(r, EnvRecord)), key=lambda r: r.rank)
    return {
        "start_time": start, "end_time": time.strftime("%Y-%m-%d %H:%M:%S"),
        "args": ["detlab", "verify-collective", *argv],
        "env": [f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)],
        "nccl_version": envs[0].nccl if envs else None, "world_size": args.world_size,
        "min_bytes": args.min_bytes, "max_bytes": args.max_bytes, "step_factor": args.step_factor,
        "warmup": args.warmup, "trials": args.trials, "backend": args.backend,
        "devices": [{"rank": e.rank, "hostname": e.host, "device_info": e.device} for e in envs],
    }


def main(argv: list[str]) -> int:
    """Entry point of `detlab verify-collective`; returns the exit code (0 reproducible, 1 not, 2 bad usage)."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed the usage error (2) or the help (0)
        return int(exc.code or 0)
    return run(args, argv)


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """The check for options as the parser gives them (`detlab verify-collective` passes its own); `argv` is
    the command line recorded in the JSON export. Returns the exit code (0 reproducible, 1 not, 2 bad usage)."""
    under_torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    try:
        _check(args, under_torchrun)
        spec = build_spec(args)
    except UsageError as exc:
        print(f"detlab verify-collective: error: {exc}", file=sys.stderr)
        return 2
    start = time.strftime("%Y-%m-%d %H:%M:%S")
    try:
        records = _in_process(spec) if under_torchrun else launch(spec, timeout_s=args.timeout)
    except RankFailed as exc:
        print(f"detlab verify-collective: {exc}", file=sys.stderr)
        return 1
    summary = summarize([r.model_dump() for r in records if isinstance(r, TrialRecord)], args.world_size)
    ok, line = verdict(summary)
    if int(os.environ.get("RANK", 0)) == 0:
        if args.json:
            print(json.dumps({"reproducible": ok, "verdict": line, "backend": args.backend,
                              "world_size": args.world_size, "summary": summary,
                              "nccl_tests": nccl_tests_json(summary, _meta(args, argv, records, start))}))
        else:
            print(f"# detlab verify-collective: backend {args.backend}, world size {args.world_size}, "
                  f"seed {args.seed}, {args.trials} trials after {args.warmup} warm-up")
            print(format_table(summary), end="")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
