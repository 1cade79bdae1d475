"""`detlab verify-collective | batch-invariance | audit | parse-log`: this machine's stack diagnosed, no server
needed (collectives, batch invariance, an op audit), and NCCL/RCCL debug logs read."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from detlab.cli.root import app

# verify-collective, batch-invariance and audit hand their options to the argparse parsers of
# detlab.worker.verify and detlab.worker.diagnose.cli (their --help is those parsers').
_PASS_ON = {"allow_extra_args": True, "ignore_unknown_options": True}


@app.command("parse-log")
def parse_log(
    files: Annotated[list[Path], typer.Argument(help="NCCL/RCCL debug log files (NCCL_DEBUG=INFO)")],
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per file")] = False,
) -> None:
    """Print the facts in NCCL/RCCL debug logs: version, ranks, channels, transports, algorithm choices."""
    from detlab.core.commlog import main

    raise typer.Exit(main([*map(str, files), *(["--json"] if as_json else [])]))


@app.command("verify-collective", add_help_option=False, context_settings=_PASS_ON)
def verify_collective(ctx: typer.Context) -> None:
    """Check that collectives give the same bits on identical inputs, without a server.

    Options are passed on: --backend gloo|nccl --world-size N --ops ... --dtypes ... --min-bytes
    --max-bytes --step-factor --trials --seed --json (see `detlab verify-collective --help`).
    Exits 0 when every size is reproducible, 1 otherwise."""
    from detlab.worker.verify import main

    raise typer.Exit(main(list(ctx.args)))


@app.command("batch-invariance", add_help_option=False, context_settings=_PASS_ON)
def batch_invariance(ctx: typer.Context) -> None:
    """Does row 0 of a batched op equal the batch-1 result bitwise? No server needed.

    Options: --device auto|cpu|cuda --ops mm,linear,... --dtypes float32,bfloat16,float16 --batch-sizes 1,2,4
    --features N --workload NAME --config PRESET|JSON --threads N --json (see `detlab batch-invariance --help`).
    Exits 0 when everything is invariant, 1 otherwise, 2 for bad options."""
    from detlab.worker.diagnose.cli import main

    raise typer.Exit(main("batch-invariance", list(ctx.args)))


@app.command("audit", add_help_option=False, context_settings=_PASS_ON)
def audit(ctx: typer.Context) -> None:
    """Every aten op of one training step of a workload, checked for nondeterminism on this device.

    Options: --workload NAME --device auto|cpu|cuda --threads N --config PRESET|JSON --reruns K --json.
    Exits 0 when no op was found nondeterministic, 1 otherwise, 2 for bad options."""
    from detlab.worker.diagnose.cli import main

    raise typer.Exit(main("op-audit", list(ctx.args)))
