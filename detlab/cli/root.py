"""The `detlab` command's root: the typer app every command group registers on."""

from __future__ import annotations

import typer

app = typer.Typer(help="detlab: where two training runs diverge, and what reproducibility costs.",
                  no_args_is_help=True, add_completion=False)
