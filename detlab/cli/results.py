"""`detlab upload | import-results`: results made elsewhere brought in, a recording to a server, result files
into this database's findings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from detlab.cli.common import DEFAULT_SERVER, Server, migrate_database
from detlab.cli.root import app


@app.command()
def upload(
    out: Annotated[Path, typer.Argument(help="a recording directory, written by detlab.Recorder(out=...)")],
    server: Server = DEFAULT_SERVER,
    name: Annotated[str | None, typer.Option(help="the run's name on the server (default: run.json's)")] = None,
) -> None:
    """Send a recording to a detlab server, where it can be compared with any other run (token: DETLAB_TOKEN,
    scope ingest). Idempotent: a recording streamed in part (online mode), or uploaded before, gets only what
    the server lacks, on the same run. Exit 0 when sent, 2 on any error."""
    import httpx

    from detlab.core.ingest_client import IngestError
    from detlab.sdk.store import RecordsError
    from detlab.sdk.upload import upload as send

    try:
        done = send(out, server.rstrip("/"), name=name)
    except (RecordsError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except (httpx.TransportError, IngestError) as exc:
        typer.echo(f"error: {server} did not take the recording ({type(exc).__name__}: {exc}); nothing is lost, "
                   "run the same command again", err=True)
        raise typer.Exit(2) from None
    typer.echo(f"uploaded {out}: {done.records} records to run {done.run_id} ({done.status}): "
               f"{server.rstrip('/')}/jobs/{done.job_id}")


@app.command("import-results")
def import_results(
    files: Annotated[list[Path], typer.Argument(help="result files as in results/*/: {job, result} of a collective, "
                                                     "sweep or train job, or a train comparison beside its job")],
) -> None:
    """Add results measured elsewhere to this database's findings (the team history).

    Each file is imported whole or not at all: a file that is not a detlab job result is named, nothing of
    it is kept, and the others are still imported. Importing a file again replaces what it gave before.
    Exits 2 when a file was refused."""
    from sqlalchemy.exc import SQLAlchemyError

    from detlab.backend.db import get_sessionmaker
    from detlab.backend.reports.findings import from_file, store

    migrate_database()
    refused = 0
    with get_sessionmaker()() as session:
        for path in files:
            # The source names the data set, not this machine's paths.
            source = f"{path.resolve().parent.name}/{path.name}"
            try:
                rows, cells = from_file(source, json.loads(path.read_text()))
                store(session=session, rows=rows, cells=cells, sources={source})
                session.commit()
            except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, SQLAlchemyError) as exc:
                session.rollback()
                refused += 1
                typer.echo(f"error: {path}: not a detlab result file, nothing of it imported "
                           f"({type(exc).__name__}: {exc})", err=True)
                continue
            kinds = sorted({c["kind"] for c in cells}) or ["nothing"]
            typer.echo(f"{path}: {len(cells)} measurements ({', '.join(kinds)})"
                       + (f", {len(rows)} collective cells" if rows else ""))
    if refused:
        typer.echo(f"{refused} of {len(files)} file(s) refused; the others were imported", err=True)
        raise typer.Exit(2)
