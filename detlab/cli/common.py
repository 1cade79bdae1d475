"""What the command groups share: the --server and --data-dir options, a user error as one line, the client of
a detlab server with the CLI's token, and the database migration."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer

from detlab.core import http

Server = Annotated[str, typer.Option(envvar="DETLAB_SERVER", help="the detlab server (DETLAB_SERVER)")]
DEFAULT_SERVER = "http://127.0.0.1:8000"
DataDir = Annotated[Path, typer.Option(envvar="DETLAB_DATA_DIR",
                                       help="the data dir of `detlab up` (DETLAB_DATABASE_URL, when set, wins)")]


def fail(message: str) -> NoReturn:
    """An error the user caused: one line on stderr, exit 2, no traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


def token() -> str | None:
    """DETLAB_TOKEN (`detlab token create`), if set."""
    from detlab.core.settings import get_settings

    return get_settings().token


def auth_headers() -> dict[str, str]:
    """`Authorization: Bearer $DETLAB_TOKEN` when the token is set."""
    return http.auth_headers(token())


@contextmanager
def server_client(server: str, *, timeout_s: float = 60.0) -> Iterator[httpx.Client]:
    """A client of `server` sending DETLAB_TOKEN; a server that cannot be reached is one line and exit 2."""
    try:
        with http.connect(server, token(), timeout_s=timeout_s) as client:
            yield client
    except httpx.TransportError as exc:  # server down or unreachable: one line, not a traceback
        typer.echo(f"error: cannot reach {server}: {exc}", err=True)
        raise typer.Exit(2) from exc


def migrate_database() -> None:
    """Upgrade the database of the current settings to the latest schema."""
    from alembic import command

    from detlab.migrations import alembic_config

    command.upgrade(alembic_config(), "head")


def config_ref(value: str) -> dict[str, Any]:
    """`--config`: a JSON file's config, or a preset's name."""
    path = Path(value)
    if path.suffix == ".json" or path.exists():
        try:
            return json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            fail(f"--config {value}: cannot read it as a JSON config ({exc})")
    return {"preset": value}


def json_option(value: str | None, option: str) -> Any:
    """An option given as JSON, parsed; not JSON is one line and exit 2."""
    try:
        return None if value is None else json.loads(value)
    except json.JSONDecodeError as exc:
        fail(f"{option}: not JSON ({exc})")
