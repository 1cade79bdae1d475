"""`detlab verify-collective | batch-invariance | audit | parse-log`: this machine's stack diagnosed, no server
needed (collectives, batch invariance, an op audit), and NCCL/RCCL debug logs read."""

from __future__ import annotations

import argparse
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperCommand

from detlab.cli.root import app
from detlab.core import diagnosis
from detlab.core.collective import DTYPE_BYTES, OPS

Json = Annotated[bool, typer.Option("--json", help="print one JSON object instead of the table")]
Threads = Annotated[int | None, typer.Option(help="torch/OMP threads (default: the config's)")]
Timeout = Annotated[float, typer.Option(help="seconds before the ranks are killed")]


# click's UsageError wherever this typer keeps click (vendored since typer 0.2x): BadParameter's base.
_USAGE_ERROR: type[Exception] = typer.BadParameter.__mro__[1]


class OneLineUsage(TyperCommand):
    """A bad command line as one line, `detlab NAME: error: ...`, and exit 2 (not click's usage box): these
    commands are CI gates whose stderr is read."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # click.Context, vendored or not
        try:
            return super().parse_args(ctx, args)
        except _USAGE_ERROR as exc:
            _usage(ctx.info_name or "", exc.format_message())  # type: ignore[attr-defined]


def _usage(command: str, message: str) -> NoReturn:
    typer.echo(f"detlab {command}: error: {message}", err=True)
    raise typer.Exit(2)


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


class Device(StrEnum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Backend(StrEnum):
    gloo = "gloo"
    nccl = "nccl"


@app.command("parse-log")
def parse_log(
    files: Annotated[list[Path], typer.Argument(help="NCCL/RCCL debug log files (NCCL_DEBUG=INFO)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per file")] = False,
) -> None:
    """Print the facts in NCCL/RCCL debug logs: version, ranks, channels, transports, algorithm choices."""
    from detlab.core.commlog import main

    raise typer.Exit(main([*map(str, files), *(["--json"] if as_json else [])]))


def _size(option: str, text: str) -> int:
    from detlab.worker.verify import parse_size

    try:
        return parse_size(text)
    except argparse.ArgumentTypeError as exc:
        _usage("verify-collective", f"argument {option}: {exc}")


@app.command("verify-collective", cls=OneLineUsage)
def verify_collective(
    backend: Annotated[Backend, typer.Option(help="gloo on CPU, nccl on GPUs")] = Backend.gloo,
    world_size: Annotated[int | None, typer.Option(help="ranks to spawn (default 2; under torchrun: its)")] = None,
    ops: Annotated[str, typer.Option(help=f"comma-separated: {','.join(OPS)}")] = "all_reduce_sum",
    dtypes: Annotated[str, typer.Option(help=f"comma-separated: {','.join(DTYPE_BYTES)}")] = "float32",
    min_bytes: Annotated[str, typer.Option(help="smallest size, e.g. 4K")] = "4K",
    max_bytes: Annotated[str, typer.Option(help="largest size, e.g. 1G")] = "1M",
    step_factor: Annotated[int, typer.Option(help="size multiplier between steps")] = 4,
    trials: Annotated[int, typer.Option(help="timed, fingerprinted trials per size")] = 5,
    warmup: Annotated[int, typer.Option(help="untimed iterations before the trials")] = 2,
    seed: Annotated[int, typer.Option(help="input seed")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch/OMP threads per rank")] = None,
    ref_max_elems: Annotated[int, typer.Option(
        help="skip the float64 reference for outputs larger than this")] = 1 << 22,
    timeout: Timeout = 600.0,
    as_json: Json = False,
) -> None:
    """Check that collectives give the same bits on identical inputs, without a server: spawns --world-size
    ranks (gloo on CPU, nccl with one GPU per rank), or runs as one rank under torchrun, and prints an
    nccl-tests-style table with digest columns, or one JSON object (summary + an nccl-tests -J export).
    Exits 0 when every size is reproducible, 1 otherwise (or when a rank failed), 2 for bad options."""
    from detlab.worker.verify import run

    args = argparse.Namespace(
        backend=backend.value, world_size=world_size, ops=_names(ops), dtypes=_names(dtypes),
        min_bytes=_size("--min-bytes", min_bytes), max_bytes=_size("--max-bytes", max_bytes),
        step_factor=step_factor, trials=trials, warmup=warmup, seed=seed, threads=threads,
        ref_max_elems=ref_max_elems, timeout=timeout, json=as_json)
    # The command line as the JSON export records it: every option as in effect.
    argv = [f"--{k.replace('_', '-')}={','.join(v) if isinstance(v, list) else v}"
            for k, v in vars(args).items() if k != "json" and v is not None]
    raise typer.Exit(run(args, [*argv, *(["--json"] if as_json else [])]))


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in _names(text)]
    except ValueError:
        _usage("batch-invariance", f"argument --batch-sizes: {text!r} is not a comma-separated list of integers")


def _diagnose(kind: str, **options: Any) -> NoReturn:
    from detlab.worker.diagnose.cli import run

    raise typer.Exit(run("batch-invariance" if kind == "batch-invariance" else "op-audit",
                         argparse.Namespace(**options)))


@app.command("batch-invariance", cls=OneLineUsage)
def batch_invariance(
    ops: Annotated[str, typer.Option(help=f"comma-separated: {','.join(diagnosis.INVARIANCE_OPS)}")] = ",".join(
        diagnosis.INVARIANCE_OPS),
    dtypes: Annotated[str, typer.Option(help=f"comma-separated: {','.join(diagnosis.INVARIANCE_DTYPES)}")] = "float32",
    batch_sizes: Annotated[str, typer.Option(help="comma-separated batch sizes")] = ",".join(
        map(str, diagnosis.DEFAULT_BATCH_SIZES)),
    features: Annotated[int, typer.Option(help="features per sample (weights are features²)")] = 256,
    workload: Annotated[str | None, typer.Option(
        help="also compare this workload's forward, module by module")] = None,
    device: Annotated[Device, typer.Option(help="where the ops run")] = Device.auto,
    config: Annotated[str, typer.Option(help="a preset name or a config as JSON (its torch flags, seed and "
                                             "threads apply)")] = "default",
    threads: Threads = None,
    timeout: Timeout = 600.0,
    as_json: Json = False,
) -> None:
    """Does row 0 of a batched op equal the batch-1 result bitwise? No server needed. Prints a table, or one
    JSON object: results (op, dtype, batch_size, invariant, max_ulp), summary (first_break per op and dtype),
    device, tf32, model. Exits 0 when everything is invariant, 1 otherwise, 2 for bad options."""
    _diagnose("batch-invariance", ops=_names(ops), dtypes=_names(dtypes), batch_sizes=_ints(batch_sizes),
              features=features, workload=workload, device=device.value, config=config, threads=threads,
              timeout=timeout, json=as_json)


@app.command("audit", cls=OneLineUsage)
def audit(
    workload: Annotated[str, typer.Option(help="a registered workload")],
    reruns: Annotated[int, typer.Option(help="re-runs per kept op call")] = diagnosis.DEFAULT_RERUNS,
    calls_per_op: Annotated[int, typer.Option(help="op calls kept per op")] = diagnosis.DEFAULT_CALLS_PER_OP,
    device: Annotated[Device, typer.Option(help="where the ops run")] = Device.auto,
    config: Annotated[str, typer.Option(help="a preset name or a config as JSON (its torch flags, seed and "
                                             "threads apply)")] = "default",
    threads: Threads = None,
    timeout: Timeout = 600.0,
    as_json: Json = False,
) -> None:
    """Every aten op of one training step of a workload, checked for nondeterminism on this device. Prints a
    table, or one JSON object: ops (op, count, nondeterministic, evidence), ineffective, workload, device,
    threads, torch_flags. Exits 0 when no op was found nondeterministic, 1 otherwise, 2 for bad options."""
    _diagnose("audit", workload=workload, reruns=reruns, calls_per_op=calls_per_op, device=device.value,
              config=config, threads=threads, timeout=timeout, json=as_json)
