"""`python -m detlab.cli`: the `detlab` command."""

from detlab.cli import app

app()
