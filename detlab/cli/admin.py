"""`detlab user | token`: users and API tokens of auth mode local, written straight to the database."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Annotated

import typer

from detlab.cli.common import DataDir, migrate_database
from detlab.cli.root import app

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

user_app = typer.Typer(help="Users of auth mode 'local' (DETLAB_AUTH_MODE=local).", no_args_is_help=True)
token_app = typer.Typer(help="API tokens for the CLI, CI and the SDK (DETLAB_TOKEN).", no_args_is_help=True)
app.add_typer(user_app, name="user")
app.add_typer(token_app, name="token")


@contextmanager
def _auth_service(data_dir: Path) -> Iterator[tuple[Session, ModuleType]]:
    """A database session on the settings `detlab up` uses, migrated, committed on success; errors a user
    caused are one line and exit 2."""
    os.environ["DETLAB_DATA_DIR"] = str(data_dir)
    migrate_database()
    from detlab.backend.db import get_sessionmaker
    from detlab.backend.services import auth

    with get_sessionmaker()() as session:
        try:
            yield session, auth
        except auth.AuthError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        session.commit()


@user_app.command("add")
def user_add(
    name: Annotated[str, typer.Argument(help="the login name (also shown as the submitter of jobs)")],
    role: Annotated[str, typer.Option(
        help="viewer (read), member (read, submit, ingest), admin, or worker (a worker node: scope worker only)",
    )] = "member",
    password_stdin: Annotated[bool, typer.Option("--password-stdin", help="read the password from the first "
                                                 "line of stdin instead of prompting")] = False,
    data_dir: DataDir = Path(".detlab"),
) -> None:
    """Add a user who logs in to the dashboard (auth mode local). Exit 2 if the name exists or the role or
    password is refused (8 characters at least)."""
    password = (sys.stdin.readline().rstrip("\r\n") if password_stdin
                else typer.prompt("password", hide_input=True, confirmation_prompt=True))
    with _auth_service(data_dir) as (session, auth):
        user = auth.create_user(session=session, name=name, role=role, password=password)
    typer.echo(f"user {user.name} added ({user.role})")


@token_app.command("create")
def token_create(
    user: Annotated[str, typer.Option(help="the user the token acts as")],
    scope: Annotated[list[str], typer.Option(
        help="read, submit, ingest, admin, or worker (a worker node's credential, for a user of role worker); "
             "repeat for several")],
    data_dir: DataDir = Path(".detlab"),
) -> None:
    """Create an API token and print it once (only its hash is kept). Send it as 'Authorization: Bearer
    <token>', or set DETLAB_TOKEN for the CLI and the SDK. A token cannot grant more than its user's role."""
    with _auth_service(data_dir) as (session, auth):
        row, token = auth.create_token(session=session, user_name=user, scopes=scope)
    typer.echo(token)
    typer.echo(f"token {row.id} for {user} with scope {', '.join(row.scopes)}; shown once, keep it "
               f"(`detlab token revoke {row.id}` ends it)", err=True)


@token_app.command("list")
def token_list(data_dir: DataDir = Path(".detlab")) -> None:
    """List tokens: id, user, scopes, created (the tokens themselves are not kept)."""
    with _auth_service(data_dir) as (session, auth):
        for row in auth.list_tokens(session=session):
            typer.echo(f"{row.id}\t{row.user.name}\t{','.join(row.scopes)}\t{row.created_at:%Y-%m-%d %H:%M}")


@token_app.command("revoke")
def token_revoke(token_id: Annotated[int, typer.Argument(help="the token's id (`detlab token list`)")],
                 data_dir: DataDir = Path(".detlab")) -> None:
    """Revoke a token: requests sending it are refused from now on. Exit 2 if there is no such token."""
    with _auth_service(data_dir) as (session, auth):
        row = auth.revoke_token(session=session, token_id=token_id)
        typer.echo(f"token {row.id} of {row.user.name} revoked")
