"""The `detlab` command line: one module per command group, each registering its commands on one typer app.

services (up, api, worker, migrate) · jobs (submit, cancel, bisect) · fix · admin (user, token) · compare · why ·
results (upload, import-results) · checkpoints (fingerprint, diff) · diagnose (verify-collective,
batch-invariance, audit, parse-log). What a finished job prints and the gates it is held to: summaries."""

from __future__ import annotations

# isort: off
# Imported for the commands they register, in the order `detlab --help` lists them.
from detlab.cli import services, jobs, fix, admin, compare, why, results, checkpoints, diagnose  # noqa: F401
# isort: on
from detlab.cli.root import app
from detlab.cli.summaries import gate_failures, typed_result

__all__ = ["app", "gate_failures", "typed_result"]
